/* The fast compact decoder on the CPU.  Decoding one element is a chain of
 * dependent steps (load, count ones, table lookup, advance), so one stream
 * runs at the latency of that chain.  The block index names where every
 * block of 1024 elements starts, so this decodes four blocks at once, one
 * independent chain each, and checks at each block's end that it stopped
 * exactly where the index says the next one starts (what the sequential
 * decoder checks too).  The value table resolves code and extra bits in one
 * lookup; the stream is read from a copy with zeros after it, so a load
 * needs no bounds check and an overrun is caught once per step of all
 * lanes.  It accepts exactly what the reference decoder (codec_compact.c)
 * accepts; on any failure it stops and leaves it to that decoder to name
 * the problem.  Byte layout: docs/protocol.md, "Delta codec". */
#include <string.h>
#include "codec_shared.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define FAST_MAX_BITS 57u /* one 64-bit load covers this many bits */
#define LUT_SLOW 0x8000u  /* lut entry flag: extra bits past the index, or no code */
#define LUT_NONE 0xffffu  /* lut entry: no code matches */
#define OVERRUN (1u << 24) /* bits a bad code advances by: past any stream end */
#define PAD_BYTES 32u     /* zeros after the stream copy: a step reads < 24 past its end */

/* Decoding facts shared by the lanes.  A lut entry resolves the next
 * lbits bits (lut_bits: 12 at most, fewer for a small chunk) to the
 * value's total code length (bits 0-3, 1..lbits) and its zig-zag
 * difference (bits 5-14, below 1024); where the extra bits of a long
 * symbol do not fit there, LUT_SLOW is set, bits 0-3 hold the prefix
 * length and 5-10 the symbol.  LUT_NONE where no code matches. */
typedef struct fastdec {
	const dcast_cpt_dec *d;
	const uint8_t *stream;    /* copy of the stream, PAD_BYTES zeros after */
	uint64_t end_bit, kmask;
	unsigned k, w, reload_at; /* reload the window when the Rice code is longer */
	uint32_t wmask, lmask;    /* lmask: the lut's index bits, 1 << lbits less one */
	uint16_t lut[DCAST_CPT_LUT_SIZE];
} fastdec;

/* One block being decoded: where its stream is and the next position;
 * its outputs go to pos/val[out..end). */
typedef struct lane {
	uint64_t bit, next, out, end;
} lane;

/* Does the entry of symbol s (code length l) hold its extra bits too?
 * Not for a direct symbol (none), nor where they pass the index. */
static int entry_holds_extra(unsigned s, unsigned l, unsigned lbits)
{
	unsigned eb = dcast_cpt_extra_bits(s);
	return s >= DCAST_CPT_NDIRECT && l + eb <= lbits && eb <= 9;
}

static uint16_t lut_entry(unsigned s, unsigned l, unsigned j, unsigned lbits)
{
	unsigned eb = dcast_cpt_extra_bits(s);
	if (s < DCAST_CPT_NDIRECT)
		return (uint16_t)((s + 1) << 5 | l);
	if (!entry_holds_extra(s, l, lbits))
		return (uint16_t)(LUT_SLOW | s << 5 | l);
	return (uint16_t)(((1u << eb) | ((j >> l) & ((1u << eb) - 1))) << 5 | (l + eb));
}

/* Index bits of the lut: every code fits (the longest code's length at
 * least), and filling it costs at most a few entries per element: a chunk
 * of a small tensor (a mixture-of-experts expert: about a hundred changes)
 * would otherwise spend more on the 4096 entries than on its elements.
 * Fewer bits only send more long values through value_long. */
static unsigned lut_bits(const dcast_cpt_table *t, unsigned nsym, uint64_t changed)
{
	unsigned longest = 1, want = changed >> 10 ? DCAST_CPT_LMAX : dcast_bitlen32((uint32_t)changed) + 2;
	for (unsigned s = 0; s < nsym; s++)
		longest = t->len[s] > longest ? t->len[s] : longest;
	return want > longest ? want : longest;
}

/* The index bits that fix symbol s's entries: its code's, and its extra
 * bits' when the entry holds them; 0 for a symbol with no code. */
static unsigned lut_level(const dcast_cpt_table *t, unsigned s, unsigned lbits)
{
	unsigned l = t->len[s];
	return l && entry_holds_extra(s, l, lbits) ? l + dcast_cpt_extra_bits(s) : l;
}

/* Level by level: at level L the lut has 2^L entries, copied from level
 * L - 1 (an entry fixed by fewer low bits holds for every index that ends
 * in them), then those fixed by exactly L bits set.  A short code costs one
 * store and its share of the copies, where filling each index it matches
 * cost 2^(lbits - l) stores: most of a small chunk's decode. */
static void lut_make(fastdec *f, const dcast_cpt_table *t, uint64_t changed)
{
	unsigned nsym = dcast_cpt_nsym(f->w), lbits = lut_bits(t, nsym, changed);
	unsigned char lev[DCAST_CPT_NSYM_MAX];

	for (unsigned s = 0; s < nsym; s++)
		lev[s] = (unsigned char)lut_level(t, s, lbits);
	f->lmask = (1u << lbits) - 1;
	f->lut[0] = LUT_NONE;
	for (unsigned L = 1; L <= lbits; L++) {
		memcpy(f->lut + (1u << (L - 1)), f->lut, (1u << (L - 1)) * sizeof(f->lut[0]));
		for (unsigned s = 0; s < nsym; s++) {
			unsigned l = t->len[s];
			if (lev[s] == L) /* x: the extra bits, when the entry holds them */
				for (unsigned x = 0; x < 1u << (L - l); x++)
					f->lut[t->code[s] | x << l] = lut_entry(s, l, t->code[s] | x << l, lbits);
		}
	}
}

static int fastdec_init(fastdec *f, const dcast_cpt_dec *d, const dcast_cpt_table *t, uint64_t changed)
{
	unsigned longest = d->mode == DCAST_CPT_RAW ? d->w : DCAST_CPT_LMAX + d->w - 3;
	uint8_t *copy = dcast_scratch(DCAST_SCRATCH_DEC_STREAM, d->stream_bytes + PAD_BYTES);
	if (!copy)
		return -1;
	memcpy(copy, d->stream, d->stream_bytes);
	memset(copy + d->stream_bytes, 0, PAD_BYTES);
	/* field by field: a compound literal would also zero the lut */
	f->d = d, f->stream = copy, f->end_bit = d->stream_bytes * 8;
	f->kmask = (1ull << d->k) - 1, f->k = d->k, f->w = d->w;
	f->reload_at = FAST_MAX_BITS - longest, f->wmask = dcast_mask_w(d->w), f->lmask = 0;
	if (d->mode == DCAST_CPT_CODED)
		lut_make(f, t, changed);
	return 0;
}

/* 64 bits of the stream from bit b, zeros past its end (b at most a step
 * past end_bit). */
static ALWAYS_INLINE uint64_t peek(const fastdec *f, uint64_t b)
{
	uint64_t w;
	memcpy(&w, f->stream + (b >> 3), 8);
	return w >> (b & 7);
}

/* The Rice-coded gap at *b (window *w): returns the gap and its length in
 * *rl; when the rest of the window may be too short for the value (an
 * escaped gap, or a long one when longk), advances *b past it, reloads *w
 * and sets *rl to 0. */
static ALWAYS_INLINE uint64_t gap_decode(const fastdec *f, uint64_t *b, uint64_t *w, unsigned *rl,
					 int longk)
{
	unsigned q = (unsigned)__builtin_ctzll(~*w | 1ull << 63);
	uint64_t gap;
	if (LIKELY(q < DCAST_CPT_QESC)) {
		*rl = q + 1 + f->k;
		gap = (uint64_t)q << f->k | ((*w >> (q + 1)) & f->kmask);
		if (!longk || LIKELY(*rl <= f->reload_at))
			return gap;
	} else {
		*rl = DCAST_CPT_QESC + DCAST_CPT_GAP_BITS;
		gap = (*w >> DCAST_CPT_QESC) & ((1u << DCAST_CPT_GAP_BITS) - 1);
	}
	*b += *rl;
	*w = peek(f, *b);
	*rl = 0;
	return gap;
}

/* A value code whose extra bits lie past the table index; no code at all
 * gets a length that runs past the stream's end. */
static uint32_t value_long(unsigned e, uint64_t v, unsigned *tl)
{
	unsigned cl = e & 15, eb = dcast_cpt_extra_bits((e >> 5) & 63);
	if (e == LUT_NONE) {
		*tl = OVERRUN;
		return 0;
	}
	*tl = cl + eb;
	return 1u << eb | ((uint32_t)(v >> cl) & ((1u << eb) - 1));
}

/* The value code in the low bits of v: its zig-zag difference (or raw
 * value) and length. */
static ALWAYS_INLINE uint32_t value_decode(const fastdec *f, uint64_t v, unsigned *tl, int raw)
{
	if (raw) {
		*tl = f->w;
		return (uint32_t)v & f->wmask;
	}
	unsigned e = f->lut[v & f->lmask];
	if (LIKELY(!(e & LUT_SLOW))) {
		*tl = e & 15;
		return e >> 5;
	}
	return value_long(e, v, tl);
}

/* Decode the element at *bit, the outputs to *pos and *val.  A bad code
 * or an overrun shows as *bit past end_bit, which the caller checks before
 * the next load. */
static ALWAYS_INLINE void elem_fast(const fastdec *f, uint64_t *bit, uint64_t *next, uint32_t *pos,
				   uint32_t *val, int raw, int longk)
{
	uint64_t b = *bit, w = peek(f, b);
	unsigned rl, tl;
	uint64_t gap = gap_decode(f, &b, &w, &rl, longk);
	*val = value_decode(f, w >> rl, &tl, raw);
	*bit = b + rl + tl;
	*next += gap;
	*pos = (uint32_t)*next;
	*next += 1;
}

static ALWAYS_INLINE uint64_t max64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* Four full blocks in lockstep: four independent chains, all state in
 * registers. */
static ALWAYS_INLINE int lockstep4(const fastdec *f, lane *ln, uint32_t *pos, uint32_t *val, int raw,
				   int longk)
{
	uint64_t b0 = ln[0].bit, b1 = ln[1].bit, b2 = ln[2].bit, b3 = ln[3].bit;
	uint64_t n0 = ln[0].next, n1 = ln[1].next, n2 = ln[2].next, n3 = ln[3].next;
	uint32_t *p = pos + ln[0].out, *v = val + ln[0].out;
	const uint64_t B = DCAST_CPT_BLOCK;
	for (uint64_t i = 0; i < B; i++) {
		elem_fast(f, &b0, &n0, p + i, v + i, raw, longk);
		elem_fast(f, &b1, &n1, p + B + i, v + B + i, raw, longk);
		elem_fast(f, &b2, &n2, p + 2 * B + i, v + 2 * B + i, raw, longk);
		elem_fast(f, &b3, &n3, p + 3 * B + i, v + 3 * B + i, raw, longk);
		if (max64(max64(b0, b1), max64(b2, b3)) > f->end_bit)
			return -1;
	}
	ln[0].bit = b0, ln[1].bit = b1, ln[2].bit = b2, ln[3].bit = b3;
	ln[0].next = n0, ln[1].next = n1, ln[2].next = n2, ln[3].next = n3;
	return 0;
}

/* One lane alone. */
static ALWAYS_INLINE int lane_run(const fastdec *f, lane *l, uint32_t *pos, uint32_t *val, int raw,
				  int longk)
{
	for (uint64_t i = l->out; i < l->end; i++) {
		elem_fast(f, &l->bit, &l->next, pos + i, val + i, raw, longk);
		if (l->bit > f->end_bit)
			return -1;
	}
	return 0;
}

static ALWAYS_INLINE int lanes_run(const fastdec *f, lane *ln, unsigned n, uint32_t *pos,
				   uint32_t *val, int raw, int longk)
{
	if (n == 4 && ln[3].end - ln[3].out == DCAST_CPT_BLOCK)
		return lockstep4(f, ln, pos, val, raw, longk);
	for (unsigned j = 0; j < n; j++)
		if (lane_run(f, &ln[j], pos, val, raw, longk))
			return -1;
	return 0;
}

/* One variant per value mode, and for Rice codes that may leave too few
 * bits in the window for the value (a large k). */
static ALWAYS_INLINE int lanes_run_mode(const fastdec *f, lane *ln, unsigned n, uint32_t *pos,
					 uint32_t *val)
{
	int raw = f->d->mode == DCAST_CPT_RAW, longk = f->k + DCAST_CPT_QESC > f->reload_at;
	if (raw)
		return longk ? lanes_run(f, ln, n, pos, val, 1, 1) : lanes_run(f, ln, n, pos, val, 1, 0);
	return longk ? lanes_run(f, ln, n, pos, val, 0, 1) : lanes_run(f, ln, n, pos, val, 0, 0);
}

/* Where block b starts, from the index (block 0 at the stream's start). */
static void block_start(const uint8_t *idx, uint64_t b, uint64_t *bit, uint64_t *next)
{
	uint32_t e[2] = { 0, 0 };
	if (b)
		memcpy(e, idx + (b - 1) * DCAST_CPT_INDEX_ENTRY, sizeof(e));
	*bit = e[0];
	*next = b ? (uint64_t)e[1] + 1 : 0;
}

/* Lanes for blocks [first, first + n): their starts must lie in the stream
 * and the range. */
static int lanes_init(const fastdec *f, const uint8_t *idx, uint64_t changed, uint64_t first,
		      unsigned n, lane *ln)
{
	for (unsigned j = 0; j < n; j++) {
		uint64_t e0 = (first + j) * DCAST_CPT_BLOCK, cnt = changed - e0;
		cnt = cnt < DCAST_CPT_BLOCK ? cnt : DCAST_CPT_BLOCK;
		block_start(idx, first + j, &ln[j].bit, &ln[j].next);
		if (ln[j].bit > f->end_bit || ln[j].next > f->d->count)
			return -1;
		ln[j].out = e0;
		ln[j].end = e0 + cnt;
	}
	return 0;
}

/* Each lane must end where the next block starts (the last one: where the
 * stream ends), its last position inside the range. */
static int lanes_check(const fastdec *f, const uint8_t *idx, uint64_t nblocks, uint64_t first,
		       unsigned n, const lane *ln)
{
	for (unsigned j = 0; j < n; j++) {
		uint64_t b = first + j + 1, bit, next;
		if (ln[j].next > f->d->count)
			return -1;
		if (b == nblocks)
			return dcast_cpt_check_trail(f->d, ln[j].bit) ? -1 : 0;
		block_start(idx, b, &bit, &next);
		if (bit != ln[j].bit || next != ln[j].next)
			return -1;
	}
	return 0;
}

/* Every block, four at a time. */
static ALWAYS_INLINE int blocks_run(const fastdec *f, const uint8_t *idx, uint64_t changed,
				    uint32_t *pos, uint32_t *val)
{
	uint64_t nblocks = dcast_cpt_nblocks(changed);
	lane ln[4];
	for (uint64_t first = 0; first < nblocks; first += 4) {
		unsigned n = nblocks - first < 4 ? (unsigned)(nblocks - first) : 4;
		if (lanes_init(f, idx, changed, first, n, ln) || lanes_run_mode(f, ln, n, pos, val) ||
		    lanes_check(f, idx, nblocks, first, n, ln))
			return -1;
	}
	return 0;
}

/* blocks_run built twice: for BMI2 and for any x86-64. */
DCAST_TARGET_BMI2 static int blocks_run_bmi2(const fastdec *f, const uint8_t *idx, uint64_t changed,
					     uint32_t *pos, uint32_t *val)
{
	return blocks_run(f, idx, changed, pos, val);
}

static int blocks_run_plain(const fastdec *f, const uint8_t *idx, uint64_t changed, uint32_t *pos,
			    uint32_t *val)
{
	return blocks_run(f, idx, changed, pos, val);
}

int dcast_cpt_decode_fast(const dcast_cpt_dec *d, const dcast_cpt_table *t, const uint8_t *idx,
			  uint64_t changed, uint32_t *pos, uint32_t *val)
{
	fastdec f;
	if (!changed)
		return dcast_cpt_check_trail(d, 0) ? -1 : 0;
	if (fastdec_init(&f, d, t, changed))
		return -1;
	if (dcast_simd_bmi2())
		return blocks_run_bmi2(&f, idx, changed, pos, val);
	return blocks_run_plain(&f, idx, changed, pos, val);
}
