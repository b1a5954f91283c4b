/* Private: an index of names to positions in the caller's array (the
 * tensors of a producer or of a consumer), so that looking a tensor up by
 * name is O(1) and registering or binding every tensor of a model with tens
 * of thousands of them (mixture-of-experts layers) is O(n), not O(n^2).
 *
 * Open addressing with linear probing; the table is kept at most half full
 * and doubles as it grows.  A slot holds a 32-bit hash of the name and its
 * position + 1, never the name: the array holds the names, and a lookup
 * compares through the caller's `at` function, so the array may move
 * (realloc) between calls.  Not thread-safe: the caller's lock covers it. */
#ifndef DCAST_NAMES_H
#define DCAST_NAMES_H

#include <stdint.h>

typedef struct dcast_names {
	uint64_t *slot; /* hash << 32 | (position + 1); 0: empty */
	uint32_t cap;   /* a power of two, or 0 before the first put */
	uint32_t n;
} dcast_names;

/* The name at position i of the caller's array. */
typedef const char *(*dcast_name_at)(const void *ctx, uint32_t i);

/* Index `name` at position i (i < UINT32_MAX).  The caller checks first that
 * the name is not indexed yet (dcast_names_get): a second put of a name
 * leaves the first one found.  Errors: DCAST_ENOMEM (the index is
 * unchanged). */
int dcast_names_put(dcast_names *x, const char *name, uint32_t i);

/* Position of `name`, or -1 when it is not indexed.  at(ctx, k) must give
 * the name put at position k. */
int64_t dcast_names_get(const dcast_names *x, const char *name, dcast_name_at at, const void *ctx);

/* Free the table and empty the index (NULL-safe; a zeroed index is empty). */
void dcast_names_free(dcast_names *x);

#endif
