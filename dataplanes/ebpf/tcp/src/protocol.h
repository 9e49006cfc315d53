/* The memcached text protocol as the TCP splitter reads it: where a client's request ends, what kind of reply it
 * gets, and where a server's reply ends. Only what the splitter needs to keep replies in request order: anything
 * else (the binary protocol, noreply, quiet meta commands, stats, a line over MB_LINE_MAX) is UNFRAMED, and from
 * there on the connection is a plain tunnel to its home. */
#ifndef MB_PROTOCOL_H
#define MB_PROTOCOL_H

#include <stddef.h>

#define MB_LINE_MAX 2048      /* a request line longer than this is not read (memcached's own limit is 2048) */
#define MB_KEY_MAX 250        /* memcached's key limit: a longer key is the home's to refuse */

enum mb_reply_kind {
	MB_REPLY_GET,         /* VALUE blocks, then END */
	MB_REPLY_META,        /* one line; VA <size> ... has a data block */
	MB_REPLY_LINE,        /* one line */
};

enum mb_request_kind {
	MB_REQ_INCOMPLETE,    /* more bytes needed */
	MB_REQ_BALANCEABLE,   /* a single-key get, gets or read-only mg: may go to a replica of its key */
	MB_REQ_HOME,          /* any other framed request: to the home */
	MB_REQ_UNFRAMED,      /* the splitter cannot frame it or its reply: tunnel to the home from here on */
};

struct mb_request {
	enum mb_request_kind kind;
	enum mb_reply_kind reply;
	size_t length;           /* bytes of the request, data block included */
	const char *key;         /* BALANCEABLE: the key (inside the buffer) */
	size_t key_length;
};

/* The first request in buf[0..len). */
struct mb_request mb_read_request(const char *buf, size_t len);

/* The length of the first whole reply of `kind` in buf[0..len), 0 if it is not all there yet. */
size_t mb_reply_length(enum mb_reply_kind kind, const char *buf, size_t len);

#endif
