/* Private to kernels/: the lane logic of compact v2 (docs/protocol.md,
 * "4: compact v2"), written once as host+device inline functions for the
 * CPU twin (codec_compact2.c, batch.c) and the warp kernel (batch.cu).
 *
 * Compact v2 codes the same codes as v1 (codec_shared.h) in blocks of 4096
 * changes; in a block, lane l (0..31) codes changes 32r + l of round r.
 * Each lane reads its own bit stream through a 64-bit buffer refilled with
 * 16-bit words, and the words of a block lie in the order in which the 32
 * lanes take them: before each code, in passes, every lane whose buffer
 * does not hold the whole code takes the next word, lanes in increasing
 * order (on the device: a warp ballot and a prefix popcount). */
#ifndef DCAST_CODEC_CPT2_H
#define DCAST_CODEC_CPT2_H

#include "codec_shared.h"

#define DCAST_CPT2_BLOCK 4096u   /* changes per index block */
#define DCAST_CPT2_LANES 32u     /* lanes per block: a warp */
#define DCAST_CPT2_ROUNDS (DCAST_CPT2_BLOCK / DCAST_CPT2_LANES)
#define DCAST_CPT2_WORD_BITS 16u /* a refill */

/* One lane's bit buffer: n bits held, the next code's first bit at bit 0,
 * every bit at or above n zero. */
typedef struct dcast_cpt2_lane {
	uint64_t buf;
	uint32_t n, pad;
} dcast_cpt2_lane;

DCAST_HD uint64_t dcast_cpt2_nblocks(uint64_t changed)
{
	return (changed + DCAST_CPT2_BLOCK - 1) / DCAST_CPT2_BLOCK;
}

DCAST_HD uint64_t dcast_cpt2_index_bytes(uint64_t changed)
{
	uint64_t nb = dcast_cpt2_nblocks(changed);
	return nb ? (nb - 1) * DCAST_CPT_INDEX_ENTRY : 0;
}

/* Changes in block b of a range with `changed` of them. */
DCAST_HD uint32_t dcast_cpt2_blk_changes(uint64_t changed, uint64_t b)
{
	uint64_t left = changed - b * DCAST_CPT2_BLOCK;
	return (uint32_t)(left < DCAST_CPT2_BLOCK ? left : DCAST_CPT2_BLOCK);
}

/* Length of the position code at the front of buf: longer than the bits
 * held when they are all ones (fewer than 20) or the code passes them. */
DCAST_HD unsigned dcast_cpt2_pos_len(uint64_t buf, unsigned k)
{
	unsigned t = (unsigned)DCAST_CTZ64(~buf); /* buf < 2^62: ~buf != 0 */
	return t >= DCAST_CPT_QESC ? DCAST_CPT_QESC + DCAST_CPT_GAP_BITS : t + 1 + k;
}

/* Length of the value code at the front of buf; LMAX + 1 where no code
 * matches its low 12 bits (a lane holding fewer takes a word first). */
DCAST_HD unsigned dcast_cpt2_val_len(const dcast_cpt_dec *d, uint64_t buf)
{
	if (d->mode == DCAST_CPT_RAW)
		return d->w;
	uint16_t e = d->lut[buf & (DCAST_CPT_LUT_SIZE - 1)];
	return e ? (e & 15u) + dcast_cpt_extra_bits(e >> 4) : DCAST_CPT_LMAX + 1;
}

/* Does the lane need a word before its position code (val 0) or its
 * value code (val 1)? */
DCAST_HD int dcast_cpt2_needs(const dcast_cpt_dec *d, const dcast_cpt2_lane *l, int val)
{
	return l->n < (val ? dcast_cpt2_val_len(d, l->buf) : dcast_cpt2_pos_len(l->buf, d->k));
}

DCAST_HD void dcast_cpt2_take(dcast_cpt2_lane *l, uint32_t word)
{
	l->buf |= (uint64_t)word << l->n;
	l->n += DCAST_CPT2_WORD_BITS;
}

/* The gap at the front of a lane that holds its whole position code. */
DCAST_HD uint32_t dcast_cpt2_gap(dcast_cpt2_lane *l, unsigned k)
{
	uint32_t gap;
	unsigned len = dcast_rice_decode(l->buf, k, &gap);
	l->buf >>= len;
	l->n -= len;
	return gap;
}

/* The value code at the front of a lane into *v; DCAST_CPT_ECODE when
 * no code matches. */
DCAST_HD int dcast_cpt2_value(const dcast_cpt_dec *d, dcast_cpt2_lane *l, uint32_t *v)
{
	unsigned len = dcast_cpt_value_decode(d, l->buf, v);
	if (!len || len > l->n)
		return DCAST_CPT_ECODE;
	l->buf >>= len;
	l->n -= len;
	return DCAST_CPT_OK;
}

/* Word j of a v2 stream (little-endian u16). */
DCAST_HD uint32_t dcast_cpt2_word(const uint8_t *stream, uint64_t j)
{
	return (uint32_t)stream[2 * j] | (uint32_t)stream[2 * j + 1] << 8;
}

/* Where block b starts (word offset, smallest position its first change
 * may take), from the index (block 0: the stream's start). */
DCAST_HD void dcast_cpt2_blk_start(const uint8_t *idx, uint64_t b, uint64_t *word, uint64_t *next)
{
	*word = b ? dcast_rd32le(idx + (b - 1) * DCAST_CPT_INDEX_ENTRY) : 0;
	*next = b ? (uint64_t)dcast_rd32le(idx + (b - 1) * DCAST_CPT_INDEX_ENTRY + 4) + 1 : 0;
}

/* A block decoded lane by lane, as the warp decodes it (the CPU decoder
 * and the batch's CPU twin): the code parameters, the stream's words, the
 * next word and the smallest position the next change may take. */
typedef struct dcast_cpt2_run {
	dcast_cpt_dec d;
	uint64_t nwords, at, next;
} dcast_cpt2_run;

/* One refill point of lanes [0, nl) before their position codes (val 0)
 * or value codes (val 1): in passes, each lane still short takes the next
 * word, lanes in increasing order. */
DCAST_HD int dcast_cpt2_refill(dcast_cpt2_run *x, dcast_cpt2_lane *ln, unsigned nl, int val)
{
	uint32_t pending = 0;
	for (unsigned l = 0; l < nl; l++)
		pending |= (uint32_t)dcast_cpt2_needs(&x->d, &ln[l], val) << l;
	while (pending) {
		for (uint32_t p = pending; p; p &= p - 1) {
			unsigned l = (unsigned)DCAST_CTZ64(p);
			if (x->at >= x->nwords)
				return DCAST_CPT_EOVERRUN;
			dcast_cpt2_take(&ln[l], dcast_cpt2_word(x->d.stream, x->at++));
			if (!dcast_cpt2_needs(&x->d, &ln[l], val))
				pending &= ~(1u << l);
		}
	}
	return DCAST_CPT_OK;
}

/* One round: nl lanes' positions (each checked below count), then their
 * values, into pos/val[0..nl). */
DCAST_HD int dcast_cpt2_round(dcast_cpt2_run *x, dcast_cpt2_lane *ln, unsigned nl, uint32_t *pos, uint32_t *val)
{
	uint64_t next = x->next;
	int e = dcast_cpt2_refill(x, ln, nl, 0);
	for (unsigned l = 0; !e && l < nl; l++) {
		next += dcast_cpt2_gap(&ln[l], x->d.k);
		if (next >= x->d.count)
			return DCAST_CPT_EPOS;
		pos[l] = (uint32_t)next++;
	}
	if (e || (e = dcast_cpt2_refill(x, ln, nl, 1)))
		return e;
	x->next = next;
	for (unsigned l = 0; l < nl; l++)
		if ((e = dcast_cpt2_value(&x->d, &ln[l], &val[l])))
			return e;
	return DCAST_CPT_OK;
}

/* A block of n changes from x's place; every lane must end with its
 * leftover bits zero. */
DCAST_HD int dcast_cpt2_blk_run(dcast_cpt2_run *x, uint32_t n, uint32_t *pos, uint32_t *val)
{
	dcast_cpt2_lane ln[DCAST_CPT2_LANES];
	for (unsigned l = 0; l < DCAST_CPT2_LANES; l++)
		ln[l].buf = 0, ln[l].n = 0;
	for (uint32_t at = 0; at < n; at += DCAST_CPT2_LANES) {
		unsigned nl = n - at < DCAST_CPT2_LANES ? n - at : DCAST_CPT2_LANES;
		int e = dcast_cpt2_round(x, ln, nl, pos + at, val + at);
		if (e)
			return e;
	}
	for (unsigned l = 0; l < DCAST_CPT2_LANES; l++)
		if (ln[l].buf)
			return DCAST_CPT_ETRAIL;
	return DCAST_CPT_OK;
}

#endif
