/* Payload checksums and range digests on the CPU (libxxhash).  The digest
 * is defined over fixed 1 MiB blocks so that the GPU, which hashes blocks
 * in parallel, gives the same value: see docs/protocol.md, "Digest". */
#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#include "codec_impl.h"

uint64_t dcast_checksum(const void *data, size_t len)
{
	return XXH3_64bits(data, len);
}

/* XXH3-64 over the little-endian array of per-block hashes, streamed so
 * that no array of block hashes is allocated. */
uint64_t dcast_digest(const void *data, size_t len)
{
	const uint8_t *p = data;
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	for (size_t off = 0; off < len; off += DCAST_DIGEST_BLOCK) {
		size_t n = len - off < DCAST_DIGEST_BLOCK ? len - off : DCAST_DIGEST_BLOCK;
		uint64_t h = XXH3_64bits(p + off, n);
		XXH3_64bits_update(&st, &h, 8);
	}
	return XXH3_64bits_digest(&st);
}
