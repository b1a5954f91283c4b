/* bench_gpu_ranges: where a device-resident producer's time per chunk range
 * goes.  The producer encodes a CUDA tensor range by range (1M elements
 * each, its default), one dcast_cuda_encode and one dcast_cuda_ldigest per
 * changed range, on up to 8 encoder threads each on its per-thread stream.
 * This times those calls over a 100M-element bf16 tensor with 1% of its
 * elements changed, on 1 and on 8 threads, call by call, so that the fixed
 * cost of a call (launches, synchronizations, scratch) shows beside its
 * work, plus the same range count of bare stream synchronizations; and
 * all its ranges in one dcast_cuda_ranges_encode (what the producer does
 * now, batch by batch), on one thread: "us per range" is then its time over
 * the range count.  A
 * probe for docs/benchmarks.md's GPU notes, not a benchmark target.
 * Usage: bench_gpu_ranges [ELEMS [RANGE_ELEMS]].  Exits 77 without a device. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "deltacast/codec.h"
#include "deltacast/codec_cuda.h"

#ifndef DCAST_HAVE_CUDA
int main(void)
{
	printf("skip: no CUDA device (built without CUDA)\n");
	return 77;
}
#else
#include <cuda_runtime.h>

enum { V_ENC, V_ENC_DIGEST, V_DIGEST, V_SYNC, V_WHOLE, V_COUNT };
static const char *const v_name[V_COUNT] = {
	"encode", "encode + ldigest (the producer's pair before)", "ldigest alone",
	"bare synchronize x4", "all ranges at once (dcast_cuda_ranges_encode)",
};

typedef struct run {
	uint16_t *cur, *base;
	uint64_t n, range;
	int variant;
	size_t slot;
	_Atomic uint64_t next;
	int failed;
} run;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int one_range(run *r, uint64_t off, uint8_t *slot)
{
	uint64_t n = r->n - off < r->range ? r->n - off : r->range, d = 0;
	dcast_chunk_info info;
	void *s = (void *)cudaStreamPerThread;
	int rc = 0;

	if (r->variant == V_SYNC) {
		for (int k = 0; k < 4 && !rc; k++)
			rc = cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess;
		return rc;
	}
	if (r->variant != V_DIGEST)
		rc = dcast_cuda_encode(r->cur + off, r->base + off, n, 2, -1, 0, slot, r->slot, &info, s);
	if (!rc && (r->variant == V_ENC_DIGEST || r->variant == V_DIGEST))
		rc = dcast_cuda_ldigest(0, off, r->base + off, n, 2, &d, s);
	return rc;
}

static void *worker(void *arg)
{
	run *r = arg;
	uint8_t *slot = malloc(r->slot);

	if (!slot) {
		r->failed = 1;
		return NULL;
	}
	for (;;) {
		uint64_t off = atomic_fetch_add(&r->next, r->range);
		if (off >= r->n)
			break;
		if (one_range(r, off, slot)) {
			fprintf(stderr, "bench_gpu_ranges: %s at %" PRIu64 ": %s\n", v_name[r->variant], off,
				dcast_last_error());
			r->failed = 1;
			break;
		}
	}
	free(slot);
	return NULL;
}

/* All ranges in one call (no baseline update, so that passes repeat). */
static double time_whole(run *r, dcast_cuda_ranges *w)
{
	uint64_t n = (r->n + r->range - 1) / r->range;
	dcast_cuda_range *d = calloc(n, sizeof(*d));
	double best = 1e30;

	for (uint64_t k = 0; d && k < n; k++)
		d[k] = (dcast_cuda_range){ r->cur + k * r->range, r->base + k * r->range,
					   r->n - k * r->range < r->range ? r->n - k * r->range : r->range, k * r->range, 0 };
	for (int rep = 0; d && rep < 3; rep++) {
		double t0 = now_s(), t;
		int held = 0;

		if (dcast_cuda_ranges_encode(w, d, n, 2, -1, 0, (size_t)1 << 30, &held, (void *)cudaStreamPerThread) ||
		    !held) {
			fprintf(stderr, "bench_gpu_ranges: whole tensor: %s\n", dcast_last_error());
			r->failed = 1;
		}
		t = now_s() - t0;
		best = t < best ? t : best;
	}
	r->failed |= !d;
	free(d);
	return best;
}

/* Best of 3 wall times of one pass over all ranges on `threads` threads. */
static double time_pass(run *r, int threads)
{
	double best = 1e30;

	for (int rep = 0; rep < 3; rep++) {
		pthread_t th[8];
		double t0 = now_s(), t;

		atomic_store(&r->next, 0);
		for (int i = 0; i < threads; i++)
			pthread_create(&th[i], NULL, worker, r);
		for (int i = 0; i < threads; i++)
			pthread_join(th[i], NULL);
		t = now_s() - t0;
		best = t < best ? t : best;
	}
	return best;
}

static void fill(uint16_t *base, uint16_t *cur, uint64_t n)
{
	uint64_t s = 0x9e3779b97f4a7c15ull;

	for (uint64_t i = 0; i < n; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		base[i] = (uint16_t)(0x3c00 + (s & 0x3ff));
		cur[i] = (uint16_t)(base[i] + ((s >> 20) % 100 == 0 ? 1 + (s >> 40) % 3 : 0));
	}
}

int main(int argc, char **argv)
{
	uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : 100000000ull;
	run r = { .n = n, .range = argc > 2 ? strtoull(argv[2], NULL, 0) : 1u << 20 };
	uint16_t *hb = malloc(n * 2), *hc = malloc(n * 2);
	uint64_t ranges = (n + r.range - 1) / r.range;

	if (!dcast_cuda_available()) {
		printf("skip: no CUDA device\n");
		return 77;
	}
	r.slot = dcast_codec_bound(r.range, 2);
	fill(hb, hc, n);
	if (cudaMalloc((void **)&r.cur, n * 2) || cudaMalloc((void **)&r.base, n * 2) ||
	    cudaMemcpy(r.cur, hc, n * 2, cudaMemcpyHostToDevice) ||
	    cudaMemcpy(r.base, hb, n * 2, cudaMemcpyHostToDevice)) {
		fprintf(stderr, "bench_gpu_ranges: device allocation or upload failed\n");
		return 1;
	}
	printf("bench_gpu_ranges: %" PRIu64 " bf16 elements, 1%% changed, %" PRIu64 " ranges of %" PRIu64
	       "; best of 3 passes\n\n| call | threads | pass ms | us per range |\n|---|---|---|---|\n",
	       n, ranges, r.range);
	dcast_cuda_ranges *whole = dcast_cuda_ranges_new();
	for (int v = 0; v < V_COUNT; v++)
		for (int threads = 1; threads <= (v == V_WHOLE ? 1 : 8); threads *= 8) {
			double t;

			r.variant = v;
			t = v == V_WHOLE ? time_whole(&r, whole) : time_pass(&r, threads);
			if (r.failed)
				return 1;
			printf("| %s | %d | %.2f | %.1f |\n", v_name[v], threads, 1e3 * t, 1e6 * t / (double)ranges);
		}
	dcast_cuda_ranges_free(whole);
	return 0;
}
#endif
