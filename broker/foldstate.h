/* Private to broker/fold.c: the fold's state (foldstate.c), the tensors
 * of the version folded last, read and written one range at a time.
 * Without --data-dir the state is one heap buffer per tensor (the model's
 * dense size) and a range is a pointer into it.  With --data-dir it is an
 * unnamed file in the data dir (O_TMPFILE: gone once closed, nothing of it
 * left after a crash), each tensor at its offset, and a range is read into
 * one buffer the size of the largest range asked for and written back from
 * it: the heap holds a chunk's range, not the model, and the file's pages
 * are the page cache's, not the broker's resident memory (no mmap). */
#ifndef DCAST_BROKER_FOLDSTATE_H
#define DCAST_BROKER_FOLDSTATE_H

#include "broker.h"

struct fold_state {
	struct broker_manifest *mf; /* reference; NULL: no state */
	uint8_t **data;             /* heap: [mf->m.n_tensors], into region */
	uint8_t *region;            /* heap: one mapping for every tensor */
	uint64_t region_bytes;
	uint64_t *off;              /* file (NULL in the heap): each tensor's offset */
	int fd;                     /* file */
	uint8_t *buf;               /* file: the range got last */
	size_t buf_cap;
	uint64_t got_off, got_bytes; /* file: where the range got last lies */
	uint64_t dense_bytes;       /* the model's dense size */
};

/* The dense size of mf's tensors, in bytes (0 for NULL). */
uint64_t fold_manifest_bytes(const struct broker_manifest *mf);

/* Make a state for the tensors of mf (s empty: zeroed or closed): in a
 * file in `dir` when dir is not NULL, else in the heap; when the file
 * cannot be made the state is kept in the heap, with a warning line.
 * Its contents are undefined until written.  Takes a reference to mf.  Errors:
 * DCAST_ENOMEM naming the tensor (s is then closed). */
int fold_state_open(struct fold_state *s, struct broker_manifest *mf, const char *dir);

/* Free the state (its file goes with its descriptor) and drop the
 * manifest's reference; s is left empty.  Safe on an empty one. */
void fold_state_close(struct fold_state *s);

/* Elements [start, start + count) of tensor t (inside it: asserted).
 * *range points at them: in the heap the state itself, in a file the
 * state's buffer, read from the file and valid until the next get (change
 * it, then fold_state_put).  Errors: DCAST_ENOMEM (the buffer), DCAST_EIO
 * (the read, naming the file and offset). */
int fold_state_get(struct fold_state *s, uint32_t t, uint64_t start, uint64_t count, uint8_t **range);

/* Write the range got last back to the file (nothing to do in the heap).
 * Errors: DCAST_EIO naming the file and offset. */
int fold_state_put(struct fold_state *s);

/* *digest = dcast_ldigest of elements [start, +count) of tensor t (inside
 * it: asserted), summed over ranges of BROKER_FOLD_RANGE_ELEMS (the digest
 * is additive), so a file state is read one bounded range at a time.
 * Errors: fold_state_get's; DCAST_EDIGEST naming the tensor when its
 * element size has no digest.  *digest is then untouched. */
int fold_state_digest(struct fold_state *s, uint32_t t, uint64_t start, uint64_t count,
		      uint64_t *digest);

/* Bytes the state holds in the heap: the model's dense size, or the
 * range buffer of a file state (0 with no state). */
uint64_t fold_state_heap_bytes(const struct fold_state *s);

#endif
