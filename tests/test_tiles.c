/* The tile order of tiled tensors (common/tiles.c) against a brute-force
 * model: for many shapes and grids, the wire index of every element is the
 * one the definition in docs/protocol.md gives (8-byte values as two
 * lanes), the two maps invert each other, every run they report is contiguous in both orders, and the runs
 * of a box (whole, or of a wire range) visit each of its elements once. */
#include <stdint.h>
#include "check.h"
#include "dcast_tiles.h"

/* The definition, element by element: tiles row-major, each row-major;
 * an 8-byte value's two lanes stay together, low word first. */
static uint64_t wire_of(const dcast_tensor_desc *d, uint64_t n)
{
	uint64_t x[DCAST_MAX_DIMS], t = 0, in = 0, te = 1, lanes = dcast_dtype_lanes((int)d->dtype);
	uint64_t lane = n % lanes;

	n /= lanes;
	for (uint32_t i = d->ndim; i-- > 0;) {
		x[i] = n % d->shape[i];
		n /= d->shape[i];
	}
	for (uint32_t i = 0; i < d->ndim; i++) {
		uint64_t tile = d->shape[i] / d->grid[i];
		t = t * d->grid[i] + x[i] / tile;
		in = in * tile + x[i] % tile;
		te *= tile;
	}
	return (t * te + in) * lanes + lane;
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
	return *s;
}

/* A random shape of 1..4 dims, each a multiple of its random grid. */
static void random_desc(dcast_tensor_desc *d, uint64_t *seed)
{
	memset(d, 0, sizeof(*d));
	snprintf(d->name, sizeof(d->name), "t");
	d->dtype = rnd(seed) % 3 ? DCAST_DTYPE_BF16 : DCAST_DTYPE_I64;
	d->ndim = 1 + (uint32_t)(rnd(seed) % 4);
	for (uint32_t i = 0; i < d->ndim; i++) {
		d->grid[i] = 1 + (uint32_t)(rnd(seed) % 3);
		d->shape[i] = d->grid[i] * (1 + rnd(seed) % 4);
	}
}

/* The definition of a box index: natural coordinates (lanes last) inside
 * the box, row-major in it; UINT64_MAX outside. */
static uint64_t box_index_of(const dcast_tiles *m, const dcast_box *b, uint64_t n)
{
	uint64_t x[DCAST_TILES_DIMS], bi = 0;

	for (uint32_t d = m->ndim; d-- > 0;) {
		x[d] = n % m->shape[d];
		n /= m->shape[d];
	}
	for (uint32_t d = 0; d < m->ndim; d++) {
		if (x[d] < b->off[d] || x[d] >= b->off[d] + b->ext[d])
			return UINT64_MAX;
		bi = bi * b->ext[d] + (x[d] - b->off[d]);
	}
	return bi;
}

static int collect(void *ctx, uint64_t bi, uint64_t wi, uint64_t n)
{
	uint64_t *seen = ctx; /* seen[wi] = bi + 1 */

	for (uint64_t i = 0; i < n; i++) {
		if (seen[wi + i])
			return 1;
		seen[wi + i] = bi + i + 1;
	}
	return 0;
}

static void check_maps(const dcast_tensor_desc *d)
{
	dcast_tiles m;

	dcast_tiles_init(&m, d);
	for (uint64_t n = 0; n < m.elems; n++) {
		uint64_t run, run2, w = dcast_tiles_to_wire(&m, n, &run);
		CHECK(w == wire_of(d, n));
		CHECK(run >= 1 && n + run <= m.elems);
		for (uint64_t i = 1; i < run; i++)
			CHECK(wire_of(d, n + i) == w + i);
		CHECK(dcast_tiles_to_natural(&m, w, &run2) == n && run2 == run);
	}
}

/* A random box; its runs, and the runs of random wire ranges inside it,
 * against the brute-force membership test. */
static void check_box(const dcast_tensor_desc *d, uint64_t *seed)
{
	dcast_tiles m;
	dcast_box b;
	uint64_t off[DCAST_MAX_DIMS], ext[DCAST_MAX_DIMS];

	dcast_tiles_init(&m, d);
	for (uint32_t i = 0; i < d->ndim; i++) {
		off[i] = rnd(seed) % d->shape[i];
		ext[i] = 1 + rnd(seed) % (d->shape[i] - off[i]);
	}
	REQUIRE(dcast_box_init(&b, d, d->ndim, off, ext, "test") == 0);
	uint64_t *seen = calloc(m.elems, sizeof(*seen)), *part = calloc(m.elems, sizeof(*part));
	uint64_t *want = calloc(m.elems, sizeof(*want)); /* box index + 1 by wire index */
	REQUIRE(seen && part && want);
	for (uint64_t n = 0; n < m.elems; n++) {
		uint64_t bi = box_index_of(&m, &b, n);
		want[wire_of(d, n)] = bi == UINT64_MAX ? 0 : bi + 1;
	}
	CHECK(dcast_tiles_box_runs(&m, &b, collect, seen) == 0);
	uint64_t in_box = 0;
	for (uint64_t w = 0; w < m.elems; w++) {
		CHECK(seen[w] == want[w]);
		in_box += want[w] != 0;
	}
	CHECK(in_box == b.elems);
	dcast_box_cursor k = {0}; /* increasing lookups through the cursor agree */
	for (uint64_t w = 0; w < m.elems; w += 1 + rnd(seed) % 3)
		CHECK(dcast_box_cursor_index(&m, &b, &k, w) + 1 == want[w]);
	for (uint64_t w = 0; w < m.elems;) { /* random wire ranges cover the tensor */
		uint64_t n = 1 + rnd(seed) % 9;
		n = n < m.elems - w ? n : m.elems - w;
		CHECK(dcast_tiles_range_runs(&m, &b, w, n, collect, part) == 0);
		w += n;
	}
	CHECK(memcmp(seen, part, m.elems * sizeof(*seen)) == 0);
	free(seen);
	free(part);
	free(want);
}

int main(void)
{
	dcast_tensor_desc d;
	dcast_box b;
	uint64_t seed = 0x9e3779b97f4a7c15ull, tile;

	for (int i = 0; i < 400; i++) {
		random_desc(&d, &seed);
		check_maps(&d);
		check_box(&d, &seed);
	}
	/* a column block of a 6x8 matrix cut into 1x4 tiles is tile 2 */
	memset(&d, 0, sizeof(d));
	d.ndim = 2, d.shape[0] = 6, d.shape[1] = 8;
	uint64_t off[2] = {0, 4}, ext[2] = {6, 2}, bad[2] = {0, 3};
	REQUIRE(dcast_box_init(&b, &d, 2, off, ext, "test") == 0);
	CHECK(dcast_box_is_tile(&b, &d, &tile) && tile == 2);
	REQUIRE(dcast_box_init(&b, &d, 2, bad, ext, "test") == 0);
	CHECK(!dcast_box_is_tile(&b, &d, &tile));
	ext[1] = 5;
	CHECK_ERR(dcast_box_init(&b, &d, 2, off, ext, "test"), DCAST_ESHAPE);
	CHECK_ERR(dcast_box_init(&b, &d, 1, off, ext, "test"), DCAST_ESHAPE);
	if (check_failures)
		return 1;
	printf("test_tiles: ok\n");
	return 0;
}
