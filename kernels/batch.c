/* A version's resolved changes as one batch (dcast_batch.h): its layout,
 * and the CPU twin of the batch kernels (batch.cu), which the tests hold
 * the kernels to, change for change. */
#include <string.h>
#include "codec_shared.h"
#include "batch_decode.h"
#include "dcast_batch.h"
#include "dcast_common.h"

static uint64_t up8(uint64_t n)
{
	return (n + 7) & ~(uint64_t)7;
}

/* Arrays of these byte sizes laid end to end, each at a multiple of 8:
 * where each starts (at[n]: the total). */
static void lay_out(const uint64_t *sizes, unsigned n, uint64_t *at)
{
	at[0] = 0;
	for (unsigned i = 0; i < n; i++)
		at[i + 1] = at[i] + up8(sizes[i]);
}

/* The batch's arrays, in the order of dcast_batch.h. */
static void offsets(const dcast_batch_dims *d, uint64_t at[7])
{
	uint64_t sizes[6] = { d->n_seg * sizeof(dcast_batch_seg), d->n_tile * sizeof(dcast_batch_tile), d->n * 4,
			      d->n * 4, d->val_bytes, d->val_bytes };

	lay_out(sizes, 6, at);
}

uint64_t dcast_batch_bytes(const dcast_batch_dims *d)
{
	uint64_t at[7];

	offsets(d, at);
	return at[6];
}

void dcast_batch_map(dcast_batch *b, void *base, const dcast_batch_dims *d)
{
	unsigned char *p = base;
	uint64_t at[7];

	offsets(d, at);
	*b = (dcast_batch){ .d = *d, .base = p, .seg = (dcast_batch_seg *)p, .tile = (dcast_batch_tile *)(p + at[1]),
			    .pos = (uint32_t *)(p + at[2]), .code = (uint32_t *)(p + at[3]), .old_vals = p + at[4],
			    .new_vals = p + at[5] };
}

void dcast_batch_tile_up(dcast_batch *b)
{
	uint64_t t = 0;

	for (uint64_t s = 0; s < b->d.n_seg; s++) {
		b->seg[s].tile0 = (uint32_t)t;
		for (uint64_t at = 0; at < b->seg[s].count; at += DCAST_BATCH_TILE, t++)
			b->tile[t] = (dcast_batch_tile){ (uint32_t)s, (uint32_t)at };
	}
	DCAST_ASSERT(t == b->d.n_tile);
}

uint64_t dcast_batch_host_bytes(const dcast_batch *b, uint64_t n_dec)
{
	const unsigned char *end = n_dec == b->d.n_seg ? (const unsigned char *)b->pos : b->old_vals;

	return (uint64_t)(end - b->base);
}

void dcast_batch_tile_range(const dcast_batch *b, uint64_t seg_lo, uint64_t seg_hi, uint64_t *t_lo,
			    uint64_t *t_hi)
{
	DCAST_ASSERT(seg_lo <= seg_hi && seg_hi <= b->d.n_seg);
	*t_lo = seg_lo < b->d.n_seg ? b->seg[seg_lo].tile0 : b->d.n_tile;
	*t_hi = seg_hi < b->d.n_seg ? b->seg[seg_hi].tile0 : b->d.n_tile;
}

/* ---- the twin ---- */

static uint64_t load_bits(const unsigned char *p, unsigned es)
{
	uint64_t v = 0;

	memcpy(&v, p, es); /* little-endian hosts only, as the wire */
	return v;
}

static void resolve_seg(const dcast_batch *b, dcast_batch_seg *s)
{
	unsigned es = s->elem_size;
	unsigned char *range = (unsigned char *)(uintptr_t)s->dst;
	unsigned char *old = b->old_vals + s->val_off, *nv = b->new_vals + s->val_off;
	dcast_ld_move m;

	DCAST_ASSERT(es == 1 || es == 2 || es == 4);
	dcast_ld_move_init(&m, s->tensor, s->start);
	for (uint64_t i = 0; i < s->count; i++) {
		uint32_t p = b->pos[s->first + i], c = b->code[s->first + i];
		uint32_t o = (uint32_t)load_bits(range + (uint64_t)p * es, es);
		uint32_t n = s->mode == DCAST_BATCH_ULP ? dcast_ulp_apply(o, c, 8 * es) : c;
		memcpy(old + i * es, &o, es);
		memcpy(nv + i * es, &n, es);
		dcast_ld_move_add(&m, p, o, n);
	}
	s->move = m.acc;
}

void dcast_batch_resolve_cpu(const dcast_batch *b)
{
	for (uint64_t s = 0; s < b->d.n_seg; s++)
		resolve_seg(b, &b->seg[s]);
}

void dcast_batch_scatter_cpu(const dcast_batch *b, int undo, uint64_t seg_lo, uint64_t seg_hi)
{
	unsigned char *src_all = undo ? b->old_vals : b->new_vals, *save_all = undo ? b->new_vals : b->old_vals;

	DCAST_ASSERT(seg_lo <= seg_hi && seg_hi <= b->d.n_seg);
	for (uint64_t k = seg_lo; k < seg_hi; k++) {
		const dcast_batch_seg *s = &b->seg[k];
		unsigned es = s->elem_size;
		unsigned char *range = (unsigned char *)(uintptr_t)s->dst;
		const unsigned char *src = src_all + s->val_off;
		unsigned char *save = save_all + s->val_off;
		for (uint64_t i = 0; i < s->count; i++) {
			unsigned char *e = range + (uint64_t)b->pos[s->first + i] * es;
			memcpy(save + i * es, e, es);
			memcpy(e, src + i * es, es);
		}
	}
}

/* ---- compact payloads decoded on the device (batch_decode.h) ---- */

/* The decode buffer's arrays, in the order of batch_decode.h. */
static void doffsets(const dcast_batch_ddims *d, uint64_t at[6])
{
	uint64_t sizes[5] = { d->n_cpt * sizeof(dcast_batch_cpt), d->n_blk * sizeof(dcast_batch_blk),
			      d->n_blk * sizeof(dcast_batch_end), d->n_lut * 2, d->payload_bytes };

	lay_out(sizes, 5, at);
}

uint64_t dcast_batch_dbytes(const dcast_batch_ddims *d)
{
	uint64_t at[6];

	doffsets(d, at);
	return at[5];
}

void dcast_batch_dmap(dcast_batch_dec *x, void *base, const dcast_batch_ddims *d)
{
	unsigned char *p = base;
	uint64_t at[6];

	doffsets(d, at);
	*x = (dcast_batch_dec){ .d = *d, .base = p, .cpt = (dcast_batch_cpt *)p, .blk = (dcast_batch_blk *)(p + at[1]),
				.end = (dcast_batch_end *)(p + at[2]), .lut = (uint16_t *)(p + at[3]),
				.payload = p + at[4] };
}

void dcast_batch_ddims_add(dcast_batch_ddims *d, const dcast_chunk_info *info)
{
	d->n_cpt++;
	d->n_blk += dcast_batch_nblocks(info->encoding, info->changed);
	d->n_lut += DCAST_CPT_LUT_SIZE;
	d->payload_bytes += up8(info->payload_bytes);
}

void dcast_batch_ddims_for(const dcast_chunk_info *info, uint64_t n, dcast_batch_ddims *d)
{
	*d = (dcast_batch_ddims){0};
	for (uint64_t c = 0; c < n; c++)
		dcast_batch_ddims_add(d, &info[c]);
}

/* The header of a compact payload checked, *p described (stream, index,
 * code parameters), its lookup built into lut when coded v1 (a v2 chunk's
 * is built where it is decoded, dcast_batch_lut_fill). */
static int cpt_open(const dcast_chunk_info *info, const void *payload, dcast_batch_cpt *p, uint16_t *lut)
{
	dcast_cpt_table t;
	dcast_cpt_dec d;
	int rc = dcast_codec_check_info(info, payload, payload ? payload : (const void *)p);

	if (rc)
		return rc;
	if (!dcast_batch_is_cpt(info->encoding))
		return dcast_fail(DCAST_EINVAL, "batch decode: a %s payload is not compact",
				  dcast_encoding_name((int)info->encoding));
	if ((rc = dcast_cpt_check_changed(info)) || (rc = dcast_cpt_open(info, payload, &d, &t)))
		return rc;
	if (d.mode == DCAST_CPT_CODED && info->encoding == DCAST_ENC_COMPACT)
		dcast_cpt_lut_build(&t, dcast_cpt_nsym(d.w), lut);
	if (!info->changed && (rc = dcast_cpt_check_trail(&d, 0)))
		return dcast_cpt_fail((int)info->encoding, rc, 0);
	p->stream_off = (uint64_t)(d.stream - (const uint8_t *)payload);
	p->stream_bytes = d.stream_bytes;
	p->index_off = dcast_cpt_hdr_bytes(d.mode, d.w);
	p->k = d.k, p->mode = d.mode, p->w = d.w, p->enc = info->encoding;
	return DCAST_OK;
}

int dcast_batch_dput(dcast_batch_dec *x, uint64_t c, const dcast_chunk_info *info, const void *payload,
		     uint64_t *at, uint64_t first)
{
	dcast_batch_cpt *p = &x->cpt[c];
	int rc;

	DCAST_ASSERT(c < x->d.n_cpt && *at + info->payload_bytes <= x->d.payload_bytes);
	*p = (dcast_batch_cpt){ .payload_off = *at, .lut_off = c * DCAST_CPT_LUT_SIZE, .count = info->count,
				.changed = info->changed, .first = first, .err = DCAST_BATCH_NO_ERR,
				.enc = info->encoding };
	*at += up8(info->payload_bytes);
	if ((rc = cpt_open(info, payload, p, x->lut + p->lut_off))) {
		p->mode = DCAST_BATCH_SKIP;
		return rc;
	}
	memcpy(x->payload + p->payload_off, payload, info->payload_bytes);
	return DCAST_OK;
}

void dcast_batch_blk_up(dcast_batch_dec *x)
{
	uint64_t g = 0;

	for (uint64_t c = 0; c < x->d.n_cpt; c++) {
		x->cpt[c].err = DCAST_BATCH_NO_ERR;
		for (uint64_t b = 0; b < dcast_batch_nblocks(x->cpt[c].enc, x->cpt[c].changed); b++, g++)
			x->blk[g] = (dcast_batch_blk){ (uint32_t)c, (uint32_t)b };
	}
	DCAST_ASSERT(g == x->d.n_blk);
}

void dcast_batch_decode_cpu(dcast_batch_dec *x, uint32_t *pos, uint32_t *code)
{
	for (uint64_t c = 0; c < x->d.n_cpt; c++)
		dcast_batch_lut_fill(x, c, 0, 1);
	for (uint64_t g = 0; g < x->d.n_blk; g++)
		if (x->cpt[x->blk[g].cpt].enc == DCAST_ENC_COMPACT2)
			dcast_batch_decode_blk2(x, g, pos, code);
		else
			dcast_batch_decode_blk(x, g, pos, code);
	for (uint64_t g = 0; g < x->d.n_blk; g++) {
		uint64_t key = dcast_batch_chain_blk(x, g);
		dcast_batch_cpt *p = &x->cpt[x->blk[g].cpt];
		p->err = key < p->err ? key : p->err;
	}
}

int dcast_batch_cpt_report(const dcast_batch_cpt *p)
{
	int e;

	if (p->err == DCAST_BATCH_NO_ERR)
		return DCAST_OK;
	e = (int)(p->err & 0xff);
	return dcast_cpt_fail((int)p->enc, e ? e : DCAST_CPT_EINDEX, p->err >> 8);
}
