/* The memcached text protocol as the TCP splitter reads it (protocol.h). */
#include "protocol.h"

#include <stdlib.h>
#include <string.h>

#define MB_TOKENS_MAX (MB_SPLIT_MAX + 1)

struct mb_line {
	size_t length;                      /* up to and including \r\n */
	int tokens;                         /* all of them; the first MB_TOKENS_MAX are kept */
	size_t longest;                     /* the longest token's length */
	const char *token[MB_TOKENS_MAX];
	size_t token_length[MB_TOKENS_MAX];
};

/* The first line of buf: 0 if it has no \r\n yet, -1 if none can come within MB_LINE_MAX (or \n stands alone). */
static int mb_split_line(const char *buf, size_t len, struct mb_line *line)
{
	const char *end = memchr(buf, '\n', len < MB_LINE_MAX ? len : MB_LINE_MAX);
	if (!end)
		return len >= MB_LINE_MAX ? -1 : 0;
	if (end == buf || end[-1] != '\r')
		return -1;
	line->length = (size_t)(end - buf) + 1;
	line->tokens = 0;
	line->longest = 0;
	const char *at = buf, *stop = end - 1;
	while (at < stop) {
		while (at < stop && *at == ' ')
			at++;
		if (at == stop)
			break;
		const char *start = at;
		while (at < stop && *at != ' ')
			at++;
		size_t length = (size_t)(at - start);
		if (line->tokens < MB_TOKENS_MAX) {
			line->token[line->tokens] = start;
			line->token_length[line->tokens] = length;
		}
		line->tokens++;
		if (length > line->longest)
			line->longest = length;
	}
	return 1;
}

static int mb_is(const struct mb_line *line, int i, const char *word)
{
	if (i >= MB_TOKENS_MAX)
		return 0;
	size_t n = strlen(word);
	return i < line->tokens && line->token_length[i] == n && memcmp(line->token[i], word, n) == 0;
}

/* A decimal number token (at most 18 digits), or -1. */
static long long mb_number(const struct mb_line *line, int i)
{
	if (i >= line->tokens || i >= MB_TOKENS_MAX || line->token_length[i] == 0 || line->token_length[i] > 18)
		return -1;
	long long value = 0;
	for (size_t j = 0; j < line->token_length[i]; j++) {
		char c = line->token[i][j];
		if (c < '0' || c > '9')
			return -1;
		value = value * 10 + (c - '0');
	}
	return value;
}

/* A meta command's flags (tokens from `first` on) hold one of `letters` as a flag. */
static int mb_meta_flag(const struct mb_line *line, int first, const char *letters)
{
	if (line->tokens > MB_TOKENS_MAX)
		return 1;  /* flags not all read: assume the worst */
	for (int i = first; i < line->tokens; i++)
		if (line->token_length[i] > 0 && strchr(letters, line->token[i][0]))
			return 1;
	return 0;
}

static struct mb_request mb_request_of(enum mb_request_kind kind, enum mb_reply_kind reply, size_t length)
{
	struct mb_request request = {.kind = kind, .reply = reply, .length = length};
	return request;
}

static const struct mb_request MB_INCOMPLETE = {.kind = MB_REQ_INCOMPLETE};
static const struct mb_request MB_UNFRAMED = {.kind = MB_REQ_UNFRAMED};

/* set/add/replace/append/prepend <key> <flags> <exptime> <bytes> [noreply], cas ... <cas unique> [noreply]. */
static struct mb_request mb_storage(const struct mb_line *line, size_t len, int cas)
{
	int fields = cas ? 6 : 5;
	long long bytes = mb_number(line, 4);
	if (line->tokens != fields || bytes < 0)
		return MB_UNFRAMED;  /* noreply (no reply to wait for), or malformed: the home answers as it will */
	size_t total = line->length + (size_t)bytes + 2;
	return len < total ? MB_INCOMPLETE : mb_request_of(MB_REQ_HOME, MB_REPLY_LINE, total);
}

/* ms <key> <datalen> <flags>*: a data block follows. */
static struct mb_request mb_meta_set(const struct mb_line *line, size_t len)
{
	long long bytes = mb_number(line, 2);
	if (bytes < 0 || mb_meta_flag(line, 3, "q"))
		return MB_UNFRAMED;
	size_t total = line->length + (size_t)bytes + 2;
	return len < total ? MB_INCOMPLETE : mb_request_of(MB_REQ_HOME, MB_REPLY_META, total);
}

/* The request's keys: the line's tokens from `first` on. */
static void mb_take_keys(struct mb_request *request, const struct mb_line *line, int first)
{
	request->keys = line->tokens - first;
	for (int i = 0; i < request->keys; i++) {
		request->key[i] = line->token[first + i];
		request->key_length[i] = line->token_length[first + i];
	}
}

/* get/gets <key>*: `get` may be balanced, key by key (`gets` goes home: a replica's CAS is its own). */
static struct mb_request mb_get(const struct mb_line *line, int plain)
{
	if (line->tokens < 2 || line->longest > MB_KEY_MAX)
		return MB_UNFRAMED;  /* a key over 250 bytes: memcached answers CLIENT_ERROR and may close, the home's to say */
	struct mb_request request = mb_request_of(MB_REQ_HOME, MB_REPLY_GET, line->length);
	if (plain && line->tokens <= MB_TOKENS_MAX) {
		request.kind = line->tokens == 2 ? MB_REQ_BALANCEABLE : MB_REQ_MULTI;
		mb_take_keys(&request, line, 1);
	}
	return request;
}

/* mg <key> <flags>*: balanced when it only reads (no T, N, I, E, q, and no base64 key; no c: a replica's CAS is
 * its own, no O or k: echoed back, harmless but rare, kept home for simplicity). */
static struct mb_request mb_meta_get(const struct mb_line *line)
{
	if (line->tokens < 2 || line->token_length[1] > MB_KEY_MAX || mb_meta_flag(line, 2, "q"))
		return MB_UNFRAMED;
	struct mb_request request = mb_request_of(MB_REQ_HOME, MB_REPLY_META, line->length);
	if (!mb_meta_flag(line, 2, "TNIEbcOk")) {
		request.kind = MB_REQ_BALANCEABLE;
		request.keys = 1;
		request.key[0] = line->token[1];
		request.key_length[0] = line->token_length[1];
	}
	return request;
}

struct mb_request mb_read_request(const char *buf, size_t len)
{
	if (len == 0)
		return MB_INCOMPLETE;
	if ((unsigned char)buf[0] == 0x80)
		return MB_UNFRAMED;  /* the binary protocol */
	struct mb_line line;
	int found = mb_split_line(buf, len, &line);
	if (found <= 0)
		return found == 0 ? MB_INCOMPLETE : MB_UNFRAMED;
	if (line.tokens == 0)
		return MB_UNFRAMED;
	if (mb_is(&line, 0, "get"))
		return mb_get(&line, 1);
	if (mb_is(&line, 0, "gets"))
		return mb_get(&line, 0);
	if (mb_is(&line, 0, "mg"))
		return mb_meta_get(&line);
	if (mb_is(&line, 0, "set") || mb_is(&line, 0, "add") || mb_is(&line, 0, "replace") ||
	    mb_is(&line, 0, "append") || mb_is(&line, 0, "prepend"))
		return mb_storage(&line, len, 0);
	if (mb_is(&line, 0, "cas"))
		return mb_storage(&line, len, 1);
	if (mb_is(&line, 0, "ms"))
		return mb_meta_set(&line, len);
	if (mb_is(&line, 0, "md") || mb_is(&line, 0, "ma") || mb_is(&line, 0, "mn"))
		return mb_meta_flag(&line, 2, "q") ? MB_UNFRAMED :
		       mb_request_of(MB_REQ_HOME, MB_REPLY_META, line.length);
	if ((mb_is(&line, 0, "delete") && line.tokens == 2) || (mb_is(&line, 0, "touch") && line.tokens == 3) ||
	    ((mb_is(&line, 0, "incr") || mb_is(&line, 0, "decr")) && line.tokens == 3) ||
	    (mb_is(&line, 0, "version") && line.tokens == 1))
		return mb_request_of(MB_REQ_HOME, MB_REPLY_LINE, line.length);
	return MB_UNFRAMED;  /* stats, flush_all, verbosity, quit, watch, noreply, unknown: the home's, raw */
}

/* A reply line that ends a reply of any kind: an error. */
static int mb_error_line(const struct mb_line *line)
{
	return mb_is(line, 0, "ERROR") || mb_is(line, 0, "CLIENT_ERROR") || mb_is(line, 0, "SERVER_ERROR");
}

static size_t mb_get_reply_length(const char *buf, size_t len)
{
	size_t at = 0;
	for (;;) {
		struct mb_line line;
		int found = mb_split_line(buf + at, len - at, &line);
		if (found <= 0)
			return 0;  /* (a malformed reply never ends: the client's timeout, as with the server itself) */
		if (mb_is(&line, 0, "END") || mb_error_line(&line))
			return at + line.length;
		long long bytes = mb_number(&line, 3);
		if (!mb_is(&line, 0, "VALUE") || bytes < 0)
			return 0;
		size_t block = line.length + (size_t)bytes + 2;
		if (len - at < block)
			return 0;
		at += block;
	}
}

size_t mb_reply_length(enum mb_reply_kind kind, const char *buf, size_t len)
{
	if (kind == MB_REPLY_GET)
		return mb_get_reply_length(buf, len);
	struct mb_line line;
	if (mb_split_line(buf, len, &line) <= 0)
		return 0;
	if (kind == MB_REPLY_META && mb_is(&line, 0, "VA")) {
		long long bytes = mb_number(&line, 1);
		size_t total = line.length + (size_t)(bytes < 0 ? 0 : bytes) + 2;
		return bytes < 0 || len < total ? 0 : total;
	}
	return line.length;
}

int mb_next_value(const char *buf, size_t len, size_t *at, const char **key, size_t *key_length, size_t *start,
		  size_t *block)
{
	struct mb_line line;
	if (*at >= len || mb_split_line(buf + *at, len - *at, &line) <= 0 || !mb_is(&line, 0, "VALUE"))
		return 0;
	long long bytes = mb_number(&line, 3);
	size_t total = line.length + (size_t)(bytes < 0 ? 0 : bytes) + 2;
	if (bytes < 0 || len - *at < total)
		return 0;
	*key = line.token[1];
	*key_length = line.token_length[1];
	*start = *at;
	*block = total;
	*at += total;
	return 1;
}
