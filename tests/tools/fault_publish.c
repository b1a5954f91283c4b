/* fault_publish: a paced `deltacast publish` for the fault suite, so that
 * faults strike while versions are still flowing.  Publishes FILE[i] as
 * version FIRST+i with the producer library (the first as an anchor, then
 * deltas), waits for each ACK, prints "acked V T_START T_ACKED", then
 * sleeps INTERVAL_MS.  Before publishing it reads every page of the file's
 * tensors, so that page faults on the mapping stay outside the publish (a
 * trainer's weights are in memory); T_START is CLOCK_REALTIME nanoseconds
 * just before dcast_producer_publish(), T_ACKED after the ACK
 * (scripts/bench_sync.sh times versions from them).
 * INTERVAL_MS -1: before each version, waits for a line on stdin instead
 * (scripts/bench_e2e.sh and bench_sync.sh pace it; EOF stops it, exit 0).
 * usage: fault_publish ENDPOINT MODEL FIRST INTERVAL_MS FILE...
 * FAULT_PUBLISH_RANGE_ELEMS=N in the environment: chunks of N elements
 * (scripts/cluster_run.sh scales them with the model).
 * FAULT_PUBLISH_ENCODE_THREADS=N: the producer's encode_threads (default:
 * the library's).
 * FAULT_PUBLISH_ACK_WAIT_MS=MS: how long each version's ACK is waited for
 * (default 20000; scripts/bench_scale.sh gives a large model's durable
 * write on a slow disk longer).
 * FAULT_PUBLISH_DEVICE=1: the tensors live in CUDA memory, as a trainer's
 * do (each file copied there before its publish, outside T_START..T_ACKED),
 * their baseline too: the producer's device path (scripts/device_run.sh,
 * step sync-gpu).  Without a CUDA build or device it exits 1 saying so.
 * Exit 0 when every file is acknowledged; 1 with the error on stderr. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "deltacast/codec.h"
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"
#ifdef DCAST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* FAULT_PUBLISH_DEVICE: one buffer in CUDA memory per tensor, kept for
 * every version (the files' tensors are the same, in the same order). */
static void **dev_bufs;
static size_t n_dev_bufs;

/* Tensor i's data in CUDA memory (t's bytes copied there); NULL on error,
 * printed.  Every file's tensor i must have the first one's size. */
static void *dev_copy(size_t i, const dcast_st_tensor *t)
{
#ifdef DCAST_HAVE_CUDA
	cudaError_t e = cudaSuccess;

	if (i >= n_dev_bufs) {
		void **b = realloc(dev_bufs, (i + 1) * sizeof(*b));
		if (!b)
			return NULL;
		dev_bufs = b;
		dev_bufs[n_dev_bufs++] = NULL;
		e = cudaMalloc(&dev_bufs[i], t->nbytes ? t->nbytes : 1);
	}
	if (!e)
		e = cudaMemcpy(dev_bufs[i], t->data, t->nbytes, cudaMemcpyHostToDevice);
	if (!e)
		return dev_bufs[i];
	fprintf(stderr, "fault_publish: tensor %s into CUDA memory: %s\n", t->name, cudaGetErrorString(e));
#else
	(void)i;
	fprintf(stderr, "fault_publish: tensor %s: FAULT_PUBLISH_DEVICE, but this build has no CUDA\n", t->name);
#endif
	return NULL;
}

static void dev_free(void)
{
#ifdef DCAST_HAVE_CUDA
	for (size_t i = 0; i < n_dev_bufs; i++)
		cudaFree(dev_bufs[i]);
#endif
	free(dev_bufs);
}

static int register_file(dcast_producer *p, dcast_st_file *f, int dev)
{
	for (size_t i = 0; i < dcast_st_count(f); i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		int d = dcast_dtype_from_name(dcast_st_dtype_name(t->dtype));
		void *ptr = dev ? dev_copy(i, t) : (void *)t->data;
		int rc = d < 0 ? DCAST_EDTYPE
			 : !ptr ? DCAST_ECUDA
				: dcast_producer_register(p, t->name, d, t->ndim, t->shape, ptr,
							  dev ? DCAST_MEM_CUDA : DCAST_MEM_HOST, 0, t->count);
		if (rc)
			return rc;
	}
	return 0;
}

/* Read one byte of every 4 KiB page of every tensor of f. */
static void touch_file(const dcast_st_file *f)
{
	volatile unsigned char sink = 0;

	for (size_t i = 0; i < dcast_st_count(f); i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		for (uint64_t off = 0; off < t->nbytes; off += 4096)
			sink ^= ((const unsigned char *)t->data)[off];
	}
	(void)sink;
}

static uint64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int ack_wait_ms(void)
{
	const char *e = getenv("FAULT_PUBLISH_ACK_WAIT_MS");

	return e && atoi(e) > 0 ? atoi(e) : 20000;
}

/* Publish the registered file as version v and wait for its ACK; print
 * "acked V T_START T_ACKED". */
static int publish_acked(dcast_producer *p, uint64_t v)
{
	uint64_t t0 = realtime_ns();
	int rc = dcast_producer_publish(p, v);

	if (!rc)
		rc = dcast_producer_wait(p, v, ack_wait_ms());
	if (!rc) {
		printf("acked %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", v, t0, realtime_ns());
		fflush(stdout);
	}
	return rc;
}

static void nap(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
	dcast_st_file *prev = NULL, *f = NULL;
	dcast_producer_opts o;
	dcast_producer *p = NULL;
	uint64_t first;
	long interval_ms;
	int dev = getenv("FAULT_PUBLISH_DEVICE") && atoi(getenv("FAULT_PUBLISH_DEVICE"));
	int rc = 0;

	if (argc < 6) {
		fprintf(stderr, "usage: fault_publish ENDPOINT MODEL FIRST INTERVAL_MS FILE...\n");
		return 2;
	}
	first = strtoull(argv[3], NULL, 10);
	interval_ms = atol(argv[4]);
	dcast_producer_opts_init(&o);
	o.client = "fault_publish";
	o.max_reconnects = 10;
	o.baseline_on_device = dev;
	if (getenv("FAULT_PUBLISH_ENCODE_THREADS"))
		o.encode_threads = (uint32_t)strtoul(getenv("FAULT_PUBLISH_ENCODE_THREADS"), NULL, 10);
	if (dev && !dcast_cuda_available()) {
		fprintf(stderr, "fault_publish: FAULT_PUBLISH_DEVICE, but no usable CUDA device\n");
		return 1;
	}
	if (getenv("FAULT_PUBLISH_RANGE_ELEMS"))
		o.range_elems = strtoull(getenv("FAULT_PUBLISH_RANGE_ELEMS"), NULL, 10);
	if ((rc = dcast_producer_open(argv[1], argv[2], 0, 1, &o, &p)))
		goto out;
	for (int i = 5; i < argc && !rc; i++) {
		uint64_t v = first + (uint64_t)(i - 5);
		char go[64];
		if (interval_ms < 0 && !fgets(go, sizeof(go), stdin))
			break;
		if ((rc = dcast_st_open(argv[i], &f)) || (rc = register_file(p, f, dev)))
			break;
		touch_file(f);
		if ((rc = publish_acked(p, v)))
			break;
		dcast_st_close(&prev); /* the producer now points into f */
		prev = f;
		f = NULL;
		nap(interval_ms > 0 ? interval_ms : 0);
	}
out:
	if (rc)
		fprintf(stderr, "fault_publish: %s: %s\n", dcast_errname(rc), dcast_last_error());
	dcast_st_close(&f);
	dcast_st_close(&prev);
	dcast_producer_close(&p);
	dev_free();
	return rc ? 1 : 0;
}
