/* Builds without CUDA: every dcast_cuda_* call reports DCAST_ENODEVICE and
 * dcast_cuda_available() says 0 (logging once), so callers take the CPU
 * codec.  With DCAST_HAVE_CUDA the real ones are in codec_cuda.cu. */
#ifndef DCAST_HAVE_CUDA
#include <stdatomic.h>
#include "deltacast/codec_cuda.h"
#include "batch_decode.h"
#include "dcast_batch.h"
#include "dcast_common.h"

int dcast_cuda_available(void)
{
	static atomic_flag logged = ATOMIC_FLAG_INIT;
	if (!atomic_flag_test_and_set(&logged))
		DCAST_LOG_I("no CUDA device: using CPU codec (built without CUDA)");
	return 0;
}

static int no_device(const char *what)
{
	return dcast_fail(DCAST_ENODEVICE, "%s: this build has no CUDA", what);
}

int dcast_cuda_encode(const void *cur, void *base, uint64_t count, unsigned elem_size,
		      int force_encoding, unsigned flags, void *out, size_t out_cap,
		      dcast_chunk_info *info, void *stream)
{
	(void)cur, (void)base, (void)count, (void)elem_size, (void)force_encoding;
	(void)flags, (void)out, (void)out_cap, (void)info, (void)stream;
	return no_device("dcast_cuda_encode");
}

int dcast_cuda_apply(const dcast_chunk_info *info, const void *payload, void *dst, void *old_out,
		     void *stream)
{
	(void)info, (void)payload, (void)dst, (void)old_out, (void)stream;
	return no_device("dcast_cuda_apply");
}

int dcast_cuda_digest(const void *data, size_t len, uint64_t *digest, void *stream)
{
	(void)data, (void)len, (void)digest, (void)stream;
	return no_device("dcast_cuda_digest");
}

int dcast_cuda_ldigest(uint32_t tensor, uint64_t start, const void *data, uint64_t count,
		       unsigned elem_size, uint64_t *digest, void *stream)
{
	(void)tensor, (void)start, (void)data, (void)count, (void)elem_size, (void)digest, (void)stream;
	return no_device("dcast_cuda_ldigest");
}
dcast_cuda_ranges *dcast_cuda_ranges_new(void)
{
	return NULL;
}

void dcast_cuda_ranges_free(dcast_cuda_ranges *r)
{
	(void)r;
}

int dcast_cuda_ranges_encode(dcast_cuda_ranges *r, const dcast_cuda_range *ranges, uint64_t n,
			     unsigned elem_size, int force_encoding, unsigned flags, size_t max_bytes, int *held,
			     void *stream)
{
	(void)r, (void)ranges, (void)n, (void)elem_size, (void)force_encoding, (void)flags;
	(void)max_bytes, (void)stream;
	*held = 0;
	return no_device("dcast_cuda_ranges_encode");
}

int dcast_cuda_ranges_get(const dcast_cuda_ranges *r, uint64_t k, dcast_chunk_info *info,
			  const void **payload, uint64_t *digest_move)
{
	(void)r, (void)k, (void)info, (void)payload, (void)digest_move;
	return no_device("dcast_cuda_ranges_get");
}

int dcast_cuda_batch_resolve(void *dev, const dcast_batch *host, void *stream)
{
	(void)dev, (void)host, (void)stream;
	return no_device("dcast_cuda_batch_resolve");
}

int dcast_cuda_batch_scatter(void *dev, const dcast_batch *host, int undo, uint64_t seg_lo, uint64_t seg_hi,
			     void *stream)
{
	(void)dev, (void)host, (void)undo, (void)seg_lo, (void)seg_hi, (void)stream;
	return no_device("dcast_cuda_batch_scatter");
}

int dcast_cuda_batch_decode(void *dev, const dcast_batch_dec *host, uint32_t *pos, uint32_t *code, void *stream)
{
	(void)dev, (void)host, (void)pos, (void)code, (void)stream;
	return no_device("dcast_cuda_batch_decode");
}

int dcast_cuda_batch_copy(void *dst, const void *src, uint64_t bytes, int wait, void *stream)
{
	(void)dst, (void)src, (void)bytes, (void)wait, (void)stream;
	return no_device("dcast_cuda_batch_copy");
}

int dcast_cuda_batch_sync(void *stream)
{
	(void)stream;
	return no_device("dcast_cuda_batch_sync");
}

int dcast_cuda_batch_event(void **event)
{
	*event = NULL;
	return no_device("dcast_cuda_batch_event");
}

void dcast_cuda_batch_event_free(void *event)
{
	(void)event;
}

int dcast_cuda_batch_record(void *event, void *stream)
{
	(void)event, (void)stream;
	return no_device("dcast_cuda_batch_record");
}

int dcast_cuda_batch_wait(void *stream, void *event)
{
	(void)stream, (void)event;
	return no_device("dcast_cuda_batch_wait");
}

int dcast_cuda_batch_event_sync(void *event)
{
	(void)event;
	return no_device("dcast_cuda_batch_event_sync");
}

int dcast_cuda_batch_device_of(const void *ptr, int *device)
{
	(void)ptr, (void)device;
	return no_device("dcast_cuda_batch_device_of");
}

int dcast_cuda_batch_enter(int device, int *prev)
{
	(void)device, (void)prev;
	return no_device("dcast_cuda_batch_enter");
}

void dcast_cuda_batch_leave(int prev)
{
	(void)prev;
}

int dcast_cuda_batch_stream(void **stream)
{
	*stream = NULL;
	return no_device("dcast_cuda_batch_stream");
}

void dcast_cuda_batch_stream_free(void *stream)
{
	(void)stream;
}

int dcast_cuda_batch_reserve(void **dev, uint64_t *cap, uint64_t bytes)
{
	(void)bytes;
	*dev = NULL, *cap = 0;
	return no_device("dcast_cuda_batch_reserve");
}

void dcast_cuda_batch_free(void **dev, uint64_t *cap)
{
	*dev = NULL, *cap = 0;
}
#else
typedef int dcast_codec_nocuda_unused; /* ISO C forbids an empty unit */
#endif
