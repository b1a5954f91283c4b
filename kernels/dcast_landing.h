/* Private to the library: a payload's checksum and the digest blocks it
 * holds whole, hashed piece by piece as the payload lands, while each
 * piece is still in cache (digest.c).  The consumer's bulk connection
 * feeds it each recv() of an anchor's payload read in place, so that the
 * chunk's checksum (dcast_checksum) and the file digest's block hashes
 * (dcast_digest's blocks of the tensor's bytes) need no pass of their own
 * over bytes that have left the cache. */
#ifndef DCAST_LANDING_H
#define DCAST_LANDING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dcast_landing dcast_landing;

/* A new hasher, with the widest XXH3 code the CPU runs; NULL when out of
 * memory.  Owned by the caller: dcast_landing_free (NULL-safe). */
dcast_landing *dcast_landing_new(void);
void dcast_landing_free(dcast_landing *l);

/* Starts a payload of len bytes that lands at byte `at` of a string of
 * total bytes (a tensor's) cut into DCAST_DIGEST_BLOCK_BYTES blocks.  The
 * blocks it holds whole (its last block is whole at the string's end) are
 * hashed.  0; or DCAST_EINVAL (the payload runs past the string),
 * DCAST_ENOMEM (no room for its blocks' hashes), and the hasher then
 * holds an empty payload, done at once. */
int dcast_landing_start(dcast_landing *l, uint64_t at, uint64_t len, uint64_t total);

/* The payload's next n bytes, in order; at most what is left of len. */
void dcast_landing_add(dcast_landing *l, const void *piece, size_t n);

/* Every byte of the payload came. */
int dcast_landing_done(const dcast_landing *l);

/* Once done: the payload's dcast_checksum. */
uint64_t dcast_landing_sum(const dcast_landing *l);

/* Once done: the whole blocks' hashes (dcast_checksum of each), *first the
 * index in the string of the first, their count returned; the array is
 * the hasher's until its next start. */
uint32_t dcast_landing_blocks(const dcast_landing *l, uint64_t *first, const uint64_t **hashes);

#ifdef __cplusplus
}
#endif

#endif
