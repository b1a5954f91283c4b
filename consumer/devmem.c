/* Where live tensors live: host memory (memcpy, the CPU codec) or a CUDA
 * device (cudaMemcpy from the pinned pool, the codec's CUDA twins; a
 * delta's sparse chunks checked ahead go as one batch, devbatch.c; each
 * device step here first waits for a batch's scatter that
 * dcast_consumer_apply_async left pending).  The
 * device paths exist only in CUDA builds (nvcc found) and run only with a
 * device.  No GPU is on the development machines: there they compile, and
 * tests/test_consumer_gpu.c checks the fallback (binding CUDA memory fails
 * with DCAST_ENODEVICE, the consumer keeps its host tensors; the codec says
 * once "no CUDA device: using CPU codec").  Its device half (bind
 * cudaMalloc'd tensors, apply, roll back from the checkpoint) runs on a
 * host with a CUDA device (`make test-gpu`). */
#include <inttypes.h>
#include <string.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#ifdef DCAST_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "deltacast/codec_cuda.h"
#endif

#ifdef DCAST_HAVE_CUDA
static int cuda_fail(int rc, const char *what, const char *name)
{
	return dcast_fail(DCAST_ECUDA, "%s of tensor %s: %s", what, name,
			  cudaGetErrorString((cudaError_t)rc));
}

/* Device tensor t may be touched: a batch's scatter not waited for
 * (dcast_consumer_apply_async) is done. */
static int device_settled(const cs_tensor *t)
{
	return cs_dbatch_settle() ? dcast_fail(DCAST_ECUDA, "tensor %s: a pending apply's scatter failed: %s",
					       t->desc.name, dcast_last_error()) : 0;
}
#endif

int cs_to_tensor(cs_tensor *t, uint64_t off, const void *src, uint64_t n)
{
	if (t->mem == DCAST_MEM_HOST) {
		memcpy(t->ptr + off, src, n);
		return 0;
	}
#ifdef DCAST_HAVE_CUDA
	if (device_settled(t))
		return DCAST_ECUDA;
	int rc = cudaMemcpy(t->ptr + off, src, n, cudaMemcpyDefault);
	return rc ? cuda_fail(rc, "cudaMemcpy to device", t->desc.name) : 0;
#else
	return dcast_fail(DCAST_ENODEVICE, "tensor %s: CUDA memory in a build without CUDA", t->desc.name);
#endif
}

int cs_from_tensor(const cs_tensor *t, uint64_t off, void *dst, uint64_t n)
{
	if (t->mem == DCAST_MEM_HOST) {
		memcpy(dst, t->ptr + off, n);
		return 0;
	}
#ifdef DCAST_HAVE_CUDA
	if (device_settled(t))
		return DCAST_ECUDA;
	int rc = cudaMemcpy(dst, t->ptr + off, n, cudaMemcpyDefault);
	return rc ? cuda_fail(rc, "cudaMemcpy from device", t->desc.name) : 0;
#else
	return dcast_fail(DCAST_ENODEVICE, "tensor %s: CUDA memory in a build without CUDA", t->desc.name);
#endif
}

int cs_tensor_apply(cs_tensor *t, const dcast_chunk_info *info, const void *payload, uint64_t start,
		    void *old)
{
	unsigned char *dst = t->ptr + start * info->elem_size;

	if (t->mem == DCAST_MEM_HOST)
		return dcast_codec_apply(info, payload, dst, old);
#ifdef DCAST_HAVE_CUDA
	DCAST_ASSERT(old == NULL); /* undone from the batch (devbatch.c) or the checkpoint */
	if (device_settled(t))
		return DCAST_ECUDA;
	return dcast_cuda_apply(info, payload, dst, NULL, NULL);
#else
	return dcast_fail(DCAST_ENODEVICE, "tensor %s: CUDA memory in a build without CUDA", t->desc.name);
#endif
}

int cs_tensor_digest(const cs_tensor *t, uint64_t off, uint64_t n, uint64_t *digest)
{
	if (t->mem == DCAST_MEM_HOST) {
		*digest = dcast_digest(t->ptr + off, n);
		return 0;
	}
#ifdef DCAST_HAVE_CUDA
	if (device_settled(t))
		return DCAST_ECUDA;
	return dcast_cuda_digest(t->ptr + off, n, digest, NULL);
#else
	return dcast_fail(DCAST_ENODEVICE, "tensor %s: CUDA memory in a build without CUDA", t->desc.name);
#endif
}

int cs_tensor_ldigest(const cs_tensor *t, uint32_t index, uint64_t start, uint64_t count, uint64_t *digest)
{
	if (t->mem == DCAST_MEM_HOST)
		return dcast_ldigest(index, start, t->ptr + start * t->elem_size, count, t->elem_size, digest);
#ifdef DCAST_HAVE_CUDA
	if (device_settled(t))
		return DCAST_ECUDA;
	return dcast_cuda_ldigest(index, start, t->ptr + start * t->elem_size, count, t->elem_size, digest, NULL);
#else
	return dcast_fail(DCAST_ENODEVICE, "tensor %s: CUDA memory in a build without CUDA", t->desc.name);
#endif
}

/* Pin the pool for the device's DMA too (registering cudaHostAlloc memory
 * with io_uring fails on some kernels, so the pool is mmap'd and registered
 * the other way round).  Done when the first device tensor is bound, not at
 * open: a consumer of host tensors never starts CUDA (its probe alone took
 * ~10 ms of every consumer's start here, with no device).  Best effort:
 * unpinned copies still work. */
void cs_pool_cuda_register(cs_pool *p)
{
#ifdef DCAST_HAVE_CUDA
	if (p->cuda_registered || !dcast_cuda_available())
		return;
	int rc = cudaHostRegister(p->base, p->bytes, cudaHostRegisterDefault);
	if (rc)
		DCAST_LOG_W("consumer: cudaHostRegister of the staging pool: %s; copies go unpinned",
			    cudaGetErrorString((cudaError_t)rc));
	else
		p->cuda_registered = 1;
#else
	(void)p;
#endif
}

void cs_pool_cuda_unregister(cs_pool *p)
{
	cs_dbatch_release(p); /* the device copy of its batches */
#ifdef DCAST_HAVE_CUDA
	if (p->cuda_registered)
		cudaHostUnregister(p->base);
#endif
	p->cuda_registered = 0;
}
