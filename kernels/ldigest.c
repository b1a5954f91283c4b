/* The additive digest of COMMIT.digests on the CPU: a sum mod 2^64 of one
 * mixed term per element (docs/protocol.md, "Checksum and digest"), so a
 * delta updates it in O(changed).  The full sum runs for every anchor on
 * every consumer: one loop per element size, compiled for AVX-512 (64-bit
 * multiplies in vector registers), AVX2 and the baseline, picked at run
 * time; the compiler vectorizes the loop and its reduction. */
#include <inttypes.h>
#include <string.h>
#include "codec_shared.h"
#include "dcast_common.h"

#define SEGMENT_ELEMS (1ull << 32) /* elements under one seed */

uint64_t dcast_ldigest_term(uint32_t tensor, uint64_t index, uint32_t bits)
{
	return dcast_ld_term_seeded(dcast_ld_seed(tensor, index >> 32), index, bits);
}

/* Sum of the terms of n elements from index `first` (one segment). */
static inline __attribute__((always_inline)) uint64_t sum_es(const uint8_t *restrict p, uint64_t n,
							      uint64_t first, uint64_t seed, unsigned es)
{
	uint64_t acc = 0;

	for (uint64_t j = 0; j < n; j++) {
		uint64_t bits = dcast_load_elem(p + j * es, es); /* any alignment */
		acc += dcast_ld_mix((((first + j) << 32) | bits) ^ seed);
	}
	return acc;
}

static inline __attribute__((always_inline)) uint64_t sum_any(const uint8_t *p, uint64_t n, uint64_t first,
							       uint64_t seed, unsigned es)
{
	switch (es) {
	case 1: return sum_es(p, n, first, seed, 1);
	case 2: return sum_es(p, n, first, seed, 2);
	default: return sum_es(p, n, first, seed, 4);
	}
}

static uint64_t sum_base(const uint8_t *p, uint64_t n, uint64_t first, uint64_t seed, unsigned es)
{
	return sum_any(p, n, first, seed, es);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("avx2"), optimize("O3"))) static uint64_t sum_avx2(const uint8_t *p, uint64_t n, uint64_t first,
							  uint64_t seed, unsigned es)
{
	return sum_any(p, n, first, seed, es);
}

__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,prefer-vector-width=512"), optimize("O3")))
static uint64_t sum_avx512(const uint8_t *p, uint64_t n, uint64_t first, uint64_t seed, unsigned es)
{
	return sum_any(p, n, first, seed, es);
}

typedef uint64_t (*sum_fn)(const uint8_t *, uint64_t, uint64_t, uint64_t, unsigned);

static sum_fn pick(void)
{
	if (__builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx512bw"))
		return sum_avx512;
	return __builtin_cpu_supports("avx2") ? sum_avx2 : sum_base;
}

static uint64_t sum_segment(const uint8_t *p, uint64_t n, uint64_t first, uint64_t seed, unsigned es)
{
	return pick()(p, n, first, seed, es); /* reads flags set once at load: cheap */
}
#else
#define sum_segment sum_base
#endif

static int check_es(unsigned es, const char *what)
{
	if (es != 1 && es != 2 && es != 4)
		return dcast_fail(DCAST_EINVAL, "%s: elem_size %u (1, 2 or 4)", what, es);
	return 0;
}

int dcast_ldigest(uint32_t tensor, uint64_t start, const void *data, uint64_t count, unsigned elem_size,
		  uint64_t *digest)
{
	const uint8_t *p = data;
	uint64_t acc = 0;
	int rc;

	if ((rc = check_es(elem_size, "dcast_ldigest")))
		return rc;
	if ((count && !data) || start + count < start)
		return dcast_fail(DCAST_EINVAL, "dcast_ldigest: %s", count && !data ? "data is NULL"
											 : "start + count past 2^64");
	while (count) { /* one seed per 2^32-element segment */
		uint64_t n = SEGMENT_ELEMS - (start & (SEGMENT_ELEMS - 1));
		n = n < count ? n : count;
		acc += sum_segment(p, n, start, dcast_ld_seed(tensor, start >> 32), elem_size);
		p += n * elem_size, start += n, count -= n;
	}
	*digest = acc;
	return 0;
}

/* ---- updates: h(new) - h(old) per changed element ---- */

/* The digest's move, counting positions [lo, hi) only. */
typedef struct ld_walk {
	dcast_ld_move m;
	uint64_t lo, hi;       /* positions counted */
} ld_walk;

static void walk_init(ld_walk *w, uint32_t tensor, uint64_t start, uint64_t lo, uint64_t hi)
{
	dcast_ld_move_init(&w->m, tensor, start);
	w->lo = lo;
	w->hi = hi;
}

static void walk_add(ld_walk *w, uint64_t pos, uint32_t oldv, uint32_t newv)
{
	if (pos >= w->lo && pos < w->hi && oldv != newv)
		dcast_ld_move_add(&w->m, pos, oldv, newv);
}

int dcast_ldigest_update(uint64_t *digest, uint32_t tensor, uint64_t start, const uint32_t *pos,
			 const void *old_vals, const void *new_vals, uint64_t n, unsigned elem_size)
{
	ld_walk w;
	int rc;

	if ((rc = check_es(elem_size, "dcast_ldigest_update")))
		return rc;
	if (n && (!pos || !old_vals || !new_vals))
		return dcast_fail(DCAST_EINVAL, "dcast_ldigest_update: NULL array with %" PRIu64 " changes", n);
	walk_init(&w, tensor, start, 0, UINT64_MAX);
	for (uint64_t i = 0; i < n; i++)
		walk_add(&w, pos[i], dcast_load_elem((const uint8_t *)old_vals + i * elem_size, elem_size),
			 dcast_load_elem((const uint8_t *)new_vals + i * elem_size, elem_size));
	*digest += w.m.acc;
	return 0;
}

/* The payload as the walkers see it: range before (old NULL) or after. */
typedef struct ld_src {
	const dcast_chunk_info *info;
	const uint8_t *pl, *range, *old;
	unsigned es;
} ld_src;

/* Change i at position p whose new value the payload holds raw. */
static void add_raw(ld_walk *w, const ld_src *s, uint64_t i, uint64_t p, uint32_t newv)
{
	uint32_t oldv = dcast_load_elem(s->old ? s->old + i * s->es : s->range + p * s->es, s->es);
	walk_add(w, p, oldv, newv);
}

static void walk_dense(ld_walk *w, const ld_src *s)
{
	uint64_t hi = w->hi < s->info->count ? w->hi : s->info->count;

	for (uint64_t p = w->lo; p < hi; p++)
		add_raw(w, s, p, p, dcast_load_elem(s->pl + p * s->es, s->es));
}

static void walk_idx32(ld_walk *w, const ld_src *s)
{
	uint64_t n = s->info->changed, stride = 4 + s->es;

	for (uint64_t i = 0; i < n; i++) {
		const uint8_t *r = s->pl + i * stride;
		if (i + DCAST_PREFETCH_AHEAD < n)
			__builtin_prefetch(s->range + (uint64_t)dcast_rd32le(r + DCAST_PREFETCH_AHEAD * stride) * s->es);
		add_raw(w, s, i, dcast_rd32le(r), dcast_load_elem(r + 4, s->es));
	}
}

static void walk_bitmask(ld_walk *w, const ld_src *s)
{
	uint64_t mb = dcast_bitmask_bytes(s->info->count), i = 0;
	const uint8_t *vals = s->pl + mb;

	for (uint64_t byte = 0; byte < mb; byte++)
		for (unsigned bits = s->pl[byte]; bits; bits &= bits - 1, i++)
			add_raw(w, s, i, byte * 8 + (unsigned)__builtin_ctz(bits), dcast_load_elem(vals + i * s->es, s->es));
}

static int walk_compact(ld_walk *w, const ld_src *s)
{
	const uint32_t *pos, *val;
	dcast_cpt_decoded dec;
	int rc;

	if ((rc = dcast_cpt_load(s->info, s->pl, &dec)))
		return rc;
	pos = dec.pos;
	val = dec.val;
	for (uint64_t i = 0; i < s->info->changed; i++) {
		__builtin_prefetch(s->range + (uint64_t)pos[i + DCAST_PREFETCH_AHEAD] * s->es);
		uint32_t here = dcast_load_elem(s->range + (uint64_t)pos[i] * s->es, s->es);
		if (s->old) /* applied: range holds the new value */
			walk_add(w, pos[i], dcast_load_elem(s->old + i * s->es, s->es), here);
		else
			walk_add(w, pos[i], here, dec.mode == DCAST_CPT_RAW ? val[i] : dcast_ulp_apply(here, val[i], 8 * s->es));
	}
	return 0;
}

static int walk_payload(ld_walk *w, const ld_src *s)
{
	const dcast_chunk_info *info = s->info;
	int rc;

	switch (info->encoding) {
	case DCAST_ENC_DENSE:
		if (!(rc = dcast_codec_check_size(info, info->count * info->elem_size)))
			walk_dense(w, s);
		return rc;
	case DCAST_ENC_IDX32:
		if (!(rc = dcast_idx32_check(info, s->pl)))
			walk_idx32(w, s);
		return rc;
	case DCAST_ENC_BITMASK:
		if (!(rc = dcast_bitmask_check(info, s->pl)))
			walk_bitmask(w, s);
		return rc;
	default:
		return walk_compact(w, s);
	}
}

int dcast_ldigest_payload(uint64_t *digest, uint32_t tensor, uint64_t start, const dcast_chunk_info *info,
			  const void *payload, const void *range, const void *old, uint64_t lo, uint64_t hi)
{
	ld_src s = { info, payload, range, old, info ? info->elem_size : 0 };
	ld_walk w;
	int rc;

	if (!info || !digest)
		return dcast_fail(DCAST_EINVAL, "dcast_ldigest_payload: NULL %s", info ? "digest" : "info");
	if ((rc = dcast_codec_check_info(info, payload, range)))
		return rc;
	if (lo > hi || hi > info->count)
		return dcast_fail(DCAST_EINVAL, "dcast_ldigest_payload: positions [%" PRIu64 ", %" PRIu64
				  ") outside the range of %" PRIu64, lo, hi, info->count);
	walk_init(&w, tensor, start, lo, hi);
	if ((rc = walk_payload(&w, &s)))
		return rc;
	*digest += w.m.acc;
	return 0;
}
