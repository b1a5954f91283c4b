/* A version's resolved changes as one batch (dcast_batch.h): its layout,
 * and the CPU twin of the batch kernels (batch.cu), which the tests hold
 * the kernels to, change for change. */
#include <string.h>
#include "codec_shared.h"
#include "dcast_batch.h"
#include "dcast_common.h"

static uint64_t up8(uint64_t n)
{
	return (n + 7) & ~(uint64_t)7;
}

/* Offsets of the arrays after seg, in the order of dcast_batch.h. */
static void offsets(const dcast_batch_dims *d, uint64_t off[6])
{
	off[0] = up8(d->n_seg * sizeof(dcast_batch_seg));               /* tile */
	off[1] = off[0] + up8(d->n_tile * sizeof(dcast_batch_tile));    /* pos */
	off[2] = off[1] + up8(d->n * 4);                                /* code */
	off[3] = off[2] + up8(d->n * 4);                                /* old_vals */
	off[4] = off[3] + up8(d->val_bytes);                            /* new_vals */
	off[5] = off[4] + up8(d->val_bytes);                            /* end */
}

uint64_t dcast_batch_bytes(const dcast_batch_dims *d)
{
	uint64_t off[6];

	offsets(d, off);
	return off[5];
}

void dcast_batch_map(dcast_batch *b, void *base, const dcast_batch_dims *d)
{
	unsigned char *p = base;
	uint64_t off[6];

	offsets(d, off);
	b->d = *d;
	b->base = p;
	b->seg = (dcast_batch_seg *)p;
	b->tile = (dcast_batch_tile *)(p + off[0]);
	b->pos = (uint32_t *)(p + off[1]);
	b->code = (uint32_t *)(p + off[2]);
	b->old_vals = p + off[3];
	b->new_vals = p + off[4];
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
