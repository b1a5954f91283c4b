/* Compact v2 on the CPU (docs/protocol.md, "4: compact v2"): its exact
 * size, the encoder, which lays each block's words out by running the
 * lanes' refills as a warp takes them, and the decoder, which runs the
 * same refills lane by lane and names the first problem it meets, as the
 * v1 decoder does.  The lane logic is codec_cpt2.h's, shared with the
 * warp kernel (batch.cu). */
#include <inttypes.h>
#include <string.h>
#include "codec_cpt2.h"
#include "dcast_common.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
/* Words one lane's stream of a block may need: 128 codes of at most
 * 46 + 43 bits. */
#define LANE_WORDS (DCAST_CPT2_ROUNDS * 89 / DCAST_CPT2_WORD_BITS + 1)

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

/* One lane's stream of a block as words, and its code lengths. */
typedef struct lane_out {
	uint64_t acc;
	uint32_t nbits, nw, taken, held;
	uint16_t w[LANE_WORDS];
} lane_out;

typedef struct blk_enc {
	lane_out lane[DCAST_CPT2_LANES];
	uint8_t len[2][DCAST_CPT2_BLOCK]; /* position, value code lengths */
} blk_enc;

static ALWAYS_INLINE void lane_put(lane_out *l, uint64_t bits, unsigned len)
{
	l->acc |= bits << l->nbits;
	l->nbits += len;
	while (l->nbits >= DCAST_CPT2_WORD_BITS) {
		l->w[l->nw++] = (uint16_t)l->acc;
		l->acc >>= DCAST_CPT2_WORD_BITS;
		l->nbits -= DCAST_CPT2_WORD_BITS;
	}
}

/* Every lane's codes of the block, in its own stream. */
static void blk_codes(blk_enc *e, const dcast_changes *ch, const dcast_cpt_plan *p, const uint8_t *cur,
		      unsigned es, uint64_t first, uint32_t n, uint64_t *pos_bits)
{
	uint32_t next = first ? ch->pos[first - 1] + 1 : 0;
	for (unsigned l = 0; l < DCAST_CPT2_LANES; l++)
		e->lane[l].acc = e->lane[l].nbits = e->lane[l].nw = e->lane[l].taken = e->lane[l].held = 0;
	for (uint32_t i = 0; i < n; i++) {
		lane_out *l = &e->lane[i % DCAST_CPT2_LANES];
		uint32_t at = ch->pos[first + i], gap = at - next;
		uint32_t newv = p->mode == DCAST_CPT_RAW ? dcast_load_elem(cur + (uint64_t)at * es, es) : 0;
		unsigned rlen = dcast_rice_len(gap, p->k), vlen;
		uint64_t vbits = dcast_cpt_value_bits(p, ch->zz[first + i], newv, &vlen);
		*pos_bits += rlen;
		lane_put(l, dcast_rice_bits(gap, p->k), rlen);
		lane_put(l, vbits, vlen);
		e->len[0][i] = (uint8_t)rlen;
		e->len[1][i] = (uint8_t)vlen;
		next = at + 1;
	}
	for (unsigned l = 0; l < DCAST_CPT2_LANES; l++)
		if (e->lane[l].nbits)
			e->lane[l].w[e->lane[l].nw++] = (uint16_t)e->lane[l].acc;
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
			memcpy(out, &lo->w[lo->taken++], 2); /* little-endian hosts only */
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

uint64_t dcast_cpt2_emit(const dcast_changes *ch, const dcast_cpt_plan *p, const void *cur, unsigned es,
			 uint8_t *out, uint64_t *pos_bits)
{
	uint8_t *idx = out + dcast_cpt_hdr_bytes(p->mode, p->w);
	uint8_t *stream = idx + dcast_cpt2_index_bytes(ch->n), *w = stream;
	blk_enc *e = dcast_scratch(DCAST_SCRATCH_CPT2, sizeof(blk_enc));
	if (!e)
		return 0;
	dcast_cpt_hdr_write(p, out);
	*pos_bits = 0;
	for (uint64_t b = 0; b < dcast_cpt2_nblocks(ch->n); b++) {
		uint64_t first = b * DCAST_CPT2_BLOCK;
		uint32_t n = dcast_cpt2_blk_changes(ch->n, b), ent[2];
		if (b) {
			ent[0] = (uint32_t)((w - stream) / 2);
			ent[1] = ch->pos[first - 1];
			memcpy(idx + (b - 1) * DCAST_CPT_INDEX_ENTRY, ent, sizeof(ent));
		}
		blk_codes(e, ch, p, cur, es, first, n, pos_bits);
		w = blk_lay(e, n, w);
	}
	return (uint64_t)(w - out);
}

/* ---- the decoder ---- */

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

int dcast_cpt2_decode(const dcast_chunk_info *info, const uint8_t *payload, uint32_t *pos, uint32_t *val,
		      unsigned *mode)
{
	dcast_cpt_table t;
	uint16_t lut[DCAST_CPT_LUT_SIZE];
	dcast_cpt2_run x = { .at = 0, .next = 0 };
	int rc = dcast_cpt_open(info, payload, &x.d, &t);
	if (rc)
		return rc;
	x.d.lut = lut;
	if (x.d.mode == DCAST_CPT_CODED)
		dcast_cpt_lut_build(&t, dcast_cpt_nsym(x.d.w), lut);
	x.nwords = x.d.stream_bytes / 2;
	*mode = x.d.mode;
	return blocks_run(&x, payload + dcast_cpt_hdr_bytes(x.d.mode, x.d.w), info->changed, pos, val);
}
