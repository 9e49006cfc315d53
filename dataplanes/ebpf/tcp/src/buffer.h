/* A growable byte buffer: appended at the end, consumed from the front. Its memory is freed when it empties, so
 * an idle connection holds none. */
#ifndef MB_BUFFER_H
#define MB_BUFFER_H

#include <stddef.h>

struct mb_buffer {
	char *data;         /* the first unconsumed byte */
	size_t length;      /* unconsumed bytes */
	char *memory;
	size_t capacity;
};

void mb_buffer_append(struct mb_buffer *buffer, const char *bytes, size_t length);
void mb_buffer_consume(struct mb_buffer *buffer, size_t length);
void mb_buffer_clear(struct mb_buffer *buffer);
void mb_buffer_free(struct mb_buffer *buffer);

#endif
