/* Random batches for the batch scatter's tests (tests/support/batch_cases.c):
 * segments of 1-, 2-, 4- and 8-byte elements over host ranges of random
 * bytes, some empty, some over a tile, at increasing random positions,
 * with random new values and every other output slot poisoned (0xa5). */
#ifndef DCAST_TEST_BATCH_CASES_H
#define DCAST_TEST_BATCH_CASES_H

#include <stdint.h>
#include "dcast_batch.h"

#define BC_POISON 0xa5

/* A batch over host ranges, and the ranges' contents before it. */
typedef struct tbatch {
	dcast_batch b;
	unsigned char *buf, *ranges, *before;
	uint64_t range_bytes;
	uint64_t *range_off;   /* segment k's range at ranges + range_off[k] */
	uint64_t *range_elems;
} tbatch;

/* The next number of the seeded generator at *state (splitmix64). */
uint64_t bc_rnd(uint64_t *state);

/* n_seg segments of up to max_changes changes each, drawn from *rng. */
void tbatch_make(tbatch *t, uint64_t n_seg, uint64_t max_changes, uint64_t *rng);
void tbatch_free(tbatch *t);

/* 1 when segments [lo, hi) hold their new values, the rest of the ranges
 * are as before, and each applied segment's old slots hold what was there. */
int tbatch_applied_as(const tbatch *t, uint64_t lo, uint64_t hi);

#endif
