/* deltacast delta codec on a CUDA device: the twins of dcast_codec_encode,
 * dcast_codec_apply, dcast_digest and dcast_ldigest for ranges that live in GPU memory.
 * They give the same payload bytes and digests as the CPU functions (which
 * are the oracle), but for compact2, which the device encoders do not
 * write: they choose the smallest of the encodings 0..3, and refuse
 * force_encoding DCAST_ENC_COMPACT2 (DCAST_EINVAL).  dcast_cuda_apply and
 * the consumer's device batch decode every encoding.  Each call runs on `stream` (a cudaStream_t, NULL for the
 * default stream) and returns when its work is complete.
 *
 * Pointers: device pointers for ranges; payloads may be device memory,
 * registered (pinned) host memory, or ordinary host memory, which
 * dcast_cuda_apply first copies to the device (one cudaMemcpy of the
 * payload).  Scratch space is taken stream-ordered from the codec's own
 * memory pool on the current device (cudaMemPoolCreate; the default pool
 * if that fails) and given back before return; the pool keeps up to 128
 * MiB of it for the next call, so that a call does not map its scratch
 * afresh.  Without CUDA in the build, or without a
 * device, every call returns DCAST_ENODEVICE; check dcast_cuda_available().
 * Errors also: DCAST_ECUDA (a CUDA call failed; detail names it). */
#ifndef DELTACAST_CODEC_CUDA_H
#define DELTACAST_CODEC_CUDA_H

#include "deltacast/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dcast_codec_encode for device cur/base: the payload goes to out (host or
 * device memory, out_cap >= dcast_codec_bound()).  base == NULL: anchor,
 * dense.  DCAST_ENCODE_UPDATE_BASE updates base on the device.  Same
 * errors as dcast_codec_encode; on error base is untouched. */
DCAST_API int dcast_cuda_encode(const void *cur, void *base, uint64_t count, unsigned elem_size,
		      int force_encoding, unsigned flags, void *out, size_t out_cap,
		      dcast_chunk_info *info, void *stream);

/* dcast_codec_apply for a device dst (and device old_out, or NULL): the
 * whole payload is checked on the device before any element of dst is
 * written; on error dst is untouched and the detail names the problem. */
DCAST_API int dcast_cuda_apply(const dcast_chunk_info *info, const void *payload, void *dst, void *old_out,
		     void *stream);

/* dcast_digest of len bytes of device memory, into *digest. */
DCAST_API int dcast_cuda_digest(const void *data, size_t len, uint64_t *digest, void *stream);

/* dcast_ldigest of count elements of device memory (elements start.. of
 * tensor), into *digest: one pass, partial sums per thread, added
 * atomically (a sum mod 2^64 is the same in any order, so it equals the
 * CPU's).  Errors also DCAST_EINVAL as dcast_ldigest; *digest is then
 * untouched. */
DCAST_API int dcast_cuda_ldigest(uint32_t tensor, uint64_t start, const void *data, uint64_t count,
		       unsigned elem_size, uint64_t *digest, void *stream);

/* Many device ranges diffed against their baselines and encoded at once
 * (a producer's chunk ranges, of any number of tensors on one device, of
 * one element size): the per-call cost of dcast_cuda_encode (launches,
 * three synchronizations, scratch) paid once for all of them.  Range k's
 * payload and info equal dcast_codec_encode of ranges[k] against its
 * baseline (force_encoding as there, -1: the smallest of 0..3), and its digest_move is
 * what the encode's version adds, mod 2^64, to that range's dcast_ldigest
 * (tensor, start): the sum over its changed elements of the new element's
 * term less the old one's.  DCAST_ENCODE_UPDATE_BASE makes every baseline
 * equal its cur once every payload is made.  Ranges must not overlap.
 *
 * Ownership: a dcast_cuda_ranges holds the results of its last encode in
 * pinned host memory that it grows as needed and keeps for the next call;
 * one caller at a time.  dcast_cuda_ranges_new returns NULL when out of
 * memory; dcast_cuda_ranges_free(NULL) does nothing.
 *
 * dcast_cuda_ranges_encode sets *held = 1 when it holds every range's
 * result.  Ranges whose changes' device scratch (28 bytes a change) would
 * pass max_bytes together are encoded in groups of consecutive ranges that
 * fit, one after another (each group's ranges are read once more), and
 * their baselines moved at the end.  *held = 0 (returning DCAST_OK,
 * baselines untouched) when one range's changes alone, or a group's
 * payloads, would pass max_bytes: encode such ranges one by one with
 * dcast_cuda_encode.
 * Errors: DCAST_EINVAL (NULL result or ranges, elem_size not 1, 2 or 4, a
 * range past DCAST_MAX_RANGE_ELEMS or with a NULL or misaligned pointer,
 * a bad force_encoding), DCAST_ETOO_LARGE (over 2^31 tiles of 4096
 * elements), DCAST_ENOMEM, DCAST_ENODEVICE, DCAST_ECUDA; the baselines are
 * then untouched unless the error is the last synchronization's. */
typedef struct dcast_cuda_range {
	const void *cur;   /* device: the range's first element */
	void *base;        /* device (or mapped host): its baseline */
	uint64_t count;    /* elements */
	uint64_t start;    /* for the digest: its first element's index in the tensor */
	uint32_t tensor;   /* and the tensor's */
} dcast_cuda_range;
typedef struct dcast_cuda_ranges dcast_cuda_ranges;
DCAST_API dcast_cuda_ranges *dcast_cuda_ranges_new(void);
DCAST_API void dcast_cuda_ranges_free(dcast_cuda_ranges *r);
DCAST_API int dcast_cuda_ranges_encode(dcast_cuda_ranges *r, const dcast_cuda_range *ranges, uint64_t n,
				       unsigned elem_size, int force_encoding, unsigned flags, size_t max_bytes,
				       int *held, void *stream);
/* Range k of the last encode that held its ranges: its info, its payload
 * (r's pinned memory, valid until r's next encode or free) and its digest
 * move.  DCAST_EINVAL when k is past the ranges held. */
DCAST_API int dcast_cuda_ranges_get(const dcast_cuda_ranges *r, uint64_t k, dcast_chunk_info *info,
				    const void **payload, uint64_t *digest_move);
#ifdef __cplusplus
}
#endif
#endif
