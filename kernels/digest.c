/* Payload checksums and range digests on the CPU (XXH3: libxxhash, or
 * inlined with AVX2 or AVX-512 when the CPU has it).  The digest is defined over fixed
 * 1 MiB blocks so that the GPU, which hashes blocks in parallel, gives the
 * same value: see docs/protocol.md, "Digest".  A payload may also be hashed
 * piece by piece as it lands (dcast_landing.h). */
#include <stdatomic.h>
#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#include "codec_shared.h"
#include "dcast_common.h"
#include "dcast_landing.h"
#include "xxh3_code.h"

enum { STATE_BYTES = sizeof(XXH3_state_t) };

XXH3_CODE(lib)

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
_Static_assert(sizeof(XXH3_state_t) == STATE_BYTES, "one XXH3 state for both copies");

XXH3_CODE(avx2)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* The widest XXH3 the CPU runs: 2 AVX-512, 1 AVX2, 0 libxxhash's. */
static int cpu_level(void)
{
	return __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
}

static _Atomic int level_now = -1; /* -1: the CPU's, read at the first use */

static int level(void)
{
	int l = atomic_load_explicit(&level_now, memory_order_relaxed);

	if (l < 0)
		atomic_store_explicit(&level_now, l = cpu_level(), memory_order_relaxed);
	return l;
}

int dcast_xxh3_level_set(int l)
{
	int was = level();

	atomic_store_explicit(&level_now, l < 0 || l > cpu_level() ? cpu_level() : l, memory_order_relaxed);
	return was;
}

/* The XXH3 code of the level in force. */
static const xxh3_code *code(void)
{
	int l = level();

	return l == 2 ? dcast_xxh3_avx512_code() : l == 1 ? &code_avx2 : &code_lib;
}
#else
static const xxh3_code *code(void)
{
	return &code_lib;
}

int dcast_xxh3_level_set(int l)
{
	(void)l;
	return 0;
}
#endif

static uint64_t xxh3(const void *data, size_t len)
{
	return code()->hash(data, len);
}

uint64_t dcast_checksum(const void *data, size_t len)
{
	return xxh3(data, len);
}

uint64_t dcast_digest(const void *data, size_t len)
{
	return digest_blocks(data, len, xxh3);
}

/* ---- a payload hashed as it lands (dcast_landing.h) ---- */

struct dcast_landing {
	void *sum_st, *block_st;  /* XXH3 states: the payload's, the block's */
	const xxh3_code *ops;
	uint64_t at, len, total;  /* the payload's place in its string */
	uint64_t got;             /* its bytes hashed so far */
	uint64_t first;           /* the first block it holds whole */
	uint64_t *hash;           /* those blocks' hashes, n of cap */
	uint32_t n, cap;
};

dcast_landing *dcast_landing_new(void)
{
	dcast_landing *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->sum_st = aligned_alloc(64, (STATE_BYTES + 63) & ~(size_t)63);
	l->block_st = aligned_alloc(64, (STATE_BYTES + 63) & ~(size_t)63);
	l->ops = code();
	DCAST_ASSERT(l->ops->state_bytes == STATE_BYTES); /* xxh3_avx512.c is a unit apart */
	if (l->sum_st && l->block_st)
		return l;
	dcast_landing_free(l);
	return NULL;
}

void dcast_landing_free(dcast_landing *l)
{
	if (!l)
		return;
	free(l->sum_st);
	free(l->block_st);
	free(l->hash);
	free(l);
}

/* Blocks of a payload of len bytes at `at`: at most one per block it meets. */
static uint64_t blocks_met(uint64_t at, uint64_t len)
{
	return len ? (at + len - 1) / DCAST_DIGEST_BLOCK - at / DCAST_DIGEST_BLOCK + 1 : 0;
}

int dcast_landing_start(dcast_landing *l, uint64_t at, uint64_t len, uint64_t total)
{
	uint64_t need = blocks_met(at, len);

	l->len = l->got = l->first = 0; /* an empty payload until this one has room */
	l->n = 0;
	l->ops->reset(l->sum_st);
	if (need > UINT32_MAX || at > total || len > total - at)
		return DCAST_EINVAL;
	if (need > l->cap) {
		uint64_t *h = realloc(l->hash, (size_t)need * sizeof(*h));
		if (!h)
			return DCAST_ENOMEM;
		l->hash = h;
		l->cap = (uint32_t)need;
	}
	l->at = at;
	l->len = len;
	l->total = total;
	l->first = (at + DCAST_DIGEST_BLOCK - 1) / DCAST_DIGEST_BLOCK;
	return 0;
}

/* n bytes of one block, from string byte pos, after the payload's stream
 * took them: hashed when the block lies whole in the payload, its hash
 * kept at its end.  A block that starts the payload needs no stream of its
 * own: at its end the payload's stream has taken exactly its bytes, and
 * XXH3's digest of a stream is that of the bytes so far (it goes on). */
static void block_add(dcast_landing *l, const uint8_t *p, uint64_t pos, uint64_t n)
{
	uint64_t b = pos / DCAST_DIGEST_BLOCK, start = b * DCAST_DIGEST_BLOCK;
	uint64_t end = start + DCAST_DIGEST_BLOCK < l->total ? start + DCAST_DIGEST_BLOCK : l->total;
	int first = start == l->at;

	if (start < l->at || end > l->at + l->len)
		return; /* begun before the payload, or ends after it */
	if (pos == start && !first)
		l->ops->reset(l->block_st);
	if (!first)
		l->ops->update(l->block_st, p, (size_t)n);
	if (pos + n == end) {
		DCAST_ASSERT(l->n < l->cap && b == l->first + l->n);
		l->hash[l->n++] = l->ops->digest(first ? l->sum_st : l->block_st);
	}
}

void dcast_landing_add(dcast_landing *l, const void *piece, size_t n)
{
	const uint8_t *p = piece;

	DCAST_ASSERT(n <= l->len - l->got);
	while (n) { /* a block at a time: the payload's stream, then the block's */
		uint64_t pos = l->at + l->got, room = DCAST_DIGEST_BLOCK - pos % DCAST_DIGEST_BLOCK;
		uint64_t k = n < room ? n : room;
		l->ops->update(l->sum_st, p, (size_t)k);
		block_add(l, p, pos, k);
		p += k;
		n -= (size_t)k;
		l->got += k;
	}
}

int dcast_landing_done(const dcast_landing *l)
{
	return l->got == l->len;
}

uint64_t dcast_landing_sum(const dcast_landing *l)
{
	DCAST_ASSERT(dcast_landing_done(l));
	return l->ops->digest(l->sum_st);
}

uint32_t dcast_landing_blocks(const dcast_landing *l, uint64_t *first, const uint64_t **hashes)
{
	DCAST_ASSERT(dcast_landing_done(l));
	*first = l->first;
	*hashes = l->hash;
	return l->n;
}
