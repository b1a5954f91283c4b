/* The fast compact decoder on the CPU.  Decoding one element is a chain of
 * dependent steps (load, count ones, table lookup, advance), so one stream
 * runs at the latency of that chain.  The block index names where every
 * block of 1024 elements starts, so this decodes four blocks at once, one
 * independent chain each, and checks at each block's end that it stopped
 * exactly where the index says the next one starts (what the sequential
 * decoder checks too).  The value table resolves code and extra bits in one
 * lookup.  It accepts exactly what the reference decoder (codec_compact.c)
 * accepts; on any failure it stops and leaves it to that decoder to name
 * the problem.  Byte layout: docs/protocol.md, "Delta codec". */
#include <string.h>
#include "codec_impl.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define LANES 4u          /* blocks decoded side by side */
#define FAST_MAX_BITS 57u /* one 64-bit load covers this many bits */
#define LUT_EXTRA 16u     /* lut entry flag: the extra bits lie past the index */

/* Decoding facts shared by the lanes.  A lut entry resolves the next 12
 * bits to the value's total code length (bits 0-3) and its zig-zag
 * difference (bits 5-15); where the extra bits of a long symbol do not fit
 * in 12 bits, LUT_EXTRA is set, bits 0-3 hold the prefix length and 5-15
 * the symbol.  0 where no code matches. */
typedef struct fastdec {
	const dcast_cpt_dec *d;
	const uint8_t *stream;
	uint64_t nbytes, end_bit, tail_start, kmask;
	unsigned k, w, reload_at; /* reload the window when the Rice code is longer */
	uint32_t wmask;
	uint8_t tail[32];         /* the stream's last bytes, zeros after */
	uint16_t lut[DCAST_CPT_LUT_SIZE];
} fastdec;

/* One block being decoded: where its stream is and the next position;
 * its outputs go to pos/val[out..end). */
typedef struct lane {
	uint64_t bit, next, out, end;
} lane;

static uint16_t lut_entry(unsigned s, unsigned l, unsigned j)
{
	unsigned eb = dcast_cpt_extra_bits(s);
	if (s < DCAST_CPT_NDIRECT)
		return (uint16_t)((s + 1) << 5 | l);
	if (l + eb > DCAST_CPT_LMAX || eb > 10)
		return (uint16_t)(s << 5 | LUT_EXTRA | l);
	return (uint16_t)(((1u << eb) | ((j >> l) & ((1u << eb) - 1))) << 5 | (l + eb));
}

static void lut_make(fastdec *f, const dcast_cpt_table *t)
{
	unsigned nsym = dcast_cpt_nsym(f->w);
	memset(f->lut, 0, sizeof(f->lut));
	for (unsigned s = 0; s < nsym; s++) {
		unsigned l = t->len[s];
		for (unsigned j = l ? t->code[s] : DCAST_CPT_LUT_SIZE; j < DCAST_CPT_LUT_SIZE; j += 1u << l)
			f->lut[j] = lut_entry(s, l, j);
	}
}

static void fastdec_init(fastdec *f, const dcast_cpt_dec *d, const dcast_cpt_table *t)
{
	unsigned longest = d->mode == DCAST_CPT_RAW ? d->w : DCAST_CPT_LMAX + d->w - 3;
	*f = (fastdec){ .d = d, .stream = d->stream, .nbytes = d->stream_bytes, .end_bit = d->stream_bytes * 8,
			.tail_start = d->stream_bytes > 8 ? d->stream_bytes - 8 : 0,
			.kmask = (1ull << d->k) - 1, .k = d->k, .w = d->w,
			.reload_at = FAST_MAX_BITS - longest, .wmask = dcast_mask_w(d->w) };
	memcpy(f->tail, d->stream + f->tail_start, d->stream_bytes - f->tail_start);
	if (d->mode == DCAST_CPT_CODED)
		lut_make(f, t);
}

/* 64 bits of the stream from bit b (b <= end_bit), zeros past its end. */
static ALWAYS_INLINE uint64_t peek(const fastdec *f, uint64_t b)
{
	uint64_t w, byte = b >> 3;
	if (LIKELY(byte + 8 <= f->nbytes))
		memcpy(&w, f->stream + byte, 8);
	else
		memcpy(&w, f->tail + (byte - f->tail_start), 8);
	return w >> (b & 7);
}

/* The Rice-coded gap at *b: returns the gap, advances *b past it when the
 * rest of the window is too short for the value (then *w is reloaded and
 * *rl is 0), else leaves *rl = its length.  0 in *ok on an overrun. */
static ALWAYS_INLINE uint64_t gap_decode(const fastdec *f, uint64_t *b, uint64_t *w, unsigned *rl,
					 int *ok)
{
	unsigned q = (unsigned)__builtin_ctzll(~*w | 1ull << 63);
	uint64_t gap;
	if (LIKELY(q < DCAST_CPT_QESC)) {
		*rl = q + 1 + f->k;
		gap = (uint64_t)q << f->k | ((*w >> (q + 1)) & f->kmask);
		if (LIKELY(*rl <= f->reload_at))
			return gap;
	} else {
		*rl = DCAST_CPT_QESC + DCAST_CPT_GAP_BITS;
		gap = (*w >> DCAST_CPT_QESC) & ((1u << DCAST_CPT_GAP_BITS) - 1);
	}
	*b += *rl;
	*ok = *b <= f->end_bit;
	*w = *ok ? peek(f, *b) : 0;
	*rl = 0;
	return gap;
}

/* The value code in the low bits of v: its zig-zag difference (or raw
 * value) and length; length 0 when no code matches. */
static ALWAYS_INLINE uint32_t value_decode(const fastdec *f, uint64_t v, unsigned *tl, int raw)
{
	if (raw) {
		*tl = f->w;
		return (uint32_t)v & f->wmask;
	}
	unsigned e = f->lut[v & (DCAST_CPT_LUT_SIZE - 1)];
	if (LIKELY(!(e & LUT_EXTRA))) {
		*tl = e & 15;
		return e >> 5;
	}
	unsigned cl = e & 15, eb = dcast_cpt_extra_bits(e >> 5);
	*tl = cl + eb;
	return 1u << eb | ((uint32_t)(v >> cl) & ((1u << eb) - 1));
}

/* Decode the element at *bit, the outputs to *pos and *val; 0 (stop, the
 * reference decoder will name the problem) on a bad code or an overrun. */
static ALWAYS_INLINE int elem_fast(const fastdec *f, uint64_t *bit, uint64_t *next, uint32_t *pos,
				   uint32_t *val, int raw)
{
	uint64_t b = *bit, w = peek(f, b);
	unsigned rl, tl;
	int ok = 1;
	uint64_t gap = gap_decode(f, &b, &w, &rl, &ok);
	uint32_t zz = value_decode(f, w >> rl, &tl, raw);
	b += rl + tl;
	if (!ok || !tl || b > f->end_bit)
		return 0;
	*bit = b;
	*next += gap;
	*pos = (uint32_t)*next;
	*val = zz;
	*next += 1;
	return 1;
}

/* Four full blocks in lockstep: four independent chains, all state in
 * registers. */
static ALWAYS_INLINE int lockstep4(const fastdec *f, lane *ln, uint32_t *pos, uint32_t *val, int raw)
{
	uint64_t b0 = ln[0].bit, b1 = ln[1].bit, b2 = ln[2].bit, b3 = ln[3].bit;
	uint64_t n0 = ln[0].next, n1 = ln[1].next, n2 = ln[2].next, n3 = ln[3].next;
	uint32_t *p = pos + ln[0].out, *v = val + ln[0].out;
	const uint64_t B = DCAST_CPT_BLOCK;
	for (uint64_t i = 0; i < B; i++) {
		if (!elem_fast(f, &b0, &n0, p + i, v + i, raw) ||
		    !elem_fast(f, &b1, &n1, p + B + i, v + B + i, raw) ||
		    !elem_fast(f, &b2, &n2, p + 2 * B + i, v + 2 * B + i, raw) ||
		    !elem_fast(f, &b3, &n3, p + 3 * B + i, v + 3 * B + i, raw))
			return -1;
	}
	ln[0].bit = b0, ln[1].bit = b1, ln[2].bit = b2, ln[3].bit = b3;
	ln[0].next = n0, ln[1].next = n1, ln[2].next = n2, ln[3].next = n3;
	return 0;
}

/* One lane alone. */
static ALWAYS_INLINE int lane_run(const fastdec *f, lane *l, uint32_t *pos, uint32_t *val, int raw)
{
	for (uint64_t i = l->out; i < l->end; i++)
		if (!elem_fast(f, &l->bit, &l->next, pos + i, val + i, raw))
			return -1;
	return 0;
}

static ALWAYS_INLINE int lanes_run(const fastdec *f, lane *ln, unsigned n, uint32_t *pos,
				   uint32_t *val, int raw)
{
	if (n == LANES && ln[n - 1].end - ln[n - 1].out == DCAST_CPT_BLOCK)
		return lockstep4(f, ln, pos, val, raw);
	for (unsigned j = 0; j < n; j++)
		if (lane_run(f, &ln[j], pos, val, raw))
			return -1;
	return 0;
}

static int lanes_run_mode(const fastdec *f, lane *ln, unsigned n, uint32_t *pos, uint32_t *val)
{
	return f->d->mode == DCAST_CPT_RAW ? lanes_run(f, ln, n, pos, val, 1)
					   : lanes_run(f, ln, n, pos, val, 0);
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
		if (ln[j].bit > f->d->stream_bytes * 8 || ln[j].next > f->d->count)
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

int dcast_cpt_decode_fast(const dcast_cpt_dec *d, const dcast_cpt_table *t, const uint8_t *idx,
			  uint64_t changed, uint32_t *pos, uint32_t *val)
{
	fastdec f;
	uint64_t nblocks = dcast_cpt_nblocks(changed);
	lane ln[LANES];
	if (!nblocks)
		return dcast_cpt_check_trail(d, 0) ? -1 : 0;
	fastdec_init(&f, d, t);
	for (uint64_t first = 0; first < nblocks; first += LANES) {
		unsigned n = nblocks - first < LANES ? (unsigned)(nblocks - first) : LANES;
		if (lanes_init(&f, idx, changed, first, n, ln) || lanes_run_mode(&f, ln, n, pos, val) ||
		    lanes_check(&f, idx, nblocks, first, n, ln))
			return -1;
	}
	return 0;
}
