/* A growable byte buffer (buffer.h). */
#include "buffer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mb_buffer_append(struct mb_buffer *buffer, const char *bytes, size_t length)
{
	if (!length)
		return;
	size_t start = buffer->memory ? (size_t)(buffer->data - buffer->memory) : 0;
	if (start + buffer->length + length > buffer->capacity) {
		if (start) {  /* room at the front first */
			memmove(buffer->memory, buffer->data, buffer->length);
			buffer->data = buffer->memory;
			start = 0;
		}
		if (buffer->length + length > buffer->capacity) {
			size_t capacity = buffer->capacity ? buffer->capacity : 4096;
			while (capacity < buffer->length + length)
				capacity *= 2;
			char *memory = realloc(buffer->memory, capacity);
			if (!memory) {
				fprintf(stderr, "mb-splitter: out of memory\n");
				abort();
			}
			buffer->memory = memory;
			buffer->data = memory;
			buffer->capacity = capacity;
		}
	}
	memcpy(buffer->data + buffer->length, bytes, length);
	buffer->length += length;
}

void mb_buffer_consume(struct mb_buffer *buffer, size_t length)
{
	buffer->data += length;
	buffer->length -= length;
	if (!buffer->length)
		mb_buffer_free(buffer);
}

void mb_buffer_clear(struct mb_buffer *buffer)
{
	mb_buffer_consume(buffer, buffer->length);
}

void mb_buffer_free(struct mb_buffer *buffer)
{
	free(buffer->memory);
	buffer->memory = buffer->data = 0;
	buffer->length = buffer->capacity = 0;
}
