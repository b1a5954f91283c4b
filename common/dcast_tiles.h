/* Private: the element order of tiled tensors (docs/protocol.md, "Tiled
 * tensors") and boxes (N-D slices) of a tensor.
 *
 * A tensor of shape S whose MANIFEST entry has grid G is split into
 * G[0] x ... x G[n-1] equal tiles of shape T = S / G.  Its wire order, the
 * index space of CHUNK.start and of digests, is tile by tile (tiles in
 * row-major order of their grid coordinates), each tile row-major.  So the
 * tile a tensor-parallel rank holds is one contiguous range of the wire
 * order, while a caller's buffers are in the natural (row-major) order of
 * the whole tensor or of a box of it.  An untiled tensor's two orders are
 * the same.
 *
 * The maps work in runs: element spans contiguous in both orders (at most
 * one tile row long along the last tiled dimension, times the elements of
 * the dimensions after it).  Indices are wire elements: an 8-byte dtype's
 * two lanes per value are one more, innermost dimension (never tiled). */
#ifndef DCAST_TILES_H
#define DCAST_TILES_H

#include <stdint.h>
#include "deltacast/schema.h"

#define DCAST_TILES_DIMS (DCAST_MAX_DIMS + 1) /* the lanes dimension too */

typedef struct dcast_tiles {
	uint32_t ndim;                 /* at least 1 (a scalar is one element) */
	uint32_t k;                    /* the last dimension cut into tiles */
	int tiled;
	uint64_t shape[DCAST_TILES_DIMS], tile[DCAST_TILES_DIMS], grid[DCAST_TILES_DIMS];
	uint64_t elems, tile_elems;
	uint64_t inner;                /* elements of the dimensions after k */
} dcast_tiles;

/* A box: elements off[d] <= x[d] < off[d] + ext[d] of every dimension,
 * kept by its callers in row-major order of ext. */
typedef struct dcast_box {
	uint32_t ndim;
	uint64_t off[DCAST_TILES_DIMS], ext[DCAST_TILES_DIMS];
	uint64_t elems;
} dcast_box;

/* The map of tensor d (its shape and grid, which must be valid: the schema
 * checks them).  Never fails. */
void dcast_tiles_init(dcast_tiles *m, const dcast_tensor_desc *d);

/* Do a and b have the same grid (0 and 1 alike: untiled)? */
int dcast_grid_same(const dcast_tensor_desc *a, const dcast_tensor_desc *b);

/* Wire index of natural index n (< m->elems); *run: the elements from n on
 * that are contiguous in both orders. */
uint64_t dcast_tiles_to_wire(const dcast_tiles *m, uint64_t n, uint64_t *run);

/* Natural index of wire index w (< m->elems); *run as above. */
uint64_t dcast_tiles_to_natural(const dcast_tiles *m, uint64_t w, uint64_t *run);

/* Fill *b from ndim offsets and extents in values (both NULL, ndim 0: the
 * whole tensor) and check it lies inside tensor d.  `what` names the caller in
 * the error.  Errors: DCAST_EINVAL (NULL arrays with ndim > 0),
 * DCAST_ESHAPE (ndim not the tensor's, a box outside it). */
int dcast_box_init(dcast_box *b, const dcast_tensor_desc *d, uint32_t ndim, const uint64_t *off,
		   const uint64_t *ext, const char *what);

/* Is the box the tensor's one tile at grid coordinates off / ext?  Then
 * *tile_index is that tile's row-major index in the grid. */
int dcast_box_is_tile(const dcast_box *b, const dcast_tensor_desc *d, uint64_t *tile_index);

/* A run: n elements at box index bi and wire index wi.  Nonzero stops the
 * walk and is returned by it. */
typedef int (*dcast_run_fn)(void *ctx, uint64_t bi, uint64_t wi, uint64_t n);

/* The runs of natural range [n, n + len), in natural order; bi counts from
 * 0 at n. */
int dcast_tiles_natural_runs(const dcast_tiles *m, uint64_t n, uint64_t len, dcast_run_fn fn, void *ctx);

/* Every run of box b, in box order. */
int dcast_tiles_box_runs(const dcast_tiles *m, const dcast_box *b, dcast_run_fn fn, void *ctx);

/* The runs of wire range [w, w + n) that fall inside box b, in wire order. */
int dcast_tiles_range_runs(const dcast_tiles *m, const dcast_box *b, uint64_t w, uint64_t n,
			   dcast_run_fn fn, void *ctx);

/* Box index of wire index w, or UINT64_MAX when it is outside the box, for
 * increasing w (a payload's changed positions): the cursor keeps the segment of the last one (contiguous in both orders
 * and in one row of the last dimension), so most lookups cost a compare
 * and an add.  Zero the cursor before the first call. */
typedef struct dcast_box_cursor {
	uint64_t lo, hi;       /* the segment, in wire indices */
	uint64_t in_lo, in_hi; /* its part inside the box */
	uint64_t bi;           /* box index of in_lo */
	int valid;             /* x and t0 describe the segment */
	uint64_t x[DCAST_TILES_DIMS];  /* natural coordinates of lo */
	uint64_t t0[DCAST_TILES_DIMS]; /* its tile's origin */
} dcast_box_cursor;
uint64_t dcast_box_cursor_index(const dcast_tiles *m, const dcast_box *b, dcast_box_cursor *k, uint64_t w);

#endif
