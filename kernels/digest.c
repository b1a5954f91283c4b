/* Payload checksums and range digests on the CPU (XXH3: libxxhash, or
 * inlined with AVX2 when the CPU has it).  The digest is defined over fixed
 * 1 MiB blocks so that the GPU, which hashes blocks in parallel, gives the
 * same value: see docs/protocol.md, "Digest". */
#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#include "codec_shared.h"

static uint64_t xxh3_lib(const void *data, size_t len)
{
	return XXH3_64bits(data, len);
}

/* XXH3-64 over the little-endian array of per-block hashes, streamed so
 * that no array of block hashes is allocated (libxxhash's streaming API:
 * defined before the inlined copy below renames the XXH3 names). */
static uint64_t digest_blocks(const void *data, size_t len,
			      uint64_t (*hash)(const void *, size_t))
{
	const uint8_t *p = data;
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	for (size_t off = 0; off < len; off += DCAST_DIGEST_BLOCK) {
		size_t n = len - off < DCAST_DIGEST_BLOCK ? len - off : DCAST_DIGEST_BLOCK;
		uint64_t h = hash(p + off, n);
		XXH3_64bits_update(&st, &h, 8);
	}
	return XXH3_64bits_digest(&st);
}

/* The same stream from hashes taken before (libxxhash's, as above). */
uint64_t dcast_digest_join(const uint64_t *block_hashes, size_t n)
{
	XXH3_state_t st;

	XXH3_64bits_reset(&st);
	for (size_t i = 0; i < n; i++)
		XXH3_64bits_update(&st, &block_hashes[i], 8);
	return XXH3_64bits_digest(&st);
}

/* The same XXH3-64 inlined with AVX2 where the CPU has it: Debian's
 * libxxhash is built for SSE2 (about 15 GB/s here, 38 with AVX2), and the
 * producer digests every range of every version. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h> /* xxhash.h includes it only when built with -mavx2 */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>
static uint64_t xxh3_avx2(const void *data, size_t len)
{
	return XXH3_64bits(data, len);
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

static uint64_t xxh3(const void *data, size_t len)
{
	return __builtin_cpu_supports("avx2") ? xxh3_avx2(data, len) : xxh3_lib(data, len);
}
#else
#define xxh3 xxh3_lib
#endif

uint64_t dcast_checksum(const void *data, size_t len)
{
	return xxh3(data, len);
}

uint64_t dcast_digest(const void *data, size_t len)
{
	return digest_blocks(data, len, xxh3);
}
