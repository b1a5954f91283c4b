/* Private to kernels/: the bit-level logic of the delta codec, written once
 * as host+device inline functions so that the CPU codec (codec*.c), the CUDA
 * kernels (codec_cuda.cu) and the CPU tests run the same code.  The byte
 * layouts are specified in docs/protocol.md ("Delta codec"); this header is
 * the implementation of that text, nothing more.  It belongs to no one
 * codec*.c (a name like codec_impl.h would count as codec.c's in
 * tests/test_layers.sh): every codec file
 * builds on it, and codec.c, the public entry points, stands on top of
 * codec_compact2.c, codec_compact.c, codec_decode.c, codec_scan.c and
 * codec_scratch.c in that order, with no arrow back up (compact v2's lane
 * logic is codec_cpt2.h's, above this header).
 *
 * Compact encoding in one paragraph: positions are Rice-coded gaps with
 * parameter k (from the gap mean, in the header); values are zig-zagged
 * differences of the sortable-integer images of the bit patterns, coded with
 * a canonical prefix code whose lengths are in the header (8 symbols for the
 * differences 1..8, one per bit length above that followed by the low bits),
 * or raw new values when that is smaller.  Every 1024 elements the header's
 * index records the bit offset and previous position, so a GPU decodes blocks
 * in parallel; the CPU decoder checks that the index agrees with the stream. */
#ifndef DCAST_CODEC_SHARED_H
#define DCAST_CODEC_SHARED_H

#include <stddef.h>
#include <stdint.h>
#include "deltacast/codec.h"
#include "xxh3_hd.h"

#ifdef __CUDA_ARCH__
#define DCAST_CTZ64(x) (__ffsll((long long)(x)) - 1)
#define DCAST_CLZ32(x) __clz((int)(x))
#else
#define DCAST_CTZ64(x) __builtin_ctzll(x)
#define DCAST_CLZ32(x) __builtin_clz(x)
#endif

#define DCAST_CPT_BLOCK 1024u    /* changed elements per index block */
#define DCAST_CPT_QESC 20u       /* a gap quotient this large escapes */
#define DCAST_CPT_GAP_BITS 26u   /* raw gap width after an escape */
#define DCAST_CPT_KMAX 25u       /* largest Rice parameter */
#define DCAST_CPT_LMAX 12u       /* longest value code, bits */
#define DCAST_CPT_NDIRECT 8u     /* differences 1..8 have a symbol each */
#define DCAST_CPT_NSYM_MAX 37u   /* 8 + (32 - 3) for 4-byte elements */
#define DCAST_CPT_HDR_FIXED 2u   /* k, value mode */
#define DCAST_CPT_INDEX_ENTRY 8u /* u32 bit offset, u32 previous position */
#define DCAST_DIGEST_BLOCK DCAST_DIGEST_BLOCK_BYTES

/* The XXH3 code that dcast_checksum, dcast_digest and dcast_landing_new
 * use from now on: 0 libxxhash's, 1 inlined for AVX2, 2 for AVX-512, at
 * most what the CPU runs (a level above it, or below 0, means the CPU's
 * widest, the default).  For tests that check each; returns the level
 * before. */
int dcast_xxh3_level_set(int level);

enum dcast_cpt_mode { DCAST_CPT_RAW = 0, DCAST_CPT_CODED = 1 };

/* Decoder failures, turned into messages by the caller (GPU and CPU alike). */
enum dcast_cpt_err {
	DCAST_CPT_OK = 0,
	DCAST_CPT_EOVERRUN,  /* a code runs past the end of the bitstream */
	DCAST_CPT_EPOS,      /* a position at or beyond count */
	DCAST_CPT_ECODE,     /* a bit pattern that is no value code */
	DCAST_CPT_EINDEX,    /* block index disagrees with the stream */
	DCAST_CPT_ETRAIL,    /* stream length or padding bits wrong */
};

DCAST_HD uint32_t dcast_mask_w(unsigned w)
{
	return w >= 32 ? 0xffffffffu : (1u << w) - 1;
}

/* Sortable-integer map of a w-bit pattern: sign set -> flip all bits,
 * sign clear -> set the sign bit.  Orders patterns as their floats. */
DCAST_HD uint32_t dcast_sortable(uint32_t x, unsigned w)
{
	uint32_t sb = 1u << (w - 1), m = dcast_mask_w(w);
	uint32_t neg = 0u - ((x >> (w - 1)) & 1u); /* branchless: signs are random */
	return x ^ (sb | (neg & m));
}

DCAST_HD uint32_t dcast_unsortable(uint32_t s, unsigned w)
{
	uint32_t sb = 1u << (w - 1), m = dcast_mask_w(w);
	uint32_t pos = 0u - ((s >> (w - 1)) & 1u);
	return s ^ (m ^ (pos & (m ^ sb)));
}

/* Zig-zag image of the w-bit difference new - old (mod 2^w) of the sortable
 * images: +1 -> 2, -1 -> 1.  Zero only when new == old. */
DCAST_HD uint32_t dcast_ulp_zz(uint32_t oldv, uint32_t newv, unsigned w)
{
	uint32_t m = dcast_mask_w(w);
	uint32_t d = (dcast_sortable(newv, w) - dcast_sortable(oldv, w)) & m;
	uint32_t neg = 0u - ((d >> (w - 1)) & 1u);
	return ((d << 1) ^ neg) & m;
}

DCAST_HD uint32_t dcast_ulp_apply(uint32_t oldv, uint32_t zz, unsigned w)
{
	uint32_t m = dcast_mask_w(w);
	uint32_t d = ((zz >> 1) ^ (0u - (zz & 1u))) & m;
	return dcast_unsortable((dcast_sortable(oldv, w) + d) & m, w);
}

DCAST_HD unsigned dcast_bitlen32(uint32_t x)
{
	return x ? 32u - (unsigned)DCAST_CLZ32(x) : 0u;
}

/* Value symbols for w-bit elements: 8 direct + one per bit length 4..w. */
DCAST_HD unsigned dcast_cpt_nsym(unsigned w)
{
	return DCAST_CPT_NDIRECT + w - 3;
}

DCAST_HD unsigned dcast_cpt_symbol(uint32_t zz)
{
	return zz <= DCAST_CPT_NDIRECT ? zz - 1 : DCAST_CPT_NDIRECT + dcast_bitlen32(zz) - 4;
}

/* Low bits that follow a symbol (its bit length less the implied top bit). */
DCAST_HD unsigned dcast_cpt_extra_bits(unsigned sym)
{
	return sym < DCAST_CPT_NDIRECT ? 0u : sym - DCAST_CPT_NDIRECT + 3;
}

/* One Rice code for a gap: q ones, a zero, k low bits; q >= QESC instead
 * writes QESC ones and the gap in GAP_BITS bits.  At most 46 bits. */
DCAST_HD unsigned dcast_rice_len(uint32_t gap, unsigned k)
{
	uint32_t q = gap >> k;
	return q < DCAST_CPT_QESC ? q + 1 + k : DCAST_CPT_QESC + DCAST_CPT_GAP_BITS;
}

DCAST_HD uint64_t dcast_rice_bits(uint32_t gap, unsigned k)
{
	uint32_t q = gap >> k;
	if (q >= DCAST_CPT_QESC)
		return ((1ull << DCAST_CPT_QESC) - 1) | ((uint64_t)gap << DCAST_CPT_QESC);
	return ((1ull << q) - 1) | ((uint64_t)(gap & ((1u << k) - 1)) << (q + 1));
}

/* The value code table: lengths in the header; codes canonical (shorter
 * first, then by symbol), stored bit-reversed for the LSB-first stream. */
typedef struct dcast_cpt_table {
	uint8_t len[DCAST_CPT_NSYM_MAX];
	uint16_t code[DCAST_CPT_NSYM_MAX];
} dcast_cpt_table;

DCAST_HD uint32_t dcast_rev_bits(uint32_t c, unsigned n)
{
	uint32_t r = 0;
	for (unsigned i = 0; i < n; i++)
		r |= ((c >> i) & 1u) << (n - 1 - i);
	return r;
}

/* Assign canonical codes from lengths; 0 when the lengths are a valid
 * prefix code (each <= LMAX, Kraft sum <= 1, at least one used), else -1. */
DCAST_HD int dcast_cpt_table_codes(dcast_cpt_table *t, unsigned nsym)
{
	uint32_t kraft = 0, code = 0, used = 0;
	for (unsigned i = 0; i < nsym; i++) {
		if (t->len[i] > DCAST_CPT_LMAX)
			return -1;
		if (t->len[i]) {
			kraft += 1u << (DCAST_CPT_LMAX - t->len[i]);
			used++;
		}
	}
	if (!used || kraft > (1u << DCAST_CPT_LMAX))
		return -1;
	for (unsigned l = 1; l <= DCAST_CPT_LMAX; l++) {
		for (unsigned i = 0; i < nsym; i++) {
			if (t->len[i] != l)
				continue;
			t->code[i] = (uint16_t)dcast_rev_bits(code, l);
			code++;
		}
		code <<= 1;
	}
	return 0;
}

/* Huffman lengths for `hist` (deterministic: ties go to the lower node),
 * limited to LMAX by halving the counts until they fit.  A single used
 * symbol gets length 1. */
DCAST_HD unsigned dcast_huff_depths(const uint64_t *w, unsigned n, uint8_t *len)
{
	uint64_t wt[2 * DCAST_CPT_NSYM_MAX];
	int16_t parent[2 * DCAST_CPT_NSYM_MAX];
	uint8_t alive[2 * DCAST_CPT_NSYM_MAX];
	unsigned nodes = n, maxd = 0;
	for (unsigned i = 0; i < n; i++) {
		wt[i] = w[i];
		alive[i] = w[i] > 0;
		parent[i] = -1;
	}
	for (;;) {
		int a = -1, b = -1;
		for (unsigned i = 0; i < nodes; i++) {
			if (!alive[i])
				continue;
			if (a < 0 || wt[i] < wt[a]) {
				b = a;
				a = (int)i;
			} else if (b < 0 || wt[i] < wt[b]) {
				b = (int)i;
			}
		}
		if (b < 0)
			break;
		wt[nodes] = wt[a] + wt[b];
		alive[nodes] = 1;
		parent[nodes] = -1;
		alive[a] = alive[b] = 0;
		parent[a] = parent[b] = (int16_t)nodes;
		nodes++;
	}
	for (unsigned i = 0; i < n; i++) {
		unsigned d = 0;
		for (int p = parent[i]; p >= 0; p = parent[p])
			d++;
		len[i] = (uint8_t)(w[i] ? (d ? d : 1) : 0);
		maxd = len[i] > maxd ? len[i] : maxd;
	}
	return maxd;
}

DCAST_HD void dcast_cpt_table_build(const uint64_t *hist, unsigned nsym, dcast_cpt_table *t)
{
	uint64_t w[DCAST_CPT_NSYM_MAX];
	for (unsigned i = 0; i < nsym; i++)
		w[i] = hist[i];
	for (unsigned i = nsym; i < DCAST_CPT_NSYM_MAX; i++)
		t->len[i] = 0;
	while (dcast_huff_depths(w, nsym, t->len) > DCAST_CPT_LMAX) {
		for (unsigned i = 0; i < nsym; i++)
			w[i] = w[i] ? (w[i] + 1) / 2 : 0;
	}
}

/* What the compact encoder needs to know about a range, gathered in one
 * pass over its changed elements. */
typedef struct dcast_cpt_stats {
	uint64_t changed;
	uint64_t gap_sum;
	uint64_t hist[DCAST_CPT_NSYM_MAX];
} dcast_cpt_stats;

/* Everything the header says plus the sizes it implies. */
typedef struct dcast_cpt_plan {
	unsigned k;
	unsigned mode;
	unsigned w;
	uint64_t changed;
	uint64_t val_bits;
	uint64_t pos_bits;   /* filled by the position pass */
	dcast_cpt_table table;
} dcast_cpt_plan;

/* Rice parameter from the gap mean: the k that minimises the expected
 * code length if gaps were geometric with that mean.  Deterministic. */
DCAST_HD unsigned dcast_cpt_choose_k(uint64_t changed, uint64_t gap_sum)
{
	if (!changed || !gap_sum)
		return 0;
	double q = (double)gap_sum / (double)(gap_sum + changed), qk = q, best = 1e300;
	unsigned bestk = 0;
	for (unsigned k = 0; k <= DCAST_CPT_KMAX; k++) {
		double cost = (double)(k + 1) + qk / (1.0 - qk);
		if (qk >= 1.0)
			cost = 1e299;
		if (cost < best) {
			best = cost;
			bestk = k;
		}
		qk *= qk;
	}
	return bestk;
}

DCAST_HD unsigned dcast_cpt_hdr_bytes(unsigned mode, unsigned w)
{
	unsigned b = DCAST_CPT_HDR_FIXED + (mode == DCAST_CPT_CODED ? (dcast_cpt_nsym(w) + 1) / 2 : 0);
	return (b + 7) & ~7u;
}

DCAST_HD uint64_t dcast_cpt_nblocks(uint64_t changed)
{
	return (changed + DCAST_CPT_BLOCK - 1) / DCAST_CPT_BLOCK;
}

DCAST_HD uint64_t dcast_cpt_index_bytes(uint64_t changed)
{
	uint64_t nb = dcast_cpt_nblocks(changed);
	return nb ? (nb - 1) * DCAST_CPT_INDEX_ENTRY : 0;
}

/* Offset of the bitstream in the payload. */
DCAST_HD uint64_t dcast_cpt_stream_off(const dcast_cpt_plan *p)
{
	return dcast_cpt_hdr_bytes(p->mode, p->w) + dcast_cpt_index_bytes(p->changed);
}

DCAST_HD uint64_t dcast_cpt_bytes(const dcast_cpt_plan *p)
{
	return dcast_cpt_stream_off(p) + (p->pos_bits + p->val_bits + 7) / 8;
}

/* Choose k, the value mode and the table from the stats. */
DCAST_HD void dcast_cpt_plan_make(const dcast_cpt_stats *st, unsigned w, dcast_cpt_plan *p)
{
	unsigned nsym = dcast_cpt_nsym(w);
	uint64_t coded = 0, raw = st->changed * w;
	p->w = w;
	p->changed = st->changed;
	p->k = dcast_cpt_choose_k(st->changed, st->gap_sum);
	p->pos_bits = 0;
	dcast_cpt_table_build(st->hist, nsym, &p->table);
	for (unsigned i = 0; i < nsym; i++)
		coded += st->hist[i] * (p->table.len[i] + dcast_cpt_extra_bits(i));
	p->mode = DCAST_CPT_RAW;
	p->val_bits = raw;
	if (st->changed && coded / 8 + dcast_cpt_hdr_bytes(DCAST_CPT_CODED, w) <
				   raw / 8 + dcast_cpt_hdr_bytes(DCAST_CPT_RAW, w)) {
		p->mode = DCAST_CPT_CODED;
		p->val_bits = coded;
		dcast_cpt_table_codes(&p->table, nsym);
	}
}

/* Header bytes (hdr_bytes of them, padding zero) for a plan. */
DCAST_HD void dcast_cpt_hdr_write(const dcast_cpt_plan *p, uint8_t *out)
{
	unsigned hb = dcast_cpt_hdr_bytes(p->mode, p->w), nsym = dcast_cpt_nsym(p->w);
	for (unsigned i = 0; i < hb; i++)
		out[i] = 0;
	out[0] = (uint8_t)p->k;
	out[1] = (uint8_t)p->mode;
	if (p->mode != DCAST_CPT_CODED)
		return;
	for (unsigned i = 0; i < nsym; i++)
		out[DCAST_CPT_HDR_FIXED + i / 2] |= (uint8_t)(p->table.len[i] << (4 * (i & 1)));
}

/* Bits of one element's value: prefix code + low bits, or raw. */
DCAST_HD uint64_t dcast_cpt_value_bits(const dcast_cpt_plan *p, uint32_t zz, uint32_t newv,
				       unsigned *len)
{
	if (p->mode == DCAST_CPT_RAW) {
		*len = p->w;
		return newv;
	}
	unsigned sym = dcast_cpt_symbol(zz), eb = dcast_cpt_extra_bits(sym);
	unsigned cl = p->table.len[sym];
	*len = cl + eb;
	return p->table.code[sym] | ((uint64_t)(zz & ((1u << eb) - 1)) << cl);
}

/* ---- decoding ---- */

/* Lookup for the prefix code: entry = symbol << 4 | length, 0 = no code. */
#define DCAST_CPT_LUT_SIZE (1u << DCAST_CPT_LMAX)

typedef struct dcast_cpt_dec {
	const uint8_t *stream;  /* bitstream start */
	uint64_t stream_bytes;
	uint64_t count;         /* elements in the range */
	unsigned k, mode, w;
	const uint16_t *lut;    /* DCAST_CPT_LUT_SIZE entries when coded */
} dcast_cpt_dec;

/* Parse and check the fixed header; fills dec's k/mode/w and the table.
 * Returns a static message naming the problem, or NULL when valid. */
DCAST_HD const char *dcast_cpt_hdr_parse(const uint8_t *pl, uint64_t bytes, unsigned w,
					 dcast_cpt_dec *d, dcast_cpt_table *t)
{
	unsigned nsym = dcast_cpt_nsym(w);
	if (bytes < DCAST_CPT_HDR_FIXED)
		return "compact header truncated";
	d->k = pl[0];
	d->mode = pl[1];
	d->w = w;
	if (d->k > DCAST_CPT_KMAX)
		return "compact Rice parameter k above 25";
	if (d->mode > DCAST_CPT_CODED)
		return "compact value mode unknown";
	unsigned hb = dcast_cpt_hdr_bytes(d->mode, w);
	if (bytes < hb)
		return "compact header truncated";
	unsigned used = DCAST_CPT_HDR_FIXED;
	if (d->mode == DCAST_CPT_CODED) {
		for (unsigned i = 0; i < nsym; i++)
			t->len[i] = (pl[DCAST_CPT_HDR_FIXED + i / 2] >> (4 * (i & 1))) & 15;
		if ((nsym & 1) && (pl[DCAST_CPT_HDR_FIXED + nsym / 2] >> 4))
			return "compact code table padding nibble not zero";
		if (dcast_cpt_table_codes(t, nsym))
			return "compact code table is not a prefix code";
		used += (nsym + 1) / 2;
	}
	for (unsigned i = used; i < hb; i++)
		if (pl[i])
			return "compact header padding not zero";
	return 0;
}

DCAST_HD void dcast_cpt_lut_fill(const dcast_cpt_table *t, unsigned nsym, uint16_t *lut,
				 unsigned first, unsigned step)
{
	for (unsigned i = first; i < DCAST_CPT_LUT_SIZE; i += step) {
		uint16_t e = 0;
		for (unsigned s = 0; s < nsym && !e; s++) {
			unsigned l = t->len[s];
			if (l && (i & ((1u << l) - 1)) == t->code[s])
				e = (uint16_t)(s << 4 | l);
		}
		lut[i] = e;
	}
}

/* 64 bits of the stream from bit `bit`, zeros past the end (at least 57
 * of them meaningful). */
DCAST_HD uint64_t dcast_bits_peek(const uint8_t *s, uint64_t nbytes, uint64_t bit)
{
	uint64_t byte = bit >> 3, v = 0;
	if (byte + 8 <= nbytes) {
#ifdef __CUDA_ARCH__
		for (unsigned i = 0; i < 8; i++)
			v |= (uint64_t)s[byte + i] << (8 * i);
#else
		__builtin_memcpy(&v, s + byte, 8); /* little-endian hosts only */
#endif
	} else {
		for (unsigned i = 0; byte + i < nbytes; i++)
			v |= (uint64_t)s[byte + i] << (8 * i);
	}
	return v >> (bit & 7);
}

/* Decode one gap at *bit; returns its code length, 0 on a bad code. */
DCAST_HD unsigned dcast_rice_decode(uint64_t peek, unsigned k, uint32_t *gap)
{
	uint64_t inv = ~peek;
	unsigned q = inv ? (unsigned)DCAST_CTZ64(inv) : 64u;
	if (q >= DCAST_CPT_QESC) {
		*gap = (uint32_t)(peek >> DCAST_CPT_QESC) & ((1u << DCAST_CPT_GAP_BITS) - 1);
		return DCAST_CPT_QESC + DCAST_CPT_GAP_BITS;
	}
	*gap = (q << k) | ((uint32_t)(peek >> (q + 1)) & ((1u << k) - 1));
	return q + 1 + k;
}

/* Decode one value code: returns its length (0 = no such code) and the
 * zig-zag difference or the raw value in *v. */
DCAST_HD unsigned dcast_cpt_value_decode(const dcast_cpt_dec *d, uint64_t peek, uint32_t *v)
{
	if (d->mode == DCAST_CPT_RAW) {
		*v = (uint32_t)peek & dcast_mask_w(d->w);
		return d->w;
	}
	uint16_t e = d->lut[peek & (DCAST_CPT_LUT_SIZE - 1)];
	if (!e)
		return 0;
	unsigned sym = e >> 4, cl = e & 15, eb = dcast_cpt_extra_bits(sym);
	if (sym < DCAST_CPT_NDIRECT) {
		*v = sym + 1;
		return cl;
	}
	*v = (1u << eb) | ((uint32_t)(peek >> cl) & ((1u << eb) - 1));
	return cl + eb;
}

/* Decode `n` elements starting at *bit with `next` the smallest position
 * the first may take.  Positions go to pos[], values (zig-zag difference or
 * raw) to val[] (either may be NULL).  On return *bit is past the last code
 * and *next is one past the last position. */
DCAST_HD int dcast_cpt_decode_run(const dcast_cpt_dec *d, uint64_t *bit, uint64_t *next,
				  uint64_t n, uint32_t *pos, uint32_t *val)
{
	uint64_t b = *bit, nx = *next, end = d->stream_bytes * 8;
	for (uint64_t i = 0; i < n; i++) {
		uint32_t gap, v;
		unsigned l = dcast_rice_decode(dcast_bits_peek(d->stream, d->stream_bytes, b), d->k, &gap);
		b += l;
		if (b > end)
			return DCAST_CPT_EOVERRUN;
		nx += gap;
		if (nx >= d->count)
			return DCAST_CPT_EPOS;
		l = dcast_cpt_value_decode(d, dcast_bits_peek(d->stream, d->stream_bytes, b), &v);
		if (!l)
			return DCAST_CPT_ECODE;
		b += l;
		if (b > end)
			return DCAST_CPT_EOVERRUN;
		if (pos)
			pos[i] = (uint32_t)nx;
		if (val)
			val[i] = v;
		nx++;
	}
	*bit = b;
	*next = nx;
	return DCAST_CPT_OK;
}

/* After the last element: the stream must end in the byte holding its last
 * bit, with the remaining bits zero. */
DCAST_HD int dcast_cpt_check_trail(const dcast_cpt_dec *d, uint64_t bit)
{
	if ((bit + 7) / 8 != d->stream_bytes)
		return DCAST_CPT_ETRAIL;
	if ((bit & 7) && (d->stream[bit / 8] >> (bit & 7)))
		return DCAST_CPT_ETRAIL;
	return DCAST_CPT_OK;
}

/* The name of a compact encoding, as dcast_encoding_name gives it (the
 * decoders below codec.c name their payloads with it). */
DCAST_HD const char *dcast_cpt_name(int enc)
{
	return enc == DCAST_ENC_COMPACT2 ? "compact2" : "compact";
}

DCAST_HD const char *dcast_cpt_errstr(int e)
{
	switch (e) {
	case DCAST_CPT_EOVERRUN: return "a code runs past the end of the bitstream";
	case DCAST_CPT_EPOS: return "a position is at or beyond the range's count";
	case DCAST_CPT_ECODE: return "a value bit pattern matches no code";
	case DCAST_CPT_EINDEX: return "block index disagrees with the bitstream";
	case DCAST_CPT_ETRAIL: return "bitstream length or trailing padding wrong";
	default: return "ok";
	}
}

/* Pick the smallest encoding (ties go to the lower id), then compact v2
 * over compact v1 when v2 is at most 1/64 larger: its blocks decode a warp
 * each (docs/protocol.md, "Delta codec").  A caller that wants no v2 sets
 * its size to UINT64_MAX. */
DCAST_HD int dcast_pick_smallest(const uint64_t sizes[DCAST_ENC_COUNT])
{
	int best = 0;
	for (int e = 1; e < DCAST_ENC_COUNT; e++)
		if (sizes[e] < sizes[best])
			best = e;
	if (best == DCAST_ENC_COMPACT && sizes[DCAST_ENC_COMPACT2] - sizes[DCAST_ENC_COMPACT] <= sizes[DCAST_ENC_COMPACT] / 64)
		return DCAST_ENC_COMPACT2;
	return best;
}

DCAST_HD uint64_t dcast_bitmask_bytes(uint64_t count)
{
	return (count + 7) / 8;
}

/* Sizes of the three encodings that depend only on counts. */
DCAST_HD void dcast_simple_sizes(uint64_t count, unsigned es, uint64_t changed,
				 uint64_t sizes[DCAST_ENC_COUNT])
{
	sizes[DCAST_ENC_DENSE] = count * es;
	sizes[DCAST_ENC_IDX32] = changed * (4 + es);
	sizes[DCAST_ENC_BITMASK] = dcast_bitmask_bytes(count) + changed * es;
}

/* ---- the additive digest (docs/protocol.md, "Checksum and digest") ---- */

/* SplitMix64's finalizer (Stafford's Mix13): a bijection of 64 bits. */
DCAST_HD uint64_t dcast_ld_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* The key of the 2^32-element segment `seg` (= index >> 32) of a tensor. */
DCAST_HD uint64_t dcast_ld_seed(uint32_t tensor, uint64_t seg)
{
	return dcast_ld_mix((((uint64_t)tensor << 32) | (seg & 0xffffffffu)) ^ 0x9e3779b97f4a7c15ull);
}

/* One element's term under its segment's seed: index's low 32 bits above
 * the bit pattern, so within a segment distinct (index, bits) never collide. */
DCAST_HD uint64_t dcast_ld_term_seeded(uint64_t seed, uint64_t index, uint32_t bits)
{
	return dcast_ld_mix(((index << 32) | bits) ^ seed);
}

/* A digest moved by changes of one range, whose position 0 is element
 * `start` of `tensor`: acc sums h(new) - h(old), and the seed of the last
 * segment is kept (changes come in position order).  The encoder, the
 * resolve and the digest walks (codec.c, ldigest.c), and the CUDA
 * encoder's per-tile moves (codec_cuda.cu). */
typedef struct dcast_ld_move {
	uint32_t tensor;
	uint64_t start, seg, seed, acc;
} dcast_ld_move;

DCAST_HD void dcast_ld_move_init(dcast_ld_move *m, uint32_t tensor, uint64_t start)
{
	m->tensor = tensor;
	m->start = start;
	m->seg = UINT64_MAX; /* no segment is UINT64_MAX */
	m->seed = 0;
	m->acc = 0;
}

DCAST_HD __attribute__((always_inline)) void dcast_ld_move_add(dcast_ld_move *m, uint64_t pos,
								uint32_t oldv, uint32_t newv)
{
	uint64_t i = m->start + pos;

	if (i >> 32 != m->seg) { /* one seed per 2^32-element segment */
		m->seg = i >> 32;
		m->seed = dcast_ld_seed(m->tensor, m->seg);
	}
	m->acc += dcast_ld_term_seeded(m->seed, i, newv) - dcast_ld_term_seeded(m->seed, i, oldv);
}

/* ---- host functions of codec*.c the CUDA host code calls too ---- */
#ifdef __cplusplus
extern "C" {
#endif
/* The checks of dcast_codec_apply on info alone: elem_size, count,
 * encoding, changed <= count, NULL pointers. */
int dcast_codec_check_info(const dcast_chunk_info *info, const void *payload, const void *dst);
/* The structural checks of an idx32 / bitmask payload (codec.c). */
int dcast_idx32_check(const dcast_chunk_info *info, const uint8_t *pl);
int dcast_bitmask_check(const dcast_chunk_info *info, const uint8_t *pl);
/* payload_bytes == want, else DCAST_EPAYLOAD_SIZE naming the encoding. */
int dcast_codec_check_size(const dcast_chunk_info *info, uint64_t want);
/* The argument checks of dcast_codec_encode. */
int dcast_codec_check_encode(uint64_t count, unsigned es, int force, size_t out_cap);
#ifdef __cplusplus
}
#endif

/* ---- host-only helpers shared by codec*.c ---- */
#ifndef __CUDACC__
#include <string.h>

/* Changed elements of a range, as found by the vectorized compare. */
typedef struct dcast_changes {
	uint32_t *pos;  /* positions, increasing */
	uint32_t *zz;   /* zig-zag ulp differences (new values: read cur at pos) */
	uint64_t n, cap;
	dcast_cpt_stats stats;
} dcast_changes;

/* Scratch slots, one array each, per thread (codec_scratch.c). */
enum { DCAST_SCRATCH_POS, DCAST_SCRATCH_ZZ, DCAST_SCRATCH_DEC_POS,
       DCAST_SCRATCH_DEC_VAL, DCAST_SCRATCH_DEC_STREAM, DCAST_SCRATCH_CPT2, DCAST_SCRATCH_SLOTS };

/* This thread's scratch array for `slot`, grown (contents kept) to at
 * least `bytes`; valid until the next call for the same slot.  NULL when
 * out of memory. */
void *dcast_scratch(unsigned slot, size_t bytes);

/* Find the changed elements of cur vs base and gather the compact stats.
 * The arrays are this thread's scratch (no free needed). */
int dcast_scan(const void *cur, const void *base, uint64_t count, unsigned es, dcast_changes *ch);

/* Grow ch so that `more` further entries fit. */
int dcast_changes_reserve(dcast_changes *ch, uint64_t more);

/* Compare kernels by instruction set; the scan picks the best the CPU has
 * unless forced (tests use this to run every variant). */
enum dcast_simd { DCAST_SIMD_AUTO = 0, DCAST_SIMD_PORTABLE, DCAST_SIMD_AVX2, DCAST_SIMD_AVX512 };
/* Force a variant (AUTO restores detection); returns the one now in use,
 * which is PORTABLE when the CPU lacks the one asked for. */
int dcast_simd_force(int simd);

/* 1 when the variant in use has BMI2 (AVX2 and AVX-512 imply it here): the
 * bit coders then run their BMI2 builds, which shift by a register. */
int dcast_simd_bmi2(void);

/* 1 when the variant in use is AVX-512 and the CPU has AVX512CD and
 * AVX512VL too: compact v2's coder then runs its 8-lanes-a-vector builds. */
int dcast_simd_avx512(void);

/* Compact v2's CPU builds (kernels/codec_compact2.c): all write the same
 * bytes and accept the same payloads. */
enum dcast_cpt2_build { DCAST_CPT2_PLAIN, DCAST_CPT2_AVX2, DCAST_CPT2_AVX512 };
/* The build the compare variant in use runs (dcast_simd_force picks it):
 * AVX512 where dcast_simd_avx512, else AVX2 under the AVX2 or AVX-512
 * variant, else PLAIN. */
int dcast_cpt2_build(void);

#if defined(__x86_64__)
#define DCAST_TARGET_BMI2 __attribute__((target("bmi,bmi2")))
#else
#define DCAST_TARGET_BMI2
#endif

/* LSB-first bit writer (the compact emitters'); each put stores 8 bytes,
 * so the buffer needs 8 bytes of slack past the last byte written, and a
 * put is at most 57 bits less the 7 pending. */
typedef struct dcast_bitwriter {
	uint8_t *start, *p;
	uint64_t acc;
	unsigned nbits;
} dcast_bitwriter;

static inline __attribute__((always_inline)) void dcast_bw_put(dcast_bitwriter *w, uint64_t v, unsigned len)
{
	w->acc |= v << w->nbits;
	w->nbits += len;
	memcpy(w->p, &w->acc, 8);
	w->p += w->nbits >> 3;
	w->acc >>= w->nbits & ~7u;
	w->nbits &= 7;
}

/* Exact bits of the positions under Rice parameter k. */
uint64_t dcast_cpt_pos_bits(const dcast_changes *ch, unsigned k);

/* Upper bound on them without a pass: each code is at most (gap >> k) + 1 + k. */
static inline uint64_t dcast_cpt_pos_bits_bound(const dcast_cpt_stats *st, unsigned k)
{
	return st->changed * (k + 1) + (st->gap_sum >> k);
}

/* Write a compact payload (pos_bits of the plan not needed); out has room
 * for its bytes + 8; cur is the range's new values (es bytes each), read for
 * raw values.  Returns the position bits it wrote. */
uint64_t dcast_cpt_emit(const dcast_changes *ch, const dcast_cpt_plan *p, const void *cur,
			unsigned es, uint8_t *out);

/* Compact v2 (codec_compact2.c): its exact payload bytes for the plan;
 * its payload written to out (room for its bytes; cur as for
 * dcast_cpt_emit), returning its bytes, 0 when out of memory; both put the
 * exact position bits (the same codes as v1's) into *pos_bits.  Its
 * decoder as dcast_cpt_decode (the v2 decoder names the problem itself). */
uint64_t dcast_cpt2_size(const dcast_changes *ch, const dcast_cpt_plan *p, uint64_t *pos_bits);
uint64_t dcast_cpt2_emit(const dcast_changes *ch, const dcast_cpt_plan *p, const void *cur, unsigned es,
			 uint8_t *out, uint64_t *pos_bits);
int dcast_cpt2_decode(const dcast_chunk_info *info, const uint8_t *payload, uint32_t *pos, uint32_t *val,
		      unsigned *mode);
/* The same with the lane-by-lane reference decoder alone (the fast path
 * hands it every failure; tests compare the two). */
int dcast_cpt2_decode_checked(const dcast_chunk_info *info, const uint8_t *payload, uint32_t *pos, uint32_t *val,
			      unsigned *mode);

/* More changes than a compact payload's bytes can hold: DCAST_ECORRUPT. */
int dcast_cpt_check_changed(const dcast_chunk_info *info);

/* Check a compact payload and decode it into pos/val (info->changed each):
 * the fast decoder, and the checking one when that fails (pos/val may be
 * scribbled on error). */
int dcast_cpt_decode(const dcast_chunk_info *info, const uint8_t *payload, uint32_t *pos,
		     uint32_t *val, unsigned *mode);

/* Positions ahead of the current one whose element a scatter or a gather
 * over decoded positions prefetches (the lines of a sparse delta are far
 * apart, and a load that misses stalls the walk: 3x slower without it). */
#define DCAST_PREFETCH_AHEAD 32

/* A decoded compact payload: positions and (zig-zag or raw) values in the
 * thread's scratch (DCAST_SCRATCH_DEC_POS / _VAL), valid until its next
 * decode; pos has DCAST_PREFETCH_AHEAD zero entries after the last, so a
 * loop may prefetch pos[i + DCAST_PREFETCH_AHEAD] without a bound check. */
typedef struct dcast_cpt_decoded {
	uint32_t *pos, *val;
	unsigned mode;
} dcast_cpt_decoded;

/* Check and decode a compact payload into the scratch (dcast_cpt_decode).
 * Errors: DCAST_ECORRUPT (more changes than the bytes can hold, or the
 * decoder's), DCAST_ENOMEM. */
int dcast_cpt_load(const dcast_chunk_info *info, const uint8_t *pl, dcast_cpt_decoded *dec);

/* Parse a compact (v1 or v2, info->encoding) payload's header and find
 * its stream: d (all but lut) and t filled; errors name the problem
 * (DCAST_ECORRUPT, DCAST_EPAYLOAD_SIZE).  dcast_cpt_lut_build: the value
 * code's lookup (DCAST_CPT_LUT_SIZE entries) from t.  dcast_cpt_fail: the
 * error of a decoder failure e (enum dcast_cpt_err) at element elem of a
 * payload of encoding enc. */
int dcast_cpt_open(const dcast_chunk_info *info, const uint8_t *payload, dcast_cpt_dec *d, dcast_cpt_table *t);
void dcast_cpt_lut_build(const dcast_cpt_table *t, unsigned nsym, uint16_t *lut);
int dcast_cpt_fail(int enc, int e, uint64_t elem);

/* The same with the sequential checking decoder only (the reference that
 * names the problem; tests compare the two). */
int dcast_cpt_decode_checked(const dcast_chunk_info *info, const uint8_t *payload, uint32_t *pos,
			     uint32_t *val, unsigned *mode);

/* The fast path of dcast_cpt_decode (codec_decode.c): several blocks at
 * once.  d and t as dcast_cpt_hdr_parse left them, idx the block index.
 * 0 when the payload decoded and passed every check the sequential decoder
 * makes; -1 when it did not or took a path this one leaves to that decoder
 * (which then runs and names the problem).  pos/val may be scribbled. */
int dcast_cpt_decode_fast(const dcast_cpt_dec *d, const dcast_cpt_table *t, const uint8_t *idx,
			  uint64_t changed, uint32_t *pos, uint32_t *val);

#include <string.h>

static inline uint32_t dcast_load_elem(const uint8_t *p, unsigned es)
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

static inline void dcast_store_elem(uint8_t *p, unsigned es, uint32_t v)
{
	uint8_t v8 = (uint8_t)v;
	uint16_t v16 = (uint16_t)v;
	switch (es) {
	case 1: memcpy(p, &v8, 1); break;
	case 2: memcpy(p, &v16, 2); break;
	default: memcpy(p, &v, 4); break;
	}
}

#endif
#endif
