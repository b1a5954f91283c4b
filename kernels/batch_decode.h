/* Private to kernels/: compact payloads of a batch decoded on the device,
 * every index block of every chunk of a version in one launch per
 * encoding (compact v1: one thread a block of 1024 changes, a 59 GB shard
 * at 1% has ~290,000 of them; compact v2: one warp a block of 4096, after
 * a launch that builds the v2 chunks' code lookups from their headers),
 * then the chain check (each block ends where the next one's index entry
 * starts, the last one at the stream's end) in a last launch, a thread a
 * block.  The block logic is codec_shared.h's and codec_cpt2.h's, written
 * once for the CPU twin (batch.c) and the kernels (batch.cu).
 *
 * One buffer holds, each at a multiple of 8 bytes (dcast_batch_dmap):
 *   cpt[n_cpt]   one per chunk: where its stream and block index are in
 *                the payloads, its code parameters, its first change in
 *                the batch's pos/code arrays, and its first failure (out);
 *   blk[n_blk]   each block's chunk and number in it;
 *   end[n_blk]   each block's decoder state at its end (scratch);
 *   lut[n_lut]   the coded chunks' value-code lookups, DCAST_CPT_LUT_SIZE each;
 *   payload[payload_bytes]  the payloads, each at a multiple of 8. */
#ifndef DCAST_BATCH_DECODE_H
#define DCAST_BATCH_DECODE_H

#include "codec_cpt2.h"
#include "dcast_batch.h"

#define DCAST_BATCH_NO_ERR UINT64_MAX
#define DCAST_BATCH_SKIP 0xffffffffu /* cpt.mode of a chunk refused at its header: its blocks do nothing */

typedef struct dcast_batch_cpt {
	uint64_t payload_off;   /* its payload in payload[] */
	uint64_t stream_off;    /* its bitstream, from the payload's start */
	uint64_t stream_bytes;
	uint64_t index_off;     /* its block index, from the payload's start */
	uint64_t lut_off;       /* its lookup in lut[] (coded mode) */
	uint64_t count, changed;
	uint64_t first;         /* its first change in the batch's pos and code */
	uint64_t err;           /* out: its first failure's key (dcast_batch_err_key), or NO_ERR */
	uint32_t k, mode, w, enc; /* enc: DCAST_ENC_COMPACT or DCAST_ENC_COMPACT2 */
} dcast_batch_cpt;

typedef struct dcast_batch_blk {
	uint32_t cpt, b;
} dcast_batch_blk;

typedef struct dcast_batch_end {
	uint64_t bit, next; /* v2: bit is the word offset */
	int32_t status, pad;
} dcast_batch_end;

typedef struct dcast_batch_ddims {
	uint64_t n_cpt, n_blk, n_lut, payload_bytes;
} dcast_batch_ddims;

typedef struct dcast_batch_dec {
	dcast_batch_ddims d;
	unsigned char *base;
	dcast_batch_cpt *cpt;
	dcast_batch_blk *blk;
	dcast_batch_end *end;
	uint16_t *lut;
	unsigned char *payload;
} dcast_batch_dec;

/* A failure's key: its element above its kind, so that the smallest key is
 * the failure the CPU's block-by-block decoder meets first (an index
 * mismatch at a block comes before that block's own decode failure, so it
 * takes kind 0). */
DCAST_HD uint64_t dcast_batch_err_key(uint64_t elem, int e)
{
	return elem << 8 | (uint64_t)(e == DCAST_CPT_EINDEX ? 0 : e);
}

DCAST_HD void dcast_batch_cpt_dec(const dcast_batch_dec *x, const dcast_batch_cpt *p, dcast_cpt_dec *d)
{
	d->stream = x->payload + p->payload_off + p->stream_off;
	d->stream_bytes = p->stream_bytes;
	d->count = p->count;
	d->k = p->k, d->mode = p->mode, d->w = p->w;
	d->lut = x->lut + p->lut_off;
}

/* Is the encoding one the batch decodes on the device? */
DCAST_HD int dcast_batch_is_cpt(uint32_t enc)
{
	return enc == DCAST_ENC_COMPACT || enc == DCAST_ENC_COMPACT2;
}

/* Index blocks of a compact chunk of that encoding and change count. */
DCAST_HD uint64_t dcast_batch_nblocks(uint32_t enc, uint64_t changed)
{
	return enc == DCAST_ENC_COMPACT2 ? dcast_cpt2_nblocks(changed) : dcast_cpt_nblocks(changed);
}

/* Entries [first, LUT_SIZE) step `step` of v2 chunk c's lookup, built
 * from its header's code lengths (checked when it was put). */
DCAST_HD void dcast_batch_lut_fill(const dcast_batch_dec *x, uint64_t c, unsigned first, unsigned step)
{
	const dcast_batch_cpt *p = &x->cpt[c];
	const uint8_t *pl = x->payload + p->payload_off;
	unsigned nsym = dcast_cpt_nsym(p->w);
	dcast_cpt_table t;

	if (p->enc != DCAST_ENC_COMPACT2 || p->mode != DCAST_CPT_CODED)
		return;
	for (unsigned i = 0; i < DCAST_CPT_NSYM_MAX; i++)
		t.len[i] = i < nsym ? (pl[DCAST_CPT_HDR_FIXED + i / 2] >> (4 * (i & 1))) & 15 : 0;
	dcast_cpt_table_codes(&t, nsym);
	dcast_cpt_lut_fill(&t, nsym, x->lut + p->lut_off, first, step);
}

/* v2 block g decoded lane by lane (the warp kernel's twin) into its place
 * in pos/code; its end state (word offset, next position) into end[g]. */
DCAST_HD void dcast_batch_decode_blk2(const dcast_batch_dec *x, uint64_t g, uint32_t *pos, uint32_t *code)
{
	dcast_batch_blk k = x->blk[g];
	const dcast_batch_cpt *p = &x->cpt[k.cpt];
	uint64_t first = (uint64_t)k.b * DCAST_CPT2_BLOCK;
	dcast_cpt2_run r;

	if (p->mode == DCAST_BATCH_SKIP)
		return;
	dcast_batch_cpt_dec(x, p, &r.d);
	r.nwords = p->stream_bytes / 2;
	dcast_cpt2_blk_start(x->payload + p->payload_off + p->index_off, k.b, &r.at, &r.next);
	x->end[g].status = dcast_cpt2_blk_run(&r, dcast_cpt2_blk_changes(p->changed, k.b), pos + p->first + first,
					      code + p->first + first);
	x->end[g].bit = r.at;
	x->end[g].next = r.next;
}

/* Decode v1 block g into its place in pos/code; its end state into end[g]. */
DCAST_HD void dcast_batch_decode_blk(const dcast_batch_dec *x, uint64_t g, uint32_t *pos, uint32_t *code)
{
	dcast_batch_blk k = x->blk[g];
	const dcast_batch_cpt *p = &x->cpt[k.cpt];
	const uint8_t *idx = x->payload + p->payload_off + p->index_off;
	uint64_t first = (uint64_t)k.b * DCAST_CPT_BLOCK, n = p->changed - first;
	uint64_t bit = k.b ? dcast_rd32le(idx + (k.b - 1) * 8) : 0;
	uint64_t next = k.b ? (uint64_t)dcast_rd32le(idx + (k.b - 1) * 8 + 4) + 1 : 0;
	dcast_cpt_dec d;

	if (p->mode == DCAST_BATCH_SKIP || p->enc == DCAST_ENC_COMPACT2)
		return;
	dcast_batch_cpt_dec(x, p, &d);
	n = n < DCAST_CPT_BLOCK ? n : DCAST_CPT_BLOCK;
	x->end[g].status = dcast_cpt_decode_run(&d, &bit, &next, n, pos + p->first + first, code + p->first + first);
	x->end[g].bit = bit;
	x->end[g].next = next;
}

/* v2 block g's chain: its end against the next block's index entry, the
 * last block's against the stream's end. */
DCAST_HD uint64_t dcast_batch_chain_blk2(const dcast_batch_dec *x, uint64_t g)
{
	dcast_batch_blk k = x->blk[g];
	const dcast_batch_cpt *p = &x->cpt[k.cpt];
	uint64_t end_elem = ((uint64_t)k.b + 1) * DCAST_CPT2_BLOCK, word, next;
	dcast_batch_end e = x->end[g];

	if (end_elem >= p->changed)
		return e.bit != p->stream_bytes / 2 ? dcast_batch_err_key(p->changed, DCAST_CPT_ETRAIL)
						    : DCAST_BATCH_NO_ERR;
	dcast_cpt2_blk_start(x->payload + p->payload_off + p->index_off, k.b + 1, &word, &next);
	return e.bit != word || e.next != next ? dcast_batch_err_key(end_elem, DCAST_CPT_EINDEX) : DCAST_BATCH_NO_ERR;
}

/* The key of the failure block g shows (its decode, the next block's
 * index entry, or the stream's end after the last block), or NO_ERR. */
DCAST_HD uint64_t dcast_batch_chain_blk(const dcast_batch_dec *x, uint64_t g)
{
	dcast_batch_blk k = x->blk[g];
	const dcast_batch_cpt *p = &x->cpt[k.cpt];
	const uint8_t *idx = x->payload + p->payload_off + p->index_off;
	uint64_t end_elem = ((uint64_t)k.b + 1) * DCAST_CPT_BLOCK;
	dcast_batch_end e = x->end[g];
	dcast_cpt_dec d;
	int t;

	if (p->mode == DCAST_BATCH_SKIP)
		return DCAST_BATCH_NO_ERR;
	if (e.status)
		return dcast_batch_err_key((uint64_t)k.b * (p->enc == DCAST_ENC_COMPACT2 ? DCAST_CPT2_BLOCK : DCAST_CPT_BLOCK),
					   e.status);
	if (p->enc == DCAST_ENC_COMPACT2)
		return dcast_batch_chain_blk2(x, g);
	if (end_elem < p->changed)
		return e.bit != dcast_rd32le(idx + k.b * 8) || e.next != (uint64_t)dcast_rd32le(idx + k.b * 8 + 4) + 1
			       ? dcast_batch_err_key(end_elem, DCAST_CPT_EINDEX)
			       : DCAST_BATCH_NO_ERR;
	dcast_batch_cpt_dec(x, p, &d);
	t = dcast_cpt_check_trail(&d, e.bit);
	return t ? dcast_batch_err_key(p->changed, t) : DCAST_BATCH_NO_ERR;
}

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a decode buffer of these dims; x's arrays pointed into base. */
uint64_t dcast_batch_dbytes(const dcast_batch_ddims *d);
void dcast_batch_dmap(dcast_batch_dec *x, void *base, const dcast_batch_ddims *d);

/* The dims of a decode buffer for the n compact (v1 or v2) chunks
 * info[0..n) (a lookup slot each). */
void dcast_batch_ddims_for(const dcast_chunk_info *info, uint64_t n, dcast_batch_ddims *d);
/* d grown by one compact chunk of this info. */
void dcast_batch_ddims_add(dcast_batch_ddims *d, const dcast_chunk_info *info);

/* Chunk c of x (dims from dcast_batch_ddims_for): its header checked as
 * dcast_codec_apply checks it, its payload copied to payload[*at] (*at
 * moves past it, to a multiple of 8 also when it is refused), its changes
 * to decode into pos/code from `first`.  Errors: dcast_codec_apply's, with
 * the same codes and details (a payload with no changes is checked whole
 * here), DCAST_EINVAL when it is not compact; the chunk's blocks then do
 * nothing. */
int dcast_batch_dput(dcast_batch_dec *x, uint64_t c, const dcast_chunk_info *info, const void *payload,
		     uint64_t *at, uint64_t first);

/* blk[] from cpt[] (every chunk put); every err NO_ERR. */
void dcast_batch_blk_up(dcast_batch_dec *x);

/* The CPU twin: the v2 chunks' lookups built, every block decoded into
 * pos/code, then chained; each chunk's err is its first failure's key. */
void dcast_batch_decode_cpu(dcast_batch_dec *x, uint32_t *pos, uint32_t *code);

/* The chunk's verdict: DCAST_OK, or the error dcast_codec_apply gives for
 * its payload (DCAST_ECORRUPT naming the element and the problem). */
int dcast_batch_cpt_report(const dcast_batch_cpt *p);

/* dcast_batch_decode_cpu on the device (four launches on stream, no wait):
 * dev the device copy of host's buffer, pos/code device arrays (the
 * batch's on the device).  Errors: DCAST_ECUDA, DCAST_ENODEVICE. */
int dcast_cuda_batch_decode(void *dev, const dcast_batch_dec *host, uint32_t *pos, uint32_t *code, void *stream);

#ifdef __cplusplus
}
#endif
#endif
