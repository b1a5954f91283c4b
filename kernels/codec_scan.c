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

uint32_t dcast_load_elem(const uint8_t *p, unsigned es)
{
	uint8_t v8;
	uint16_t v16;
	uint32_t v32;
	switch (es) {
	case 1: memcpy(&v8, p, 1); return v8;
	case 2: memcpy(&v16, p, 2); return v16;
	default: memcpy(&v32, p, 4); return v32;
	}
}

void dcast_store_elem(uint8_t *p, unsigned es, uint32_t v)
{
	uint8_t v8 = (uint8_t)v;
	uint16_t v16 = (uint16_t)v;
	switch (es) {
	case 1: memcpy(p, &v8, 1); break;
	case 2: memcpy(p, &v16, 2); break;
	default: memcpy(p, &v, 4); break;
	}
}

void dcast_changes_free(dcast_changes *ch)
{
	free(ch->pos);
	free(ch->newv);
	free(ch->zz);
	memset(ch, 0, sizeof(*ch));
}

int dcast_changes_reserve(dcast_changes *ch, uint64_t more)
{
	if (ch->n + more <= ch->cap)
		return DCAST_OK;
	uint64_t cap = ch->cap ? ch->cap * 2 : 1024;
	while (cap < ch->n + more)
		cap *= 2;
	uint32_t *p = realloc(ch->pos, cap * 4), *v, *z;
	if (p)
		ch->pos = p;
	v = p ? realloc(ch->newv, cap * 4) : NULL;
	if (v)
		ch->newv = v;
	z = v ? realloc(ch->zz, cap * 4) : NULL;
	if (!z) {
		dcast_changes_free(ch);
		return dcast_fail(DCAST_ENOMEM, "codec scan: no memory for %" PRIu64 " changes", cap);
	}
	ch->zz = z;
	ch->cap = cap;
	return DCAST_OK;
}

/* Record element i (known to differ). Caller reserved room. */
static ALWAYS_INLINE void record(dcast_changes *ch, const uint8_t *cur, const uint8_t *base,
				 uint64_t i, unsigned es)
{
	uint32_t nv = dcast_load_elem(cur + i * es, es), ov = dcast_load_elem(base + i * es, es);
	uint32_t zz = dcast_ulp_zz(ov, nv, 8 * es);
	uint64_t n = ch->n++;
	ch->pos[n] = (uint32_t)i;
	ch->newv[n] = nv;
	ch->zz[n] = zz;
	ch->stats.hist[dcast_cpt_symbol(zz)]++;
}

/* Record every element flagged in `bits`, where bit j*es stands for
 * element first + j (byte-granular compare masks). */
static ALWAYS_INLINE int record_mask(dcast_changes *ch, const uint8_t *cur, const uint8_t *base,
				     uint64_t first, uint64_t bits, unsigned es)
{
	if (dcast_changes_reserve(ch, 64))
		return DCAST_ENOMEM;
	while (bits) {
		unsigned b = (unsigned)__builtin_ctzll(bits);
		record(ch, cur, base, first + b / es, es);
		bits &= bits - 1;
	}
	return DCAST_OK;
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
		record(ch, c, b, i, es);
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
		if (record_mask(ch, c, b, off / es, elem_bits(m, es), es))
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

__attribute__((target("avx2"))) static ALWAYS_INLINE uint64_t neq_mask_avx2(const uint8_t *c,
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

__attribute__((target("avx2"))) static ALWAYS_INLINE int
scan_avx2_es(const uint8_t *c, const uint8_t *b, uint64_t count, unsigned es, dcast_changes *ch)
{
	uint64_t bytes = count * es, off = 0;
	for (; off + 64 <= bytes; off += 64) {
		uint64_t m = neq_mask_avx2(c + off, b + off, es);
		if (m && record_mask(ch, c, b, off / es, elem_bits(m, es), es))
			return DCAST_ENOMEM;
	}
	return scan_tail(c, b, off / es, count, es, ch);
}

__attribute__((target("avx2"))) static int scan_avx2(const uint8_t *c, const uint8_t *b,
						      uint64_t count, unsigned es, dcast_changes *ch)
{
	switch (es) {
	case 1: return scan_avx2_es(c, b, count, 1, ch);
	case 2: return scan_avx2_es(c, b, count, 2, ch);
	default: return scan_avx2_es(c, b, count, 4, ch);
	}
}

/* AVX-512BW: one mask bit per element straight from the compare. */
__attribute__((target("avx512f,avx512bw"))) static ALWAYS_INLINE int
scan_avx512_es(const uint8_t *c, const uint8_t *b, uint64_t count, unsigned es, dcast_changes *ch)
{
	uint64_t bytes = count * es, off = 0;
	for (; off + 64 <= bytes; off += 64) {
		__m512i x = _mm512_loadu_si512((const void *)(c + off));
		__m512i y = _mm512_loadu_si512((const void *)(b + off));
		uint64_t m = es == 1 ? _mm512_cmpneq_epi8_mask(x, y)
			     : es == 2 ? _mm512_cmpneq_epi16_mask(x, y)
				       : _mm512_cmpneq_epi32_mask(x, y);
		if (!m)
			continue;
		if (dcast_changes_reserve(ch, 64))
			return DCAST_ENOMEM;
		for (; m; m &= m - 1)
			record(ch, c, b, off / es + (unsigned)__builtin_ctzll(m), es);
	}
	return scan_tail(c, b, off / es, count, es, ch);
}

__attribute__((target("avx512f,avx512bw"))) static int
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
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
	if (simd == DCAST_SIMD_AVX2)
		return __builtin_cpu_supports("avx2");
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

int dcast_scan(const void *cur, const void *base, uint64_t count, unsigned es, dcast_changes *ch)
{
	const uint8_t *c = cur, *b = base;
	int rc;
	memset(ch, 0, sizeof(*ch));
	if (dcast_changes_reserve(ch, count / 64 + 64))
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
	ch->stats.changed = ch->n;
	ch->stats.gap_sum = ch->n ? (uint64_t)ch->pos[ch->n - 1] + 1 - ch->n : 0;
	return DCAST_OK;
}
