/* Tensors in CUDA memory: diffed on their device with the codec's CUDA
 * twins (kernels/codec_cuda.cu), so only payloads cross PCIe into the
 * encode slots.  Their baseline is device memory when opts.baseline_on_device
 * asks for it and cudaMalloc finds room, else the pinned host region,
 * registered with CUDA so the kernels read it over PCIe.  A delta's chunk
 * ranges of CUDA tensors are diffed and encoded in batches, consecutive
 * ranges on one device of one element size, up to DEV_BATCH_ELEMS elements
 * (dcast_cuda_ranges_encode: three synchronizations per batch instead of
 * about six per range), each by the first encoder that claims one of its
 * ranges; every encoder then copies its range's payload from that batch.
 * A batch whose changes would need over DEV_BATCH_MAX_BYTES of scratch or
 * payload goes range by range (dcast_cuda_encode), as do anchors.  The device path
 * keeps no old values (the CUDA encoder has no SAVE_OLD): a version with a
 * changed device range can be neither rolled back nor resumed as a delta,
 * and goes again, or is followed, as an anchor.
 *
 * There is no GPU on the development machines: there the build has CUDA
 * (nvcc is present) and dcast_cuda_available() says 0, so a CUDA tensor is
 * refused at register with DCAST_ENODEVICE (tests/test_producer_gpu.c
 * checks that).  The device half of that test, and the fault suite with
 * the producer on the GPU, run only on a GPU host (`make test-gpu`,
 * scripts/device_run.sh; they passed on H100 hosts, docs/benchmarks.md). */
#include <inttypes.h>
#include <string.h>
#include "producer_shared.h"
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
}

/* Elements of a batch, at most.  A batch costs about 1 ms besides its
 * elements (three synchronizations, launches, scratch) and batches run one
 * after another, so fewer is faster: on an H100, a 1% delta of 100M bf16
 * parameters in 173 ranges went to the broker's ACK in 12.5 ms with 8M,
 * 7.3 ms with 32M and 5.2 ms with 128M (one batch; docs/benchmarks.md).
 * A batch's scratch stays under DEV_BATCH_MAX_BYTES up to about 7% of
 * its elements changed; above, dcast_cuda_ranges_encode takes its ranges
 * in groups that fit. */
#define DEV_BATCH_ELEMS ((uint64_t)128 << 20)
#define DEV_BATCH_MAX_BYTES ((size_t)256 << 20)

/* Elements of a batch, at most: DEV_BATCH_ELEMS, or the environment's
 * DELTACAST_DEVICE_BATCH_ELEMS (a tuning knob, docs/operations.md). */
static uint64_t batch_elems(void)
{
	const char *e = getenv("DELTACAST_DEVICE_BATCH_ELEMS");
	unsigned long long n = e ? strtoull(e, NULL, 10) : 0;

	return n ? (uint64_t)n : DEV_BATCH_ELEMS;
}

/* Does chunk j of tensor t, count elements, go on batch b (of at most max elements)? */
static int joins(const prod_dev_batch *b, const prod_tensor *t, uint32_t j, uint64_t count, uint64_t max)
{
	return b && b->first + b->n == j && b->device == t->device && b->elem_size == t->elem_size &&
	       b->elems + count <= max;
}

/* A new batch from chunk j of tensor t on. */
static prod_dev_batch *batch_open(dcast_producer *p, const prod_tensor *t, uint32_t j)
{
	prod_dev_batch *b = &p->dev_batch[p->n_dev_batches++];

	b->first = j;
	b->device = t->device;
	b->elem_size = t->elem_size;
	b->desc = &p->dev_ranges[j];
	pthread_mutex_init(&b->lock, NULL);
	return b;
}

/* Chunk k of tensor ti as the next range of the last batch, or of a new one. */
static void batch_add(dcast_producer *p, uint32_t ti, uint32_t k, uint64_t max)
{
	const prod_tensor *t = &p->tensors[ti];
	uint64_t off = (uint64_t)k * p->opts.range_elems, count = prod_range_count(p, t, off);
	uint32_t j = t->first_chunk + k;
	prod_dev_batch *b = p->n_dev_batches ? &p->dev_batch[p->n_dev_batches - 1] : NULL;
	dcast_cuda_range *d;

	if (!joins(b, t, j, count, max))
		b = batch_open(p, t, j);
	d = &b->desc[b->n];
	d->base = t->base + off * t->elem_size; /* cur: at each encode (batch_refresh) */
	d->count = count;
	d->start = t->shard_off + off;
	d->tensor = ti;
	p->chunk_batch[j] = (uint32_t)(b - p->dev_batch);
	b->elems += count;
	b->n++;
}

/* The batches of the CUDA tensors' chunks, once the chunks are laid out. */
static int dev_batches(dcast_producer *p)
{
	uint64_t max = batch_elems();
	uint32_t n = 0;

	for (uint32_t i = 0; i < p->n_tensors; i++)
		n += p->tensors[i].mem == DCAST_MEM_CUDA ? p->tensors[i].n_chunks : 0;
	if (!n)
		return 0;
	p->dev_batch = calloc(n, sizeof(*p->dev_batch));
	p->dev_ranges = calloc(p->n_chunks, sizeof(*p->dev_ranges));
	p->chunk_batch = malloc(p->n_chunks * sizeof(*p->chunk_batch));
	if (!p->dev_batch || !p->dev_ranges || !p->chunk_batch)
		return dcast_fail(DCAST_ENOMEM, "producer: out of memory for %u device ranges", n);
	memset(p->chunk_batch, 0xff, p->n_chunks * sizeof(*p->chunk_batch));
	for (uint32_t i = 0; i < p->n_tensors; i++)
		for (uint32_t k = 0; p->tensors[i].mem == DCAST_MEM_CUDA && k < p->tensors[i].n_chunks; k++)
			batch_add(p, i, k, max);
	return 0;
}

/* After: the batches; the kernels read host baselines of CUDA tensors over PCIe. */
int prod_dev_map(dcast_producer *p)
{
	int host_base = 0, rc;
	cudaError_t e;

	if ((rc = dev_batches(p)))
		return rc;
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
	for (uint32_t i = 0; i < p->n_dev_batches; i++) {
		dcast_cuda_ranges_free(p->dev_batch[i].ranges);
		pthread_mutex_destroy(&p->dev_batch[i].lock);
	}
	free(p->dev_batch);
	free(p->dev_ranges);
	free(p->chunk_batch);
	p->dev_batch = NULL;
	p->dev_ranges = NULL;
	p->chunk_batch = NULL;
	p->n_dev_batches = 0;
}

/* Each encoder thread's work goes to its own default stream: on the
 * legacy default stream (NULL) the encoders' kernels, copies and
 * synchronizations of different ranges would run one after another. */
#define DEV_STREAM ((void *)cudaStreamPerThread)

/* A range encoded by itself (an anchor, or a batch left range by range):
 * its digest computed whole, since dcast_cuda_encode keeps no old values
 * to move it from, O(range) GPU reads at memory bandwidth (a batch moves
 * its ranges' digests by their changes, O(changed)). */
static int dev_digest(const prod_tensor *t, uint32_t tensor, uint64_t off, uint64_t count, uint64_t *d)
{
	const unsigned char *base = t->base + off * t->elem_size;

	if (!t->base_on_device)
		return dcast_ldigest(tensor, t->shard_off + off, base, count, t->elem_size, d);
	return dcast_cuda_ldigest(tensor, t->shard_off + off, base, count, t->elem_size, d, DEV_STREAM);
}

/* Point batch b's ranges at their tensors' memory now: a tensor registered
 * again may have moved (on another device, when its baseline is in host
 * memory: then 0, range by range). */
static int batch_refresh(dcast_producer *p, prod_dev_batch *b)
{
	for (uint32_t k = 0; k < b->n; k++) {
		dcast_cuda_range *d = &b->desc[k];
		const prod_tensor *t = &p->tensors[d->tensor];

		if (t->device != b->device)
			return 0;
		d->cur = t->ptr + (d->start - t->shard_off) * t->elem_size;
	}
	return 1;
}

/* Encode batch b (its lock held). */
static int batch_encode(dcast_producer *p, prod_dev_batch *b)
{
	dcast_chunk_info info;
	const void *pl;
	uint64_t move;
	cudaError_t e;
	int rc, moved = 0;

	b->held = 0;
	if (!batch_refresh(p, b) || (!b->ranges && !(b->ranges = dcast_cuda_ranges_new())))
		return 0; /* moved to another device, or out of memory: range by range */
	if ((e = cudaSetDevice(b->device)))
		return cu_fail(e, "cudaSetDevice", p->tensors[b->desc[0].tensor].desc.name);
	rc = dcast_cuda_ranges_encode(b->ranges, b->desc, b->n, b->elem_size, -1, DCAST_ENCODE_UPDATE_BASE,
				      DEV_BATCH_MAX_BYTES, &b->held, DEV_STREAM);
	DCAST_LOG_D("producer %s: chunks %u..%u %s on device %d, %.2f ms after publish", p->model, b->first,
		    b->first + b->n - 1, rc ? "failed" : b->held ? "encoded" : "left to range by range",
		    b->device, prod_since_publish_ms(p));
	for (uint32_t k = 0; !rc && b->held && !moved && k < b->n; k++)
		if (!(rc = dcast_cuda_ranges_get(b->ranges, k, &info, &pl, &move)))
			moved = info.changed != 0;
	if (rc || moved) /* a baseline moved (or may have) */
		__atomic_store_n(&p->enc.dev_moved, 1, __ATOMIC_RELAXED);
	return rc;
}

/* Batch bi for this run, made by the first encoder to ask. */
static int batch_for(dcast_producer *p, uint32_t bi, uint64_t run, prod_dev_batch **out)
{
	prod_dev_batch *b = &p->dev_batch[bi];
	int rc, mine = 0;

	pthread_mutex_lock(&b->lock);
	if (b->run != run) {
		b->run = run;
		b->rc = batch_encode(p, b);
		mine = 1;
	}
	rc = b->rc;
	pthread_mutex_unlock(&b->lock);
	*out = b;
	if (rc && !mine)
		return dcast_fail(rc, "producer: the device encode of chunks %u..%u failed (the first error "
				  "says why)", b->first, b->first + b->n - 1);
	return rc;
}

/* Chunk j from its batch, into the job's slot. */
static int batch_take(dcast_producer *p, const prod_dev_batch *b, uint32_t j, prod_job *job)
{
	const void *pl;
	uint64_t move;
	int rc;

	if ((rc = dcast_cuda_ranges_get(b->ranges, j - b->first, &job->info, &pl, &move)))
		return rc;
	if (job->info.payload_bytes > p->pool.slot_bytes)
		return dcast_fail(DCAST_ETOO_LARGE, "producer: chunk %u: payload of %" PRIu64 " bytes past "
				  "the %zu-byte slot", j, job->info.payload_bytes, p->pool.slot_bytes);
	memcpy(job->slot->buf, pl, job->info.payload_bytes);
	job->digest = p->chunk_digest[j] + move;
	job->no_old = job->info.changed != 0;
	return 0;
}

int prod_dev_encode(dcast_producer *p, const prod_tensor *t, int anchor, uint64_t off,
		    uint64_t count, prod_job *job)
{
	size_t bytes = count * t->elem_size;
	const unsigned char *cur = t->ptr + off * t->elem_size;
	unsigned char *base = t->base + off * t->elem_size;
	uint32_t j = t->first_chunk + (uint32_t)(off / p->opts.range_elems);
	prod_dev_batch *b;
	cudaError_t e;
	int rc;

	if (!anchor && p->chunk_batch && p->chunk_batch[j] != UINT32_MAX) {
		if ((rc = batch_for(p, p->chunk_batch[j], job->run, &b)))
			return rc;
		if (b->held)
			return batch_take(p, b, j, job);
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

/* The whole shard's baseline from host memory (a fetched baseline). */
int prod_base_write(prod_tensor *t, const void *src, size_t bytes)
{
	cudaError_t e;

	if (!t->base_on_device) {
		memcpy(t->base, src, bytes);
		return 0;
	}
	if ((e = cudaSetDevice(t->device)) ||
	    (e = cudaMemcpy(t->base, src, bytes, cudaMemcpyHostToDevice)))
		return cu_fail(e, "cudaMemcpy into the baseline", t->desc.name);
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

int prod_base_write(prod_tensor *t, const void *src, size_t bytes)
{
	memcpy(t->base, src, bytes);
	return 0;
}
#endif
