/* Compact v2 on the CPU (docs/protocol.md, "4: compact v2"): its exact
 * size, the encoder, which lays each block's words out by running the
 * lanes' refills as a warp takes them, and the decoder, which runs the
 * same refills and names the first problem it meets, as the v1 decoder
 * does.  The lane logic is codec_cpt2.h's, shared with the warp kernel
 * (batch.cu).  The encoder (coded values) and the decoder's fast path
 * run a block's 32 lanes in vector registers, a refill point at a time:
 * 16 or 8 lanes to one where the compare variant in use is AVX-512 (and
 * the CPU has AVX512CD and AVX512VL), 8 where it is AVX2 (or AVX-512
 * without those); elsewhere the scalar builds run (dcast_cpt2_build picks,
 * test_codec runs each).  All write the same bytes and accept the same
 * payloads. */
#include <inttypes.h>
#include <pthread.h>
#include <string.h>
#include "codec_cpt2.h"
#include "dcast_common.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512cd,avx512vl,bmi,bmi2,popcnt")))
#define AVX2 __attribute__((target("avx2,bmi,bmi2,popcnt")))
#endif
/* Zeros after the stream copy the AVX-512 decoder reads: a round reads
 * fewer than 2 * 3 * 32 + 16 words past where it starts. */
#define V2_PAD_WORDS 512u
/* Words one lane's stream of a block may need: 128 codes of at most
 * 46 + 43 bits. */
#define LANE_WORDS (DCAST_CPT2_ROUNDS * 89 / DCAST_CPT2_WORD_BITS + 1)

int dcast_cpt2_build(void)
{
	if (dcast_simd_avx512())
		return DCAST_CPT2_AVX512;
#if defined(__x86_64__)
	if (dcast_simd_bmi2()) /* the AVX2 or AVX-512 variant: the CPU has AVX2 */
		return DCAST_CPT2_AVX2;
#endif
	return DCAST_CPT2_PLAIN;
}

/* Bits of one change: position code, then value code. */
static ALWAYS_INLINE unsigned cpt2_val_len(const dcast_cpt_plan *p, uint32_t zz)
{
	unsigned sym;
	if (p->mode == DCAST_CPT_RAW)
		return p->w;
	sym = dcast_cpt_symbol(zz);
	return p->table.len[sym] + dcast_cpt_extra_bits(sym);
}

/* Words of one block: each lane takes exactly the words its bits fill
 * (a lane takes a word only for a code it does not yet hold whole). */
static uint64_t blk_words(const dcast_changes *ch, const dcast_cpt_plan *p, uint64_t first, uint32_t n,
			  uint64_t *bits)
{
	uint32_t lane_bits[DCAST_CPT2_LANES] = { 0 }, next = first ? ch->pos[first - 1] + 1 : 0;
	uint64_t words = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t at = ch->pos[first + i];
		unsigned len = dcast_rice_len(at - next, p->k);
		*bits += len;
		lane_bits[i % DCAST_CPT2_LANES] += len + cpt2_val_len(p, ch->zz[first + i]);
		next = at + 1;
	}
	for (unsigned l = 0; l < DCAST_CPT2_LANES; l++)
		words += (lane_bits[l] + DCAST_CPT2_WORD_BITS - 1) / DCAST_CPT2_WORD_BITS;
	return words;
}

uint64_t dcast_cpt2_size(const dcast_changes *ch, const dcast_cpt_plan *p, uint64_t *pos_bits)
{
	uint64_t words = 0;
	*pos_bits = 0;
	for (uint64_t b = 0; b < dcast_cpt2_nblocks(ch->n); b++)
		words += blk_words(ch, p, b * DCAST_CPT2_BLOCK, dcast_cpt2_blk_changes(ch->n, b), pos_bits);
	return dcast_cpt_hdr_bytes(p->mode, p->w) + dcast_cpt2_index_bytes(ch->n) + 2 * words;
}

/* ---- the encoder ---- */

/* Value codes of the differences below VT, prebuilt per payload. */
#define VT 64u

/* One lane's stream of a block (bytes; 8 of slack past its last), and
 * where the layout is in it. */
typedef struct lane_out {
	uint32_t taken, held;
	uint8_t bytes[LANE_WORDS * 2 + 8];
} lane_out;

typedef struct blk_enc {
	lane_out lane[DCAST_CPT2_LANES];
	uint8_t len[2][DCAST_CPT2_BLOCK]; /* position, value code lengths */
	uint64_t vbits[VT];
	uint8_t vlen[VT];
} blk_enc;

static void vtab_make(blk_enc *e, const dcast_cpt_plan *p)
{
	for (uint32_t z = 1; z < VT && p->mode == DCAST_CPT_CODED; z++) {
		unsigned len;
		e->vbits[z] = dcast_cpt_value_bits(p, z, 0, &len);
		e->vlen[z] = (uint8_t)len;
	}
}

/* Lane l's codes of the block (changes l, l + 32, ...) into its stream,
 * their lengths into len[][]; returns its position bits. */
static ALWAYS_INLINE uint64_t lane_codes(blk_enc *e, const dcast_changes *ch, const dcast_cpt_plan *p,
					 const uint8_t *cur, unsigned es, uint64_t first, uint32_t n, unsigned l)
{
	const uint32_t *pos = ch->pos + first, *zz = ch->zz + first;
	dcast_bitwriter w = { e->lane[l].bytes, e->lane[l].bytes, 0, 0 };
	uint64_t bits = 0;
	for (uint32_t i = l; i < n; i += DCAST_CPT2_LANES) {
		uint32_t gap = pos[i] - (first + i ? pos[(int64_t)i - 1] + 1 : 0), z = zz[i];
		unsigned rlen = dcast_rice_len(gap, p->k), vlen;
		uint64_t rbits = dcast_rice_bits(gap, p->k), vbits;
		if (p->mode == DCAST_CPT_CODED && z < VT)
			vbits = e->vbits[z], vlen = e->vlen[z];
		else
			vbits = dcast_cpt_value_bits(p, z, dcast_load_elem(cur + (uint64_t)pos[i] * es, es), &vlen);
		if (rlen + vlen <= 56) {
			dcast_bw_put(&w, rbits | vbits << rlen, rlen + vlen);
		} else {
			dcast_bw_put(&w, rbits, rlen);
			dcast_bw_put(&w, vbits, vlen);
		}
		e->len[0][i] = (uint8_t)rlen, e->len[1][i] = (uint8_t)vlen;
		bits += rlen;
	}
	e->lane[l].taken = e->lane[l].held = 0;
	return bits;
}

/* Every lane's codes of the block, each in its own stream; built for
 * BMI2 (shifts by a register) and for any x86-64. */
DCAST_TARGET_BMI2 static void blk_codes_bmi2(blk_enc *e, const dcast_changes *ch, const dcast_cpt_plan *p,
					     const uint8_t *cur, unsigned es, uint64_t first, uint32_t n,
					     uint64_t *pos_bits)
{
	for (unsigned l = 0; l < DCAST_CPT2_LANES; l++)
		*pos_bits += lane_codes(e, ch, p, cur, es, first, n, l);
}

static void blk_codes(blk_enc *e, const dcast_changes *ch, const dcast_cpt_plan *p, const uint8_t *cur,
		      unsigned es, uint64_t first, uint32_t n, uint64_t *pos_bits)
{
	if (dcast_simd_bmi2()) {
		blk_codes_bmi2(e, ch, p, cur, es, first, n, pos_bits);
		return;
	}
	for (unsigned l = 0; l < DCAST_CPT2_LANES; l++)
		*pos_bits += lane_codes(e, ch, p, cur, es, first, n, l);
}

/* One refill point: in passes, each lane short of its code's bits takes
 * its next word, lanes in increasing order; then the codes are used. */
static ALWAYS_INLINE uint8_t *refill_point(blk_enc *e, const uint8_t *len, unsigned nl, uint8_t *out)
{
	uint32_t pending = 0;
	for (unsigned l = 0; l < nl; l++)
		pending |= (uint32_t)(e->lane[l].held < len[l]) << l;
	while (pending) {
		for (uint32_t p = pending; p; p &= p - 1) {
			lane_out *lo = &e->lane[__builtin_ctz(p)];
			memcpy(out, lo->bytes + 2 * lo->taken++, 2);
			out += 2;
			lo->held += DCAST_CPT2_WORD_BITS;
			if (lo->held >= len[__builtin_ctz(p)])
				pending &= ~(p & -p);
		}
	}
	for (unsigned l = 0; l < nl; l++)
		e->lane[l].held -= len[l];
	return out;
}

/* The block's words, in the order the lanes take them. */
static uint8_t *blk_lay(blk_enc *e, uint32_t n, uint8_t *out)
{
	for (uint32_t r = 0; r * DCAST_CPT2_LANES < n; r++) {
		uint32_t at = r * DCAST_CPT2_LANES, nl = n - at < DCAST_CPT2_LANES ? n - at : DCAST_CPT2_LANES;
		out = refill_point(e, e->len[0] + at, nl, out);
		out = refill_point(e, e->len[1] + at, nl, out);
	}
	return out;
}

/* Block b's index entry: its first word, the position before it. */
static void idx_entry(uint8_t *idx, uint64_t b, uint32_t word, uint32_t prev)
{
	uint32_t ent[2] = { word, prev };
	memcpy(idx + (b - 1) * DCAST_CPT_INDEX_ENTRY, ent, sizeof(ent));
}

/* A block's words by one build: its 16-bit word count; x its context. */
typedef uint32_t (*blk_fn)(const void *x, uint64_t first, uint32_t n, uint8_t *out, uint32_t *fix,
			   uint64_t *pos_bits);

/* Every block of ch through blk, each after its index entry; returns the
 * stream's end. */
static uint8_t *blocks_each(const dcast_changes *ch, uint8_t *idx, uint8_t *stream, blk_fn blk,
			    const void *x, uint32_t *fix, uint64_t *pos_bits)
{
	uint8_t *w = stream;

	for (uint64_t b = 0; b < dcast_cpt2_nblocks(ch->n); b++) {
		uint64_t first = b * DCAST_CPT2_BLOCK;
		if (b)
			idx_entry(idx, b, (uint32_t)((w - stream) / 2), ch->pos[first - 1]);
		w += 2 * blk(x, first, dcast_cpt2_blk_changes(ch->n, b), w, fix, pos_bits);
	}
	return w;
}

/* ---- the encoder on AVX-512: the 32 lanes in vectors of 16 or 8 ---- */
#if defined(__x86_64__)

/* What each lane knows of the words it has taken, in one pass over the
 * codes: held (0..15) as the decoder counts them, the known low bits of
 * the last word it took (16 - held of them) and that word's slot in the
 * block.  Taking a word only gives it its slot (the next one of the
 * block); a word is stored once complete (when the lane takes the next,
 * at once for all but the last of a code's words, at the block's end)
 * through a list of slots and values applied in order at the block's
 * end.  A lane starts with slot 0 as its last word: every lane of the
 * block takes its first word in the first refill point, storing junk
 * there first, and the word of slot 0 is stored over it later. */
typedef struct venc {
	__m512i part[4], held[4], last[4];
	__m512i before; /* lane 7: the position before the next change */
} venc;

/* The block's words: how many have their slot, the list of stores. */
typedef struct vout {
	uint32_t cur, nfix;
	uint32_t *fix;
	uint64_t pbits; /* position code bits of the points run 8 lanes a vector */
} vout;

static AVX512 ALWAYS_INLINE __m512i e_set(uint64_t x)
{
	return _mm512_set1_epi64((long long)x);
}

/* The lanes of m: word x & 0xffff into slot `slot`, to the list. */
static AVX512 ALWAYS_INLINE void e_store(vout *o, __m512i slot, __m512i x, __mmask8 m)
{
	__m512i e = _mm512_or_si512(slot, _mm512_slli_epi64(_mm512_and_si512(x, e_set(0xffff)), 16));
	_mm256_storeu_si256((__m256i *)(void *)(o->fix + o->nfix), _mm512_cvtepi64_epi32(_mm512_maskz_compress_epi64(m, e)));
	o->nfix += (unsigned)__builtin_popcount(m);
}

/* A pass: the lanes of mk take the next slots, in lane order. */
static AVX512 ALWAYS_INLINE __m512i e_take(vout *o, __mmask8 mk)
{
	__m512i slot = _mm512_maskz_expand_epi64(mk, _mm512_add_epi64(_mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
								      e_set(o->cur)));
	o->cur += (unsigned)__builtin_popcount(mk);
	return slot;
}

/* The lanes of a refill point whose code needs a second or third word,
 * for the passes after every lane's first. */
typedef struct elate {
	__m512i x[4], m[4];
	__mmask8 mk[4];
	unsigned any;
} elate;

/* Passes 2 and 3: the word a lane took in the pass before is complete. */
static AVX512 void e_more(vout *o, venc *s, const elate *late)
{
	__mmask8 m3[4];
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		e_store(o, s->last[v], _mm512_srli_epi64(late->x[v], 16), late->mk[v]);
		s->last[v] = _mm512_mask_mov_epi64(s->last[v], late->mk[v], e_take(o, late->mk[v]));
	}
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		m3[v] = late->mk[v] & _mm512_cmpgt_epu64_mask(late->m[v], e_set(2));
		e_store(o, s->last[v], _mm512_srli_epi64(late->x[v], 32), m3[v]);
		s->last[v] = _mm512_mask_mov_epi64(s->last[v], m3[v], e_take(o, m3[v]));
	}
}

/* One refill point of vector v's lanes (a: those in the round), codes c
 * of lengths L.  A lane takes m = ceil((L - held) / 16) words (none when
 * it holds L bits), in passes: this is the first (every lane's first
 * word, vector by vector), which completes the word it took before;
 * lanes that need more go to late. */
static AVX512 ALWAYS_INLINE void e_vec(vout *o, venc *s, unsigned v, __mmask8 a, __m512i c, __m512i L, elate *late)
{
	__m512i h = s->held[v], d = _mm512_sub_epi64(_mm512_max_epu64(L, h), h);
	__m512i m = _mm512_srli_epi64(_mm512_add_epi64(d, e_set(15)), 4), m16 = _mm512_slli_epi64(m, 4);
	__m512i x = _mm512_or_si512(s->part[v], _mm512_sllv_epi64(c, _mm512_sub_epi64(e_set(16), h)));
	__mmask8 m1 = a & _mm512_cmpgt_epu64_mask(m, e_set(0)), m2 = a & _mm512_cmpgt_epu64_mask(m, e_set(1));
	e_store(o, s->last[v], x, m1);
	s->last[v] = _mm512_mask_mov_epi64(s->last[v], m1, e_take(o, m1));
	late->mk[v] = m2;
	if (m2) {
		late->x[v] = x, late->m[v] = m;
		late->any = 1;
	}
	s->part[v] = _mm512_mask_srlv_epi64(s->part[v], a, x, m16);
	s->held[v] = _mm512_mask_mov_epi64(h, a, _mm512_sub_epi64(_mm512_add_epi64(h, m16), L));
}

/* Position codes of 8 changes from pos[i] (before: lane 7 the position
 * ahead of the first, all ones for none; left holding these 8): bits
 * into *c, lengths returned. */
static AVX512 ALWAYS_INLINE __m512i e_pos(const dcast_cpt_plan *p, const uint32_t *pos, __m512i *before, __mmask8 a,
					  __m512i *c)
{
	__m512i at = _mm512_cvtepu32_epi64(_mm256_maskz_loadu_epi32(a, pos));
	__m512i prev = _mm512_alignr_epi64(at, *before, 7);
	__m512i gap = _mm512_sub_epi64(_mm512_sub_epi64(at, prev), e_set(1));
	*before = at;
	__m512i q = _mm512_srlv_epi64(gap, e_set(p->k));
	__mmask8 esc = _mm512_cmpge_epu64_mask(q, e_set(DCAST_CPT_QESC));
	__m512i ones = _mm512_sub_epi64(_mm512_sllv_epi64(e_set(1), q), e_set(1));
	__m512i low = _mm512_sllv_epi64(_mm512_and_si512(gap, e_set((1ull << p->k) - 1)), _mm512_add_epi64(q, e_set(1)));
	__m512i big = _mm512_or_si512(e_set((1u << DCAST_CPT_QESC) - 1), _mm512_slli_epi64(gap, DCAST_CPT_QESC));
	*c = _mm512_mask_blend_epi64(esc, _mm512_or_si512(ones, low), big);
	return _mm512_mask_blend_epi64(esc, _mm512_add_epi64(q, e_set(1 + p->k)),
				       e_set(DCAST_CPT_QESC + DCAST_CPT_GAP_BITS));
}

/* The value codes, looked up by permutes: t[0..3] the whole code of the
 * differences below 64, bits | length << 24 (16 to a vector); t[4..6]
 * each symbol's, code | length << 16 | extra bits << 24. */
typedef struct etab {
	__m512i t[7];
} etab;

/* 32-bit entries i (the low 6 bits of each 64-bit lane) of a 64-entry
 * table t[0..3]. */
static AVX512 ALWAYS_INLINE __m512i e_lookup(const __m512i *t, __m512i i)
{
	__m512i lo = _mm512_maskz_permutex2var_epi32(0x5555, t[0], i, t[1]);
	__m512i hi = _mm512_maskz_permutex2var_epi32(0x5555, t[2], i, t[3]);
	return _mm512_mask_blend_epi64(_mm512_test_epi64_mask(i, e_set(32)), lo, hi);
}

/* Value codes of differences z from their symbols: bits into *c, lengths
 * returned. */
static AVX512 __m512i e_val_sym(const etab *t, __m512i z, __m512i *c)
{
	__m512i big = _mm512_sub_epi64(e_set(64 + DCAST_CPT_NDIRECT - 4), _mm512_lzcnt_epi64(z));
	__mmask8 dir = _mm512_cmple_epu64_mask(z, e_set(DCAST_CPT_NDIRECT));
	__m512i sym = _mm512_mask_blend_epi64(dir, big, _mm512_sub_epi64(z, e_set(1)));
	__m512i e = _mm512_maskz_permutex2var_epi32(0x5555, t->t[4], sym, t->t[5]); /* symbols 0..31 */
	e = _mm512_mask_blend_epi64(_mm512_cmpge_epu64_mask(sym, e_set(32)), e,
				    _mm512_maskz_permutexvar_epi32(0x5555, sym, t->t[6]));
	__m512i cl = _mm512_and_si512(_mm512_srli_epi64(e, 16), e_set(0xff)), eb = _mm512_srli_epi64(e, 24);
	__m512i x = _mm512_and_si512(z, _mm512_sub_epi64(_mm512_sllv_epi64(e_set(1), eb), e_set(1)));
	*c = _mm512_or_si512(_mm512_and_si512(e, e_set(0xffff)), _mm512_sllv_epi64(x, cl));
	return _mm512_add_epi64(cl, eb);
}

/* Value codes of 8 changes (coded mode) from zz[i]: bits into *c,
 * lengths returned; the differences below 64 by one lookup. */
static AVX512 ALWAYS_INLINE __m512i e_val(const etab *t, const uint32_t *zz, __mmask8 a, __m512i *c)
{
	__m512i z = _mm512_cvtepu32_epi64(_mm256_maskz_loadu_epi32(a, zz)), e = e_lookup(t->t, z);
	__mmask8 big = _mm512_cmpge_epu64_mask(z, e_set(64));
	*c = _mm512_and_si512(e, e_set(0xffffff));
	if (__builtin_expect(!big, 1))
		return _mm512_srli_epi64(e, 24);
	__m512i cb, L = e_val_sym(t, z, &cb);
	*c = _mm512_mask_blend_epi64(big, *c, cb);
	return _mm512_mask_blend_epi64(big, _mm512_srli_epi64(e, 24), L);
}

/* The common refill point, 16 lanes a vector: every code at most 16 bits
 * longer than the bits its lane holds, so a lane takes at most one word
 * and x, the lane's last word's known bits and the code above them, fits
 * 32 bits; the lanes' state (held, last word's bits, its slot) fits 32
 * bits at any point.  A point with a longer code widens the state and
 * runs 8 lanes a vector (e_vec, e_more). */
typedef struct venc16 {
	__m512i part[2], held[2], last[2];
	__m512i before; /* lane 15: the position before the next change */
	__m512i pbits;  /* position code bits, per lane */
} venc16;

/* What the rounds read: the changes, the plan, the value tables. */
typedef struct ectx {
	const dcast_changes *ch;
	const dcast_cpt_plan *p;
	const etab *t;
} ectx;

static AVX512 ALWAYS_INLINE __m512i h_set(uint32_t x)
{
	return _mm512_set1_epi32((int)x);
}

/* Position codes of 16 changes from pos (an escape's length 255, for
 * the wide path). */
static AVX512 ALWAYS_INLINE __m512i h_pos(const dcast_cpt_plan *p, const uint32_t *pos, __m512i *before, __mmask16 a,
					  __m512i *c)
{
	__m512i at = _mm512_maskz_loadu_epi32(a, pos);
	__m512i gap = _mm512_sub_epi32(_mm512_sub_epi32(at, _mm512_alignr_epi32(at, *before, 15)), h_set(1));
	__m512i q = _mm512_srlv_epi32(gap, h_set(p->k));
	__m512i ones = _mm512_sub_epi32(_mm512_sllv_epi32(h_set(1), q), h_set(1));
	*before = at;
	*c = _mm512_or_si512(ones, _mm512_sllv_epi32(_mm512_and_si512(gap, h_set((1u << p->k) - 1)),
						      _mm512_add_epi32(q, h_set(1))));
	return _mm512_mask_mov_epi32(_mm512_add_epi32(q, h_set(1 + p->k)), _mm512_cmpge_epu32_mask(q, h_set(DCAST_CPT_QESC)),
				     h_set(255));
}

/* Value codes of 16 changes from zz (a difference of 64 or more: length
 * 255, for the wide path). */
static AVX512 ALWAYS_INLINE __m512i h_val(const etab *t, const uint32_t *zz, __mmask16 a, __m512i *c)
{
	__m512i z = _mm512_maskz_loadu_epi32(a, zz);
	__m512i lo = _mm512_permutex2var_epi32(t->t[0], z, t->t[1]), hi = _mm512_permutex2var_epi32(t->t[2], z, t->t[3]);
	__m512i e = _mm512_mask_blend_epi32(_mm512_test_epi32_mask(z, h_set(32)), lo, hi);
	*c = _mm512_and_si512(e, h_set(0xffffff));
	return _mm512_mask_mov_epi32(_mm512_srli_epi32(e, 24), _mm512_cmpge_epu32_mask(z, h_set(64)), h_set(255));
}

/* One refill point of half h's lanes (a: those in the round), codes c of
 * lengths L <= held + 16: a lane takes a word when short of L bits,
 * which completes the word it took before. */
static AVX512 ALWAYS_INLINE void h_vec(vout *o, venc16 *s, unsigned h, __mmask16 a, __m512i c, __m512i L)
{
	__m512i hd = s->held[h], m16 = _mm512_maskz_mov_epi32(_mm512_cmpgt_epu32_mask(L, hd), h_set(16));
	__m512i x = _mm512_or_si512(s->part[h], _mm512_sllv_epi32(c, _mm512_sub_epi32(h_set(16), hd)));
	__mmask16 m1 = a & _mm512_test_epi32_mask(m16, m16);
	__m512i e = _mm512_or_si512(s->last[h], _mm512_slli_epi32(x, 16));
	_mm512_storeu_si512(o->fix + o->nfix, _mm512_maskz_compress_epi32(m1, e));
	o->nfix += (unsigned)__builtin_popcount(m1);
	__m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
	s->last[h] = _mm512_mask_expand_epi32(s->last[h], m1, _mm512_add_epi32(iota, h_set(o->cur)));
	o->cur += (unsigned)__builtin_popcount(m1);
	s->part[h] = _mm512_mask_srlv_epi32(s->part[h], a, x, m16);
	s->held[h] = _mm512_mask_mov_epi32(hd, a, _mm512_sub_epi32(_mm512_add_epi32(hd, m16), L));
}

/* Half h (0, 1) of a 32-bit state vector as 8 64-bit lanes, and back. */
static AVX512 ALWAYS_INLINE __m512i h_wide(__m512i x, unsigned h)
{
	return _mm512_cvtepu32_epi64(h ? _mm512_extracti64x4_epi64(x, 1) : _mm512_castsi512_si256(x));
}

static AVX512 ALWAYS_INLINE __m512i h_narrow(__m512i lo, __m512i hi)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)), _mm512_cvtepi64_epi32(hi), 1);
}

/* A refill point with a code longer than 16 bits, 8 lanes a vector, its
 * codes made again (val: the value codes; before0: the positions'
 * vector before this round's). */
static AVX512 __attribute__((noinline)) void h_long(vout *o, venc16 *s, const ectx *x, uint64_t i, uint32_t am,
						     __m512i before0, int val)
{
	__mmask8 act[4] = { (__mmask8)am, (__mmask8)(am >> 8), (__mmask8)(am >> 16), (__mmask8)(am >> 24) };
	__m512i pbits = _mm512_setzero_si512();
	elate late;
	venc w;
	late.any = 0;
	w.before = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(_mm512_permutexvar_epi32(h_set(15), before0)));
	for (unsigned v = 0; v < 4; v++)
		w.part[v] = h_wide(s->part[v / 2], v & 1), w.held[v] = h_wide(s->held[v / 2], v & 1),
		w.last[v] = h_wide(s->last[v / 2], v & 1);
	for (unsigned v = 0; v < 4; v++) {
		__m512i c, L = val ? e_val(x->t, x->ch->zz + i + 8 * v, act[v], &c)
				   : e_pos(x->p, x->ch->pos + i + 8 * v, &w.before, act[v], &c);
		pbits = _mm512_mask_add_epi64(pbits, val ? 0 : act[v], pbits, L);
		e_vec(o, &w, v, act[v], c, L, &late);
	}
	if (late.any)
		e_more(o, &w, &late);
	for (unsigned h = 0; h < 2; h++)
		s->part[h] = h_narrow(w.part[2 * h], w.part[2 * h + 1]), s->held[h] = h_narrow(w.held[2 * h], w.held[2 * h + 1]),
		s->last[h] = h_narrow(w.last[2 * h], w.last[2 * h + 1]);
	o->pbits += (uint64_t)_mm512_reduce_add_epi64(pbits);
}

/* One round of changes [i, i + 32) of the range (am: the lanes in it):
 * its position codes' refill point, then its value codes'. */
static AVX512 ALWAYS_INLINE void h_round(vout *o, venc16 *s, const ectx *x, uint64_t i, uint32_t am)
{
	__mmask16 act[2] = { (__mmask16)am, (__mmask16)(am >> 16) }, lng = 0;
	__m512i c[2], L[2], before0 = s->before;
	for (unsigned h = 0; h < 2; h++) {
		L[h] = h_pos(x->p, x->ch->pos + i + 16 * h, &s->before, act[h], &c[h]);
		lng |= act[h] & _mm512_cmpgt_epu32_mask(L[h], _mm512_add_epi32(s->held[h], h_set(16)));
	}
	if (lng)
		h_long(o, s, x, i, am, before0, 0);
	for (unsigned h = 0; !lng && h < 2; h++) {
		s->pbits = _mm512_mask_add_epi32(s->pbits, act[h], s->pbits, L[h]);
		h_vec(o, s, h, act[h], c[h], L[h]);
	}
	lng = 0;
	for (unsigned h = 0; h < 2; h++) {
		L[h] = h_val(x->t, x->ch->zz + i + 16 * h, act[h], &c[h]);
		lng |= act[h] & _mm512_cmpgt_epu32_mask(L[h], _mm512_add_epi32(s->held[h], h_set(16)));
	}
	if (lng)
		h_long(o, s, x, i, am, before0, 1);
	for (unsigned h = 0; !lng && h < 2; h++)
		h_vec(o, s, h, act[h], c[h], L[h]);
}

/* A block of n changes from `first` into out; returns its words. */
static AVX512 uint32_t e_blk(const ectx *x, uint64_t first, uint32_t n, uint8_t *out, uint32_t *fix, uint64_t *pos_bits)
{
	vout o = { 0, 0, fix, 0 };
	venc16 s;
	uint32_t r = 0, took = n < DCAST_CPT2_LANES ? (1u << n) - 1 : 0xffffffffu; /* lanes with a word */
	for (unsigned h = 0; h < 2; h++)
		s.part[h] = s.held[h] = s.last[h] = _mm512_setzero_si512();
	s.pbits = _mm512_setzero_si512();
	s.before = h_set(first ? x->ch->pos[first - 1] : UINT32_MAX);
	for (; r + DCAST_CPT2_LANES <= n; r += DCAST_CPT2_LANES) /* the mask a constant: no lane masked */
		h_round(&o, &s, x, first + r, 0xffffffffu);
	if (r < n)
		h_round(&o, &s, x, first + r, (1u << (n - r)) - 1);
	for (unsigned h = 0; h < 2; h++) {
		__mmask16 m = (__mmask16)(took >> 16 * h);
		__m512i e = _mm512_or_si512(s.last[h], _mm512_slli_epi32(s.part[h], 16));
		_mm512_storeu_si512(fix + o.nfix, _mm512_maskz_compress_epi32(m, e));
		o.nfix += (unsigned)__builtin_popcount(m);
	}
#pragma GCC unroll 4
	for (uint32_t f = 0; f < o.nfix; f++) {
		uint16_t w = (uint16_t)(fix[f] >> 16);
		memcpy(out + 2 * (fix[f] & 0xffff), &w, 2);
	}
	/* a store a word and a junk one a lane; slots fit 16 bits */
	DCAST_ASSERT(o.nfix == o.cur + (unsigned)__builtin_popcount(took) && o.cur <= DCAST_CPT2_LANES * LANE_WORDS);
	*pos_bits += o.pbits + (uint64_t)_mm512_reduce_add_epi32(s.pbits);
	return o.cur;
}

/* Stores one AVX-512 block may list (one a word: a lane's 128 codes of
 * at most 46 + 43 bits), and the 8 a store writes. */
#define V2_FIXES (DCAST_CPT2_LANES * (LANE_WORDS + 1) + 16)

/* The value code tables of e_val. */
static AVX512 void etab_make(const dcast_cpt_plan *p, etab *t)
{
	uint32_t ent[112] = { 0 };
	for (uint32_t z = 1; z < 64 && z < (1ull << p->w); z++) {
		unsigned len;
		ent[z] = (uint32_t)dcast_cpt_value_bits(p, z, 0, &len) | len << 24;
	}
	for (unsigned s = 0; s < dcast_cpt_nsym(p->w); s++)
		ent[64 + s] = p->table.code[s] | (uint32_t)p->table.len[s] << 16 | dcast_cpt_extra_bits(s) << 24;
	for (unsigned i = 0; i < 7; i++)
		t->t[i] = _mm512_loadu_si512(ent + 16 * i);
}

static uint32_t e_blk_any(const void *x, uint64_t first, uint32_t n, uint8_t *out, uint32_t *fix,
			  uint64_t *pos_bits)
{
	return e_blk(x, first, n, out, fix, pos_bits);
}

/* The blocks' words by the AVX-512 build (coded values); w: the stream. */
static uint8_t *blocks_avx512(const dcast_changes *ch, const dcast_cpt_plan *p, uint8_t *idx, uint8_t *stream,
			      uint64_t *pos_bits)
{
	uint32_t *fix = dcast_scratch(DCAST_SCRATCH_CPT2, V2_FIXES * sizeof(*fix));
	etab t;
	ectx x = { ch, p, &t };
	if (!fix)
		return NULL;
	etab_make(p, &t);
	return blocks_each(ch, idx, stream, e_blk_any, &x, fix, pos_bits);
}
#endif

/* ---- AVX2: the 32 lanes as 4 vectors of 8 ---- */
#if defined(__x86_64__)

static AVX2 ALWAYS_INLINE __m256i a_set(uint32_t x)
{
	return _mm256_set1_epi32((int)x);
}

static AVX2 ALWAYS_INLINE unsigned a_mask(__m256i m)
{
	return (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(m));
}

/* Lanes j < cnt of a vector (all ones, or all zeros at cnt <= 0). */
static AVX2 ALWAYS_INLINE __m256i a_first(int cnt)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 words from p, the lanes of act (all: a plain load). */
static AVX2 ALWAYS_INLINE __m256i a_load(const uint32_t *p, __m256i act, int all)
{
	if (all)
		return _mm256_loadu_si256((const __m256i *)(const void *)p);
	return _mm256_maskload_epi32((const int *)(const void *)p, act);
}

/* Where lane j of a vector of mask m takes from among the lanes that take
 * (its rank in m), one byte a lane: the index of an expand, and the
 * slot past the first of a pass. */
#define RK(m, j) ((uint64_t)__builtin_popcount((m) & ((1u << (j)) - 1)) << (8 * (j)))
#define RANK(m) (RK(m, 1) | RK(m, 2) | RK(m, 3) | RK(m, 4) | RK(m, 5) | RK(m, 6) | RK(m, 7))
#define RANK4(m) RANK(m), RANK(m + 1), RANK(m + 2), RANK(m + 3)
#define RANK16(m) RANK4(m), RANK4(m + 4), RANK4(m + 8), RANK4(m + 12)
#define RANK64(m) RANK16(m), RANK16(m + 16), RANK16(m + 32), RANK16(m + 48)
static const uint64_t a_rank[256] = { RANK64(0), RANK64(64), RANK64(128), RANK64(192) };

static AVX2 ALWAYS_INLINE __m256i a_ranks(unsigned m)
{
	return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)&a_rank[m]));
}

/* ---- the encoder on AVX2 ---- */

/* Each lane's state as the AVX-512 build's 16 to a vector (venc16): held
 * (0..15) as the decoder counts them, the known low bits of the last
 * word it took (16 - held of them), that word's slot; a word is listed
 * for its slot once complete (a lane's first word: junk into slot 0
 * first, stored over later), the list applied at the block's end.  The
 * lanes of a point with a code more than 16 bits longer than they hold
 * take their second and third words lane by lane (a_long). */
typedef struct aenc {
	__m256i part[4], held[4], last[4];
	__m256i pbits;       /* position code bits, per lane */
	uint32_t cur, nfix;  /* slots given, stores listed */
	uint32_t again;      /* of those, words listed again (a_long) */
	uint32_t *fix;       /* the stores, slot | word << 16, in order */
} aenc;

/* What the rounds read: the changes, the plan, the value codes of the
 * differences below 64 (bits | length << 24) and each symbol's code
 * (code | length << 16 | extra bits << 24). */
typedef struct actx {
	const dcast_changes *ch;
	const dcast_cpt_plan *p;
	uint32_t vtab[64], stab[DCAST_CPT_NSYM_MAX];
	__m256i v64[8]; /* vtab in registers */
	__m256i s32[4]; /* stab[11..43) in registers: the symbols of 64 and more */
} actx;

/* Where the j-th lane of mask m is (a compress's index), one byte each. */
static uint64_t a_sel[256];
static pthread_once_t a_sel_once = PTHREAD_ONCE_INIT;

static void a_sel_make(void)
{
	for (unsigned m = 0; m < 256; m++)
		for (unsigned l = 0, j = 0; l < 8; l++)
			if (m >> l & 1)
				a_sel[m] |= (uint64_t)l << 8 * j++;
}

/* The lanes of m to the list of stores: the word x >> 16 of each into
 * slot x & 0xffff (8 entries written, those of m kept). */
static AVX2 ALWAYS_INLINE void a_put(aenc *s, __m256i x, unsigned m)
{
	__m256i sel = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)&a_sel[m]));
	_mm256_storeu_si256((__m256i *)(void *)(s->fix + s->nfix), _mm256_permutevar8x32_epi32(x, sel));
	s->nfix += (unsigned)__builtin_popcount(m);
}

/* Position codes of vector v's lanes (act) of the round from change i:
 * bits into *c (their low 32; an escape's code only by a_long), lengths
 * returned. */
static AVX2 ALWAYS_INLINE __m256i a_epos(const actx *x, uint64_t i, __m256i act, int all, __m256i *c)
{
	const uint32_t *pos = x->ch->pos + i;
	unsigned k = x->p->k;
	__m256i at = a_load(pos, act, all), prev, one = a_set(1);
	if (i)
		prev = a_load(pos - 1, act, all);
	else /* the range's first change: as after position -1 */
		prev = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(at, _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6)),
					  a_set(UINT32_MAX), 1);
	__m256i gap = _mm256_sub_epi32(_mm256_sub_epi32(at, prev), one);
	__m256i q = _mm256_srl_epi32(gap, _mm_cvtsi32_si128((int)k));
	__m256i ones = _mm256_sub_epi32(_mm256_sllv_epi32(one, q), one);
	__m256i low = _mm256_and_si256(gap, a_set((1u << k) - 1));
	*c = _mm256_or_si256(ones, _mm256_sllv_epi32(low, _mm256_add_epi32(q, one)));
	__m256i esc = _mm256_cmpgt_epi32(q, a_set(DCAST_CPT_QESC - 1)); /* gaps are below 2^26 */
	return _mm256_blendv_epi8(_mm256_add_epi32(q, a_set(1 + k)), a_set(DCAST_CPT_QESC + DCAST_CPT_GAP_BITS), esc);
}

/* Floor of log2 of each lane (above 0; exact as a float below 2^24). */
static AVX2 ALWAYS_INLINE __m256i a_log2(__m256i z)
{
	__m256i e = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(z)), 23);
	return _mm256_sub_epi32(_mm256_and_si256(e, a_set(0xff)), a_set(127));
}

/* Lanes of a or b by bit `bit` of z. */
static AVX2 ALWAYS_INLINE __m256i a_vblend(__m256i a, __m256i b, __m256i z, int bit)
{
	return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b),
						    _mm256_castsi256_ps(_mm256_slli_epi32(z, 31 - bit))));
}

/* Value codes of differences z of 64 or more, from their symbols (bit
 * length + 4, 11 to 36, looked up by permutes): bits into *c (their low
 * 32), lengths returned. */
static AVX2 ALWAYS_INLINE __m256i a_eval_sym(const actx *x, __m256i z, __m256i *c)
{
	__m256i one = a_set(1), lg, j, q[4];
	z = _mm256_max_epu32(z, a_set(64)); /* the other lanes: a symbol in the table */
	lg = a_log2(z);
	if (x->p->w > 24) { /* above 2^24 a float rounds: the log of z >> 8 */
		__m256i hi = _mm256_srli_epi32(z, 8);
		__m256i is_hi = _mm256_xor_si256(_mm256_cmpeq_epi32(hi, _mm256_setzero_si256()), a_set(~0u));
		lg = _mm256_blendv_epi8(lg, _mm256_add_epi32(a_log2(hi), a_set(8)), is_hi);
	}
	j = _mm256_sub_epi32(lg, a_set(6));
#pragma GCC unroll 4
	for (unsigned t = 0; t < 4; t++)
		q[t] = _mm256_permutevar8x32_epi32(x->s32[t], j);
	__m256i e = a_vblend(a_vblend(q[0], q[1], j, 3), a_vblend(q[2], q[3], j, 3), j, 4);
	__m256i cl = _mm256_and_si256(_mm256_srli_epi32(e, 16), a_set(0xff)), eb = _mm256_srli_epi32(e, 24);
	__m256i low = _mm256_and_si256(z, _mm256_sub_epi32(_mm256_sllv_epi32(one, eb), one));
	*c = _mm256_or_si256(_mm256_and_si256(e, a_set(0xffff)), _mm256_sllv_epi32(low, cl));
	return _mm256_add_epi32(cl, eb);
}

/* vtab[z & 15] of each lane: two permutes. */
static AVX2 ALWAYS_INLINE __m256i a_vlook16(const actx *x, __m256i z)
{
	return a_vblend(_mm256_permutevar8x32_epi32(x->v64[0], z), _mm256_permutevar8x32_epi32(x->v64[1], z), z, 3);
}

/* vtab[z & 63] of each lane: eight permutes, no branch. */
static AVX2 ALWAYS_INLINE __m256i a_vlook64(const actx *x, __m256i z)
{
	__m256i q[4];
#pragma GCC unroll 4
	for (unsigned j = 0; j < 4; j++)
		q[j] = a_vblend(_mm256_permutevar8x32_epi32(x->v64[2 * j], z),
				_mm256_permutevar8x32_epi32(x->v64[2 * j + 1], z), z, 3);
	return a_vblend(a_vblend(q[0], q[1], z, 4), a_vblend(q[2], q[3], z, 4), z, 5);
}

/* How a point's differences are looked up, from all of them or'ed: the
 * table's first 16, all 64, those and the symbols of 64 or more. */
enum { A_V16, A_V64, A_VSYM };

static AVX2 ALWAYS_INLINE int a_vtier(__m256i zor)
{
	return _mm256_testz_si256(zor, a_set(~15u)) ? A_V16 : _mm256_testz_si256(zor, a_set(~63u)) ? A_V64 : A_VSYM;
}

/* Value codes of differences z (tier: a_vtier's for the point): bits
 * into *c, lengths returned. */
static AVX2 ALWAYS_INLINE __m256i a_eval(const actx *x, __m256i z, int tier, __m256i *c)
{
	__m256i e = tier == A_V16 ? a_vlook16(x, z) : a_vlook64(x, z);
	*c = _mm256_and_si256(e, a_set(0xffffff));
	if (tier != A_VSYM)
		return _mm256_srli_epi32(e, 24);
	__m256i big = _mm256_xor_si256(_mm256_cmpeq_epi32(_mm256_and_si256(z, a_set(~63u)), _mm256_setzero_si256()),
				       a_set(~0u));
	__m256i cb, L = a_eval_sym(x, z, &cb);
	*c = _mm256_blendv_epi8(*c, cb, big);
	return _mm256_blendv_epi8(_mm256_srli_epi32(e, 24), L, big);
}

/* The first pass of a refill point of vector v's lanes, codes c (their
 * low 32 bits) of lengths L (0 for a lane not in the round, which keeps
 * its state): a lane short of L bits takes a word,
 * which completes the word it took before (the state right for a code at
 * most held + 16 bits long; a_long does the others). */
static AVX2 ALWAYS_INLINE void a_evec(aenc *s, unsigned v, __m256i c, __m256i L)
{
	__m256i hd = s->held[v], take = _mm256_cmpgt_epi32(L, hd);
	__m256i m16 = _mm256_and_si256(take, a_set(16));
	__m256i x = _mm256_or_si256(s->part[v], _mm256_sllv_epi32(c, _mm256_sub_epi32(a_set(16), hd)));
	unsigned m = a_mask(take);
	a_put(s, _mm256_or_si256(s->last[v], _mm256_slli_epi32(x, 16)), m);
	s->last[v] = _mm256_blendv_epi8(s->last[v], _mm256_add_epi32(a_ranks(m), a_set(s->cur)), take);
	s->cur += (unsigned)__builtin_popcount(m);
	s->part[v] = _mm256_srlv_epi32(x, m16);
	s->held[v] = _mm256_sub_epi32(_mm256_add_epi32(hd, m16), L);
}

/* Lane l's code at a point (val: its value code) of the round from
 * change i, lane by lane; its length into *len. */
static uint64_t a_code(const actx *x, uint64_t i, unsigned l, int val, unsigned *len)
{
	const uint32_t *pos = x->ch->pos;
	if (val)
		return dcast_cpt_value_bits(x->p, x->ch->zz[i + l], 0, len);
	uint32_t gap = pos[i + l] - (i + l ? pos[i + l - 1] + 1 : 0);
	*len = dcast_rice_len(gap, x->p->k);
	return dcast_rice_bits(gap, x->p->k);
}

/* The lanes' held bits and known bits before a refill point. */
typedef struct abefore {
	uint32_t part[DCAST_CPT2_LANES], held[DCAST_CPT2_LANES], last[DCAST_CPT2_LANES];
} abefore;

/* The passes after the first of a point's lanes of `lng`, whose codes
 * are more than 16 bits longer than they held (b): the word the first
 * pass completed listed again from the whole code (the vectors have its
 * low 32 bits, an escape's not even those); in lane order, each lane's
 * second word, then the third of those that need it, each word listed
 * as the next one completes it; then their state. */
static AVX2 __attribute__((noinline)) void a_long(aenc *s, const actx *x, uint64_t i, int val, uint32_t lng,
						   const abefore *b)
{
	uint32_t part[DCAST_CPT2_LANES], held[DCAST_CPT2_LANES], last[DCAST_CPT2_LANES];
	uint64_t code[DCAST_CPT2_LANES];
	unsigned len[DCAST_CPT2_LANES];
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++)
		_mm256_storeu_si256((__m256i *)(void *)(last + 8 * v), s->last[v]);
	for (uint32_t m = lng; m; m &= m - 1) {
		unsigned l = (unsigned)__builtin_ctz(m);
		code[l] = b->part[l] | a_code(x, i, l, val, &len[l]) << (16 - b->held[l]);
		s->fix[s->nfix++] = b->last[l] | (uint32_t)code[l] << 16;
		s->again++;
	}
	for (unsigned pass = 1; pass < 3; pass++)
		for (uint32_t m = lng; m; m &= m - 1) {
			unsigned l = (unsigned)__builtin_ctz(m);
			if (len[l] <= b->held[l] + 16 * pass)
				continue;
			s->fix[s->nfix++] = last[l] | (uint32_t)(code[l] >> 16 * pass) << 16;
			last[l] = s->cur++;
		}
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		_mm256_storeu_si256((__m256i *)(void *)(part + 8 * v), s->part[v]);
		_mm256_storeu_si256((__m256i *)(void *)(held + 8 * v), s->held[v]);
	}
	for (uint32_t m = lng; m; m &= m - 1) {
		unsigned l = (unsigned)__builtin_ctz(m), words = (len[l] - b->held[l] + 15) / 16;
		part[l] = (uint32_t)(code[l] >> 16 * words), held[l] = b->held[l] + 16 * words - len[l];
	}
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		s->part[v] = _mm256_loadu_si256((const __m256i *)(const void *)(part + 8 * v));
		s->held[v] = _mm256_loadu_si256((const __m256i *)(const void *)(held + 8 * v));
		s->last[v] = _mm256_loadu_si256((const __m256i *)(const void *)(last + 8 * v));
	}
}

/* One refill point of the round from change i, lanes [0, nl) (val: the
 * value codes). */
static AVX2 ALWAYS_INLINE void a_epoint(aenc *s, const actx *x, uint64_t i, unsigned nl, int val)
{
	__m256i act[4], c[4], L[4], z[4], over[4], any = _mm256_setzero_si256(), zor = any;
	uint32_t lng = 0;
	abefore b;
	int tier = A_V16;
#pragma GCC unroll 4
	for (unsigned v = 0; val && v < 4; v++) {
		act[v] = a_first((int)nl - 8 * (int)v);
		z[v] = a_load(x->ch->zz + i + 8 * v, act[v], nl == DCAST_CPT2_LANES);
		zor = _mm256_or_si256(zor, z[v]);
	}
	if (val)
		tier = a_vtier(zor);
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		act[v] = a_first((int)nl - 8 * (int)v);
		L[v] = val ? a_eval(x, z[v], tier, &c[v]) : a_epos(x, i + 8 * v, act[v], nl == DCAST_CPT2_LANES, &c[v]);
		if (nl != DCAST_CPT2_LANES)
			L[v] = _mm256_and_si256(L[v], act[v]), c[v] = _mm256_and_si256(c[v], act[v]);
		over[v] = _mm256_cmpgt_epi32(_mm256_sub_epi32(L[v], s->held[v]), a_set(16));
		any = _mm256_or_si256(any, over[v]);
	}
	if (!_mm256_testz_si256(any, any))
		for (unsigned v = 0; v < 4; v++)
			lng |= a_mask(over[v]) << 8 * v;
#pragma GCC unroll 4
	for (unsigned v = 0; lng && v < 4; v++) {
		_mm256_storeu_si256((__m256i *)(void *)(b.part + 8 * v), s->part[v]);
		_mm256_storeu_si256((__m256i *)(void *)(b.held + 8 * v), s->held[v]);
		_mm256_storeu_si256((__m256i *)(void *)(b.last + 8 * v), s->last[v]);
	}
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) { /* every lane's first pass */
		if (!val)
			s->pbits = _mm256_add_epi32(s->pbits, L[v]);
		a_evec(s, v, c[v], L[v]);
	}
	if (lng) { /* on a copy: the state's address stays here, in registers */
		aenc t = *s;
		a_long(&t, x, i, val, lng, &b);
		*s = t;
	}
}

/* A block of n changes from `first` into out; returns its words. */
static AVX2 uint32_t a_eblk(const actx *x, uint64_t first, uint32_t n, uint8_t *out, uint32_t *fix, uint64_t *pos_bits)
{
	aenc s;
	uint32_t r = 0, pb[8];
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++)
		s.part[v] = s.held[v] = s.last[v] = _mm256_setzero_si256();
	s.pbits = _mm256_setzero_si256();
	s.cur = s.nfix = s.again = 0, s.fix = fix;
	for (; r + DCAST_CPT2_LANES <= n; r += DCAST_CPT2_LANES) { /* nl a constant: no lane masked */
		a_epoint(&s, x, first + r, DCAST_CPT2_LANES, 0);
		a_epoint(&s, x, first + r, DCAST_CPT2_LANES, 1);
	}
	if (r < n) {
		a_epoint(&s, x, first + r, n - r, 0);
		a_epoint(&s, x, first + r, n - r, 1);
	}
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) /* the last words of the lanes that took any */
		a_put(&s, _mm256_or_si256(s.last[v], _mm256_slli_epi32(s.part[v], 16)), a_mask(a_first((int)n - 8 * (int)v)));
#pragma GCC unroll 4
	for (uint32_t f = 0; f < s.nfix; f++) {
		uint16_t w = (uint16_t)(fix[f] >> 16);
		memcpy(out + 2 * (fix[f] & 0xffff), &w, 2);
	}
	_mm256_storeu_si256((__m256i *)(void *)pb, s.pbits);
	for (unsigned v = 0; v < 8; v++)
		*pos_bits += pb[v];
	/* a store a word and a junk one a lane; slots fit 16 bits */
	DCAST_ASSERT(s.nfix == s.cur + (n < DCAST_CPT2_LANES ? n : DCAST_CPT2_LANES) + s.again &&
		     s.cur <= DCAST_CPT2_LANES * LANE_WORDS);
	return s.cur;
}

/* Stores one AVX2 block may list: V2_FIXES and a word listed again for
 * each long code (which takes two words or three). */
#define A2_FIXES (V2_FIXES + DCAST_CPT2_LANES * LANE_WORDS / 2)

static uint32_t a_eblk_any(const void *x, uint64_t first, uint32_t n, uint8_t *out, uint32_t *fix,
			   uint64_t *pos_bits)
{
	return a_eblk(x, first, n, out, fix, pos_bits);
}

/* The blocks' words by the AVX2 build (coded values). */
static uint8_t *blocks_avx2(const dcast_changes *ch, const dcast_cpt_plan *p, uint8_t *idx, uint8_t *stream,
			    uint64_t *pos_bits)
{
	actx x = { .ch = ch, .p = p };
	uint32_t *fix = dcast_scratch(DCAST_SCRATCH_CPT2, A2_FIXES * sizeof(*fix));
	if (!fix)
		return NULL;
	pthread_once(&a_sel_once, a_sel_make);
	for (uint32_t z = 1; z < 64 && z < (1ull << p->w); z++) {
		unsigned len;
		x.vtab[z] = (uint32_t)dcast_cpt_value_bits(p, z, 0, &len) | len << 24;
	}
	for (unsigned sym = 0; sym < dcast_cpt_nsym(p->w); sym++)
		x.stab[sym] = p->table.code[sym] | (uint32_t)p->table.len[sym] << 16 | dcast_cpt_extra_bits(sym) << 24;
	memcpy(x.v64, x.vtab, sizeof(x.v64));
	memcpy(x.s32, x.stab + 11, sizeof(x.stab) - 11 * sizeof(*x.stab));
	return blocks_each(ch, idx, stream, a_eblk_any, &x, fix, pos_bits);
}
#endif

/* The scalar build's blocks: each lane's stream, then the words laid
 * out. */
typedef struct {
	blk_enc *e;
	const dcast_changes *ch;
	const dcast_cpt_plan *p;
	const void *cur;
	unsigned es;
} plain_ctx;

static uint32_t plain_blk(const void *x, uint64_t first, uint32_t n, uint8_t *out, uint32_t *fix,
			  uint64_t *pos_bits)
{
	const plain_ctx *c = x;

	(void)fix;
	blk_codes(c->e, c->ch, c->p, c->cur, c->es, first, n, pos_bits);
	return (uint32_t)((blk_lay(c->e, n, out) - out) / 2);
}

static uint8_t *blocks_plain(const dcast_changes *ch, const dcast_cpt_plan *p, const void *cur, unsigned es,
			     uint8_t *idx, uint8_t *stream, uint64_t *pos_bits)
{
	plain_ctx x = { dcast_scratch(DCAST_SCRATCH_CPT2, sizeof(blk_enc)), ch, p, cur, es };

	if (!x.e)
		return NULL;
	vtab_make(x.e, p);
	return blocks_each(ch, idx, stream, plain_blk, &x, NULL, pos_bits);
}

uint64_t dcast_cpt2_emit(const dcast_changes *ch, const dcast_cpt_plan *p, const void *cur, unsigned es,
			 uint8_t *out, uint64_t *pos_bits)
{
	uint8_t *idx = out + dcast_cpt_hdr_bytes(p->mode, p->w);
	uint8_t *stream = idx + dcast_cpt2_index_bytes(ch->n), *w;
	dcast_cpt_hdr_write(p, out);
	*pos_bits = 0;
#if defined(__x86_64__)
	if (p->mode == DCAST_CPT_CODED && dcast_cpt2_build() == DCAST_CPT2_AVX512)
		w = blocks_avx512(ch, p, idx, stream, pos_bits);
	else if (p->mode == DCAST_CPT_CODED && dcast_cpt2_build() == DCAST_CPT2_AVX2)
		w = blocks_avx2(ch, p, idx, stream, pos_bits);
	else
#endif
		w = blocks_plain(ch, p, cur, es, idx, stream, pos_bits);
	return w ? (uint64_t)(w - out) : 0;
}

/* ---- the decoder ---- */

/* The fast path: the same refills and codes with the lanes' state in
 * local arrays, each lane's first refill of a code and its decode in one
 * step (a second or third refill, which only long codes need, after the
 * others in lane order, as the passes order them), a value lookup that
 * resolves the extra bits' place, and the checks gathered per round.  On
 * any failure it stops, and the reference decoder (dcast_cpt2_blk_run)
 * runs from the start to name the problem. */
typedef struct fast2 {
	const uint8_t *w;        /* the stream's words */
	const uint16_t *lut;     /* code length | extra bits << 4 | direct value << 9; 0: none */
	uint64_t nwords, count, kmask;
	unsigned k, raw, w_bits, build; /* a vector build: w is a copy with zeros after it */
} fast2;

/* A block's lanes and where the decode is. */
typedef struct lanes2 {
	uint64_t buf[DCAST_CPT2_LANES];
	uint32_t n[DCAST_CPT2_LANES];
	uint64_t at, next;
} lanes2;

static ALWAYS_INLINE uint64_t word_at(const fast2 *f, uint64_t j)
{
	static const uint8_t zero[2];
	uint16_t v;
	memcpy(&v, j < f->nwords ? f->w + 2 * j : zero, 2); /* a select, not a branch */
	return v;
}

static ALWAYS_INLINE unsigned pos_len(const fast2 *f, uint64_t b, unsigned *t)
{
	*t = (unsigned)__builtin_ctzll(~b);
	return *t >= DCAST_CPT_QESC ? DCAST_CPT_QESC + DCAST_CPT_GAP_BITS : *t + 1 + f->k;
}

static ALWAYS_INLINE unsigned val_len(const fast2 *f, uint64_t b, unsigned *e, int raw)
{
	if (raw)
		return f->w_bits;
	*e = f->lut[b & (DCAST_CPT_LUT_SIZE - 1)];
	return *e ? (*e & 15) + ((*e >> 4) & 31) : DCAST_CPT_LMAX + 1;
}

static ALWAYS_INLINE unsigned code_len(const fast2 *f, uint64_t b, int val, unsigned *aux, int raw)
{
	return val ? val_len(f, b, aux, raw) : pos_len(f, b, aux);
}

/* The code at the front of b (its length len, aux from code_len). */
static ALWAYS_INLINE uint32_t code_of(const fast2 *f, uint64_t b, int val, unsigned aux, int raw)
{
	unsigned cl = aux & 15, eb = (aux >> 4) & 31;
	if (!val)
		return aux >= DCAST_CPT_QESC ? (uint32_t)(b >> DCAST_CPT_QESC) & ((1u << DCAST_CPT_GAP_BITS) - 1)
					     : (uint32_t)(aux << f->k) | ((uint32_t)(b >> (aux + 1)) & (uint32_t)f->kmask);
	if (raw)
		return (uint32_t)b & dcast_mask_w(f->w_bits);
	return (aux >> 9) + (eb ? 1u << eb : 0) + ((uint32_t)(b >> cl) & ((1u << eb) - 1));
}

/* Lane l's code into *out when it holds it whole, after at most one
 * word; 0 when it needs more (its buffer kept). */
static ALWAYS_INLINE int lane_step(const fast2 *f, lanes2 *s, unsigned l, int val, int raw, uint32_t *out)
{
	uint64_t b = s->buf[l];
	unsigned n = s->n[l], aux = 0, len = code_len(f, b, val, &aux, raw);
	uint64_t need = n < len; /* without a branch: it goes either way about as often */
	b |= (word_at(f, s->at) << n) & (0 - need);
	s->at += need;
	n += DCAST_CPT2_WORD_BITS * (unsigned)need;
	len = code_len(f, b, val, &aux, raw);
	if (__builtin_expect(n < len, 0)) {
		s->buf[l] = b, s->n[l] = n;
		return 0;
	}
	*out = code_of(f, b, val, aux, raw);
	s->buf[l] = b >> len, s->n[l] = n - len;
	return 1;
}

/* The lanes of `late`: words in further passes (each still short takes
 * one, in lane order), then their codes; -1 for a code none matches. */
static int late_codes(const fast2 *f, lanes2 *s, uint32_t late, int val, int raw, uint32_t *out)
{
	uint32_t left = late, aux = 0;
	while (left) {
		for (uint32_t p = left; p; p &= p - 1) {
			unsigned l = (unsigned)__builtin_ctz(p);
			s->buf[l] |= word_at(f, s->at++) << s->n[l];
			s->n[l] += DCAST_CPT2_WORD_BITS;
			if (s->n[l] >= code_len(f, s->buf[l], val, &aux, raw))
				left &= ~(1u << l);
			else if (s->n[l] > 48)
				return -1;
		}
	}
	for (; late; late &= late - 1) {
		unsigned l = (unsigned)__builtin_ctz(late), len = code_len(f, s->buf[l], val, &aux, raw);
		out[l] = code_of(f, s->buf[l], val, aux, raw);
		s->buf[l] >>= len, s->n[l] -= len;
	}
	return 0;
}

/* One refill point and its codes for lanes [0, nl) into out. */
static ALWAYS_INLINE int codes_step(const fast2 *f, lanes2 *s, unsigned nl, int val, int raw, uint32_t *out)
{
	uint32_t late = 0;
	for (unsigned l = 0; l < nl; l++)
		late |= (uint32_t)!lane_step(f, s, l, val, raw, &out[l]) << l;
	return late ? late_codes(f, s, late, val, raw, out) : 0;
}

/* One round of nl lanes; 0, or -1 on any failure (a value code no code
 * matches shows as a length past the bits held). */
static ALWAYS_INLINE int round_fast(const fast2 *f, lanes2 *s, unsigned nl, uint32_t *pos, uint32_t *val, int raw)
{
	uint32_t gap[DCAST_CPT2_LANES];
	uint64_t next = s->next;
	if (codes_step(f, s, nl, 0, raw, gap))
		return -1;
	for (unsigned l = 0; l < nl; l++) {
		next += gap[l];
		pos[l] = (uint32_t)next++;
	}
	s->next = next;
	if (next > f->count || codes_step(f, s, nl, 1, raw, val))
		return -1;
	for (unsigned l = 0; !raw && l < nl; l++) /* 0: no code matched (a difference is never 0) */
		if (!val[l])
			return -1;
	return s->at > f->nwords ? -1 : 0;
}

/* The parameters copied to a local, which the output stores cannot
 * alias (so they stay in registers). */
static ALWAYS_INLINE int blk_fast_mode(const fast2 *fp, lanes2 *s, uint32_t n, uint32_t *pos, uint32_t *val, int raw)
{
	const fast2 local = *fp, *f = &local;
	for (uint32_t at = 0; at < n; at += DCAST_CPT2_LANES) {
		unsigned nl = n - at < DCAST_CPT2_LANES ? n - at : DCAST_CPT2_LANES;
		if (round_fast(f, s, nl, pos + at, val + at, raw))
			return -1;
	}
	for (unsigned l = 0; l < DCAST_CPT2_LANES; l++)
		if (s->buf[l])
			return -1;
	return 0;
}

/* blk_fast_mode for both value modes, for any target. */
static int blk_fast_plain(const fast2 *f, lanes2 *s, uint32_t n, uint32_t *pos, uint32_t *val)
{
	return f->raw ? blk_fast_mode(f, s, n, pos, val, 1) : blk_fast_mode(f, s, n, pos, val, 0);
}


/* ---- the fast path on AVX-512: the 32 lanes as 4 vectors of 8 ---- */
#if defined(__x86_64__)

/* The lanes of a block: buffers and bits held, lanes 8v..8v+7 in
 * vector v. */
typedef struct vlanes {
	__m512i buf[4], n[4];
} vlanes;

/* A refill point's code lengths and what code_of needs beside the
 * buffer (position: trailing ones; value: the lookup entry). */
typedef struct vcodes {
	__m512i len[4], aux[4];
} vcodes;

static AVX512 ALWAYS_INLINE __m512i v_set(uint64_t x)
{
	return _mm512_set1_epi64((long long)x);
}

/* Trailing ones of each buffer: ~b & (b + 1) is the lowest zero bit
 * (buffers are below 2^62). */
static AVX512 ALWAYS_INLINE __m512i v_ones(__m512i b)
{
	__m512i low = _mm512_andnot_si512(b, _mm512_add_epi64(b, v_set(1)));
	return _mm512_sub_epi64(v_set(63), _mm512_lzcnt_epi64(low));
}

static AVX512 ALWAYS_INLINE __m512i v_pos_len(const fast2 *f, __m512i b, __m512i *t)
{
	*t = v_ones(b);
	__mmask8 esc = _mm512_cmpge_epu64_mask(*t, v_set(DCAST_CPT_QESC));
	return _mm512_mask_blend_epi64(esc, _mm512_add_epi64(*t, v_set(1 + f->k)),
				       v_set(DCAST_CPT_QESC + DCAST_CPT_GAP_BITS));
}

/* The fast lookup's entry of each buffer's low 12 bits (the table has a
 * spare entry: a gather reads 4 bytes at each). */
static AVX512 ALWAYS_INLINE __m512i v_val_len(const fast2 *f, __m512i b, __m512i *e, int raw)
{
	*e = _mm512_setzero_si512();
	if (raw)
		return v_set(f->w_bits);
	__m512i i = _mm512_and_si512(b, v_set(DCAST_CPT_LUT_SIZE - 1));
	__m256i g = _mm512_i64gather_epi32(i, (const void *)f->lut, 2);
	*e = _mm512_and_si512(_mm512_cvtepu32_epi64(g), v_set(0xffff));
	__m512i len = _mm512_add_epi64(_mm512_and_si512(*e, v_set(15)),
				       _mm512_and_si512(_mm512_srli_epi64(*e, 4), v_set(31)));
	return _mm512_mask_blend_epi64(_mm512_test_epi64_mask(*e, *e), v_set(DCAST_CPT_LMAX + 1), len);
}

static AVX512 ALWAYS_INLINE void v_lens(const fast2 *f, const vlanes *s, vcodes *c, int val, int raw)
{
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++)
		c->len[v] = val ? v_val_len(f, s->buf[v], &c->aux[v], raw) : v_pos_len(f, s->buf[v], &c->aux[v]);
}

/* One pass: each lane of need takes the next word, lanes in order. */
static AVX512 ALWAYS_INLINE void v_take(const fast2 *f, vlanes *s, const __mmask8 *need, uint64_t *at)
{
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		__m128i w8 = _mm_loadu_si128((const __m128i *)(const void *)(f->w + 2 * *at));
		__m512i w = _mm512_maskz_expand_epi64(need[v], _mm512_cvtepu16_epi64(w8));
		s->buf[v] = _mm512_or_si512(s->buf[v], _mm512_sllv_epi64(w, s->n[v]));
		s->n[v] = _mm512_mask_add_epi64(s->n[v], need[v], s->n[v], v_set(DCAST_CPT2_WORD_BITS));
		*at += (unsigned)__builtin_popcount(need[v]);
	}
}

/* One refill point of the lanes in act: passes until every one holds
 * its code; c gets the codes' lengths. */
static AVX512 ALWAYS_INLINE void v_refill(const fast2 *f, vlanes *s, const __mmask8 *act, vcodes *c, int val,
					  int raw, uint64_t *at)
{
	__mmask8 need[4];
	unsigned any = 0;
	v_lens(f, s, c, val, raw);
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++)
		any |= need[v] = act[v] & _mm512_cmplt_epu64_mask(s->n[v], c->len[v]);
	while (any) {
		v_take(f, s, need, at);
		v_lens(f, s, c, val, raw);
		any = 0;
#pragma GCC unroll 4
		for (unsigned v = 0; v < 4; v++)
			any |= need[v] &= _mm512_cmplt_epu64_mask(s->n[v], c->len[v]);
	}
}

/* The codes used: the lanes of act drop them from their buffers. */
static AVX512 ALWAYS_INLINE void v_drop(vlanes *s, const __mmask8 *act, const vcodes *c)
{
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		s->buf[v] = _mm512_mask_srlv_epi64(s->buf[v], act[v], s->buf[v], c->len[v]);
		s->n[v] = _mm512_mask_sub_epi64(s->n[v], act[v], s->n[v], c->len[v]);
	}
}

/* Each gap plus one (t: trailing ones) into g[0..8) of the lanes of m. */
static AVX512 ALWAYS_INLINE void v_gap_store(const fast2 *f, __m512i b, __m512i t, __mmask8 m, uint32_t *g)
{
	__mmask8 esc = _mm512_cmpge_epu64_mask(t, v_set(DCAST_CPT_QESC));
	__m512i low = _mm512_and_si512(_mm512_srlv_epi64(b, _mm512_add_epi64(t, v_set(1))), v_set(f->kmask));
	__m512i gap = _mm512_or_si512(_mm512_sllv_epi64(t, v_set(f->k)), low);
	__m512i big = _mm512_and_si512(_mm512_srli_epi64(b, DCAST_CPT_QESC), v_set((1u << DCAST_CPT_GAP_BITS) - 1));
	gap = _mm512_mask_blend_epi64(esc, gap, big);
	_mm512_mask_cvtepi64_storeu_epi32(g, m, _mm512_add_epi64(gap, v_set(1)));
}

/* Each value (e: lookup entry) into o[0..8) of the lanes of m; returns
 * the lanes of m whose bits match no code. */
static AVX512 ALWAYS_INLINE __mmask8 v_val_store(const fast2 *f, __m512i b, __m512i e, __mmask8 m, uint32_t *o,
						 int raw)
{
	if (raw) {
		_mm512_mask_cvtepi64_storeu_epi32(o, m, _mm512_and_si512(b, v_set(dcast_mask_w(f->w_bits))));
		return 0;
	}
	__m512i cl = _mm512_and_si512(e, v_set(15)), eb = _mm512_and_si512(_mm512_srli_epi64(e, 4), v_set(31));
	__m512i top = _mm512_maskz_sllv_epi64(_mm512_test_epi64_mask(eb, eb), v_set(1), eb);
	__m512i x = _mm512_and_si512(_mm512_srlv_epi64(b, cl), _mm512_sub_epi64(_mm512_sllv_epi64(v_set(1), eb), v_set(1)));
	__m512i val = _mm512_add_epi64(_mm512_add_epi64(_mm512_srli_epi64(e, 9), top), x);
	_mm512_mask_cvtepi64_storeu_epi32(o, m, val);
	return m & ~_mm512_test_epi64_mask(e, e);
}

/* The lanes 16 to a vector, 32-bit buffers: between refill points a lane
 * holds fewer than 16 bits (it takes a word only while short of its
 * code, then uses the code), so a point's first pass always fits 32
 * bits; a point where a lane is still short after it (a code longer than
 * the bits then held: an escaped gap, a long value code) goes on with
 * the lanes 8 to a vector (v_refill), then back. */
typedef struct dlanes {
	__m512i buf[2], n[2];
} dlanes;

static AVX512 ALWAYS_INLINE __m512i d_set(uint32_t x)
{
	return _mm512_set1_epi32((int)x);
}

/* Each lane's code length and aux (trailing ones; the lookup entry), as
 * v_pos_len and v_val_len on 32-bit buffers (all ones: 32 ones). */
static AVX512 ALWAYS_INLINE __m512i d_len(const fast2 *f, __m512i b, int val, int raw, __m512i *aux)
{
	if (!val) {
		__m512i low = _mm512_andnot_si512(b, _mm512_add_epi32(b, d_set(1)));
		*aux = _mm512_sub_epi32(d_set(31), _mm512_lzcnt_epi32(low)); /* 31 - 32 wraps: past 20 */
		return _mm512_mask_blend_epi32(_mm512_cmpge_epu32_mask(*aux, d_set(DCAST_CPT_QESC)),
					       _mm512_add_epi32(*aux, d_set(1 + f->k)), d_set(DCAST_CPT_QESC + DCAST_CPT_GAP_BITS));
	}
	*aux = _mm512_setzero_si512();
	if (raw)
		return d_set(f->w_bits);
	__m512i g = _mm512_i32gather_epi32(_mm512_and_si512(b, d_set(DCAST_CPT_LUT_SIZE - 1)), (const void *)f->lut, 2);
	*aux = _mm512_and_si512(g, d_set(0xffff));
	__m512i len = _mm512_add_epi32(_mm512_and_si512(*aux, d_set(15)), _mm512_and_si512(_mm512_srli_epi32(*aux, 4), d_set(31)));
	return _mm512_mask_blend_epi32(_mm512_test_epi32_mask(*aux, *aux), d_set(DCAST_CPT_LMAX + 1), len);
}

/* The rest of a point 8 lanes a vector: further passes, the codes into
 * out, then the buffers back to 32 bits; -1 for a value with no code. */
static AVX512 __attribute__((noinline)) int d_long(const fast2 *f, dlanes *d, uint32_t am, int val, int raw,
						   uint64_t *at, uint32_t *out)
{
	__mmask8 act[4] = { (__mmask8)am, (__mmask8)(am >> 8), (__mmask8)(am >> 16), (__mmask8)(am >> 24) }, bad = 0;
	vlanes s;
	vcodes c;
	for (unsigned v = 0; v < 4; v++) {
		__m256i b = v & 1 ? _mm512_extracti64x4_epi64(d->buf[v / 2], 1) : _mm512_castsi512_si256(d->buf[v / 2]);
		__m256i n = v & 1 ? _mm512_extracti64x4_epi64(d->n[v / 2], 1) : _mm512_castsi512_si256(d->n[v / 2]);
		s.buf[v] = _mm512_cvtepu32_epi64(b), s.n[v] = _mm512_cvtepu32_epi64(n);
	}
	v_refill(f, &s, act, &c, val, raw, at);
	for (unsigned v = 0; v < 4; v++) {
		if (val)
			bad |= v_val_store(f, s.buf[v], c.aux[v], act[v], out + 8 * v, raw);
		else
			v_gap_store(f, s.buf[v], c.aux[v], act[v], out + 8 * v);
	}
	v_drop(&s, act, &c);
	for (unsigned h = 0; h < 2; h++) {
		d->buf[h] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(s.buf[2 * h])),
					       _mm512_cvtepi64_epi32(s.buf[2 * h + 1]), 1);
		d->n[h] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(s.n[2 * h])),
					     _mm512_cvtepi64_epi32(s.n[2 * h + 1]), 1);
	}
	return bad ? -1 : 0;
}

/* Half h's codes (16 lanes of act, lengths L, aux) into o: gaps plus one
 * or values; returns the lanes whose value matches no code. */
static AVX512 ALWAYS_INLINE __mmask16 d_store(const fast2 *f, __m512i b, __m512i aux, __mmask16 a, int val, int raw,
					      uint32_t *o)
{
	if (!val) {
		__m512i low = _mm512_and_si512(_mm512_srlv_epi32(b, _mm512_add_epi32(aux, d_set(1))), d_set((uint32_t)f->kmask));
		__m512i gap = _mm512_or_si512(_mm512_sllv_epi32(aux, d_set(f->k)), low);
		_mm512_mask_storeu_epi32(o, a, _mm512_add_epi32(gap, d_set(1)));
		return 0;
	}
	if (raw) {
		_mm512_mask_storeu_epi32(o, a, _mm512_and_si512(b, d_set(dcast_mask_w(f->w_bits))));
		return 0;
	}
	__m512i cl = _mm512_and_si512(aux, d_set(15)), eb = _mm512_and_si512(_mm512_srli_epi32(aux, 4), d_set(31));
	__m512i top = _mm512_maskz_sllv_epi32(_mm512_test_epi32_mask(eb, eb), d_set(1), eb);
	__m512i x = _mm512_and_si512(_mm512_srlv_epi32(b, cl), _mm512_sub_epi32(_mm512_sllv_epi32(d_set(1), eb), d_set(1)));
	_mm512_mask_storeu_epi32(o, a, _mm512_add_epi32(_mm512_add_epi32(_mm512_srli_epi32(aux, 9), top), x));
	return a & ~_mm512_test_epi32_mask(aux, aux);
}

/* One refill point of the lanes of am (val: the value codes), its codes
 * into out[0..32); -1 for a value with no code. */
static AVX512 ALWAYS_INLINE int d_point(const fast2 *f, dlanes *d, uint32_t am, int val, int raw, uint64_t *at,
					uint32_t *out)
{
	__mmask16 act[2] = { (__mmask16)am, (__mmask16)(am >> 16) }, bad = 0, late = 0;
	__m512i L[2], aux[2];
	for (unsigned h = 0; h < 2; h++) {
		__mmask16 need = act[h] & _mm512_cmplt_epu32_mask(d->n[h], d_len(f, d->buf[h], val, raw, &aux[h]));
		__m256i w16 = _mm256_loadu_si256((const __m256i *)(const void *)(f->w + 2 * *at));
		__m512i w = _mm512_maskz_expand_epi32(need, _mm512_cvtepu16_epi32(w16));
		d->buf[h] = _mm512_or_si512(d->buf[h], _mm512_sllv_epi32(w, d->n[h]));
		d->n[h] = _mm512_mask_add_epi32(d->n[h], need, d->n[h], d_set(DCAST_CPT2_WORD_BITS));
		*at += (unsigned)__builtin_popcount(need);
	}
	for (unsigned h = 0; h < 2; h++) {
		L[h] = d_len(f, d->buf[h], val, raw, &aux[h]);
		late |= act[h] & _mm512_cmplt_epu32_mask(d->n[h], L[h]);
	}
	if (late)
		return d_long(f, d, am, val, raw, at, out);
	for (unsigned h = 0; h < 2; h++) {
		bad |= d_store(f, d->buf[h], aux[h], act[h], val, raw, out + 16 * h);
		d->buf[h] = _mm512_mask_srlv_epi32(d->buf[h], act[h], d->buf[h], L[h]);
		d->n[h] = _mm512_mask_sub_epi32(d->n[h], act[h], d->n[h], L[h]);
	}
	return bad ? -1 : 0;
}

/* The positions from the gaps plus one, from *next on; -1 when one is
 * at or past count. */
static AVX512 ALWAYS_INLINE int v_positions(const fast2 *f, uint64_t *next, uint32_t n, uint32_t *pos)
{
	__m512i run = _mm512_set1_epi32((int)*next), z = _mm512_setzero_si512(), cnt = _mm512_set1_epi32((int)f->count);
	__mmask16 bad = 0;
	for (uint32_t i = 0; i < n; i += 16) {
		__mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
		__m512i g = _mm512_maskz_loadu_epi32(m, pos + i);
		bad |= _mm512_cmpgt_epu32_mask(g, cnt); /* no sum of 16 wraps, nor one past count */
		g = _mm512_add_epi32(g, _mm512_alignr_epi32(g, z, 15));
		g = _mm512_add_epi32(g, _mm512_alignr_epi32(g, z, 14));
		g = _mm512_add_epi32(g, _mm512_alignr_epi32(g, z, 12));
		g = _mm512_add_epi32(_mm512_add_epi32(g, _mm512_alignr_epi32(g, z, 8)), run);
		_mm512_mask_storeu_epi32(pos + i, m, _mm512_sub_epi32(g, _mm512_set1_epi32(1)));
		run = _mm512_permutexvar_epi32(_mm512_set1_epi32(15), g);
		bad |= _mm512_cmpgt_epu32_mask(run, cnt);
	}
	*next = (uint32_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(run));
	return bad ? -1 : 0;
}

static AVX512 ALWAYS_INLINE int v_blk_mode(const fast2 *fp, uint64_t *at, uint64_t *next, uint32_t n, uint32_t *pos,
					   uint32_t *val, int raw)
{
	const fast2 local = *fp, *f = &local;
	dlanes d;
	uint32_t r = 0;
	for (unsigned h = 0; h < 2; h++)
		d.buf[h] = d.n[h] = _mm512_setzero_si512();
	for (; r + DCAST_CPT2_LANES <= n; r += DCAST_CPT2_LANES) /* the mask a constant: no lane masked */
		if (d_point(f, &d, 0xffffffffu, 0, raw, at, pos + r) || d_point(f, &d, 0xffffffffu, 1, raw, at, val + r) ||
		    *at > f->nwords)
			return -1;
	if (r < n && (d_point(f, &d, (1u << (n - r)) - 1, 0, raw, at, pos + r) ||
		      d_point(f, &d, (1u << (n - r)) - 1, 1, raw, at, val + r) || *at > f->nwords))
		return -1;
	__m512i left = _mm512_or_si512(d.buf[0], d.buf[1]);
	return _mm512_test_epi32_mask(left, left) ? -1 : v_positions(f, next, n, pos);
}

/* One block from (at, next) to its end, which it leaves in *at, *next. */
static AVX512 int blk_fast_avx512(const fast2 *f, uint64_t *at, uint64_t *next, uint32_t n, uint32_t *pos,
				  uint32_t *val)
{
	return f->raw ? v_blk_mode(f, at, next, n, pos, val, 1) : v_blk_mode(f, at, next, n, pos, val, 0);
}
#endif

/* ---- the fast path on AVX2: the 32 lanes as 4 vectors of 8 ---- */
#if defined(__x86_64__)

/* 32-bit buffers, as the AVX-512 build's 16-lane vectors: between refill
 * points a lane holds fewer than 16 bits, so its first pass fits.  A point
 * where a lane is still short after it (an escaped gap, a long value code)
 * goes on in the scalar build's late_codes. */
typedef struct alanes {
	__m256i buf[4], n[4];
} alanes;

/* Trailing ones of each buffer (below 2^31): the exponent of its lowest
 * zero bit as a float. */
static AVX2 ALWAYS_INLINE __m256i a_ones(__m256i b)
{
	__m256i low = _mm256_andnot_si256(b, _mm256_add_epi32(b, a_set(1)));
	__m256i e = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(low)), 23);
	return _mm256_sub_epi32(_mm256_and_si256(e, a_set(0xff)), a_set(127));
}

/* Each lane's code length and aux (trailing ones; the lookup entry), as
 * code_len. */
static AVX2 ALWAYS_INLINE __m256i a_len(const fast2 *f, __m256i b, int val, int raw, __m256i *aux)
{
	if (!val) {
		*aux = a_ones(b);
		__m256i esc = _mm256_cmpgt_epi32(*aux, a_set(DCAST_CPT_QESC - 1));
		return _mm256_blendv_epi8(_mm256_add_epi32(*aux, a_set(1 + f->k)),
					  a_set(DCAST_CPT_QESC + DCAST_CPT_GAP_BITS), esc);
	}
	*aux = _mm256_setzero_si256();
	if (raw)
		return a_set(f->w_bits);
	__m256i i = _mm256_and_si256(b, a_set(DCAST_CPT_LUT_SIZE - 1));
	*aux = _mm256_and_si256(_mm256_i32gather_epi32((const int *)(const void *)f->lut, i, 2), a_set(0xffff));
	__m256i len = _mm256_add_epi32(_mm256_and_si256(*aux, a_set(15)),
				       _mm256_and_si256(_mm256_srli_epi32(*aux, 4), a_set(31)));
	return _mm256_blendv_epi8(a_set(DCAST_CPT_LMAX + 1), len,
				  _mm256_xor_si256(_mm256_cmpeq_epi32(*aux, _mm256_setzero_si256()), a_set(~0u)));
}

/* Vector v's codes (act: its lanes in the round, aux from a_len) into
 * o[0..8): gaps plus one or values; returns the lanes whose value matches
 * no code (all ones). */
static AVX2 ALWAYS_INLINE __m256i a_store(const fast2 *f, __m256i b, __m256i aux, __m256i act, int val, int raw,
					   int full, uint32_t *o)
{
	__m256i out, one = a_set(1);
	if (!val) {
		__m256i low = _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_add_epi32(aux, one)), a_set((uint32_t)f->kmask));
		out = _mm256_add_epi32(_mm256_or_si256(_mm256_sll_epi32(aux, _mm_cvtsi32_si128((int)f->k)), low), one);
	} else if (raw) {
		out = _mm256_and_si256(b, a_set(dcast_mask_w(f->w_bits)));
	} else {
		__m256i cl = _mm256_and_si256(aux, a_set(15)), eb = _mm256_and_si256(_mm256_srli_epi32(aux, 4), a_set(31));
		__m256i bit = _mm256_sllv_epi32(one, eb);
		__m256i top = _mm256_and_si256(bit, _mm256_cmpgt_epi32(eb, _mm256_setzero_si256()));
		__m256i x = _mm256_and_si256(_mm256_srlv_epi32(b, cl), _mm256_sub_epi32(bit, one));
		out = _mm256_add_epi32(_mm256_add_epi32(_mm256_srli_epi32(aux, 9), top), x);
	}
	if (full)
		_mm256_storeu_si256((__m256i *)(void *)o, out);
	else
		_mm256_maskstore_epi32((int *)(void *)o, act, out);
	if (!val || raw)
		return _mm256_setzero_si256();
	return _mm256_and_si256(act, _mm256_cmpeq_epi32(aux, _mm256_setzero_si256()));
}

/* The rest of a point whose lanes of `late` are still short after the
 * first pass, lane by lane in the scalar build's order: the others'
 * codes, then late_codes; -1 for a code none matches. */
static AVX2 __attribute__((noinline)) int a_late(const fast2 *f, alanes *d, unsigned nl, uint32_t late, int val,
						 int raw, uint64_t *at, uint32_t *out)
{
	uint32_t b32[DCAST_CPT2_LANES], n32[DCAST_CPT2_LANES], aux = 0;
	lanes2 s;
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		_mm256_storeu_si256((__m256i *)(void *)(b32 + 8 * v), d->buf[v]);
		_mm256_storeu_si256((__m256i *)(void *)(n32 + 8 * v), d->n[v]);
	}
	for (unsigned l = 0; l < DCAST_CPT2_LANES; l++)
		s.buf[l] = b32[l], s.n[l] = n32[l];
	s.at = *at;
	for (unsigned l = 0; l < nl; l++) {
		if (late >> l & 1)
			continue;
		unsigned len = code_len(f, s.buf[l], val, &aux, raw);
		out[l] = code_of(f, s.buf[l], val, aux, raw);
		s.buf[l] >>= len, s.n[l] -= len;
	}
	if (late_codes(f, &s, late, val, raw, out))
		return -1;
	for (unsigned l = 0; !val && l < nl; l++) /* gaps plus one, as a_store's */
		out[l]++;
	for (unsigned l = 0; val && !raw && l < nl; l++)
		if (!out[l])
			return -1;
	for (unsigned l = 0; l < DCAST_CPT2_LANES; l++)
		b32[l] = (uint32_t)s.buf[l], n32[l] = s.n[l];
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		d->buf[v] = _mm256_loadu_si256((const __m256i *)(const void *)(b32 + 8 * v));
		d->n[v] = _mm256_loadu_si256((const __m256i *)(const void *)(n32 + 8 * v));
	}
	*at = s.at;
	return 0;
}

/* One refill point of lanes [0, nl) (val: the value codes), its codes into
 * out[0..nl); -1 for a value with no code. */
static AVX2 ALWAYS_INLINE int a_point(const fast2 *f, alanes *d, unsigned nl, int val, int raw, uint64_t *at,
				      uint32_t *out)
{
	__m256i act[4], L[4], aux[4], lack[4], any = _mm256_setzero_si256(), bad = any;
	unsigned late = 0;
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		act[v] = a_first((int)nl - 8 * (int)v);
		__m256i need = _mm256_and_si256(act[v], _mm256_cmpgt_epi32(a_len(f, d->buf[v], val, raw, &aux[v]), d->n[v]));
		unsigned m = a_mask(need);
		__m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(f->w + 2 * *at)));
		w = _mm256_and_si256(_mm256_permutevar8x32_epi32(w, a_ranks(m)), need);
		d->buf[v] = _mm256_or_si256(d->buf[v], _mm256_sllv_epi32(w, d->n[v]));
		d->n[v] = _mm256_add_epi32(d->n[v], _mm256_and_si256(need, a_set(DCAST_CPT2_WORD_BITS)));
		*at += (unsigned)__builtin_popcount(m);
	}
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		L[v] = a_len(f, d->buf[v], val, raw, &aux[v]);
		lack[v] = _mm256_and_si256(act[v], _mm256_cmpgt_epi32(L[v], d->n[v]));
		any = _mm256_or_si256(any, lack[v]);
	}
	if (!_mm256_testz_si256(any, any)) {
		for (unsigned v = 0; v < 4; v++)
			late |= a_mask(lack[v]) << 8 * v; /* on a copy: the state's address stays here, in registers */
		alanes t = *d;
		uint64_t t_at = *at;
		int rc = a_late(f, &t, nl, late, val, raw, &t_at, out);
		*d = t, *at = t_at;
		return rc;
	}
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++) {
		bad = _mm256_or_si256(bad, a_store(f, d->buf[v], aux[v], act[v], val, raw, nl == DCAST_CPT2_LANES, out + 8 * v));
		d->buf[v] = _mm256_srlv_epi32(d->buf[v], _mm256_and_si256(L[v], act[v]));
		d->n[v] = _mm256_sub_epi32(d->n[v], _mm256_and_si256(L[v], act[v]));
	}
	return _mm256_testz_si256(bad, bad) ? 0 : -1;
}

/* The positions from the gaps plus one, from *next on, 8 at a time (no
 * sum of 8 wraps when each and the position before are at most count,
 * which is below 2^26); -1 when one is at or past count. */
static AVX2 ALWAYS_INLINE int a_positions(const fast2 *f, uint64_t *next, uint32_t n, uint32_t *pos)
{
	__m256i run = a_set((uint32_t)*next), cnt = a_set((uint32_t)f->count), top = run;
	__m256i hi = _mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1);
	uint32_t i = 0;
	uint64_t at;
	for (; i + 8 <= n; i += 8) {
		__m256i g = _mm256_loadu_si256((const __m256i *)(const void *)(pos + i));
		top = _mm256_max_epu32(top, g);
		g = _mm256_add_epi32(g, _mm256_slli_si256(g, 4));
		g = _mm256_add_epi32(g, _mm256_slli_si256(g, 8));
		g = _mm256_add_epi32(g, _mm256_and_si256(_mm256_permutevar8x32_epi32(g, a_set(3)), hi));
		g = _mm256_add_epi32(g, run);
		_mm256_storeu_si256((__m256i *)(void *)(pos + i), _mm256_sub_epi32(g, a_set(1)));
		run = _mm256_permutevar8x32_epi32(g, a_set(7));
		top = _mm256_max_epu32(top, run);
	}
	if (a_mask(_mm256_cmpeq_epi32(_mm256_max_epu32(top, cnt), cnt)) != 0xff)
		return -1;
	for (at = (uint32_t)_mm256_cvtsi256_si32(run); i < n; i++) {
		at += pos[i];
		pos[i] = (uint32_t)(at - 1);
	}
	*next = at;
	return at > f->count ? -1 : 0;
}

static AVX2 ALWAYS_INLINE int a_blk_mode(const fast2 *fp, uint64_t *at, uint64_t *next, uint32_t n, uint32_t *pos,
					 uint32_t *val, int raw)
{
	const fast2 local = *fp, *f = &local;
	alanes d;
	uint32_t r = 0;
	__m256i left = _mm256_setzero_si256();
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++)
		d.buf[v] = d.n[v] = _mm256_setzero_si256();
	for (; r + DCAST_CPT2_LANES <= n; r += DCAST_CPT2_LANES) /* nl a constant: no lane masked */
		if (a_point(f, &d, DCAST_CPT2_LANES, 0, raw, at, pos + r) ||
		    a_point(f, &d, DCAST_CPT2_LANES, 1, raw, at, val + r) || *at > f->nwords)
			return -1;
	if (r < n && (a_point(f, &d, n - r, 0, raw, at, pos + r) || a_point(f, &d, n - r, 1, raw, at, val + r) ||
		      *at > f->nwords))
		return -1;
#pragma GCC unroll 4
	for (unsigned v = 0; v < 4; v++)
		left = _mm256_or_si256(left, d.buf[v]);
	return !_mm256_testz_si256(left, left) ? -1 : a_positions(f, next, n, pos);
}

/* One block from (at, next) to its end, which it leaves in *at, *next. */
static AVX2 int blk_fast_avx2(const fast2 *f, uint64_t *at, uint64_t *next, uint32_t n, uint32_t *pos,
			      uint32_t *val)
{
	return f->raw ? a_blk_mode(f, at, next, n, pos, val, 1) : a_blk_mode(f, at, next, n, pos, val, 0);
}
#endif

/* One block from (at, next) to its end, which it leaves in *at, *next. */
static int blk_fast(const fast2 *f, uint64_t *at, uint64_t *next, uint32_t n, uint32_t *pos, uint32_t *val)
{
#if defined(__x86_64__)
	if (f->build == DCAST_CPT2_AVX512)
		return blk_fast_avx512(f, at, next, n, pos, val);
	if (f->build == DCAST_CPT2_AVX2)
		return blk_fast_avx2(f, at, next, n, pos, val);
#endif
	lanes2 s;
	int rc;
	memset(&s, 0, sizeof(s));
	s.at = *at, s.next = *next;
	rc = blk_fast_plain(f, &s, n, pos, val);
	*at = s.at, *next = s.next;
	return rc;
}

/* The fast path's lookup from the code table, level by level: at level
 * L the first 2^L entries are the previous level's twice (an entry fixed
 * by fewer low bits holds for every index ending in them), then the codes
 * of length L set; the same entries as the reference lookup's, in 8 KiB of
 * copies and a store a symbol, not a pass over the 4096. */
static void fast_lut(uint16_t *fl, const dcast_cpt_table *t, unsigned nsym)
{
	fl[0] = 0;
	for (unsigned L = 1; L <= DCAST_CPT_LMAX; L++) {
		memcpy(fl + (1u << (L - 1)), fl, (1u << (L - 1)) * sizeof(*fl));
		for (unsigned s = 0; s < nsym; s++)
			if (t->len[s] == L)
				fl[t->code[s]] = (uint16_t)(L | dcast_cpt_extra_bits(s) << 4 |
							   (s < DCAST_CPT_NDIRECT ? s + 1 : 0) << 9);
	}
	fl[DCAST_CPT_LUT_SIZE] = 0; /* read by the vector builds' gathers, never used */
}

/* The stream the fast path reads: the vector builds load 8 words at a
 * time, so they read a copy with zeros after it. */
static const uint8_t *fast_stream(const dcast_cpt2_run *x, int build)
{
	uint8_t *copy;
	if (build == DCAST_CPT2_PLAIN)
		return x->d.stream;
	copy = dcast_scratch(DCAST_SCRATCH_DEC_STREAM, x->d.stream_bytes + 2 * V2_PAD_WORDS);
	if (copy) {
		memcpy(copy, x->d.stream, x->d.stream_bytes);
		memset(copy + x->d.stream_bytes, 0, 2 * V2_PAD_WORDS);
	}
	return copy;
}

/* Every block by the fast path; 0 when all decoded and chained. */
static int blocks_fast(const dcast_cpt2_run *x, const dcast_cpt_table *t, const uint8_t *idx, uint64_t changed,
		       uint32_t *pos, uint32_t *val)
{
	uint16_t *fl = dcast_scratch(DCAST_SCRATCH_CPT2, (DCAST_CPT_LUT_SIZE + 1) * sizeof(*fl));
	int build = dcast_cpt2_build();
	const uint8_t *w = fast_stream(x, build);
	uint64_t at = 0, next = 0;
	if (!fl || !w)
		return -1;
	fast2 fs = { .w = w, .lut = fl, .nwords = x->nwords, .count = x->d.count, .kmask = (1ull << x->d.k) - 1,
		     .k = x->d.k, .raw = x->d.mode == DCAST_CPT_RAW, .w_bits = x->d.w, .build = (unsigned)build },
	      *f = &fs;
	if (!f->raw)
		fast_lut(fl, t, dcast_cpt_nsym(x->d.w));
	for (uint64_t b = 0; b < dcast_cpt2_nblocks(changed); b++) {
		uint64_t first = b * DCAST_CPT2_BLOCK, word, start;
		dcast_cpt2_blk_start(idx, b, &word, &start);
		if (word != at || start != next ||
		    blk_fast(f, &at, &next, dcast_cpt2_blk_changes(changed, b), pos + first, val + first))
			return -1;
	}
	return at == x->nwords ? 0 : -1;
}

/* Block by block, each index entry checked against where the previous
 * block ended. */
static int blocks_run(dcast_cpt2_run *x, const uint8_t *idx, uint64_t changed, uint32_t *pos, uint32_t *val)
{
	for (uint64_t b = 0; b < dcast_cpt2_nblocks(changed); b++) {
		uint64_t first = b * DCAST_CPT2_BLOCK, word, next;
		dcast_cpt2_blk_start(idx, b, &word, &next);
		if (word != x->at || next != x->next)
			return dcast_cpt_fail(DCAST_ENC_COMPACT2, DCAST_CPT_EINDEX, first);
		int e = dcast_cpt2_blk_run(x, dcast_cpt2_blk_changes(changed, b), pos + first, val + first);
		if (e)
			return dcast_cpt_fail(DCAST_ENC_COMPACT2, e, first);
	}
	if (x->at != x->nwords)
		return dcast_cpt_fail(DCAST_ENC_COMPACT2, DCAST_CPT_ETRAIL, changed);
	return DCAST_OK;
}

/* The header opened and the lookup built; *idx the block index. */
static int cpt2_open(const dcast_chunk_info *info, const uint8_t *payload, dcast_cpt2_run *x, dcast_cpt_table *t,
		     const uint8_t **idx)
{
	int rc = dcast_cpt_open(info, payload, &x->d, t);
	if (rc)
		return rc;
	x->nwords = x->d.stream_bytes / 2;
	x->at = x->next = 0;
	*idx = payload + dcast_cpt_hdr_bytes(x->d.mode, x->d.w);
	return DCAST_OK;
}

/* The decode, by the fast path first unless `checked`; the reference
 * lookup is built only for the reference decoder. */
static int cpt2_decode(const dcast_chunk_info *info, const uint8_t *payload, uint32_t *pos, uint32_t *val,
		       unsigned *mode, int checked)
{
	uint16_t lut[DCAST_CPT_LUT_SIZE];
	const uint8_t *idx;
	dcast_cpt2_run x;
	dcast_cpt_table t;
	int rc = cpt2_open(info, payload, &x, &t, &idx);
	if (rc)
		return rc;
	*mode = x.d.mode;
	if (!checked && !blocks_fast(&x, &t, idx, info->changed, pos, val))
		return DCAST_OK;
	x.d.lut = lut;
	if (x.d.mode == DCAST_CPT_CODED)
		dcast_cpt_lut_build(&t, dcast_cpt_nsym(x.d.w), lut);
	return blocks_run(&x, idx, info->changed, pos, val);
}

int dcast_cpt2_decode_checked(const dcast_chunk_info *info, const uint8_t *payload, uint32_t *pos, uint32_t *val,
			      unsigned *mode)
{
	return cpt2_decode(info, payload, pos, val, mode, 1);
}

int dcast_cpt2_decode(const dcast_chunk_info *info, const uint8_t *payload, uint32_t *pos, uint32_t *val,
		      unsigned *mode)
{
	return cpt2_decode(info, payload, pos, val, mode, 0);
}
