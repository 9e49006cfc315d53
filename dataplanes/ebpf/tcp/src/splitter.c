/* mb-splitter: the eBPF switch's TCP path (docs/dataplanes/tcp.md). The switch hands it the clients' TCP
 * connections to memcached servers (the program steers their segments to the splitter's port; a listener on the
 * memcached port takes connections to any address there). For each client connection it opens, when first
 * needed, one connection of its own to each server it sends requests to (IP_TRANSPARENT; the switch steers the
 * servers' segments back here by the socket table and its mark): to the home from the client's own address and
 * port, so the home sees the client it always saw; to a replica from the home's address, so that in a fabric its
 * answers come back through the home's leaf, where this splitter is. Requests are framed (protocol.c): a single-key get or read-only mg goes where the switch's pipeline
 * says (decide.c: hot and clean, a replica by weight; else home); every other request goes to the home, the
 * switch counting and copying its writes on the way as for any client. A multi-key get whose keys go to several
 * servers is split into one get per server, and their replies joined in the client's key order. Replies go back
 * in request order. What it cannot frame is tunnelled to the home untouched from there on.
 *
 *   mb-splitter PINS MARK PORT...    PINS: the switch's pin directory; MARK: the SO_MARK of its sockets (their
 *                                    route out through the switch); PORT: memcached ports to listen on
 * It writes "ready" to stdout, and closes it, once it listens on every port. One line to stderr per decision worth
 * knowing (a listener, a server that failed, a tunnel); SIGTERM ends it. The process started is a small
 * supervisor: the splitter runs as its child, started again if a signal kills it (a crash costs the connections it
 * held, not the TCP path); a child that cannot start (exit 1: the port taken, no pins) ends the supervisor too. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "buffer.h"
#include "decide.h"
#include "protocol.h"

#define MB_PORTS_MAX 16
#define MB_OUT_LIMIT (4u << 20)  /* bytes waiting for a client that does not read: its servers wait too */
#define MB_REQUEST_LIMIT ((2u << 20) + MB_LINE_MAX)  /* a request buffered whole at most (memcached's items: 1 MB) */
#define MB_EVENTS 256

enum mb_kind { MB_LISTENER, MB_CLIENT, MB_UPSTREAM };

/* A client's home before the controller has named its server (a switch just loaded): the address the client
 * connected to, and nothing balanced until it is named (mb_learn_home). */
#define MB_HOME_UNKNOWN UINT32_MAX

struct mb_entry;

/* A multi-key get split by server: its parts, and which part each of its keys (in the client's order) went in. */
struct mb_split {
	int parts, waiting;            /* parts made; parts whose replies are not in yet */
	struct mb_entry *part[MB_SPLIT_MAX];
	unsigned char part_of[MB_SPLIT_MAX];
};

/* One connection of the splitter's own to a server, for one client connection. */
struct mb_upstream {
	enum mb_kind kind;
	int fd;
	uint32_t server;
	int connected;
	uint32_t mask;                 /* the epoll events asked for */
	struct mb_client *client;
	struct mb_buffer out, in;
	struct mb_entry *waiting, *waiting_tail;  /* requests sent here, in order, whose replies are not all in */
};

/* One request of a client, from the time it is read until its reply has been passed on. */
struct mb_entry {
	uint32_t server;
	enum mb_reply_kind reply;
	int tunnel;                    /* the home's bytes from here on, unframed */
	int complete;
	struct mb_buffer answer;       /* its reply, once whole (or, tunnel, as it comes) */
	struct mb_buffer request;      /* a balanced get's own bytes: sent home again if its replica fails (a split
					* get's: the client's line, to join the parts in its order) */
	struct mb_split *split;        /* a split get: its parts (which are in no client's order) */
	struct mb_entry *whole;        /* a part: the split get it joins into */
	struct mb_entry *next;         /* in the client's order */
	struct mb_entry *next_waiting; /* in its upstream's order */
};

struct mb_client {
	enum mb_kind kind;
	int fd;
	struct mb_server_addr peer, local;
	uint32_t home;
	int tunnel, eof;
	uint32_t mask;
	uint16_t entropy;
	struct mb_buffer in, out;
	struct mb_entry *first, *last;
	struct mb_upstream **upstreams;  /* its connections to servers, `upstream_count` of them (few: a key's
					 * replicas and the home) */
	int upstream_count, upstream_room;
};

/* Memory of connections closed in this round of the event loop, freed after it (its later events name them). */
struct mb_grave {
	void *memory;
	struct mb_grave *next;
};

struct mb_listener {
	enum mb_kind kind;
	int fd;
};

static struct {
	int epoll;
	int mark;
	struct mb_decider decider;
	unsigned long balanced, home, tunnels, replica_failures;
	struct mb_grave *graves;
	volatile sig_atomic_t stop;
} mb;

static void mb_bury(void *memory)
{
	struct mb_grave *grave = malloc(sizeof(*grave));
	grave->memory = memory;
	grave->next = mb.graves;
	mb.graves = grave;
}

static void mb_free_graves(void)
{
	while (mb.graves) {
		struct mb_grave *next = mb.graves->next;
		free(mb.graves->memory);
		free(mb.graves);
		mb.graves = next;
	}
}

static void mb_log(const char *format, ...)
{
	va_list args;
	va_start(args, format);
	fprintf(stderr, "mb-splitter: ");
	vfprintf(stderr, format, args);
	fputc('\n', stderr);
	va_end(args);
}

static void mb_watch(int op, int fd, void *owner, uint32_t events)
{
	struct epoll_event event = {.events = events, .data.ptr = owner};
	epoll_ctl(mb.epoll, op, fd, &event);
}

/* Bytes the client's servers have not taken yet. */
static size_t mb_unsent(const struct mb_client *client)
{
	size_t unsent = 0;
	for (int i = 0; i < client->upstream_count; i++)
		unsent += client->upstreams[i]->out.length;
	return unsent;
}

/* What to wait for: a client is not read while its replies or its requests pile up (it does not read, or its
 * servers do not), nor its servers while its replies pile up, so one slow party holds up only its own. */
static void mb_update_watch(struct mb_client *client)
{
	int replies_room = client->out.length < MB_OUT_LIMIT;
	uint32_t mask = (!client->eof && replies_room && mb_unsent(client) < MB_OUT_LIMIT ? EPOLLIN | EPOLLRDHUP : 0) |
			(client->out.length ? EPOLLOUT : 0);
	if (mask != client->mask) {
		client->mask = mask;
		mb_watch(EPOLL_CTL_MOD, client->fd, client, mask);
	}
	for (int i = 0; i < client->upstream_count; i++) {
		struct mb_upstream *up = client->upstreams[i];
		uint32_t wanted = !up->connected ? EPOLLOUT : (replies_room ? EPOLLIN | EPOLLRDHUP : 0) |
									  (up->out.length ? EPOLLOUT : 0);
		if (wanted != up->mask) {
			up->mask = wanted;
			mb_watch(EPOLL_CTL_MOD, up->fd, up, wanted);
		}
	}
}

enum mb_read { MB_READ_MORE, MB_READ_EOF, MB_READ_ERROR };

/* Read what the socket holds into `into`, while it holds less than `limit` bytes: MB_READ_MORE (more may come),
 * MB_READ_EOF or MB_READ_ERROR (errno says why). A short read means the socket is empty for now: epoll is
 * level-triggered and reports what comes later, so the read that would only say EAGAIN is saved. */
static enum mb_read mb_read_into(int fd, struct mb_buffer *into, size_t limit)
{
	while (into->length < limit) {
		char chunk[65536];
		ssize_t got = recv(fd, chunk, sizeof(chunk), 0);
		if (got == 0)
			return MB_READ_EOF;
		if (got < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? MB_READ_MORE : MB_READ_ERROR;
		mb_buffer_append(into, chunk, (size_t)got);
		if ((size_t)got < sizeof(chunk))
			break;
	}
	return MB_READ_MORE;
}

/* Send what `from` holds until it is empty or the socket is full: 0, or -1 if the socket failed (errno says why). */
static int mb_write_from(int fd, struct mb_buffer *from)
{
	while (from->length) {
		ssize_t sent = send(fd, from->data, from->length, MSG_NOSIGNAL);
		if (sent < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
		mb_buffer_consume(from, (size_t)sent);
	}
	return 0;
}

/* --- upstreams ------------------------------------------------------------------------------------------- */

static struct mb_upstream *mb_find_upstream(struct mb_client *client, uint32_t server)
{
	for (int i = 0; i < client->upstream_count; i++)
		if (client->upstreams[i]->server == server)
			return client->upstreams[i];
	return 0;
}

/* The client's connection to the server, opened now if it has none. */
static struct mb_upstream *mb_upstream_of(struct mb_client *client, uint32_t server)
{
	struct mb_upstream *found = mb_find_upstream(client, server);
	if (found)
		return found;
	struct mb_server_addr address = client->local;  /* the home: where the client connected */
	if (server != client->home && mb_server_address(&mb.decider, server, &address) < 0)
		return 0;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
	if (fd < 0)
		return 0;
	/* To the home from the client's own address and port (the home sees the client it always saw); to a replica
	 * from the home's address, any port: its answers go to the home's MAC, so in a fabric they come back through
	 * the home's leaf, where this splitter is, and not by the client's own leaf. */
	struct sockaddr_in from = {.sin_family = AF_INET, .sin_addr.s_addr = client->peer.ip,
				   .sin_port = client->peer.port};
	if (server != client->home)
		from = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = client->local.ip};
	struct sockaddr_in to = {.sin_family = AF_INET, .sin_addr.s_addr = address.ip, .sin_port = address.port};
	setsockopt(fd, SOL_IP, IP_TRANSPARENT, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_MARK, &mb.mark, sizeof(mb.mark));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&from, sizeof(from)) < 0 ||
	    (connect(fd, (struct sockaddr *)&to, sizeof(to)) < 0 && errno != EINPROGRESS)) {
		mb_log("server %u: no connection for client %s:%u: %s", server, inet_ntoa(from.sin_addr),
		       ntohs(from.sin_port), strerror(errno));
		close(fd);
		return 0;
	}
	struct mb_upstream *up = calloc(1, sizeof(*up));
	up->kind = MB_UPSTREAM;
	up->fd = fd;
	up->server = server;
	up->client = client;
	if (client->upstream_count == client->upstream_room) {
		client->upstream_room = client->upstream_room ? client->upstream_room * 2 : 2;
		client->upstreams = realloc(client->upstreams, sizeof(*client->upstreams) * client->upstream_room);
	}
	client->upstreams[client->upstream_count++] = up;
	up->mask = EPOLLOUT;
	mb_watch(EPOLL_CTL_ADD, fd, up, up->mask);
	return up;
}

static void mb_send_to(struct mb_upstream *up, struct mb_entry *entry, const char *bytes, size_t length)
{
	mb_buffer_append(&up->out, bytes, length);
	if (!entry)
		return;
	if (up->waiting_tail)
		up->waiting_tail->next_waiting = entry;
	else
		up->waiting = entry;
	up->waiting_tail = entry;
	entry->next_waiting = 0;
}

static void mb_flush_upstream(struct mb_upstream *up);
static void mb_close_client(struct mb_client *client, const char *why);
static void mb_deliver(struct mb_client *client);

static void mb_free_entry(struct mb_entry *entry)
{
	for (int i = 0; entry->split && i < entry->split->parts; i++)
		mb_free_entry(entry->split->part[i]);
	free(entry->split);
	mb_buffer_free(&entry->answer);
	mb_buffer_free(&entry->request);
	free(entry);
}

/* Every part of a split get answered: its answer is theirs, VALUE blocks in the client's key order, then END (a
 * part that answered an error answers for the whole). */
static void mb_join(struct mb_entry *whole)
{
	struct mb_split *split = whole->split;
	size_t at[MB_SPLIT_MAX] = {0};
	for (int p = 0; p < split->parts; p++) {
		struct mb_buffer *answer = &split->part[p]->answer;
		if (answer->length < 5 || memcmp(answer->data + answer->length - 5, "END\r\n", 5) != 0) {
			mb_buffer_append(&whole->answer, answer->data, answer->length);
			whole->complete = 1;
			return;
		}
	}
	struct mb_request line = mb_read_request(whole->request.data, whole->request.length);
	for (int k = 0; k < line.keys; k++) {
		struct mb_buffer *answer = &split->part[split->part_of[k]]->answer;
		size_t *cursor = &at[split->part_of[k]], was = *cursor, start, block, length;
		const char *key;
		if (!mb_next_value(answer->data, answer->length, cursor, &key, &length, &start, &block))
			continue;
		if (length == line.key_length[k] && memcmp(key, line.key[k], length) == 0)
			mb_buffer_append(&whole->answer, answer->data + start, block);
		else
			*cursor = was;  /* a miss: that block is a later key's */
	}
	mb_buffer_append(&whole->answer, "END\r\n", 5);
	whole->complete = 1;
}

static void mb_drop_upstream(struct mb_upstream *up)
{
	struct mb_client *client = up->client;
	for (int i = 0; i < client->upstream_count; i++)
		if (client->upstreams[i] == up)
			client->upstreams[i] = client->upstreams[--client->upstream_count];
	epoll_ctl(mb.epoll, EPOLL_CTL_DEL, up->fd, 0);
	/* Reset, not closed: a closed one waits in TIME_WAIT on the client's own address and port, and the client's
	 * next connection from that port (ephemeral ports come round) could not be made for a minute. The server had
	 * answered everything it was sent (a client's connection ends once its replies are in). */
	struct linger reset = {.l_onoff = 1, .l_linger = 0};
	setsockopt(up->fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
	close(up->fd);
	up->fd = -1;
	mb_buffer_free(&up->out);
	mb_buffer_free(&up->in);
	mb_bury(up);
}

/* A replica's connection failed or closed: the gets it had not answered go to the home instead (a get may be asked
 * twice; its reply is taken once, in its place). The home's own: the client's connection ends with it, as it would
 * have without the splitter. */
static void mb_upstream_failed(struct mb_upstream *up, const char *why)
{
	struct mb_client *client = up->client;
	if (up->server == client->home) {
		mb_close_client(client, why);
		return;
	}
	mb.replica_failures++;
	mb_log("server %u failed under client %s:%u (%s): its %s gets go home", up->server,
	       inet_ntoa((struct in_addr){client->peer.ip}), ntohs(client->peer.port), why,
	       up->waiting ? "unanswered" : "next");
	struct mb_entry *entry = up->waiting;
	mb_drop_upstream(up);
	struct mb_upstream *home = mb_upstream_of(client, client->home);
	if (!home) {
		mb_close_client(client, "the home cannot be reached");
		return;
	}
	for (struct mb_entry *next; entry; entry = next) {
		next = entry->next_waiting;
		entry->server = client->home;
		mb_buffer_clear(&entry->answer);
		mb_send_to(home, entry, entry->request.data, entry->request.length);
	}
	mb_flush_upstream(home);
}

static void mb_flush_upstream(struct mb_upstream *up)
{
	if (!up->connected || up->fd < 0)
		return;
	if (mb_write_from(up->fd, &up->out) < 0) {
		mb_upstream_failed(up, strerror(errno));
		return;
	}
	if (!up->out.length && up->client->eof && up->client->tunnel && up->server == up->client->home)
		shutdown(up->fd, SHUT_WR);  /* the client's half close, passed on once its bytes are */
}

/* The replies in the upstream's bytes, each to its request, in the order they were sent. */
static void mb_take_replies(struct mb_upstream *up)
{
	while (up->waiting && up->in.length) {
		struct mb_entry *entry = up->waiting;
		if (entry->tunnel) {
			mb_buffer_append(&entry->answer, up->in.data, up->in.length);
			mb_buffer_clear(&up->in);
			return;
		}
		size_t length = mb_reply_length(entry->reply, up->in.data, up->in.length);
		if (!length)
			return;
		mb_buffer_append(&entry->answer, up->in.data, length);
		mb_buffer_consume(&up->in, length);
		entry->complete = 1;
		up->waiting = entry->next_waiting;
		if (!up->waiting)
			up->waiting_tail = 0;
		if (entry->whole && --entry->whole->split->waiting == 0)
			mb_join(entry->whole);
	}
}

static void mb_upstream_event(struct mb_upstream *up, uint32_t events)
{
	struct mb_client *client = up->client;
	if (!up->connected && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
		int error = 0;
		socklen_t size = sizeof(error);
		getsockopt(up->fd, SOL_SOCKET, SO_ERROR, &error, &size);
		if (error) {
			mb_upstream_failed(up, strerror(error));
			return;
		}
		up->connected = 1;
	}
	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
		size_t room = client->out.length < MB_OUT_LIMIT ? MB_OUT_LIMIT - client->out.length : 0;
		enum mb_read read = mb_read_into(up->fd, &up->in, up->in.length + room);
		mb_take_replies(up);
		if (read != MB_READ_MORE) {
			mb_deliver(client);
			mb_upstream_failed(up, read == MB_READ_EOF ? "closed" : strerror(errno));
			return;
		}
	}
	mb_flush_upstream(up);
	if (client->fd >= 0)
		mb_deliver(client);
}

/* --- clients --------------------------------------------------------------------------------------------- */

static struct mb_entry *mb_new_entry(struct mb_client *client, uint32_t server, enum mb_reply_kind reply)
{
	struct mb_entry *entry = calloc(1, sizeof(*entry));
	entry->server = server;
	entry->reply = reply;
	if (client->last)
		client->last->next = entry;
	else
		client->first = entry;
	client->last = entry;
	return entry;
}

static void mb_start_tunnel(struct mb_client *client, struct mb_upstream *home)
{
	struct mb_entry *entry = mb_new_entry(client, client->home, MB_REPLY_LINE);
	entry->tunnel = 1;
	mb_send_to(home, entry, client->in.data, client->in.length);
	mb_buffer_clear(&client->in);
	client->tunnel = 1;
	mb.tunnels++;
}

/* 1 once the client's home is a server the controller named: its index from now on, for the client, its
 * connection there and the requests out on it. */
static int mb_learn_home(struct mb_client *client)
{
	if (client->home != MB_HOME_UNKNOWN)
		return 1;
	int server = mb_server_of(&mb.decider, client->local);
	if (server < 0)
		return 0;
	struct mb_upstream *home = mb_find_upstream(client, MB_HOME_UNKNOWN);
	if (home) {
		home->server = (uint32_t)server;
		for (struct mb_entry *entry = home->waiting; entry; entry = entry->next_waiting)
			entry->server = (uint32_t)server;
	}
	for (struct mb_entry *entry = client->first; entry; entry = entry->next)
		if (entry->server == MB_HOME_UNKNOWN)
			entry->server = (uint32_t)server;
	client->home = (uint32_t)server;
	return 1;
}

/* The server a key goes to, as the pipeline says (home if it cannot be asked, or its home is not named yet). */
static uint32_t mb_server_for(struct mb_client *client, const char *key, size_t length)
{
	if (!mb_learn_home(client))
		return client->home;
	int server = mb_decide(&mb.decider, client->home, client->local, client->peer, client->entropy++, key, length);
	return server < 0 ? client->home : (uint32_t)server;
}

/* Send `bytes` for `entry` to `server` (home if that cannot be reached); a copy kept for a replica's failure. */
static void mb_send_request(struct mb_client *client, struct mb_entry *entry, uint32_t server, const char *bytes,
			    size_t length)
{
	struct mb_upstream *up = mb_upstream_of(client, server);
	if (!up)
		up = mb_upstream_of(client, client->home);
	if (!up) {
		mb_close_client(client, "the home cannot be reached");
		return;
	}
	entry->server = up->server;
	if (up->server != client->home) {
		mb_buffer_append(&entry->request, bytes, length);
		mb.balanced++;
	} else {
		mb.home++;
	}
	mb_send_to(up, entry, bytes, length);
	mb_flush_upstream(up);
}

/* A multi-key get: each key to its server; one get per server, joined in the client's order (one server: as is). */
static void mb_dispatch_split(struct mb_client *client, const struct mb_request *request, const char *bytes)
{
	uint32_t server[MB_SPLIT_MAX];
	int spread = 0;
	for (int k = 0; k < request->keys; k++) {
		server[k] = mb_server_for(client, request->key[k], request->key_length[k]);
		spread |= server[k] != server[0];
	}
	struct mb_entry *whole = mb_new_entry(client, client->home, MB_REPLY_GET);
	if (!spread) {
		mb_send_request(client, whole, server[0], bytes, request->length);
		return;
	}
	whole->split = calloc(1, sizeof(*whole->split));
	mb_buffer_append(&whole->request, bytes, request->length);
	struct mb_split *split = whole->split;
	for (int k = 0; k < request->keys; k++) {
		int p = 0;
		while (p < split->parts && split->part[p]->server != server[k])
			p++;
		if (p == split->parts) {
			split->part[p] = calloc(1, sizeof(struct mb_entry));
			split->part[p]->server = server[k];
			split->part[p]->reply = MB_REPLY_GET;
			split->part[p]->whole = whole;
			split->parts++;
		}
		split->part_of[k] = (unsigned char)p;
	}
	split->waiting = split->parts;
	for (int p = 0; p < split->parts; p++) {
		struct mb_buffer line = {0};
		mb_buffer_append(&line, "get", 3);
		for (int k = 0; k < request->keys; k++) {
			if (split->part_of[k] == p) {
				mb_buffer_append(&line, " ", 1);
				mb_buffer_append(&line, request->key[k], request->key_length[k]);
			}
		}
		mb_buffer_append(&line, "\r\n", 2);
		mb_send_request(client, split->part[p], split->part[p]->server, line.data, line.length);
		mb_buffer_free(&line);
		if (client->fd < 0)
			return;
	}
}

/* The requests read so far, each to its server. */
static void mb_dispatch(struct mb_client *client)
{
	struct mb_upstream *home = mb_upstream_of(client, client->home);
	if (!home) {
		mb_close_client(client, "the home cannot be reached");
		return;
	}
	while (client->in.length && !client->tunnel) {
		struct mb_request request = mb_read_request(client->in.data, client->in.length);
		if (request.kind == MB_REQ_INCOMPLETE && client->in.length < MB_REQUEST_LIMIT)
			break;
		if (request.kind == MB_REQ_INCOMPLETE || request.kind == MB_REQ_UNFRAMED) {
			mb_start_tunnel(client, home);
			break;
		}
		if (request.kind == MB_REQ_MULTI) {
			mb_dispatch_split(client, &request, client->in.data);
		} else {
			uint32_t server = request.kind == MB_REQ_BALANCEABLE ?
				mb_server_for(client, request.key[0], request.key_length[0]) : client->home;
			mb_send_request(client, mb_new_entry(client, server, request.reply), server, client->in.data,
					request.length);
		}
		if (client->fd < 0)
			return;
		mb_buffer_consume(&client->in, request.length);
	}
	if (client->tunnel && client->in.length) {
		mb_send_to(home, 0, client->in.data, client->in.length);
		mb_buffer_clear(&client->in);
	}
	mb_flush_upstream(home);
}

/* Replies whose turn has come, to the client, in its order. */
static void mb_deliver(struct mb_client *client)
{
	while (client->first && (client->first->complete || client->first->tunnel)) {
		struct mb_entry *entry = client->first;
		mb_buffer_append(&client->out, entry->answer.data, entry->answer.length);
		mb_buffer_clear(&entry->answer);
		if (entry->tunnel)
			break;  /* it stays first: the home's bytes go on through it */
		client->first = entry->next;
		if (!client->first)
			client->last = 0;
		mb_free_entry(entry);
	}
	if (mb_write_from(client->fd, &client->out) < 0)
		mb_close_client(client, strerror(errno));
	if (client->fd < 0)
		return;
	if (client->eof && !client->first && !client->out.length)
		mb_close_client(client, 0);
	else
		mb_update_watch(client);
}

static void mb_close_client(struct mb_client *client, const char *why)
{
	if (client->fd < 0)
		return;
	if (why)
		mb_log("client %s:%u closed: %s", inet_ntoa((struct in_addr){client->peer.ip}), ntohs(client->peer.port),
		       why);
	while (client->upstream_count)
		mb_drop_upstream(client->upstreams[0]);
	free(client->upstreams);
	client->upstreams = 0;
	while (client->first) {
		struct mb_entry *next = client->first->next;
		mb_free_entry(client->first);
		client->first = next;
	}
	epoll_ctl(mb.epoll, EPOLL_CTL_DEL, client->fd, 0);
	close(client->fd);
	client->fd = -1;
	mb_buffer_free(&client->in);
	mb_buffer_free(&client->out);
	mb_bury(client);
}

static void mb_client_event(struct mb_client *client, uint32_t events)
{
	if (events & (EPOLLIN | EPOLLRDHUP)) {
		enum mb_read read = mb_read_into(client->fd, &client->in, MB_REQUEST_LIMIT);
		if (read == MB_READ_ERROR) {
			mb_close_client(client, strerror(errno));
			return;
		}
		if (read == MB_READ_EOF)
			client->eof = 1;
		mb_dispatch(client);
		if (client->fd < 0)
			return;
	}
	if (events & (EPOLLHUP | EPOLLERR)) {
		mb_close_client(client, "reset");
		return;
	}
	mb_deliver(client);
}

static void mb_accept(struct mb_listener *listener)
{
	for (int round = 0; round < 64; round++) {
		struct sockaddr_in peer, local;
		socklen_t size = sizeof(peer);
		int fd = accept4(listener->fd, (struct sockaddr *)&peer, &size, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		size = sizeof(local);
		getsockname(fd, (struct sockaddr *)&local, &size);
		struct mb_server_addr home = {.ip = local.sin_addr.s_addr, .port = local.sin_port};
		int server = mb_server_of(&mb.decider, home);  /* < 0: not named yet, or taken out of the config */
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		struct mb_client *client = calloc(1, sizeof(*client));
		client->kind = MB_CLIENT;
		client->fd = fd;
		client->peer = (struct mb_server_addr){.ip = peer.sin_addr.s_addr, .port = peer.sin_port};
		client->local = home;
		client->home = server < 0 ? MB_HOME_UNKNOWN : (uint32_t)server;
		client->mask = EPOLLIN | EPOLLRDHUP;
		client->entropy = (uint16_t)(peer.sin_port ^ (peer.sin_addr.s_addr >> 16) ^ random());
		mb_watch(EPOLL_CTL_ADD, fd, client, EPOLLIN | EPOLLRDHUP);
	}
}

/* --- the loop -------------------------------------------------------------------------------------------- */

static int mb_listen(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
	struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(port)};
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(fd, SOL_IP, IP_TRANSPARENT, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_MARK, &mb.mark, sizeof(mb.mark));
	if (fd < 0 || bind(fd, (struct sockaddr *)&any, sizeof(any)) < 0 || listen(fd, 4096) < 0) {
		mb_log("cannot listen on port %u: %s", port, strerror(errno));
		exit(1);
	}
	return fd;
}

static void mb_on_signal(int signal)
{
	(void)signal;
	mb.stop = 1;
}

#define MB_RESTART_PAUSE_NS 200000000L  /* between a child's death and the next, so a crash loop costs little */
static volatile pid_t mb_child;

static void mb_pass_signal(int signal)
{
	mb.stop = 1;
	if (mb_child > 0)
		kill(mb_child, signal);
}

/* Returns in the child, which is the splitter; the supervisor itself exits with the child's status once it ends
 * other than killed by a signal (or once it was told to stop). */
static void mb_supervise(void)
{
	signal(SIGTERM, mb_pass_signal);
	signal(SIGINT, mb_pass_signal);
	for (int started = 0;; started++) {
		pid_t child = fork();
		if (child < 0) {
			mb_log("cannot start the splitter: %s", strerror(errno));
			exit(1);
		}
		if (child == 0) {
			mb_child = 0;
			prctl(PR_SET_PDEATHSIG, SIGTERM);  /* the supervisor killed outright: no splitter left behind */
			if (started)
				freopen("/dev/null", "w", stdout);  /* "ready" was said once, by the first */
			return;
		}
		mb_child = child;
		int status = 0;
		while (waitpid(child, &status, 0) < 0 && errno == EINTR)
			;
		if (mb.stop || !WIFSIGNALED(status))
			exit(WIFEXITED(status) ? WEXITSTATUS(status) : 0);
		mb_log("the splitter (pid %d) was killed by signal %d: started again (its connections ended; new ones "
		       "are balanced again once it listens)", (int)child, WTERMSIG(status));
		nanosleep(&(struct timespec){.tv_nsec = MB_RESTART_PAUSE_NS}, 0);
	}
}

int main(int argc, char **argv)
{
	if (argc < 4 || argc - 3 > MB_PORTS_MAX) {
		fprintf(stderr, "usage: mb-splitter PINS MARK PORT... (at most %d ports)\n", MB_PORTS_MAX);
		return 2;
	}
	mb_supervise();
	if (mb_decider_open(&mb.decider, argv[1]) < 0) {
		mb_log("the switch's pins in %s cannot be opened: %s", argv[1], strerror(errno));
		return 1;
	}
	mb.mark = atoi(argv[2]);
	mb.epoll = epoll_create1(EPOLL_CLOEXEC);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGTERM, mb_on_signal);
	signal(SIGINT, mb_on_signal);
	srandom((unsigned)time(0) ^ (unsigned)getpid());
	static struct mb_listener listeners[MB_PORTS_MAX];
	for (int i = 3; i < argc; i++) {
		struct mb_listener *listener = &listeners[i - 3];
		listener->kind = MB_LISTENER;
		listener->fd = mb_listen((uint16_t)atoi(argv[i]));
		mb_watch(EPOLL_CTL_ADD, listener->fd, listener, EPOLLIN);
		mb_log("listening on port %s", argv[i]);
	}
	printf("ready\n");
	fclose(stdout);
	while (!mb.stop) {
		struct epoll_event events[MB_EVENTS];
		int ready = epoll_wait(mb.epoll, events, MB_EVENTS, 1000);
		for (int i = 0; i < ready; i++) {
			enum mb_kind *kind = events[i].data.ptr;
			if (*kind == MB_LISTENER) {
				mb_accept((struct mb_listener *)kind);
			} else if (*kind == MB_CLIENT) {
				struct mb_client *client = (struct mb_client *)kind;
				if (client->fd >= 0)  /* (not closed earlier in this round) */
					mb_client_event(client, events[i].events);
			} else {
				struct mb_upstream *up = (struct mb_upstream *)kind;
				if (up->fd >= 0 && up->client->fd >= 0)
					mb_upstream_event(up, events[i].events);
			}
		}
		mb_free_graves();
	}
	mb_log("stopped: %lu gets balanced, %lu requests home, %lu tunnels, %lu replica failures", mb.balanced,
	       mb.home, mb.tunnels, mb.replica_failures);
	return 0;
}
