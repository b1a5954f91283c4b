/* The encoder's only full pass over a range: compare cur with base, and
 * for each changed element record its position, new bit pattern and ulp
 * difference, counting value symbols for the compact code table on the way.
 * AVX-512BW and AVX2 variants are chosen at run time; the portable one
 * compares 8 bytes at a time. */
#include <inttypes.h>
#include <string.h>
#include "codec_shared.h"
#include "dcast_common.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define LIKELY(x) __builtin_expect(!!(x), 1)

int dcast_changes_reserve(dcast_changes *ch, uint64_t more)
{
	if (ch->n + more <= ch->cap)
		return DCAST_OK;
	uint64_t cap = ch->cap ? ch->cap * 2 : 1024;
	while (cap < ch->n + more)
		cap *= 2;
	ch->pos = dcast_scratch(DCAST_SCRATCH_POS, cap * 4);
	ch->zz = ch->pos ? dcast_scratch(DCAST_SCRATCH_ZZ, cap * 4) : NULL;
	if (!ch->zz)
		return dcast_fail(DCAST_ENOMEM, "codec scan: no memory for %" PRIu64 " changes", cap);
	ch->cap = cap;
	return DCAST_OK;
}

/* Bytes compared before their changes are gathered: no more than the
 * prefetch distance, so loads stay in flight while the gather computes
 * (2048 measured best of 1024..8192 at 1% and 5%). */
#define SCAN_BLOCK 2048u

/* The lowest set bit's index, or junk for 0 (a junk slot's).  On x86-64
 * tzcnt: 64 for 0 with BMI1, and read as bsf before it (destination left
 * as it was), so no OR to keep 0 away. */
static ALWAYS_INLINE unsigned low_bit(uint64_t bits)
{
#if defined(__x86_64__)
	uint64_t r;
	__asm__("tzcnt %1, %0" : "=r"(r) : "r"(bits) : "cc");
	return (unsigned)r;
#else
	return (unsigned)__builtin_ctzll(bits | (1ull << 63));
#endif
}

/* Append at p the positions flagged in `bits` (bit j*es: element first +
 * j), W at a time (2 or 4) without a branch per element; returns the new
 * end.  Up to W - 1 slots past it get junk: the caller reserved room for a
 * block's elements and RECORD_SLACK more. */
#define RECORD_SLACK 68u
static ALWAYS_INLINE uint32_t *record_pos(uint32_t *p, uint64_t first, uint64_t bits, unsigned es,
					  unsigned W)
{
	unsigned cnt = (unsigned)__builtin_popcountll(bits);
	uint32_t *end = p + cnt;
	for (;;) {
#pragma GCC unroll 4
		for (unsigned j = 0; j < W; j++) {
			p[j] = (uint32_t)(first + low_bit(bits) / es);
			bits &= bits - 1;
		}
		if (cnt <= W)
			return end;
		p += W;
		cnt -= W;
	}
}

/* Room for the changes of one block of SCAN_BLOCK bytes. */
static ALWAYS_INLINE uint32_t *block_room(dcast_changes *ch)
{
	return dcast_changes_reserve(ch, SCAN_BLOCK + RECORD_SLACK) ? NULL : ch->pos + ch->n;
}

/* Counts of the ulp differences below 64 by value, and of the larger ones
 * by bit length (folded into symbol counts at the end), four copies so that
 * increments stay independent. */
#define HZ 64u
typedef uint32_t scan_hist[4][HZ + 33];

/* An element's bit pattern, sign-extended from its width. */
static ALWAYS_INLINE int32_t load_sx(const uint8_t *p, unsigned es)
{
	uint32_t v = dcast_load_elem(p, es);
	return es == 1 ? (int8_t)v : es == 2 ? (int16_t)v : (int32_t)v; /* one movsx */
}

static ALWAYS_INLINE unsigned hist_slot(uint32_t zz)
{
	return zz < HZ ? zz : HZ + 32 - (unsigned)__builtin_clz(zz);
}

/* dcast_ulp_zz of two elements loaded sign-extended that have the same
 * sign (nearly always): the difference of their sortable images is nv - ov,
 * negated for negative values, and fits w - 1 bits, so no wrap-around to
 * undo. */
static ALWAYS_INLINE uint32_t zz_same_sign(int32_t nv, int32_t ov)
{
	int32_t m = nv >> 31, d = (int32_t)(((uint32_t)nv - (uint32_t)ov) ^ (uint32_t)m) - m;
	return (uint32_t)d << 1 ^ (uint32_t)(d >> 31);
}

static ALWAYS_INLINE void gather1(dcast_changes *ch, const uint8_t *c, const uint8_t *b, uint64_t i,
				  unsigned es, uint32_t *h)
{
	uint64_t at = (uint64_t)ch->pos[i] * es;
	int32_t nv = load_sx(c + at, es), ov = load_sx(b + at, es);
	uint32_t m = dcast_mask_w(8 * es);
	uint32_t zz = LIKELY((nv ^ ov) >= 0) ? zz_same_sign(nv, ov)
					     : dcast_ulp_zz((uint32_t)ov & m, (uint32_t)nv & m, 8 * es);
	ch->zz[i] = zz;
	if (LIKELY(zz < HZ))
		h[zz]++;
	else
		h[hist_slot(zz)]++;
}

/* ulp differences of the changes recorded since `from`, read while their
 * block is still in L1; counts them. */
static ALWAYS_INLINE void gather(dcast_changes *ch, const uint8_t *c, const uint8_t *b, uint64_t from,
				 unsigned es, scan_hist hist)
{
	uint64_t i = from;
	for (; i + 4 <= ch->n; i += 4) {
		gather1(ch, c, b, i, es, hist[0]);
		gather1(ch, c, b, i + 1, es, hist[1]);
		gather1(ch, c, b, i + 2, es, hist[2]);
		gather1(ch, c, b, i + 3, es, hist[3]);
	}
	for (; i < ch->n; i++)
		gather1(ch, c, b, i, es, hist[0]);
}

/* Elements [from, count) one by one; then the differences of changes
 * [done, n), those not gathered yet. */
static ALWAYS_INLINE int scan_tail(const uint8_t *c, const uint8_t *b, uint64_t from, uint64_t count,
				   unsigned es, dcast_changes *ch, uint64_t done, scan_hist hist)
{
	for (uint64_t i = from; i < count; i++) {
		if (memcmp(c + i * es, b + i * es, es) == 0)
			continue;
		if (dcast_changes_reserve(ch, 1))
			return DCAST_ENOMEM;
		ch->pos[ch->n++] = (uint32_t)i;
	}
	gather(ch, c, b, done, es, hist);
	return DCAST_OK;
}

/* Portable: 8 bytes at a time. */
static ALWAYS_INLINE uint64_t neq_mask_word(const uint8_t *c, const uint8_t *b, unsigned es)
{
	uint64_t x, y, m = 0, em = es == 1 ? 0xff : es == 2 ? 0xffff : 0xffffffffull;
	memcpy(&x, c, 8);
	memcpy(&y, b, 8);
	if (x == y)
		return 0;
	for (unsigned j = 0; j < 8; j += es) /* bit j*es: element j differs */
		m |= (((x ^ y) >> (8 * j)) & em) ? 1ull << j : 0;
	return m;
}

static ALWAYS_INLINE int scan_portable_es(const uint8_t *c, const uint8_t *b, uint64_t count,
					  unsigned es, dcast_changes *ch, scan_hist hist)
{
	uint64_t bytes = count * es, off = 0;
	while (off + 8 <= bytes) {
		uint64_t from = ch->n, end = off + SCAN_BLOCK < bytes ? off + SCAN_BLOCK : bytes & ~7ull;
		uint32_t *p = block_room(ch);
		if (!p)
			return DCAST_ENOMEM;
		for (; off < end; off += 8) {
			uint64_t m = neq_mask_word(c + off, b + off, es);
			if (m)
				p = record_pos(p, off / es, m, es, 4);
		}
		ch->n = (uint64_t)(p - ch->pos);
		gather(ch, c, b, from, es, hist);
	}
	return scan_tail(c, b, off / es, count, es, ch, ch->n, hist);
}

static int scan_portable(const uint8_t *c, const uint8_t *b, uint64_t count, unsigned es,
			 dcast_changes *ch, scan_hist hist)
{
	switch (es) {
	case 1: return scan_portable_es(c, b, count, 1, ch, hist);
	case 2: return scan_portable_es(c, b, count, 2, ch, hist);
	default: return scan_portable_es(c, b, count, 4, ch, hist);
	}
}

#if defined(__x86_64__)
#include <immintrin.h>

#define TARGET_AVX2 __attribute__((target("avx2,popcnt,bmi,bmi2,lzcnt")))
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx2,popcnt,bmi,bmi2,lzcnt")))

TARGET_AVX2 static ALWAYS_INLINE __m256i eq_avx2(const uint8_t *c, const uint8_t *b, unsigned es)
{
	__m256i x = _mm256_loadu_si256((const __m256i *)c), y = _mm256_loadu_si256((const __m256i *)b);
	return es == 1 ? _mm256_cmpeq_epi8(x, y) : es == 2 ? _mm256_cmpeq_epi16(x, y) : _mm256_cmpeq_epi32(x, y);
}

/* Equality of 32 elements as one byte each, in element order. */
TARGET_AVX2 static ALWAYS_INLINE uint32_t eq32_avx2(const uint8_t *c, const uint8_t *b, unsigned es)
{
	if (es == 1)
		return (uint32_t)_mm256_movemask_epi8(eq_avx2(c, b, 1));
	if (es == 2) { /* pack two 16-lane results to bytes; undo the lane interleave */
		__m256i p = _mm256_packs_epi16(eq_avx2(c, b, 2), eq_avx2(c + 32, b + 32, 2));
		return (uint32_t)_mm256_movemask_epi8(_mm256_permute4x64_epi64(p, 0xd8));
	}
	__m256i p01 = _mm256_packs_epi32(eq_avx2(c, b, 4), eq_avx2(c + 32, b + 32, 4));
	__m256i p23 = _mm256_packs_epi32(eq_avx2(c + 64, b + 64, 4), eq_avx2(c + 96, b + 96, 4));
	__m256i p = _mm256_packs_epi16(p01, p23);
	p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	return (uint32_t)_mm256_movemask_epi8(p);
}

/* One bit per differing element for the 64 elements at c/b. */
TARGET_AVX2 static ALWAYS_INLINE uint64_t neq_mask_avx2(const uint8_t *c, const uint8_t *b,
							 unsigned es)
{
	uint64_t eq = eq32_avx2(c, b, es) | (uint64_t)eq32_avx2(c + 32 * es, b + 32 * es, es) << 32;
	return ~eq;
}

/* AVX-512BW: one mask bit per element for 64 elements. */
TARGET_AVX512 static ALWAYS_INLINE uint64_t neq_mask_avx512(const uint8_t *c, const uint8_t *b,
							     unsigned es)
{
	uint64_t m = 0;
	for (unsigned part = 0; part < es; part++) {
		__m512i x = _mm512_loadu_si512((const void *)(c + 64 * part));
		__m512i y = _mm512_loadu_si512((const void *)(b + 64 * part));
		uint64_t k = es == 1 ? _mm512_cmpneq_epi8_mask(x, y)
			     : es == 2 ? _mm512_cmpneq_epi16_mask(x, y)
				       : _mm512_cmpneq_epi32_mask(x, y);
		m |= k << (part * (64 / es));
	}
	return m;
}

/* Changes whose ulp difference is 1..GV (nearly all of them in RL
 * updates) are counted 8 at a time, each value in its own lanes: acc[v - 1]
 * less one for each lane that matched. */
#define GV 4
typedef __m256i gather_acc[GV];

/* 8 elements at c + pos * es, as 32-bit lanes sign-extended from es. */
TARGET_AVX2 static ALWAYS_INLINE __m256i gather8_sx(const uint8_t *c, __m256i pv, unsigned es)
{
	if (es == 4)
		return _mm256_i32gather_epi32((const int *)c, pv, 4);
	__m256i v = es == 2 ? _mm256_i32gather_epi32((const int *)c, pv, 2)
			    : _mm256_i32gather_epi32((const int *)c, pv, 1);
	unsigned sh = 32 - 8 * es;
	return _mm256_srai_epi32(_mm256_slli_epi32(v, (int)sh), (int)sh);
}

/* zz_same_sign of the 8 changes from i, stored, and counted in a; returns
 * the lanes left to gather1: a sign flip, or a difference above GV. */
TARGET_AVX2 static ALWAYS_INLINE unsigned gather8(const dcast_changes *ch, const uint8_t *c,
						  const uint8_t *b, uint64_t i, unsigned es, __m256i *a)
{
	__m256i pv = _mm256_loadu_si256((const __m256i *)(ch->pos + i));
	__m256i nv = gather8_sx(c, pv, es), ov = gather8_sx(b, pv, es);
	__m256i m = _mm256_srai_epi32(nv, 31);
	__m256i d = _mm256_sub_epi32(_mm256_xor_si256(_mm256_sub_epi32(nv, ov), m), m);
	__m256i zz = _mm256_xor_si256(_mm256_slli_epi32(d, 1), _mm256_srai_epi32(d, 31));
	__m256i flip = _mm256_srai_epi32(_mm256_xor_si256(nv, ov), 31), seen = _mm256_setzero_si256();
	_mm256_storeu_si256((__m256i *)(ch->zz + i), zz);
#pragma GCC unroll 4
	for (int v = 0; v < GV; v++) {
		__m256i e = _mm256_andnot_si256(flip, _mm256_cmpeq_epi32(zz, _mm256_set1_epi32(v + 1)));
		a[v] = _mm256_sub_epi32(a[v], e);
		seen = _mm256_or_si256(seen, e);
	}
	return ~(unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(seen)) & 0xffu;
}

/* gather() 8 changes at a time while the 4 bytes read at each position
 * stay inside the range (`bytes` long) and positions fit a gather's
 * signed index; returns how far it got.  The lanes left over go through
 * gather1 (which stores and counts them again, exactly) after up to 8
 * batches, so that the loop over them, not a branch per batch, takes the
 * misprediction. */
TARGET_AVX2 static ALWAYS_INLINE uint64_t gather_avx2(dcast_changes *ch, const uint8_t *c,
						      const uint8_t *b, uint64_t i, unsigned es,
						      uint64_t bytes, scan_hist hist, gather_acc acc)
{
	__m256i a[GV]; /* acc in registers: __m256i may alias hist */
	uint64_t end = ch->n; /* changes up to end: 4 bytes read at each stay inside */
	if (bytes > INT32_MAX)
		return i;
	while (end > i && (uint64_t)ch->pos[end - 1] * es + 4 > bytes)
		end--;
	memcpy(a, acc, sizeof(a));
	while (i + 8 <= end) {
		uint64_t i0 = i, left = 0;
		for (unsigned t = 0; t < 64 && i + 8 <= end; t += 8, i += 8)
			left |= (uint64_t)gather8(ch, c, b, i, es, a) << t;
		for (; left; left &= left - 1)
			gather1(ch, c, b, i0 + (unsigned)__builtin_ctzll(left), es, hist[0]);
	}
	memcpy(acc, a, sizeof(a));
	return i;
}

/* Add acc's counts to hist. */
TARGET_AVX2 static void gather_acc_fold(gather_acc acc, scan_hist hist)
{
	for (int v = 0; v < GV; v++) {
		uint32_t lane[8];
		_mm256_storeu_si256((__m256i *)lane, acc[v]);
		for (int j = 0; j < 8; j++)
			hist[0][v + 1] += lane[j];
	}
}

/* 64 elements a step (one mask bit each); gather after each SCAN_BLOCK
 * bytes, while they are still in L1.  How a block runs depends on how many
 * changes the last one had:
 * - at most PREFETCH_MIN: a branch skips groups without changes, which is
 *   then well predicted, and no software prefetch (with no work to hide the
 *   loads behind, the hardware prefetcher keeps up and prefetches only cost);
 * - more: every group records W positions without a branch (W = 2 up to
 *   WIDE_MIN changes a block, else 4), so that the number of changes in a
 *   group, now unpredictable, costs no mispredicted branch, and the next
 *   block is prefetched. */
#define PREFETCH_MIN 2u
#define WIDE_MIN 24u
#define SCAN_GROUPS(maskfn, W)                                                                 \
	for (; off < end; off += group) {                                                       \
		for (unsigned l_ = 0; W && l_ < es; l_++) { /* each line */                    \
			__builtin_prefetch(c + off + 2048 + 64 * l_);                           \
			__builtin_prefetch(b + off + 2048 + 64 * l_);                           \
		}                                                                               \
		uint64_t m = maskfn(c + off, b + off, es);                                      \
		if (W || m)                                                                     \
			p = record_pos(p, off / es, m, 1, W ? W : 4);                           \
	}
#define SCAN_SIMD_BODY(maskfn)                                                                 \
	uint64_t bytes = count * es, off = 0, group = 64 * es, last = PREFETCH_MIN + 1, done = 0; \
	gather_acc acc = { _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), \
			   _mm256_setzero_si256() };                                            \
	while (off + group <= bytes) {                                                          \
		uint64_t from = ch->n, end = off + SCAN_BLOCK;                                  \
		uint32_t *p = block_room(ch);                                                   \
		if (!p)                                                                         \
			return DCAST_ENOMEM;                                                    \
		if (end > bytes - bytes % group)                                                \
			end = bytes - bytes % group;                                            \
		if (last <= PREFETCH_MIN)                                                       \
			SCAN_GROUPS(maskfn, 0)                                                  \
		else if (last <= WIDE_MIN)                                                      \
			SCAN_GROUPS(maskfn, 2)                                                  \
		else                                                                            \
			SCAN_GROUPS(maskfn, 4)                                                  \
		ch->n = (uint64_t)(p - ch->pos);                                                \
		last = ch->n - from;                                                            \
		done = gather_avx2(ch, c, b, done, es, bytes, hist, acc);                       \
	}                                                                                       \
	gather_acc_fold(acc, hist);                                                             \
	return scan_tail(c, b, off / es, count, es, ch, done, hist)

TARGET_AVX2 static ALWAYS_INLINE int scan_avx2_es(const uint8_t *c, const uint8_t *b, uint64_t count,
						  unsigned es, dcast_changes *ch, scan_hist hist)
{
	SCAN_SIMD_BODY(neq_mask_avx2);
}

TARGET_AVX2 static int scan_avx2(const uint8_t *c, const uint8_t *b, uint64_t count, unsigned es,
				 dcast_changes *ch, scan_hist hist)
{
	switch (es) {
	case 1: return scan_avx2_es(c, b, count, 1, ch, hist);
	case 2: return scan_avx2_es(c, b, count, 2, ch, hist);
	default: return scan_avx2_es(c, b, count, 4, ch, hist);
	}
}

TARGET_AVX512 static ALWAYS_INLINE int scan_avx512_es(const uint8_t *c, const uint8_t *b,
						      uint64_t count, unsigned es, dcast_changes *ch,
						      scan_hist hist)
{
	SCAN_SIMD_BODY(neq_mask_avx512);
}

TARGET_AVX512 static int scan_avx512(const uint8_t *c, const uint8_t *b, uint64_t count, unsigned es,
				     dcast_changes *ch, scan_hist hist)
{
	switch (es) {
	case 1: return scan_avx512_es(c, b, count, 1, ch, hist);
	case 2: return scan_avx512_es(c, b, count, 2, ch, hist);
	default: return scan_avx512_es(c, b, count, 4, ch, hist);
	}
}

static int simd_supported(int simd)
{
	__builtin_cpu_init();
	if (simd == DCAST_SIMD_AVX512)
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       simd_supported(DCAST_SIMD_AVX2);
	if (simd == DCAST_SIMD_AVX2)
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt") &&
		       __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
	return simd == DCAST_SIMD_PORTABLE;
}
#else
static int simd_supported(int simd)
{
	return simd == DCAST_SIMD_PORTABLE;
}
#endif

static _Atomic int simd_forced;

int dcast_simd_force(int simd)
{
	if (simd != DCAST_SIMD_AUTO && !simd_supported(simd))
		simd = DCAST_SIMD_PORTABLE;
	simd_forced = simd;
	return simd == DCAST_SIMD_AUTO ? (simd_supported(DCAST_SIMD_AVX512) ? DCAST_SIMD_AVX512
					  : simd_supported(DCAST_SIMD_AVX2) ? DCAST_SIMD_AVX2
									    : DCAST_SIMD_PORTABLE)
				       : simd;
}

static int simd_pick(void)
{
	int f = simd_forced;
	if (f != DCAST_SIMD_AUTO)
		return f;
	if (simd_supported(DCAST_SIMD_AVX512))
		return DCAST_SIMD_AVX512;
	return simd_supported(DCAST_SIMD_AVX2) ? DCAST_SIMD_AVX2 : DCAST_SIMD_PORTABLE;
}

int dcast_simd_bmi2(void)
{
	return simd_pick() != DCAST_SIMD_PORTABLE;
}

int dcast_simd_avx512(void)
{
#if defined(__x86_64__)
	return simd_pick() == DCAST_SIMD_AVX512 && __builtin_cpu_supports("avx512cd") &&
	       __builtin_cpu_supports("avx512vl");
#else
	return 0;
#endif
}

uint64_t dcast_cpt_pos_bits(const dcast_changes *ch, unsigned k)
{
	uint32_t next = 0, *pos = ch->pos;
	uint64_t bits = 0;
	for (uint64_t i = 0; i < ch->n; i++) {
		bits += dcast_rice_len(pos[i] - next, k);
		next = pos[i] + 1;
	}
	return bits;
}

int dcast_scan(const void *cur, const void *base, uint64_t count, unsigned es, dcast_changes *ch)
{
	const uint8_t *c = cur, *b = base;
	scan_hist hist;
	int rc;
	memset(ch, 0, sizeof(*ch));
	memset(hist, 0, sizeof(hist));
	if (dcast_changes_reserve(ch, count / 64 + 128))
		return DCAST_ENOMEM;
	switch (simd_pick()) {
#if defined(__x86_64__)
	case DCAST_SIMD_AVX512: rc = scan_avx512(c, b, count, es, ch, hist); break;
	case DCAST_SIMD_AVX2: rc = scan_avx2(c, b, count, es, ch, hist); break;
#endif
	default: rc = scan_portable(c, b, count, es, ch, hist); break;
	}
	if (rc)
		return rc;
	for (unsigned z = 1; z < HZ + 33; z++) {
		uint64_t cnt = (uint64_t)hist[0][z] + hist[1][z] + hist[2][z] + hist[3][z];
		if (cnt) /* slot HZ + b counts bit length b (7 or more): the symbol of 1 << (b - 1) */
			ch->stats.hist[dcast_cpt_symbol(z < HZ ? z : 1u << (z - HZ - 1))] += cnt;
	}
	ch->stats.changed = ch->n;
	ch->stats.gap_sum = ch->n ? (uint64_t)ch->pos[ch->n - 1] + 1 - ch->n : 0;
	return DCAST_OK;
}
