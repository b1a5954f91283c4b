/* deltacast delta codec: encode one element range of a tensor against its
 * baseline, check-and-apply a payload to a destination, digest a range.
 *
 * Works on bit patterns of 1-, 2- or 4-byte elements (fp8, bf16/fp16, fp32);
 * never float arithmetic, so every round trip is bit-exact.  The CPU
 * functions are the oracle; the CUDA twins (dcast_cuda_*) produce the same
 * payload bytes and digests.  Byte layouts: docs/protocol.md, "Delta codec".
 *
 * Thread safety: every function is reentrant; callers own all buffers. */
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

/* Name of an encoding ("dense", "idx32", "bitmask", "compact"); "?" if unknown. */
const char *dcast_encoding_name(int encoding);

/* Upper bound on the payload bytes any encoding produces for `count`
 * elements of `elem_size` bytes: size encode's output buffer with it. */
size_t dcast_codec_bound(uint64_t count, unsigned elem_size);

/* Flags for dcast_codec_encode. */
#define DCAST_ENCODE_UPDATE_BASE 1u /* copy changed elements of cur into base: O(changed) */

/* Encode cur[0..count) against base[0..count).  base == NULL means an
 * anchor: the range is sent dense.  force_encoding < 0 picks the smallest
 * encoding; otherwise that one is used.  The payload goes to out (out_cap
 * bytes, at least dcast_codec_bound()); info describes it.
 * Errors: DCAST_EINVAL (elem_size, count > DCAST_MAX_CHUNK_ELEMS, out_cap too
 * small, unknown encoding).  On error base is untouched. */
int dcast_codec_encode(const void *cur, void *base, uint64_t count, unsigned elem_size,
		       int force_encoding, unsigned flags, void *out, size_t out_cap,
		       dcast_chunk_info *info);

/* Payload size of every encoding for this range, without writing payloads,
 * and the number of changed elements (for reports and the diff CLI). */
int dcast_codec_sizes(const void *cur, const void *base, uint64_t count, unsigned elem_size,
		      uint64_t sizes[DCAST_ENC_COUNT], uint64_t *changed);

/* Check the payload against info completely (lengths, counts, every
 * position in range and strictly increasing, padding), then write it into
 * dst[0..info->count), which holds the base version of the range.  If
 * old_out is not NULL it receives the overwritten bit patterns of the
 * changed elements, in position order (info->changed * elem_size bytes), so
 * dcast_codec_revert() can undo the write.  A dense payload overwrites all.
 * Errors: DCAST_ECORRUPT / DCAST_EPAYLOAD_SIZE / DCAST_EINVAL, with a detail
 * naming the problem; on any error dst is untouched. */
int dcast_codec_apply(const dcast_chunk_info *info, const void *payload, void *dst,
		      void *old_out);

/* Undo a dcast_codec_apply(): write the `old` values saved by it back to the
 * positions the same payload names.  For a dense payload `old` must be the
 * whole previous range (info->count * elem_size bytes). */
int dcast_codec_revert(const dcast_chunk_info *info, const void *payload, void *dst,
		       const void *old);

/* Checksum of a payload as carried in CHUNK.checksum: XXH3-64, seed 0. */
uint64_t dcast_checksum(const void *data, size_t len);

/* Digest of a range's bytes as carried in COMMIT.digests: defined in
 * docs/protocol.md over fixed blocks so CPU and GPU agree. */
uint64_t dcast_digest(const void *data, size_t len);

/* 1 when a usable CUDA device is present and this build has CUDA; else 0.
 * The first call that finds none logs once that the CPU twin is used. */
int dcast_cuda_available(void);

#ifdef __cplusplus
}
#endif
#endif
