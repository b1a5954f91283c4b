/* The encoder's only full pass over a range: compare cur with base, and
 * for each changed element record its position, new bit pattern and ulp
 * difference, counting value symbols for the compact code table on the way.
 * AVX-512BW and AVX2 variants are chosen at run time; the portable one
 * compares 8 bytes at a time. */
#include <inttypes.h>
#include <string.h>
#include "codec_impl.h"
#include "dcast_common.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

int dcast_changes_reserve(dcast_changes *ch, uint64_t more)
{
	if (ch->n + more <= ch->cap)
		return DCAST_OK;
	uint64_t cap = ch->cap ? ch->cap * 2 : 1024;
	while (cap < ch->n + more)
		cap *= 2;
	ch->pos = dcast_scratch(DCAST_SCRATCH_POS, cap * 4);
	ch->newv = ch->pos ? dcast_scratch(DCAST_SCRATCH_NEWV, cap * 4) : NULL;
	ch->zz = ch->newv ? dcast_scratch(DCAST_SCRATCH_ZZ, cap * 4) : NULL;
	if (!ch->zz)
		return dcast_fail(DCAST_ENOMEM, "codec scan: no memory for %" PRIu64 " changes", cap);
	ch->cap = cap;
	return DCAST_OK;
}

/* Append the changed elements flagged in `bits` (bit j*es: element
 * first + j of a fully loaded group g/gb of `group` bytes), with new value
 * and ulp difference, four at a time without a branch per element.  Slots
 * past the new end get the group's last element; capacity has room. */
static ALWAYS_INLINE int record_mask(dcast_changes *ch, const uint8_t *g, const uint8_t *gb,
				     uint64_t first, uint64_t bits, unsigned es, unsigned group)
{
	if (ch->n + 68 > ch->cap && dcast_changes_reserve(ch, 68))
		return DCAST_ENOMEM;
	uint32_t *p = ch->pos + ch->n, *nv = ch->newv + ch->n, *zz = ch->zz + ch->n;
	unsigned cnt = (unsigned)__builtin_popcountll(bits);
	ch->n += cnt;
	for (;;) {
		for (int j = 0; j < 4; j++) {
			unsigned e = (unsigned)__builtin_ctzll(bits | (1ull << (group - 1))) / es;
			uint32_t v = dcast_load_elem(g + e * es, es);
			p[j] = (uint32_t)(first + e);
			nv[j] = v;
			zz[j] = dcast_ulp_zz(dcast_load_elem(gb + e * es, es), v, 8 * es);
			bits &= bits - 1;
		}
		if (cnt <= 4)
			return DCAST_OK;
		p += 4, nv += 4, zz += 4;
		cnt -= 4;
	}
}

/* Same with one mask bit per element (AVX-512 compares). */
static ALWAYS_INLINE int record_mask_1bit(dcast_changes *ch, const uint8_t *g, const uint8_t *gb,
					  uint64_t first, uint64_t bits, unsigned es)
{
	uint64_t spread = 0;
	for (unsigned j = 0; j < 64 / es; j++)
		spread |= ((bits >> j) & 1) << (j * es);
	return record_mask(ch, g, gb, first, spread, es, 64);
}

/* Keep one bit per element of a byte-granular mask. */
static ALWAYS_INLINE uint64_t elem_bits(uint64_t m, unsigned es)
{
	return es == 1 ? m : es == 2 ? m & 0x5555555555555555ull : m & 0x1111111111111111ull;
}

static ALWAYS_INLINE int scan_tail(const uint8_t *c, const uint8_t *b, uint64_t from,
				   uint64_t count, unsigned es, dcast_changes *ch)
{
	for (uint64_t i = from; i < count; i++) {
		if (memcmp(c + i * es, b + i * es, es) == 0)
			continue;
		if (dcast_changes_reserve(ch, 1))
			return DCAST_ENOMEM;
		uint32_t v = dcast_load_elem(c + i * es, es);
		ch->pos[ch->n] = (uint32_t)i;
		ch->newv[ch->n] = v;
		ch->zz[ch->n++] = dcast_ulp_zz(dcast_load_elem(b + i * es, es), v, 8 * es);
	}
	return DCAST_OK;
}

static ALWAYS_INLINE int scan_portable_es(const uint8_t *c, const uint8_t *b, uint64_t count,
					  unsigned es, dcast_changes *ch)
{
	uint64_t bytes = count * es, off = 0;
	for (; off + 8 <= bytes; off += 8) {
		uint64_t x, y, m = 0;
		uint64_t em = es == 1 ? 0xff : es == 2 ? 0xffff : 0xffffffffull;
		memcpy(&x, c + off, 8);
		memcpy(&y, b + off, 8);
		if (x == y)
			continue;
		for (unsigned j = 0; j < 8; j += es) /* bit j*es: element j differs */
			m |= (((x ^ y) >> (8 * j)) & em) ? 1ull << j : 0;
		if (record_mask(ch, c + off, b + off, off / es, elem_bits(m, es), es, 8))
			return DCAST_ENOMEM;
	}
	return scan_tail(c, b, off / es, count, es, ch);
}

static int scan_portable(const uint8_t *c, const uint8_t *b, uint64_t count, unsigned es,
			 dcast_changes *ch)
{
	switch (es) {
	case 1: return scan_portable_es(c, b, count, 1, ch);
	case 2: return scan_portable_es(c, b, count, 2, ch);
	default: return scan_portable_es(c, b, count, 4, ch);
	}
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2,popcnt,bmi,bmi2"))) static ALWAYS_INLINE uint64_t neq_mask_avx2(const uint8_t *c,
									     const uint8_t *b,
									     unsigned es)
{
	__m256i c0 = _mm256_loadu_si256((const __m256i *)c);
	__m256i c1 = _mm256_loadu_si256((const __m256i *)(c + 32));
	__m256i b0 = _mm256_loadu_si256((const __m256i *)b);
	__m256i b1 = _mm256_loadu_si256((const __m256i *)(b + 32));
	__m256i e0, e1;
	if (es == 1) {
		e0 = _mm256_cmpeq_epi8(c0, b0);
		e1 = _mm256_cmpeq_epi8(c1, b1);
	} else if (es == 2) {
		e0 = _mm256_cmpeq_epi16(c0, b0);
		e1 = _mm256_cmpeq_epi16(c1, b1);
	} else {
		e0 = _mm256_cmpeq_epi32(c0, b0);
		e1 = _mm256_cmpeq_epi32(c1, b1);
	}
	uint64_t eq = (uint32_t)_mm256_movemask_epi8(e0) |
		      (uint64_t)(uint32_t)_mm256_movemask_epi8(e1) << 32;
	return ~eq;
}

__attribute__((target("avx2,popcnt,bmi,bmi2"))) static ALWAYS_INLINE int
scan_avx2_es(const uint8_t *c, const uint8_t *b, uint64_t count, unsigned es, dcast_changes *ch)
{
	uint64_t bytes = count * es, off = 0;
	for (; off + 64 <= bytes; off += 64) {
		uint64_t m = neq_mask_avx2(c + off, b + off, es);
		if (m && record_mask(ch, c + off, b + off, off / es, elem_bits(m, es), es, 64))
			return DCAST_ENOMEM;
	}
	return scan_tail(c, b, off / es, count, es, ch);
}

__attribute__((target("avx2,popcnt,bmi,bmi2"))) static int scan_avx2(const uint8_t *c, const uint8_t *b,
						      uint64_t count, unsigned es, dcast_changes *ch)
{
	switch (es) {
	case 1: return scan_avx2_es(c, b, count, 1, ch);
	case 2: return scan_avx2_es(c, b, count, 2, ch);
	default: return scan_avx2_es(c, b, count, 4, ch);
	}
}

/* AVX-512BW: one mask bit per element straight from the compare. */
__attribute__((target("avx512f,avx512bw,popcnt,bmi,bmi2"))) static ALWAYS_INLINE int
scan_avx512_es(const uint8_t *c, const uint8_t *b, uint64_t count, unsigned es, dcast_changes *ch)
{
	uint64_t bytes = count * es, off = 0;
	for (; off + 64 <= bytes; off += 64) {
		__m512i x = _mm512_loadu_si512((const void *)(c + off));
		__m512i y = _mm512_loadu_si512((const void *)(b + off));
		uint64_t m = es == 1 ? _mm512_cmpneq_epi8_mask(x, y)
			     : es == 2 ? _mm512_cmpneq_epi16_mask(x, y)
				       : _mm512_cmpneq_epi32_mask(x, y);
		if (m && record_mask_1bit(ch, c + off, b + off, off / es, m, es))
			return DCAST_ENOMEM;
	}
	return scan_tail(c, b, off / es, count, es, ch);
}

__attribute__((target("avx512f,avx512bw,popcnt,bmi,bmi2"))) static int
scan_avx512(const uint8_t *c, const uint8_t *b, uint64_t count, unsigned es, dcast_changes *ch)
{
	switch (es) {
	case 1: return scan_avx512_es(c, b, count, 1, ch);
	case 2: return scan_avx512_es(c, b, count, 2, ch);
	default: return scan_avx512_es(c, b, count, 4, ch);
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

/* Second pass, over the recorded changes only (contiguous): the symbol
 * histogram (four copies, to keep increments independent) and the exact
 * Rice bits of the positions under the k their mean implies. */
static void stats_pass(dcast_changes *ch)
{
	uint32_t hist[4][DCAST_CPT_NSYM_MAX] = { { 0 } };
	uint32_t next = 0, *pos = ch->pos, *zzv = ch->zz;
	uint64_t pos_bits = 0, n = ch->n;
	ch->stats.changed = n;
	ch->stats.gap_sum = n ? (uint64_t)pos[n - 1] + 1 - n : 0;
	unsigned k = ch->k = dcast_cpt_choose_k(n, ch->stats.gap_sum);
	for (uint64_t i = 0; i < n; i++) {
		hist[i & 3][dcast_cpt_symbol(zzv[i])]++;
		pos_bits += dcast_rice_len(pos[i] - next, k);
		next = pos[i] + 1;
	}
	for (unsigned s = 0; s < DCAST_CPT_NSYM_MAX; s++)
		ch->stats.hist[s] = (uint64_t)hist[0][s] + hist[1][s] + hist[2][s] + hist[3][s];
	ch->pos_bits = pos_bits;
}

int dcast_scan(const void *cur, const void *base, uint64_t count, unsigned es, dcast_changes *ch)
{
	const uint8_t *c = cur, *b = base;
	int rc;
	memset(ch, 0, sizeof(*ch));
	if (dcast_changes_reserve(ch, count / 64 + 128))
		return DCAST_ENOMEM;
	switch (simd_pick()) {
#if defined(__x86_64__)
	case DCAST_SIMD_AVX512: rc = scan_avx512(c, b, count, es, ch); break;
	case DCAST_SIMD_AVX2: rc = scan_avx2(c, b, count, es, ch); break;
#endif
	default: rc = scan_portable(c, b, count, es, ch); break;
	}
	if (rc)
		return rc;
	stats_pass(ch);
	return DCAST_OK;
}
