/* The memcached text protocol as the TCP splitter reads it: where a client's request ends, what kind of reply it
 * gets, and where a server's reply ends. Only what the splitter needs to keep replies in request order: anything
 * else (the binary protocol, noreply, quiet meta commands, stats, a line over MB_LINE_MAX) is UNFRAMED, and from
 * there on the connection is a plain tunnel to its home. */
#ifndef MB_PROTOCOL_H
#define MB_PROTOCOL_H

#include <stddef.h>

#define MB_LINE_MAX 2048      /* a request line longer than this is not read (memcached's own limit is 2048) */
#define MB_KEY_MAX 250        /* memcached's key limit: a longer key is the home's to refuse */
#define MB_SPLIT_MAX 32       /* keys of a multi-key get split by server at most (more: it goes home whole) */

enum mb_reply_kind {
	MB_REPLY_GET,         /* VALUE blocks, then END */
	MB_REPLY_META,        /* one line; VA <size> ... has a data block */
	MB_REPLY_LINE,        /* one line */
};

enum mb_request_kind {
	MB_REQ_INCOMPLETE,    /* more bytes needed */
	MB_REQ_BALANCEABLE,   /* a single-key get or read-only mg: may go to a replica of its key */
	MB_REQ_MULTI,         /* a `get` of 2..MB_SPLIT_MAX keys: each may go to a replica of its own */
	MB_REQ_HOME,          /* any other framed request: to the home */
	MB_REQ_UNFRAMED,      /* the splitter cannot frame it or its reply: tunnel to the home from here on */
};

struct mb_request {
	enum mb_request_kind kind;
	enum mb_reply_kind reply;
	size_t length;           /* bytes of the request, data block included */
	int keys;                /* BALANCEABLE, MULTI: its keys (inside the buffer) */
	const char *key[MB_SPLIT_MAX];
	size_t key_length[MB_SPLIT_MAX];
};

/* The first request in buf[0..len). */
struct mb_request mb_read_request(const char *buf, size_t len);

/* The length of the first whole reply of `kind` in buf[0..len), 0 if it is not all there yet. */
size_t mb_reply_length(enum mb_reply_kind kind, const char *buf, size_t len);

/* A whole get reply's first VALUE block at or after `*at`: its key, and the block's start and length; 0 at the
 * END (or an error line), 1 if one was found (*at is then past it). */
int mb_next_value(const char *buf, size_t len, size_t *at, const char **key, size_t *key_length, size_t *start,
		  size_t *block);

#endif
