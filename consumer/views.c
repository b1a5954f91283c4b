/* Views: boxes (N-D slices) of live tensors kept in the caller's memory
 * (dcast_consumer_bind_slice, and dcast_consumer_bind of a tiled tensor).
 * The tensor itself stays in the consumer's host copy, in wire order: it
 * is what apply writes, verification reads and the checkpoint saves.  A
 * view is brought up to date chunk by chunk as apply writes the host copy:
 * a dense chunk's runs are copied, a sparse chunk's changed elements are
 * copied one by one into host memory, or re-encoded as idx32 payloads in
 * the view's own order and applied by the CUDA codec for device memory,
 * so a delta costs O(changed).  Anything that rewrites the host copy otherwise (an anchor
 * file loaded, a rollback) refreshes the views whole. */
#include <inttypes.h>
#include <string.h>
#include "consumer_impl.h"
#include "dcast_common.h"

#define VIEW_BATCH 65536u /* changes per idx32 payload applied to a view */

/* t's geometry with the view's memory: the cs_* device helpers take it. */
static cs_tensor view_tensor(const cs_tensor *t, const cs_view *v)
{
	cs_tensor vt = *t;

	vt.ptr = v->ptr;
	vt.mem = v->mem;
	vt.bytes = v->box.elems * t->elem_size;
	vt.owned = 0;
	vt.views = NULL, vt.n_views = 0;
	return vt;
}

typedef struct copy_ctx {
	cs_tensor *dst;        /* the view (to_view) or the tensor */
	const cs_tensor *src;
	unsigned char *host;   /* read_slice, the anchor file's pieces: a host buffer */
	unsigned es;
} copy_ctx;

/* Host copy (wire order) -> view (box order). */
static int run_to_view(void *ctx, uint64_t bi, uint64_t wi, uint64_t n)
{
	copy_ctx *x = ctx;

	return cs_to_tensor(x->dst, bi * x->es, x->src->ptr + wi * x->es, n * x->es);
}

/* Live tensor (wire order, host or device) -> caller's host buffer. */
static int run_to_host(void *ctx, uint64_t bi, uint64_t wi, uint64_t n)
{
	copy_ctx *x = ctx;

	return cs_from_tensor(x->src, wi * x->es, x->host + bi * x->es, n * x->es);
}

/* Caller's host buffer -> live tensor (wire order, host or device). */
static int run_from_host(void *ctx, uint64_t bi, uint64_t wi, uint64_t n)
{
	copy_ctx *x = ctx;

	return cs_to_tensor(x->dst, wi * x->es, x->host + bi * x->es, n * x->es);
}

int cs_tensor_read_natural(const cs_tensor *t, uint64_t n0, uint64_t count, void *dst)
{
	copy_ctx x = {NULL, t, dst, t->elem_size};

	return dcast_tiles_natural_runs(&t->map, n0, count, run_to_host, &x);
}

int cs_tensor_write_natural(cs_tensor *t, uint64_t n0, uint64_t count, const void *src)
{
	copy_ctx x = {t, t, (unsigned char *)src, t->elem_size};

	return dcast_tiles_natural_runs(&t->map, n0, count, run_from_host, &x);
}

static int view_fill(const cs_tensor *t, const cs_view *v)
{
	cs_tensor vt = view_tensor(t, v);
	copy_ctx x = {&vt, t, NULL, t->elem_size};

	return dcast_tiles_box_runs(&t->map, &v->box, run_to_view, &x);
}

int cs_views_refresh(dcast_consumer *c)
{
	int err = 0;

	for (uint32_t i = 0; i < c->n_tensors; i++)
		for (uint32_t j = 0; j < c->tensors[i].n_views; j++) {
			int e = view_fill(&c->tensors[i], &c->tensors[i].views[j]);
			err = err ? err : e;
		}
	return err;
}

/* ---- sparse chunks: changed elements in the view's order ---- */

typedef struct vchange {
	uint64_t bi, wi;
} vchange;

static int vchange_cmp(const void *a, const void *b)
{
	const vchange *x = a, *y = b;

	return x->bi < y->bi ? -1 : x->bi > y->bi;
}

static int grow(void **p, uint64_t *cap, uint64_t n, size_t size, const char *what)
{
	if (n <= *cap)
		return 0;
	void *q = realloc(*p, n * size);
	if (!q)
		return dcast_fail(DCAST_ENOMEM, "views: %" PRIu64 " %s", n, what);
	*p = q;
	*cap = n;
	return 0;
}

/* The changes of the chunk at wire `start` (positions pos[0..n)) that fall
 * in view v, sorted by box index, into c->vs.ch; their number. */
static uint64_t view_changes(dcast_consumer *c, const cs_tensor *t, const cs_view *v, uint64_t start,
			     const uint32_t *pos, uint64_t n)
{
	vchange *ch = c->vs.ch;
	dcast_box_cursor k = {0};
	uint64_t m = 0;
	int sorted = 1;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t w = start + pos[i], bi = dcast_box_cursor_index(&t->map, &v->box, &k, w);
		if (bi == UINT64_MAX)
			continue;
		sorted &= !m || ch[m - 1].bi < bi;
		ch[m++] = (vchange){bi, w};
	}
	if (!sorted) /* the chunk crossed tiles */
		qsort(ch, m, sizeof(*ch), vchange_cmp);
	return m;
}

/* Changes [i, i + n) as one idx32 payload on the view, from its first. */
static int apply_batch(dcast_consumer *c, const cs_tensor *t, cs_tensor *vt, uint64_t i, uint64_t n)
{
	const vchange *ch = (const vchange *)c->vs.ch + i;
	unsigned es = t->elem_size;
	unsigned char *p = c->vs.buf;
	dcast_chunk_info info = {DCAST_ENC_IDX32, es, ch[n - 1].bi - ch[0].bi + 1, n, n * (4 + es)};

	for (uint64_t k = 0; k < n; k++, p += 4 + es) {
		uint32_t rel = (uint32_t)(ch[k].bi - ch[0].bi);
		memcpy(p, &rel, 4); /* little-endian hosts only (docs/architecture.md) */
		memcpy(p + 4, t->ptr + ch[k].wi * es, es);
	}
	return cs_tensor_apply(vt, &info, c->vs.buf, ch[0].bi, NULL);
}

/* May change j join the idx32 payload that begins at change i? */
static int span_ok(const dcast_consumer *c, uint64_t i, uint64_t j)
{
	const vchange *ch = c->vs.ch;

	return j - i < VIEW_BATCH && ch[j].bi - ch[i].bi < DCAST_MAX_CHUNK_ELEMS;
}

/* Host memory: each changed element straight from the host copy (the
 * positions were checked when they were decoded); ES a constant, so each
 * copy is one load and one store. */
#define VIEW_COPY_LOOP(ES)                                                              \
	for (uint64_t i = 0; i < n; i++) {                                              \
		uint64_t w = start + pos[i], bi = dcast_box_cursor_index(&t->map, &v->box, &k, w); \
		if (bi != UINT64_MAX)                                                   \
			memcpy(v->ptr + bi * (ES), t->ptr + w * (ES), (ES));             \
	}

static void view_sparse_host(const cs_tensor *t, const cs_view *v, uint64_t start, const uint32_t *pos,
			     uint64_t n)
{
	dcast_box_cursor k = {0};

	switch (t->elem_size) {
	case 1: VIEW_COPY_LOOP(1) break;
	case 2: VIEW_COPY_LOOP(2) break;
	default: VIEW_COPY_LOOP(4) break;
	}
}

/* Device memory: the changes as idx32 payloads in the view's order, applied
 * by the CUDA codec (one copy to the device per batch). */
static int view_sparse_device(dcast_consumer *c, const cs_tensor *t, const cs_view *v, uint64_t start,
			      const uint32_t *pos, uint64_t n)
{
	cs_tensor vt = view_tensor(t, v);
	uint64_t m;
	int err;

	if ((err = grow((void **)&c->vs.ch, &c->vs.ch_cap, n + 1, sizeof(vchange), "changes")) ||
	    (err = grow((void **)&c->vs.buf, &c->vs.buf_cap, (uint64_t)VIEW_BATCH * 8, 1, "payload bytes")))
		return err;
	m = view_changes(c, t, v, start, pos, n);
	for (uint64_t i = 0, j; i < m && !err; i = j) {
		for (j = i + 1; j < m && span_ok(c, i, j); j++)
			;
		err = apply_batch(c, t, &vt, i, j - i);
	}
	return err;
}

int cs_views_write_host(dcast_consumer *c, const cs_chunk *k, const unsigned char *payload, void *old,
			const uint32_t **pos)
{
	cs_tensor *t = &c->tensors[k->tensor];
	int err;

	DCAST_ASSERT(t->owned && t->mem == DCAST_MEM_HOST); /* views feed from the host copy */
	*pos = NULL;
	if (k->info.encoding == DCAST_ENC_DENSE)
		return cs_tensor_apply(t, &k->info, payload, k->start, old);
	if ((err = grow((void **)&c->vs.pos, &c->vs.pos_cap, k->info.changed + 1, 4, "positions")) ||
	    (err = dcast_codec_apply_positions(&k->info, payload, t->ptr + k->start * t->elem_size, old,
					       c->vs.pos)))
		return err;
	*pos = c->vs.pos;
	return 0;
}

int cs_views_chunk(dcast_consumer *c, const cs_chunk *k, const uint32_t *pos)
{
	cs_tensor *t = &c->tensors[k->tensor];
	int err = 0;

	if (!t->n_views)
		return 0;
	if (k->info.encoding == DCAST_ENC_DENSE) {
		for (uint32_t j = 0; j < t->n_views && !err; j++) {
			cs_tensor vt = view_tensor(t, &t->views[j]);
			copy_ctx x = {&vt, t, NULL, t->elem_size};
			err = dcast_tiles_range_runs(&t->map, &t->views[j].box, k->start, k->info.count,
						     run_to_view, &x);
		}
		return err;
	}
	DCAST_ASSERT(pos); /* cs_views_write_host decoded them */
	for (uint32_t j = 0; j < t->n_views && !err; j++) {
		const cs_view *v = &t->views[j];
		if (v->mem == DCAST_MEM_HOST)
			view_sparse_host(t, v, k->start, pos, k->info.changed);
		else
			err = view_sparse_device(c, t, v, k->start, pos, k->info.changed);
	}
	return err;
}

/* ---- the public calls ---- */

/* Add view {box, ptr, mem} to t, filled with t's current contents. */
static int view_add(dcast_consumer *c, cs_tensor *t, const dcast_box *box, void *ptr, dcast_mem mem)
{
	cs_view v = {*box, ptr, (int)mem}, *n;
	int err;

	if (mem == DCAST_MEM_CUDA)
		cs_pool_cuda_register(&c->pool);
	if ((err = view_fill(t, &v)))
		return err;
	if (!(n = realloc(t->views, (t->n_views + 1) * sizeof(*n))))
		return dcast_fail(DCAST_ENOMEM, "bind_slice %s: view table", t->desc.name);
	t->views = n;
	t->views[t->n_views++] = v;
	return 0;
}

int cs_bind_view(dcast_consumer *c, cs_tensor *t, void *ptr, dcast_mem mem, uint32_t ndim,
		 const uint64_t *off, const uint64_t *ext, uint64_t bytes)
{
	dcast_box box;
	int err;

	if (mem == DCAST_MEM_CUDA && !dcast_cuda_available())
		return dcast_fail(DCAST_ENODEVICE, "bind %s: CUDA memory but no CUDA device (or a build "
				  "without CUDA)", t->desc.name);
	if (mem != DCAST_MEM_HOST && mem != DCAST_MEM_CUDA)
		return dcast_fail(DCAST_EINVAL, "bind %s: unknown memory kind %d", t->desc.name, (int)mem);
	if (!t->owned)
		return dcast_fail(DCAST_ESTATE, "bind_slice %s: the tensor is bound whole", t->desc.name);
	if ((err = dcast_box_init(&box, &t->desc, ndim, off, ext, "bind_slice")))
		return err;
	if (bytes != box.elems * t->elem_size)
		return dcast_fail(DCAST_ESHAPE, "bind %s: %" PRIu64 " bytes given, the slice holds %" PRIu64,
				  t->desc.name, bytes, box.elems * t->elem_size);
	return view_add(c, t, &box, ptr, mem);
}

int dcast_consumer_bind_slice(dcast_consumer *c, const char *name, void *ptr, dcast_mem mem, uint32_t ndim,
			      const uint64_t *offset, const uint64_t *extent, uint64_t bytes)
{
	cs_tensor *t;
	int err;

	if (!c || !name || !ptr || !ndim)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_bind_slice: NULL argument or 0 dims");
	pthread_mutex_lock(&c->lock);
	if (!(t = cs_tensor_find(c, name)))
		err = dcast_fail(DCAST_ENOTFOUND, "bind_slice: no tensor \"%s\" in the manifest of %s", name,
				 c->model);
	else
		err = cs_bind_view(c, t, ptr, mem, ndim, offset, extent, bytes);
	pthread_mutex_unlock(&c->lock);
	return err;
}

static int read_locked(dcast_consumer *c, const char *name, uint32_t ndim, const uint64_t *off,
		       const uint64_t *ext, void *dst, uint64_t bytes)
{
	cs_tensor *t = cs_tensor_find(c, name);
	dcast_box box;
	int err;

	if (!t)
		return dcast_fail(DCAST_ENOTFOUND, "read_slice: no tensor \"%s\" in the manifest of %s", name,
				  c->model);
	if ((err = dcast_box_init(&box, &t->desc, ndim, off, ext, "read_slice")))
		return err;
	if (bytes != box.elems * t->elem_size)
		return dcast_fail(DCAST_ESHAPE, "read_slice %s: %" PRIu64 " bytes given, the slice holds %"
				  PRIu64, name, bytes, box.elems * t->elem_size);
	copy_ctx x = {NULL, t, dst, t->elem_size};
	return dcast_tiles_box_runs(&t->map, &box, run_to_host, &x);
}

int dcast_consumer_read_slice(dcast_consumer *c, const char *name, uint32_t ndim, const uint64_t *offset,
			      const uint64_t *extent, void *dst, uint64_t bytes)
{
	int err;

	if (!c || !name || (!dst && bytes))
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_read_slice: NULL argument");
	pthread_mutex_lock(&c->lock);
	err = read_locked(c, name, ndim, offset, extent, dst, bytes);
	pthread_mutex_unlock(&c->lock);
	return err;
}

