/* Tiled tensors' wire order against the natural order, and boxes
 * (dcast_tiles.h; docs/protocol.md, "Tiled tensors"). */
#include <string.h>
#include "dcast_common.h"
#include "dcast_tiles.h"

static uint64_t min64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* Row-major coordinates of flat index i in dims[0..n). */
static void unlin(uint64_t i, const uint64_t *dims, uint32_t n, uint64_t *x)
{
	for (uint32_t d = n; d-- > 0;) {
		x[d] = i % dims[d];
		i /= dims[d];
	}
}

static uint64_t lin(const uint64_t *x, const uint64_t *dims, uint32_t n)
{
	uint64_t i = 0;

	for (uint32_t d = 0; d < n; d++)
		i = i * dims[d] + x[d];
	return i;
}

void dcast_tiles_init(dcast_tiles *m, const dcast_tensor_desc *d)
{
	unsigned lanes = dcast_dtype_lanes((int)d->dtype);

	memset(m, 0, sizeof(*m));
	m->ndim = (d->ndim ? d->ndim : 1) + (lanes > 1);
	m->elems = m->tile_elems = m->inner = 1;
	for (uint32_t i = 0; i < m->ndim; i++) {
		int lane_dim = lanes > 1 && i == m->ndim - 1;
		m->shape[i] = lane_dim ? lanes : d->ndim ? d->shape[i] : 1;
		m->grid[i] = !lane_dim && d->ndim && d->grid[i] ? d->grid[i] : 1;
		m->tile[i] = m->shape[i] / m->grid[i];
		m->elems *= m->shape[i];
		m->tile_elems *= m->tile[i];
		if (m->grid[i] > 1) {
			m->tiled = 1;
			m->k = i;
		}
	}
	for (uint32_t i = m->k + 1; m->tiled && i < m->ndim; i++)
		m->inner *= m->shape[i];
}

int dcast_grid_same(const dcast_tensor_desc *a, const dcast_tensor_desc *b)
{
	for (uint32_t d = 0; d < DCAST_MAX_DIMS; d++)
		if ((a->grid[d] ? a->grid[d] : 1) != (b->grid[d] ? b->grid[d] : 1))
			return 0;
	return 1;
}

uint64_t dcast_tiles_to_wire(const dcast_tiles *m, uint64_t n, uint64_t *run)
{
	uint64_t x[DCAST_TILES_DIMS], t = 0, in = 0;

	if (!m->tiled) {
		*run = m->elems - n;
		return n;
	}
	unlin(n, m->shape, m->ndim, x);
	for (uint32_t d = 0; d < m->ndim; d++) {
		t = t * m->grid[d] + x[d] / m->tile[d];
		in = in * m->tile[d] + x[d] % m->tile[d];
	}
	*run = (m->tile[m->k] - x[m->k] % m->tile[m->k]) * m->inner - n % m->inner;
	return t * m->tile_elems + in;
}

/* Natural coordinates x of wire index w; *run as for dcast_tiles_to_natural. */
static void natural_coords(const dcast_tiles *m, uint64_t w, uint64_t *x, uint64_t *run)
{
	uint64_t r[DCAST_TILES_DIMS] = {0}, in;

	if (!m->tiled) {
		unlin(w, m->shape, m->ndim, x);
		*run = m->elems - w;
		return;
	}
	in = w % m->tile_elems;
	unlin(w / m->tile_elems, m->grid, m->ndim, x);
	unlin(in, m->tile, m->ndim, r);
	for (uint32_t d = 0; d < m->ndim; d++)
		x[d] = x[d] * m->tile[d] + r[d];
	*run = (m->tile[m->k] - r[m->k]) * m->inner - in % m->inner;
}

uint64_t dcast_tiles_to_natural(const dcast_tiles *m, uint64_t w, uint64_t *run)
{
	uint64_t x[DCAST_TILES_DIMS] = {0};

	if (!m->tiled) {
		*run = m->elems - w;
		return w;
	}
	natural_coords(m, w, x, run);
	return lin(x, m->shape, m->ndim);
}

int dcast_box_init(dcast_box *b, const dcast_tensor_desc *d, uint32_t ndim, const uint64_t *off,
		   const uint64_t *ext, const char *what)
{
	dcast_tiles m;

	dcast_tiles_init(&m, d);
	if (ndim && (!off || !ext))
		return dcast_fail(DCAST_EINVAL, "%s %s: NULL offsets or extents", what, d->name);
	if (ndim && ndim != d->ndim)
		return dcast_fail(DCAST_ESHAPE, "%s %s: a box of %u dims for a tensor of %u", what,
				  d->name, ndim, d->ndim);
	memset(b, 0, sizeof(*b));
	b->ndim = m.ndim;
	b->elems = 1;
	for (uint32_t i = 0; i < m.ndim; i++) {
		int given = ndim && i < ndim; /* not the lanes dimension */
		b->off[i] = given ? off[i] : 0;
		b->ext[i] = given ? ext[i] : m.shape[i];
		if (b->off[i] > m.shape[i] || b->ext[i] > m.shape[i] - b->off[i])
			return dcast_fail(DCAST_ESHAPE, "%s %s: dim %u, [%llu, +%llu) outside its %llu", what,
					  d->name, i, (unsigned long long)b->off[i],
					  (unsigned long long)b->ext[i], (unsigned long long)m.shape[i]);
		b->elems *= b->ext[i];
	}
	return 0;
}

int dcast_box_is_tile(const dcast_box *b, const dcast_tensor_desc *d, uint64_t *tile_index)
{
	dcast_tiles m;
	uint64_t q[DCAST_TILES_DIMS], g[DCAST_TILES_DIMS];

	dcast_tiles_init(&m, d);
	for (uint32_t i = 0; i < b->ndim; i++) {
		if (!b->ext[i] || m.shape[i] % b->ext[i] || b->off[i] % b->ext[i])
			return 0;
		q[i] = b->off[i] / b->ext[i];
		g[i] = m.shape[i] / b->ext[i];
	}
	*tile_index = lin(q, g, b->ndim);
	return 1;
}

/* Box index of natural coordinates x (changed), or UINT64_MAX outside. */
static uint64_t box_index_at(const dcast_tiles *m, const dcast_box *b, uint64_t *x)
{
	for (uint32_t d = 0; d < m->ndim; d++) {
		if (x[d] < b->off[d] || x[d] - b->off[d] >= b->ext[d])
			return UINT64_MAX;
		x[d] -= b->off[d];
	}
	return lin(x, b->ext, b->ndim);
}

/* Box index of natural index n, or UINT64_MAX outside. */
static uint64_t box_index(const dcast_tiles *m, const dcast_box *b, uint64_t n)
{
	uint64_t x[DCAST_TILES_DIMS];

	unlin(n, m->shape, m->ndim, x);
	return box_index_at(m, b, x);
}

/* The runs of natural row segment [n, n + len), at box index bi on. */
static int row_runs(const dcast_tiles *m, uint64_t n, uint64_t len, uint64_t bi, dcast_run_fn fn, void *ctx)
{
	int rc = 0;

	while (len && !rc) {
		uint64_t run, w = dcast_tiles_to_wire(m, n, &run), k = min64(run, len);
		rc = fn(ctx, bi, w, k);
		bi += k, n += k, len -= k;
	}
	return rc;
}

int dcast_tiles_natural_runs(const dcast_tiles *m, uint64_t n, uint64_t len, dcast_run_fn fn, void *ctx)
{
	return row_runs(m, n, len, 0, fn, ctx);
}

int dcast_tiles_box_runs(const dcast_tiles *m, const dcast_box *b, dcast_run_fn fn, void *ctx)
{
	uint32_t last = b->ndim - 1;
	uint64_t x[DCAST_TILES_DIMS], rows = b->elems ? b->elems / b->ext[last] : 0;
	int rc = 0;

	for (uint64_t r = 0; r < rows && !rc; r++) {
		unlin(r, b->ext, last, x);
		for (uint32_t d = 0; d < last; d++)
			x[d] += b->off[d];
		x[last] = b->off[last];
		rc = row_runs(m, lin(x, m->shape, m->ndim), b->ext[last], r * b->ext[last], fn, ctx);
	}
	return rc;
}

int dcast_tiles_range_runs(const dcast_tiles *m, const dcast_box *b, uint64_t w, uint64_t n,
			   dcast_run_fn fn, void *ctx)
{
	uint32_t last = m->ndim - 1;
	uint64_t width = m->shape[last], lo_b = b->off[last], hi_b = b->off[last] + b->ext[last];
	int rc = 0;

	while (n && !rc) {
		uint64_t run, nat = dcast_tiles_to_natural(m, w, &run), r = min64(run, n);
		n -= r;
		while (r && !rc) { /* one row of the last dimension at a time */
			uint64_t col = nat % width, seg = min64(r, width - col);
			uint64_t lo = col > lo_b ? col : lo_b, hi = min64(col + seg, hi_b);
			uint64_t bi = lo < hi ? box_index(m, b, nat + (lo - col)) : UINT64_MAX;
			if (bi != UINT64_MAX)
				rc = fn(ctx, bi, w + (lo - col), hi - lo);
			nat += seg, w += seg, r -= seg;
		}
	}
	return rc;
}

/* Segment [w, w + seg) whose first element has natural coordinates x:
 * its part inside the box. */
static void segment_set(const dcast_tiles *m, const dcast_box *b, dcast_box_cursor *k, uint64_t w,
			uint64_t seg)
{
	uint32_t last = m->ndim - 1;
	uint64_t y[DCAST_TILES_DIMS], col = k->x[last], lo_b = b->off[last], bi = UINT64_MAX;
	uint64_t a = col > lo_b ? col : lo_b, z = min64(col + seg, lo_b + b->ext[last]);

	if (a < z) {
		memcpy(y, k->x, sizeof(y));
		y[last] = a;
		bi = box_index_at(m, b, y);
	}
	k->lo = w, k->hi = w + seg;
	k->in_lo = k->in_hi = w; /* empty: the segment is outside the box */
	if (bi != UINT64_MAX)
		k->in_lo = w + (a - col), k->in_hi = w + (z - col), k->bi = bi;
}

/* The segment of w, from its coordinates (a few divisions). */
static void cursor_seek(const dcast_tiles *m, const dcast_box *b, dcast_box_cursor *k, uint64_t w)
{
	uint32_t last = m->ndim - 1;
	uint64_t run;

	natural_coords(m, w, k->x, &run);
	for (uint32_t d = 0; d < m->ndim; d++)
		k->t0[d] = k->x[d] - k->x[d] % m->tile[d];
	k->valid = 1;
	segment_set(m, b, k, w, min64(run, m->shape[last] - k->x[last]));
}

/* The segment after the current one, when it is the next row of the same
 * tile (no division): 0 when the tile ends there (seek instead). */
static int cursor_step(const dcast_tiles *m, const dcast_box *b, dcast_box_cursor *k)
{
	uint32_t last = m->ndim - 1;
	int d;

	if (!k->valid)
		return 0;
	k->x[last] = k->t0[last];
	for (d = (int)last - 1; d >= 0; d--) {
		if (++k->x[d] < k->t0[d] + m->tile[d])
			break;
		k->x[d] = k->t0[d];
	}
	if (d < 0) { /* past the tile's last row */
		k->valid = 0;
		return 0;
	}
	/* a row start: the rest of the tile row when the last dimension is
	 * tiled, else the whole row (the tile holds whole rows) */
	segment_set(m, b, k, k->hi, m->tiled && m->k == last ? m->tile[last] : m->shape[last]);
	return 1;
}

uint64_t dcast_box_cursor_index(const dcast_tiles *m, const dcast_box *b, dcast_box_cursor *k, uint64_t w)
{
	for (int steps = 0; w >= k->hi && k->hi > k->lo && steps < 64 && cursor_step(m, b, k); steps++)
		;
	if (w < k->lo || w >= k->hi)
		cursor_seek(m, b, k, w);
	return w >= k->in_lo && w < k->in_hi ? k->bi + (w - k->in_lo) : UINT64_MAX;
}
