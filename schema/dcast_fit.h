/* Private to the library and the broker: does a message's reference to a
 * tensor fit the manifest of its model?  One check for every side that
 * holds a manifest (the broker at ingest and at segment load, the consumer
 * at intake, at replay and before it verifies), with one set of codes:
 * docs/protocol.md, "Which refusal gets which code".  The header's own
 * rules (changed <= count, an anchor is dense, a dense payload's size) are
 * the decoder's (dcast_msg_validate), checked before any of these. */
#ifndef DCAST_FIT_H
#define DCAST_FIT_H

#include <stddef.h>
#include <stdint.h>
#include "deltacast/schema.h"

/* A manifest's tensor descriptors where their holder keeps them: n
 * entries, the first at `first`, each `stride` bytes after the one before
 * (a dcast_manifest's own array, or the descriptor field of larger
 * per-tensor records).  Borrowed: nothing is copied or owned. */
typedef struct dcast_desc_array {
	const dcast_tensor_desc *first; /* NULL only when n is 0 */
	size_t stride;                  /* at least sizeof(dcast_tensor_desc) */
	uint32_t n;
} dcast_desc_array;

/* The descriptors of manifest m, in place. */
dcast_desc_array dcast_manifest_descs(const dcast_manifest *m);

/* Does CHUNK c fit the manifest `d`: its tensor one of d's, its range
 * [start, start + count) inside that tensor's wire elements, its elem_size
 * the tensor's dtype's?  0, or DCAST_EFIELD_RANGE (tensor outside the
 * manifest) or DCAST_ESHAPE (range outside its tensor, elem_size not the
 * dtype's), with a detail naming the field, its value and the limit. */
int dcast_chunk_fits(const dcast_chunk *c, dcast_desc_array d);

/* Where a dense CHUNK's payload, not yet received or checked, lies: 1 and
 * *byte_off (its offset in its tensor's wire bytes) when c is dense, fits
 * `d` (dcast_chunk_fits) and its payload_bytes are exactly its range's;
 * else 0 (the last error may say why).  Only where to read it: the chunk
 * is taken after dcast_chunk_sound, once it has come. */
int dcast_chunk_dense_at(const dcast_chunk *c, dcast_desc_array d, uint64_t *byte_off);

/* Is CHUNK c sound and does it fit: dcast_chunk_fits, then its checksum
 * against payload_sum, the dcast_checksum() of its payload
 * (dcast_chunk_verify_sum).  0, or the codes of those two. */
int dcast_chunk_sound(const dcast_chunk *c, dcast_desc_array d, uint64_t payload_sum);

/* Does COMMIT.digests[i], e, fit the manifest `d`: its tensor one of d's,
 * its range inside that tensor's wire elements?  0, or DCAST_EFIELD_RANGE
 * / DCAST_ESHAPE as dcast_chunk_fits. */
int dcast_digest_fits(const dcast_range_digest *e, uint32_t i, dcast_desc_array d);

/* A version's COMMIT digest ranges, sorted by (tensor, start)
 * (dcast_range_key_cmp), asked in turn whether they hold each range its
 * chunks write: n ranges, the first at `first`, each `stride` bytes after
 * the one before (a COMMIT's own array, or the range field of larger
 * records).  Borrowed: nothing is copied or owned.  `at` is a cursor, 0
 * before the first ask. */
typedef struct dcast_digest_cover {
	const dcast_range_digest *first; /* NULL only when n is 0 */
	size_t stride;                   /* at least sizeof(dcast_range_digest) */
	uint64_t n, at;
} dcast_digest_cover;

/* Do cv's ranges hold every element of [start, start + count) of
 * `tensor` (of manifest d, named in the error)?  Asked for a version's
 * chunks in (tensor, start) order, so that the cursor only moves on.  A
 * chunk that writes elements no digest holds would go unchecked by every
 * consumer that verifies: 0, or DCAST_ECORRUPT naming the first such
 * element (docs/protocol.md, "COMMIT"). */
int dcast_digests_hold(dcast_digest_cover *cv, dcast_desc_array d, uint32_t tensor, uint64_t start,
		       uint64_t count);

#endif
