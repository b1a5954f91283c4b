/* Private to the library: a version's sparse changes to the tensors of one
 * device, resolved ahead and applied in one launch (batch.c, the CPU twin,
 * and batch.cu, the CUDA kernels; the consumer's devbatch.c builds it).
 *
 * One contiguous buffer holds, in this order and each at a multiple of 8
 * bytes (dcast_batch_map):
 *   seg[n_seg]    one per resolved chunk range: where its tensor range
 *                 starts, its element size, its first change and count,
 *                 where its values lie, and its digest move (an output);
 *   tile[n_tile]  DCAST_BATCH_TILE changes or fewer of one segment: one
 *                 thread block each, so no thread searches for its segment;
 *   pos[n]        each change's element offset in its segment's range;
 *   code[n]       what the payload says of it: its new bit pattern (mode
 *                 RAW) or the zig-zag ulp difference to apply to the old one
 *                 (mode ULP, the compact code's), for elements of 1-4 bytes;
 *   old_vals, new_vals  val_bytes each, a segment's values packed at its
 *                 val_off: the old values are the undo buffer.
 * The same bytes serve on the host and on the device: a buffer is built on
 * the host, copied once, and the kernels find every array by its offset.
 * Segments never overlap, so the changes may be applied in any order. */
#ifndef DCAST_BATCH_H
#define DCAST_BATCH_H

#include <stdint.h>
#include "deltacast/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DCAST_BATCH_TILE 1024u

enum dcast_batch_mode { DCAST_BATCH_RAW = 0, DCAST_BATCH_ULP = 1 };

typedef struct dcast_batch_seg {
	uint64_t dst;       /* address of element 0 of its range (device, or host for the twin) */
	uint64_t start;     /* that element's index in its tensor (for the digest) */
	uint64_t first;     /* its first change in pos and code */
	uint64_t val_off;   /* its values' byte offset in old_vals and new_vals, a multiple of 8 */
	uint64_t move;      /* set by resolve: sum of h(new) - h(old) of its changes, mod 2^64 */
	uint32_t count;     /* its changes */
	uint32_t tensor;    /* for the digest */
	uint32_t elem_size; /* 1, 2, 4 or 8 (8: scatter only, no resolve) */
	uint32_t mode;      /* enum dcast_batch_mode */
	uint32_t tile0;     /* its first tile */
	uint32_t cpt;       /* its compact payload's entry in the decode tables (batch_decode.h), if any */
} dcast_batch_seg;

typedef struct dcast_batch_tile {
	uint32_t seg;       /* the segment */
	uint32_t at;        /* its first change in the segment */
} dcast_batch_tile;

/* The sizes that fix a batch's layout. */
typedef struct dcast_batch_dims {
	uint64_t n_seg, n_tile, n, val_bytes;
} dcast_batch_dims;

/* A batch's arrays at their places in one buffer (base). */
typedef struct dcast_batch {
	dcast_batch_dims d;
	unsigned char *base;
	dcast_batch_seg *seg;
	dcast_batch_tile *tile;
	uint32_t *pos, *code;
	unsigned char *old_vals, *new_vals;
} dcast_batch;

/* Bytes of a batch of these dims. */
uint64_t dcast_batch_bytes(const dcast_batch_dims *d);

/* Point b's arrays into base (dcast_batch_bytes(d) bytes, 8-aligned). */
void dcast_batch_map(dcast_batch *b, void *base, const dcast_batch_dims *d);

/* Tiles of a segment of `count` changes. */
static inline uint64_t dcast_batch_tiles(uint64_t count)
{
	return (count + DCAST_BATCH_TILE - 1) / DCAST_BATCH_TILE;
}

/* Bytes a segment's values take in old_vals (and in new_vals). */
static inline uint64_t dcast_batch_val_bytes(uint64_t count, unsigned elem_size)
{
	return (count * elem_size + 7) & ~(uint64_t)7;
}

/* Fill the tile table and every segment's tile0 from the segments' counts
 * (b's seg filled, its n_tile the sum of dcast_batch_tiles). */
void dcast_batch_tile_up(dcast_batch *b);

/* The tiles of segments [seg_lo, seg_hi). */
void dcast_batch_tile_range(const dcast_batch *b, uint64_t seg_lo, uint64_t seg_hi, uint64_t *t_lo,
			    uint64_t *t_hi);

/* Bytes from b's start that its device copy needs from the host before
 * resolve: the tables, and the changes too unless every segment's come
 * from the device's decode (n_dec of them); the values are made there. */
uint64_t dcast_batch_host_bytes(const dcast_batch *b, uint64_t n_dec);

/* Check a sparse payload as dcast_codec_apply checks it and decode its
 * changes without reading the range: positions (increasing) into pos,
 * codes into code (info->changed of each, the caller's arrays), *mode
 * theirs (codec.c).  Errors: those of dcast_codec_apply, with the same
 * codes and details; DCAST_EINVAL for a dense payload or a NULL array with
 * changes.  On error the arrays' contents are undefined. */
int dcast_batch_decode(const dcast_chunk_info *info, const void *payload, uint32_t *pos, uint32_t *code,
		       unsigned *mode);

/* ---- the CPU twin: the oracle of the kernels, and the path without a device ---- */

/* Read each change's old value at its position (into old_vals), make its
 * new one from its code (into new_vals) and set each segment's move (the
 * gather before apply).  Segments of 1-, 2- and 4-byte elements. */
void dcast_batch_resolve_cpu(const dcast_batch *b);

/* For every change of segments [seg_lo, seg_hi): save[i] = the element at
 * its position, then the element = src[i].  undo 0: src new_vals, save
 * old_vals (apply); undo 1: src old_vals, save new_vals (what was written
 * comes back into new_vals unchanged): the second undoes the first bit for
 * bit. */
void dcast_batch_scatter_cpu(const dcast_batch *b, int undo, uint64_t seg_lo, uint64_t seg_hi);

/* ---- the CUDA kernels (batch.cu; without CUDA they report DCAST_ENODEVICE) ----
 * dev: the device copy of host, a batch whose segments' dst are device
 * addresses (host's dims and tables say where to launch; its arrays are
 * not read).  Each call enqueues on stream (a cudaStream_t, NULL
 * the default) and returns without waiting; errors: DCAST_ECUDA (a launch
 * failed), DCAST_ENODEVICE. */

/* dcast_batch_resolve_cpu on the device; segments' moves are summed into
 * their move fields, which must be 0 before. */
int dcast_cuda_batch_resolve(void *dev, const dcast_batch *host, void *stream);

/* dcast_batch_scatter_cpu on the device, in one launch. */
int dcast_cuda_batch_scatter(void *dev, const dcast_batch *host, int undo, uint64_t seg_lo, uint64_t seg_hi,
			     void *stream);

/* Copy bytes between host and device memory (either way) on stream;
 * wait: return when it is done. */
int dcast_cuda_batch_copy(void *dst, const void *src, uint64_t bytes, int wait, void *stream);

/* Wait for stream. */
int dcast_cuda_batch_sync(void *stream);

/* An event of the current device (no timing) into *event, for a scatter
 * that the caller does not wait for; dcast_cuda_batch_event_free(NULL)
 * does nothing.  dcast_cuda_batch_record: event marks the work enqueued
 * on stream so far (both of one device).  dcast_cuda_batch_wait: work
 * enqueued on stream later waits for event (the host does not).
 * dcast_cuda_batch_event_sync: return when event's work is done (at once
 * for an event never recorded).  Errors: DCAST_ECUDA, DCAST_ENODEVICE. */
int dcast_cuda_batch_event(void **event);
void dcast_cuda_batch_event_free(void *event);
int dcast_cuda_batch_record(void *event, void *stream);
int dcast_cuda_batch_wait(void *stream, void *event);
int dcast_cuda_batch_event_sync(void *event);

/* The device that holds ptr (device or managed memory; else DCAST_EINVAL). */
int dcast_cuda_batch_device_of(const void *ptr, int *device);

/* Make `device` the calling thread's current one, its previous one in
 * *prev for dcast_cuda_batch_leave, which makes it current again: a
 * library thread may run a batch for tensors on any device. */
int dcast_cuda_batch_enter(int device, int *prev);
void dcast_cuda_batch_leave(int prev);

/* A stream of the current device that does not wait for the legacy
 * default stream (work ahead of apply runs beside an engine's kernels);
 * dcast_cuda_batch_stream_free(NULL) does nothing. */
int dcast_cuda_batch_stream(void **stream);
void dcast_cuda_batch_stream_free(void *stream);

/* *dev, device memory of *cap bytes, grown (its contents dropped) to at
 * least `bytes` when smaller; dcast_cuda_batch_free gives it back and
 * zeroes both.  Errors: DCAST_ENOMEM (*dev and *cap then 0), DCAST_ENODEVICE. */
int dcast_cuda_batch_reserve(void **dev, uint64_t *cap, uint64_t bytes);
void dcast_cuda_batch_free(void **dev, uint64_t *cap);

#ifdef __cplusplus
}
#endif
#endif
