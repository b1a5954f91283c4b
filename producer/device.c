/* Tensors in CUDA memory: diffed on their device with the codec's CUDA
 * twins (kernels/codec_cuda.cu), so only payloads cross PCIe into the
 * encode slots.  Their baseline is device memory when opts.baseline_on_device
 * asks for it and cudaMalloc finds room, else the pinned host region,
 * registered with CUDA so the kernels read it over PCIe.  A delta of a
 * tensor is diffed and encoded whole, all its chunk ranges in one call
 * (dcast_cuda_ranges_encode: three synchronizations per tensor instead of
 * about six per range), by the first encoder that claims one of its
 * ranges; every encoder then copies its range's payload from that batch.
 * A tensor whose changes would need over DEV_BATCH_MAX_BYTES of scratch
 * goes range by range (dcast_cuda_encode), as do anchors.  The device path
 * keeps no old values (the CUDA encoder has no SAVE_OLD): a version with a
 * changed device range can be neither rolled back nor resumed as a delta,
 * and goes again, or is followed, as an anchor.
 *
 * UNTESTED: there is no GPU on the development machines.  There the build
 * has CUDA (nvcc is present) and dcast_cuda_available() says 0, so a CUDA
 * tensor is refused at register with DCAST_ENODEVICE (tests/test_producer_gpu.c
 * checks that); the device half of that test runs only where a GPU is lent
 * (`make test-gpu`). */
#include <inttypes.h>
#include <string.h>
#include "producer_impl.h"
#ifdef DCAST_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "deltacast/codec_cuda.h"
#endif

#ifdef DCAST_HAVE_CUDA
static int cu_fail(cudaError_t e, const char *what, const char *name)
{
	return dcast_fail(DCAST_ECUDA, "producer: %s for tensor %s: %s", what, name,
			  cudaGetErrorString(e));
}

int prod_dev_register(prod_tensor *t, const void *ptr)
{
	struct cudaPointerAttributes a;
	cudaError_t e;

	if (!dcast_cuda_available())
		return dcast_fail(DCAST_ENODEVICE, "register %s: the tensor is in CUDA memory but "
				  "no usable CUDA device is present", t->desc.name);
	if ((e = cudaPointerGetAttributes(&a, ptr)))
		return cu_fail(e, "cudaPointerGetAttributes", t->desc.name);
	if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
		return dcast_fail(DCAST_EINVAL, "register %s: mem is CUDA but the pointer is not "
				  "device memory", t->desc.name);
	t->device = a.device;
	return 0;
}

/* A batch per tensor when any is in CUDA memory; none (every range by
 * itself) when out of memory. */
static void dev_batches(dcast_producer *p)
{
	int any = 0;

	for (uint32_t i = 0; i < p->n_tensors; i++)
		any |= p->tensors[i].mem == DCAST_MEM_CUDA;
	if (!any || !(p->dev_batch = calloc(p->n_tensors, sizeof(*p->dev_batch))))
		return;
	for (uint32_t i = 0; i < p->n_tensors; i++)
		pthread_mutex_init(&p->dev_batch[i].lock, NULL);
}

/* Before the host region is laid out: device baselines where asked for and
 * cudaMalloc finds room (the rest go to the pinned host region). */
void prod_dev_alloc(dcast_producer *p)
{
	for (uint32_t i = 0; i < p->n_tensors && p->opts.baseline_on_device; i++) {
		prod_tensor *t = &p->tensors[i];
		size_t bytes = t->shard_count * t->elem_size;
		void *d = NULL;

		if (t->mem != DCAST_MEM_CUDA || !bytes)
			continue;
		if (!cudaSetDevice(t->device) && !cudaMalloc(&d, bytes)) {
			t->base = d;
			t->base_on_device = 1;
			continue;
		}
		DCAST_LOG_I("producer: baseline of %s does not fit on device %d: pinned host "
			    "memory instead", t->desc.name, t->device);
	}
	dev_batches(p);
}

/* After: the kernels read host baselines of CUDA tensors over PCIe. */
int prod_dev_map(dcast_producer *p)
{
	int host_base = 0;
	cudaError_t e;

	for (uint32_t i = 0; i < p->n_tensors; i++)
		host_base |= p->tensors[i].mem == DCAST_MEM_CUDA && !p->tensors[i].base_on_device;
	if (!host_base || !p->base_region_bytes)
		return 0;
	if ((e = cudaHostRegister(p->base_region, p->base_region_bytes, cudaHostRegisterMapped)))
		return cu_fail(e, "cudaHostRegister of the baseline", "(all)");
	p->base_registered = 1;
	return 0;
}

void prod_dev_free(dcast_producer *p)
{
	for (uint32_t i = 0; i < p->n_tensors; i++)
		if (p->tensors[i].base_on_device) {
			cudaFree(p->tensors[i].base);
			p->tensors[i].base = NULL;
			p->tensors[i].base_on_device = 0;
		}
	if (p->base_registered)
		cudaHostUnregister(p->base_region);
	p->base_registered = 0;
	for (uint32_t i = 0; p->dev_batch && i < p->n_tensors; i++) {
		dcast_cuda_ranges_free(p->dev_batch[i].ranges);
		pthread_mutex_destroy(&p->dev_batch[i].lock);
	}
	free(p->dev_batch);
	p->dev_batch = NULL;
}

/* Each encoder thread's work goes to its own default stream: on the
 * legacy default stream (NULL) the encoders' kernels, copies and
 * synchronizations of different ranges would run one after another. */
#define DEV_STREAM ((void *)cudaStreamPerThread)

/* The range's digest, computed whole: the CUDA encode keeps no old values
 * to update it from, so a changed range on a device costs O(range) GPU
 * reads here (the host path is O(changed), encode.c).  Acceptable for now:
 * the GPU reads the range at memory bandwidth. */
static int dev_digest(const prod_tensor *t, uint32_t tensor, uint64_t off, uint64_t count, uint64_t *d)
{
	const unsigned char *base = t->base + off * t->elem_size;

	if (!t->base_on_device)
		return dcast_ldigest(tensor, t->shard_off + off, base, count, t->elem_size, d);
	return dcast_cuda_ldigest(tensor, t->shard_off + off, base, count, t->elem_size, d, DEV_STREAM);
}

/* Scratch (12 bytes a change) or payloads above this: range by range. */
#define DEV_BATCH_MAX_BYTES ((size_t)64 << 20)

/* Encode tensor ti's delta whole into b (its lock held). */
static int batch_encode(dcast_producer *p, const prod_tensor *t, uint32_t ti, prod_dev_batch *b)
{
	dcast_chunk_info info;
	const void *pl;
	uint64_t move;
	cudaError_t e;
	int rc, moved = 0;

	b->held = 0;
	if (!b->ranges && !(b->ranges = dcast_cuda_ranges_new()))
		return 0; /* out of memory: range by range */
	if ((e = cudaSetDevice(t->device)))
		return cu_fail(e, "cudaSetDevice", t->desc.name);
	rc = dcast_cuda_ranges_encode(b->ranges, t->ptr, t->base, t->shard_count, t->elem_size,
				      p->opts.range_elems, -1, DCAST_ENCODE_UPDATE_BASE, ti, t->shard_off,
				      DEV_BATCH_MAX_BYTES, &b->held, DEV_STREAM);
	for (uint32_t k = 0; !rc && b->held && !moved && k < t->n_chunks; k++)
		if (!(rc = dcast_cuda_ranges_get(b->ranges, k, &info, &pl, &move)))
			moved = info.changed != 0;
	if (rc || moved) /* the baseline moved (or may have) */
		__atomic_store_n(&p->enc.dev_moved, 1, __ATOMIC_RELAXED);
	return rc;
}

/* Tensor ti's batch for this run, made by the first encoder to ask. */
static int batch_for(dcast_producer *p, const prod_tensor *t, uint32_t ti, uint64_t run,
		     prod_dev_batch **out)
{
	prod_dev_batch *b = &p->dev_batch[ti];
	int rc, mine = 0;

	pthread_mutex_lock(&b->lock);
	if (b->run != run) {
		b->run = run;
		b->rc = batch_encode(p, t, ti, b);
		mine = 1;
	}
	rc = b->rc;
	pthread_mutex_unlock(&b->lock);
	*out = b;
	if (rc && !mine)
		return dcast_fail(rc, "producer: tensor %s: its device encode failed (the first error says "
				  "why)", t->desc.name);
	return rc;
}

/* Range `off` of tensor ti from its batch, into the job's slot. */
static int batch_take(dcast_producer *p, const prod_tensor *t, const prod_dev_batch *b, uint64_t off,
		      prod_job *job)
{
	uint64_t k = off / p->opts.range_elems, move;
	const void *pl;
	int rc;

	if ((rc = dcast_cuda_ranges_get(b->ranges, k, &job->info, &pl, &move)))
		return rc;
	if (job->info.payload_bytes > p->pool.slot_bytes)
		return dcast_fail(DCAST_ETOO_LARGE, "producer: tensor %s range %" PRIu64 ": payload of %"
				  PRIu64 " bytes past the %zu-byte slot", t->desc.name, k,
				  job->info.payload_bytes, p->pool.slot_bytes);
	memcpy(job->slot->buf, pl, job->info.payload_bytes);
	job->digest = p->chunk_digest[t->first_chunk + k] + move;
	job->no_old = job->info.changed != 0;
	return 0;
}

int prod_dev_encode(dcast_producer *p, const prod_tensor *t, int anchor, uint64_t off,
		    uint64_t count, prod_job *job)
{
	size_t bytes = count * t->elem_size;
	const unsigned char *cur = t->ptr + off * t->elem_size;
	unsigned char *base = t->base + off * t->elem_size;
	prod_dev_batch *b;
	cudaError_t e;
	int rc;

	if (!anchor && p->dev_batch) {
		if ((rc = batch_for(p, t, job->tensor, job->run, &b)))
			return rc;
		if (b->held)
			return batch_take(p, t, b, off, job);
	}
	if ((e = cudaSetDevice(t->device)))
		return cu_fail(e, "cudaSetDevice", t->desc.name);
	rc = dcast_cuda_encode(cur, anchor ? NULL : base, count, t->elem_size, -1,
			       DCAST_ENCODE_UPDATE_BASE, job->slot->buf, p->pool.slot_bytes,
			       &job->info, DEV_STREAM);
	if (rc)
		return rc;
	job->no_old = !anchor && job->info.changed;
	if (anchor && ((e = cudaMemcpyAsync(base, cur, bytes, cudaMemcpyDefault, cudaStreamPerThread)) ||
		       (e = cudaStreamSynchronize(cudaStreamPerThread))))
		return cu_fail(e, "cudaMemcpy into the baseline", t->desc.name);
	if (anchor || job->info.changed)
		return dev_digest(t, job->tensor, off, count, &job->digest);
	return 0;
}

int prod_base_read(const prod_tensor *t, uint64_t off, void *dst, size_t bytes)
{
	cudaError_t e;

	if (!t->base_on_device) {
		memcpy(dst, t->base + off * t->elem_size, bytes);
		return 0;
	}
	if ((e = cudaSetDevice(t->device)) ||
	    (e = cudaMemcpy(dst, t->base + off * t->elem_size, bytes, cudaMemcpyDeviceToHost)))
		return cu_fail(e, "cudaMemcpy from the baseline", t->desc.name);
	return 0;
}
#else /* no CUDA in this build */
int prod_dev_register(prod_tensor *t, const void *ptr)
{
	(void)ptr;
	return dcast_fail(DCAST_ENODEVICE, "register %s: the tensor is in CUDA memory but this "
			  "build has no CUDA", t->desc.name);
}

void prod_dev_alloc(dcast_producer *p)
{
	(void)p;
}

int prod_dev_map(dcast_producer *p)
{
	(void)p;
	return 0;
}

void prod_dev_free(dcast_producer *p)
{
	(void)p;
}

int prod_dev_encode(dcast_producer *p, const prod_tensor *t, int anchor, uint64_t off,
		    uint64_t count, prod_job *job)
{
	(void)p, (void)anchor, (void)off, (void)count, (void)job;
	return dcast_fail(DCAST_ENODEVICE, "producer: tensor %s is in CUDA memory but this "
			  "build has no CUDA", t->desc.name);
}

int prod_base_read(const prod_tensor *t, uint64_t off, void *dst, size_t bytes)
{
	memcpy(dst, t->base + off * t->elem_size, bytes);
	return 0;
}
#endif
