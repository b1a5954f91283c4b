/* The deltacast patch file (docs/patch-format.md): NEW as a delta on BASE.
 * Layout constants and the little-endian record codecs shared by
 * `deltacast delta` (writer) and `deltacast apply` (reader). */
#ifndef DCAST_CLI_PATCH_H
#define DCAST_CLI_PATCH_H

#include <stdint.h>

#define PATCH_MAGIC "DCPATCH1"
#define PATCH_TRAILER_MAGIC "DCPEND01"
#define PATCH_VERSION 1u
#define PATCH_HEADER_BYTES 48u
#define PATCH_TENSOR_BYTES 32u
#define PATCH_CHUNK_BYTES 48u
#define PATCH_TRAILER_BYTES 24u

typedef struct patch_header {
	uint32_t version, flags;
	uint64_t tensor_count, chunk_count;
	uint64_t new_header_bytes; /* NEW's safetensors header, with its 8-byte prefix */
	uint64_t new_data_bytes;
} patch_header;

typedef struct patch_tensor {
	uint64_t base_digest, new_digest;
	uint32_t has_base;  /* 0: NEW's tensor is sent dense (not in BASE) */
	uint32_t elem_size; /* codec element size */
	uint64_t count;     /* codec elements */
} patch_tensor;

typedef struct patch_chunk {
	uint32_t tensor_index, encoding;
	uint64_t begin, count, changed, payload_bytes, checksum;
} patch_chunk;

/* The patch format's little-endian 64-bit fields (the CLI is built on the
 * public API alone: these are its one copy). */
void patch_put_le64(unsigned char *p, uint64_t v);
uint64_t patch_get_le64(const unsigned char *p);

void patch_header_put(unsigned char *p, const patch_header *h);
int patch_header_get(const unsigned char *p, patch_header *h); /* -1: bad magic */
void patch_tensor_put(unsigned char *p, const patch_tensor *t);
void patch_tensor_get(const unsigned char *p, patch_tensor *t);
void patch_chunk_put(unsigned char *p, const patch_chunk *c);
void patch_chunk_get(const unsigned char *p, patch_chunk *c);

/* Bytes of padding after n bytes to reach a multiple of 8. */
static inline uint64_t patch_pad(uint64_t n)
{
	return (8 - n % 8) % 8;
}

#endif
