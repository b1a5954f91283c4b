/* deltacast delta codec: encode one element range of a tensor against its
 * baseline, check-and-apply a payload to a destination, digest a range.
 *
 * Works on bit patterns of 1-, 2- or 4-byte elements (fp8, bf16/fp16, fp32);
 * never float arithmetic, so every round trip is bit-exact.  The CPU
 * functions are the oracle; the CUDA twins (dcast_cuda_*) produce the same
 * payload bytes and digests.  Byte layouts: docs/protocol.md, "Delta codec".
 *
 * Thread safety: every function is reentrant; callers own all buffers.
 * Memory: encode and apply keep per-thread scratch arrays between calls
 * (O(changed) of the largest chunk the thread has coded: 8 bytes a changed
 * element each, and apply a copy of the largest compact payload), freed
 * when the thread exits; nothing else is allocated. */
#ifndef DELTACAST_CODEC_H
#define DELTACAST_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include "deltacast/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Encoding ids, as carried in CHUNK.encoding on the wire. */
enum dcast_encoding {
	DCAST_ENC_DENSE = 0,   /* every element's new bit pattern */
	DCAST_ENC_IDX32 = 1,   /* (u32 position, raw value) per changed element */
	DCAST_ENC_BITMASK = 2, /* bitmask of changed positions + raw values */
	DCAST_ENC_COMPACT = 3, /* entropy-coded positions + value differences */
	DCAST_ENC_COMPACT2 = 4, /* compact's codes laid out for a warp per block */
	DCAST_ENC_COUNT
};

/* Largest element range one chunk may cover (positions fit in u32). */
#define DCAST_MAX_CHUNK_ELEMS (1u << 26)

/* What a payload is: filled by encode, carried in the CHUNK header, and
 * handed back to apply, which checks the payload against it. */
typedef struct dcast_chunk_info {
	uint32_t encoding;      /* enum dcast_encoding */
	uint32_t elem_size;     /* 1, 2 or 4 */
	uint64_t count;         /* elements in the range */
	uint64_t changed;       /* elements whose bit pattern differs */
	uint64_t payload_bytes; /* bytes of payload */
} dcast_chunk_info;

/* Name of an encoding ("dense", "idx32", "bitmask", "compact", "compact2");
 * "?" if unknown. */
DCAST_API const char *dcast_encoding_name(int encoding);

/* Upper bound on the payload bytes any encoding produces for `count`
 * elements of `elem_size` bytes (plus slack the encoder writes into):
 * size encode's output buffer with it.  count * (4 + elem_size) + count/8 + 64. */
DCAST_API size_t dcast_codec_bound(uint64_t count, unsigned elem_size);

/* Flags for dcast_codec_encode. */
#define DCAST_ENCODE_UPDATE_BASE 1u /* copy changed elements of cur into base: O(changed) */
#define DCAST_ENCODE_SAVE_OLD 2u    /* with UPDATE_BASE: the bit patterns it overwrote
				       follow the payload in out, from the first multiple
				       of 8 at or past info->payload_bytes, laid out as
				       dcast_codec_apply's old_out (the whole previous
				       range for dense), so dcast_codec_revert() undoes
				       the update; dcast_codec_bound() has room for them
				       when force_encoding < 0 */
#define DCAST_ENCODE_COMPACT2 4u    /* may pick compact v2, the compact layout a GPU
				       decodes a warp per block: where compact is the
				       smallest and v2 at most 1/64 larger.  Without it
				       v2 is written only when forced (its CPU decoder
				       is slower than v1's). */

/* Encode cur[0..count) against base[0..count).  base == NULL means an
 * anchor: the range is sent dense (info->changed = count).  force_encoding
 * < 0 picks the smallest of encodings 0..3 (ties: the lower id); with
 * DCAST_ENCODE_COMPACT2 in flags, compact2 over compact when compact2 is at
 * most 1/64 larger (docs/protocol.md, "Delta codec"); otherwise
 * force_encoding is used.  The payload goes to out (out_cap bytes, at least
 * dcast_codec_bound(); bytes past info->payload_bytes may be scribbled);
 * info describes it.  For a delta, info->changed counts the elements whose
 * bit pattern differs, whatever the encoding.
 * Errors: DCAST_EINVAL (elem_size, count > DCAST_MAX_CHUNK_ELEMS, out_cap too
 * small, unknown encoding, an anchor forced to a sparse encoding),
 * DCAST_ENOMEM.  On error base is untouched. */
DCAST_API int dcast_codec_encode(const void *cur, void *base, uint64_t count, unsigned elem_size,
		       int force_encoding, unsigned flags, void *out, size_t out_cap,
		       dcast_chunk_info *info);

/* dcast_codec_encode() of a delta with DCAST_ENCODE_UPDATE_BASE in flags,
 * also moving *digest, the additive digest (dcast_ldigest) of base, whose
 * elements are start..start+count-1 of tensor, by every change it copies
 * into base, in the same pass: *digest ends as the digest of base after the
 * update, at O(changed).  An anchor's digest is dcast_ldigest() of the
 * range.  Errors: those of dcast_codec_encode; DCAST_EINVAL also for base
 * or digest NULL, or flags without DCAST_ENCODE_UPDATE_BASE; on error
 * *digest and base are untouched. */
DCAST_API int dcast_codec_encode_digest(const void *cur, void *base, uint64_t count, unsigned elem_size,
					int force_encoding, unsigned flags, void *out, size_t out_cap,
					dcast_chunk_info *info, uint32_t tensor, uint64_t start,
					uint64_t *digest);

/* Payload size of every encoding for this range, without writing payloads,
 * and the number of changed elements (for reports and the diff CLI).
 * base must not be NULL.  Errors: DCAST_EINVAL, DCAST_ENOMEM. */
DCAST_API int dcast_codec_sizes(const void *cur, const void *base, uint64_t count, unsigned elem_size,
		      uint64_t sizes[DCAST_ENC_COUNT], uint64_t *changed);

/* Check the payload against info completely (lengths, counts, every
 * position in range and strictly increasing, code tables, block index,
 * padding), then write it into dst[0..info->count), which holds the base
 * version of the range (compact value differences are applied to it).  If
 * old_out is not NULL it receives the overwritten bit patterns so that
 * dcast_codec_revert() can undo the write: for the sparse encodings those
 * of the changed elements in position order (info->changed * elem_size
 * bytes); for dense, which overwrites everything, the whole previous range
 * (info->count * elem_size bytes).  The checksum is the caller's (CHUNK).
 * Errors: DCAST_EPAYLOAD_SIZE (length differs from what info implies),
 * DCAST_ECORRUPT (structure), DCAST_EINVAL (elem_size, encoding, count,
 * NULL buffers), DCAST_ENOMEM; the detail names the problem (and the element
 * where there is one).  On any error dst and old_out are untouched. */
DCAST_API int dcast_codec_apply(const dcast_chunk_info *info, const void *payload, void *dst,
		      void *old_out);

/* dcast_codec_apply(), also writing the positions (0..count, increasing) of
 * the changed elements of a sparse payload into pos_out (info->changed
 * entries, the caller's; NULL: none), from the same decode (what a
 * consumer's bound slices need of a delta).  A dense payload writes no
 * positions.  Errors as dcast_codec_apply; pos_out is then untouched. */
DCAST_API int dcast_codec_apply_positions(const dcast_chunk_info *info, const void *payload, void *dst,
				void *old_out, uint32_t *pos_out);

/* Undo a dcast_codec_apply(): write the `old` values saved by it back to the
 * positions the same payload names (checked again as apply checks it).  For
 * a dense payload `old` is the whole previous range (info->count * elem_size
 * bytes).  Errors as dcast_codec_apply; on error dst is untouched. */
DCAST_API int dcast_codec_revert(const dcast_chunk_info *info, const void *payload, void *dst,
		       const void *old);

/* Resolve a sparse payload against `range`, the elements it applies to,
 * before it is applied: the positions it changes (0..count, increasing:
 * info->changed of them into pos), the values range holds there now
 * (old_vals) and the values apply writes (new_vals), each a packed array of
 * info->changed elem_size-byte patterns.  All arrays are the caller's;
 * range is only read.  With them dcast_codec_scatter() applies the payload
 * (new_vals) or undoes it (old_vals), and dcast_ldigest_update() moves a
 * digest by it, neither decoding the payload nor reading range again.  The
 * payload is checked as dcast_codec_apply checks it; compact payloads are
 * decoded into the thread's scratch arrays.  digest, unless NULL, is moved
 * on the way by every change, range being elements start..start+count-1
 * of tensor (as dcast_ldigest_payload with lo 0, hi count would move it,
 * without a second pass).  Errors: those of dcast_codec_apply; DCAST_EINVAL
 * for a dense payload (it names no positions: apply it with
 * dcast_codec_apply) or a NULL array with changes; the arrays' contents
 * are then undefined and *digest untouched. */
DCAST_API int dcast_codec_resolve(const dcast_chunk_info *info, const void *payload, const void *range,
				  uint32_t *pos, void *old_vals, void *new_vals, uint32_t tensor,
				  uint64_t start, uint64_t *digest);

/* Write vals[i] (packed elem_size-byte patterns, elem_size 1, 2 or 4) to
 * element pos[i] of dst, for i < n: a resolved payload applied or undone.
 * The caller guarantees every position lies inside dst (as
 * dcast_codec_resolve's do for the range it resolved); nothing is
 * checked, nothing fails. */
DCAST_API void dcast_codec_scatter(const uint32_t *pos, const void *vals, uint64_t n, unsigned elem_size,
				   void *dst);

/* Checksum of a payload as carried in CHUNK.checksum: XXH3-64, seed 0. */
DCAST_API uint64_t dcast_checksum(const void *data, size_t len);

/* Digest of a byte string for files (anchor metadata, patch files): XXH3-64
 * of each 1 MiB block, then XXH3-64 of those hashes as little-endian u64s
 * (docs/protocol.md, "Checksum and digest"), so CPU and GPU agree.  COMMIT
 * digests use dcast_ldigest instead. */
DCAST_API uint64_t dcast_digest(const void *data, size_t len);

/* dcast_digest's block: 1 MiB. */
#define DCAST_DIGEST_BLOCK_BYTES (1u << 20)

/* dcast_digest of a byte string from the hashes of its blocks, for a
 * caller that hashed each block as it arrived: block_hashes[i] is
 * dcast_checksum of bytes [i, i + 1) * DCAST_DIGEST_BLOCK_BYTES (the last
 * block shorter), n their count (0 for the empty string).  Reads only the
 * hashes; nothing fails. */
DCAST_API uint64_t dcast_digest_join(const uint64_t *block_hashes, size_t n);

/* ---- the additive digest carried in COMMIT.digests ----
 * The digest of elements [start, start+count) of tensor `tensor` is the sum
 * mod 2^64 of one term per element, h(tensor, index, bits), where bits is
 * the element's bit pattern (its elem_size bytes as a little-endian
 * integer) and index its position in the whole tensor (docs/protocol.md,
 * "Checksum and digest").  A sum does not depend on order, so CPU and GPU
 * agree, and a delta moves it by h(new) - h(old) of each changed element:
 * O(changed).  It catches accidental damage, not forgery (no key). */

/* h(tensor, index, bits): the term one element adds to its range's digest. */
DCAST_API uint64_t dcast_ldigest_term(uint32_t tensor, uint64_t index, uint32_t bits);

/* *digest = the digest of data[0..count), elements start..start+count-1 of
 * tensor (count 0 gives 0).  Reads count * elem_size bytes; allocates
 * nothing.  Errors: DCAST_EINVAL (elem_size not 1, 2 or 4; data NULL with
 * count > 0; start + count past 2^64); *digest is then untouched. */
DCAST_API int dcast_ldigest(uint32_t tensor, uint64_t start, const void *data, uint64_t count,
		  unsigned elem_size, uint64_t *digest);

/* Move *digest, the digest of a range that begins at element `start`, by
 * n changes: element start + pos[i] went from old_vals[i] to new_vals[i]
 * (packed arrays of elem_size-byte bit patterns, in any order; a position
 * listed twice must chain, its second old value being its first new one).
 * The caller owns all arrays.  Errors: DCAST_EINVAL (elem_size, NULL
 * arrays with n > 0); *digest is then untouched. */
DCAST_API int dcast_ldigest_update(uint64_t *digest, uint32_t tensor, uint64_t start, const uint32_t *pos,
			 const void *old_vals, const void *new_vals, uint64_t n, unsigned elem_size);

/* Move *digest by the change that payload (info, as for dcast_codec_apply)
 * makes to the range `range` = elements start..start+info->count-1 of
 * tensor, counting only the changed elements at positions [lo, hi) of the
 * range (lo = 0, hi = info->count: all; a digest range that covers part of
 * a chunk takes its part).  Two moments:
 *  - old == NULL: range still holds the values before the payload (a check
 *    before apply): old values are read from range, new ones decoded;
 *  - old != NULL: the payload has been applied to range and old holds the
 *    values it overwrote, laid out as dcast_codec_apply's old_out (or
 *    DCAST_ENCODE_SAVE_OLD's): new values are read from range.
 * Reads O(changed) elements (a dense payload: the whole range).  The
 * payload is checked as dcast_codec_apply checks it; compact payloads are
 * decoded into the thread's scratch arrays (see the top of this file).
 * Errors: those of dcast_codec_apply, DCAST_EINVAL (lo > hi or hi > count);
 * *digest is then untouched. */
DCAST_API int dcast_ldigest_payload(uint64_t *digest, uint32_t tensor, uint64_t start,
			  const dcast_chunk_info *info, const void *payload, const void *range,
			  const void *old, uint64_t lo, uint64_t hi);

/* 1 when a usable CUDA device is present and this build has CUDA; else 0.
 * The first call that finds none logs once that the CPU twin is used. */
DCAST_API int dcast_cuda_available(void);

#ifdef __cplusplus
}
#endif
#endif
