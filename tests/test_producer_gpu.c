/* The producer with tensors in CUDA memory (producer/device.c).
 * Without a CUDA device (the development machines) it checks the fallback:
 * registering a CUDA tensor is refused with DCAST_ENODEVICE and a message
 * naming the tensor, baseline_on_device is refused at open, and the same
 * producer goes on publishing its host tensors, bit-exact.
 * With a device (a GPU host, `make test-gpu`; the 2-core VM has none)
 * it registers cudaMalloc'd tensors beside a host one, with the
 * baseline in device memory and in pinned host memory, and publishes an
 * anchor and three deltas (the second leaving a range alone; both
 * device tensors' ranges encoded in one batch; before the third, one
 * tensor registered again at new device memory) that a reader gets
 * bit-exact, every COMMIT digest checked; and the broker, killed in the
 * middle of a device delta and back with its log, gets that version again
 * as an anchor (a device batch moved the baseline past the undo log),
 * bit-exact, and the next one as a delta. */
#include <pthread.h>
#include <stdint.h>
#include "check.h"
#include "deltacast/codec_cuda.h"
#include "deltacast/producer.h"
#include "producer_harness.h"
#ifdef DCAST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define N_H 4096            /* host tensor "h" */
#define N_D ((1u << 19) + 3) /* device tensor "d": two ranges and a bit */
#define N_E 3001             /* device tensor "e": one short range after d's */

static char dir[] = "/tmp/dcast-test-producer-gpu-XXXXXX";
static uint16_t *h, *d_host; /* d_host: what the device tensor holds */
static uint16_t e_host[N_E];
static uint64_t seed = 11;

static int read_back(const harness_broker *b, const char *model, uint64_t v)
{
	char out[256];

	snprintf(out, sizeof(out), "%s/%s-v%llu.safetensors", dir, model, (unsigned long long)v);
	return !harness_read(b, model, v, out) && harness_same_as_file(out, "h", h, N_H * 2) &&
	       (!d_host || (harness_same_as_file(out, "d", d_host, N_D * 2ull) &&
			    harness_same_as_file(out, "e", e_host, N_E * 2ull)));
}

static dcast_producer *open_model(const harness_broker *b, const char *model, int on_device)
{
	dcast_producer_opts o;
	dcast_producer *p = NULL;

	dcast_producer_opts_init(&o);
	o.range_elems = 1u << 18;
	o.baseline_on_device = on_device;
	REQUIRE(dcast_producer_open(b->producers, model, 0, 1, &o, &p) == 0);
	return p;
}

static void test_no_device(const harness_broker *b)
{
	uint64_t shape_h[1] = {N_H}, shape_d[1] = {N_D};
	dcast_producer_opts o;
	dcast_producer *p = NULL;

	dcast_producer_opts_init(&o);
	o.baseline_on_device = 1;
	CHECK_ERR(dcast_producer_open(b->producers, "nodev", 0, 1, &o, &p), DCAST_ENODEVICE);
	CHECK(strstr(dcast_last_error(), "baseline_on_device") != NULL);
	p = open_model(b, "nodev", 0);
	CHECK_ERR(dcast_producer_register(p, "d", DCAST_DTYPE_BF16, 1, shape_d, h, DCAST_MEM_CUDA,
					  0, N_D), DCAST_ENODEVICE);
	fprintf(stderr, "refused as: %s\n", dcast_last_error());
	CHECK(strstr(dcast_last_error(), "CUDA") && strstr(dcast_last_error(), "register d"));
	REQUIRE(dcast_producer_register(p, "h", DCAST_DTYPE_BF16, 1, shape_h, h, DCAST_MEM_HOST, 0,
					N_H) == 0);
	CHECK_ERR(harness_publish(p, 1), 0);
	harness_perturb(h, N_H, 50000, &seed);
	CHECK_ERR(harness_publish(p, 2), 0);
	CHECK(read_back(b, "nodev", 2));
	dcast_producer_close(&p);
}

#ifdef DCAST_HAVE_CUDA
/* Both device tensors' current values into their CUDA memory. */
static void upload(void *dev, void *dev_e)
{
	REQUIRE(cudaMemcpy(dev, d_host, N_D * 2ull, cudaMemcpyHostToDevice) == cudaSuccess);
	REQUIRE(cudaMemcpy(dev_e, e_host, N_E * 2ull, cudaMemcpyHostToDevice) == cudaSuccess);
}

/* Version 4: "d" registered again at new device memory holding the next
 * values (a trainer's new weights buffer): the delta is read from there. */
static void moved_delta(const harness_broker *b, const char *model, dcast_producer *p, void **dev)
{
	uint64_t shape_d[1] = {N_D};
	dcast_producer_stats s;
	void *moved = NULL;

	REQUIRE(cudaMalloc(&moved, N_D * 2ull) == cudaSuccess);
	harness_perturb(d_host, N_D, 10000, &seed);
	REQUIRE(cudaMemcpy(moved, d_host, N_D * 2ull, cudaMemcpyHostToDevice) == cudaSuccess);
	REQUIRE(cudaMemset(*dev, 0, N_D * 2ull) == cudaSuccess); /* the old buffer no longer counts */
	REQUIRE(dcast_producer_register(p, "d", DCAST_DTYPE_BF16, 1, shape_d, moved, DCAST_MEM_CUDA, 0,
					N_D) == 0);
	cudaFree(*dev);
	*dev = moved;
	CHECK_ERR(harness_publish(p, 4), 0);
	dcast_producer_stats_get(p, &s);
	CHECK(!s.anchor);
	CHECK(read_back(b, model, 4));
}

/* Anchor and deltas of two device tensors (their chunk ranges encoded in
 * one batch) beside a host one; then one of them moved. */
static void test_device(const harness_broker *b, const char *model, int on_device)
{
	uint64_t shape_h[1] = {N_H}, shape_d[1] = {N_D}, shape_e[1] = {N_E};
	dcast_producer_stats s;
	dcast_producer *p = open_model(b, model, on_device);
	void *dev = NULL, *dev_e = NULL;

	REQUIRE(cudaMalloc(&dev, N_D * 2ull) == cudaSuccess && cudaMalloc(&dev_e, N_E * 2ull) == cudaSuccess);
	harness_fill(d_host, N_D, &seed);
	harness_fill(e_host, N_E, &seed);
	upload(dev, dev_e);
	REQUIRE(dcast_producer_register(p, "h", DCAST_DTYPE_BF16, 1, shape_h, h, DCAST_MEM_HOST, 0,
					N_H) == 0);
	REQUIRE(dcast_producer_register(p, "d", DCAST_DTYPE_BF16, 1, shape_d, dev, DCAST_MEM_CUDA,
					0, N_D) == 0);
	REQUIRE(dcast_producer_register(p, "e", DCAST_DTYPE_BF16, 1, shape_e, dev_e, DCAST_MEM_CUDA,
					0, N_E) == 0);
	CHECK_ERR(harness_publish(p, 1), 0);
	CHECK(read_back(b, model, 1));
	harness_perturb(d_host, N_D, 10000, &seed);
	harness_perturb(e_host, N_E, 20000, &seed);
	harness_perturb(h, N_H, 10000, &seed);
	upload(dev, dev_e);
	CHECK_ERR(harness_publish(p, 2), 0);
	dcast_producer_stats_get(p, &s);
	CHECK(!s.anchor && s.payload_bytes < s.model_bytes / 4);
	CHECK(read_back(b, model, 2));
	harness_perturb(d_host + N_D / 2, N_D / 2, 5000, &seed); /* the first range unchanged */
	harness_perturb(e_host, N_E, 20000, &seed);
	upload(dev, dev_e);
	CHECK_ERR(harness_publish(p, 3), 0); /* digests moved from moved digests */
	dcast_producer_stats_get(p, &s);
	CHECK(!s.anchor);
	CHECK(read_back(b, model, 3));
	moved_delta(b, model, p, &dev);
	dcast_producer_close(&p);
	cudaFree(dev);
	cudaFree(dev_e);
}

#define N_K (8u << 20)        /* 16 MiB of bf16 in 512 KiB chunks, credit window 1 MiB */
#define IN_FLIGHT (16u << 10) /* bytes waiting for the stopped broker: chunks of the version */

static harness_broker kb;

/* Kill the broker once its socket holds chunks of the version (*arg: 1 when
 * seen within 10 s), and start it again on the same ports and data. */
static void *killer(void *arg)
{
	*(int *)arg = tp_wait_unread(kb.pport, IN_FLIGHT, 10000);
	tp_broker_kill(&kb, SIGKILL);
	tp_broker_start(&kb);
	return NULL;
}

static int kill_read_back(const char *kdir, uint64_t v, const uint16_t *w)
{
	char out[256];

	snprintf(out, sizeof(out), "%s/v%llu.safetensors", kdir, (unsigned long long)v);
	return !harness_read(&kb, "kill", v, out) && harness_same_as_file(out, "w", w, N_K * 2ull);
}

/* Version 2 (90% changed, more than the credit window) published with the
 * broker stopped, then killed mid-version and restarted. */
static void publish_through_kill(dcast_producer *p)
{
	dcast_producer_stats s;
	pthread_t th;
	int in_flight = 0;

	tp_broker_kill(&kb, SIGSTOP);
	pthread_create(&th, NULL, killer, &in_flight);
	CHECK_ERR(harness_publish(p, 2), 0);
	pthread_join(th, NULL);
	CHECK(in_flight);
	dcast_producer_stats_get(p, &s);
	CHECK(s.anchor && s.total_reconnects >= 1 && s.acked_version == 2);
}

static void test_device_kill(void)
{
	static char kdir[] = "/tmp/dcast-test-producer-gpu-kill-XXXXXX";
	char data[300];
	uint64_t shape[1] = {N_K};
	uint16_t *w = calloc(N_K, 2);
	dcast_producer_opts o;
	dcast_producer_stats s;
	dcast_producer *p = NULL;
	void *dev = NULL;

	REQUIRE(w && mkdtemp(kdir) && cudaMalloc(&dev, N_K * 2ull) == cudaSuccess);
	snprintf(data, sizeof(data), "%s/data", kdir);
	kb.extra[kb.n_extra++] = "--producer-window-bytes";
	kb.extra[kb.n_extra++] = "1048576";
	kb.extra[kb.n_extra++] = "--data-dir";
	kb.extra[kb.n_extra++] = data;
	REQUIRE(harness_broker_start(&kb, kdir) == 0);
	dcast_producer_opts_init(&o);
	o.connect_timeout_ms = 1000;
	o.max_reconnects = 5;
	o.range_elems = 1u << 18;
	o.baseline_on_device = 1;
	REQUIRE(dcast_producer_open(kb.producers, "kill", 0, 1, &o, &p) == 0);
	harness_fill(w, N_K, &seed);
	REQUIRE(cudaMemcpy(dev, w, N_K * 2ull, cudaMemcpyHostToDevice) == cudaSuccess);
	REQUIRE(dcast_producer_register(p, "w", DCAST_DTYPE_BF16, 1, shape, dev, DCAST_MEM_CUDA, 0, N_K) == 0);
	CHECK_ERR(harness_publish(p, 1), 0);
	harness_perturb(w, N_K, 900000, &seed);
	REQUIRE(cudaMemcpy(dev, w, N_K * 2ull, cudaMemcpyHostToDevice) == cudaSuccess);
	publish_through_kill(p);
	CHECK(kill_read_back(kdir, 2, w));
	harness_perturb(w, N_K, 10000, &seed);
	REQUIRE(cudaMemcpy(dev, w, N_K * 2ull, cudaMemcpyHostToDevice) == cudaSuccess);
	CHECK_ERR(harness_publish(p, 3), 0);
	dcast_producer_stats_get(p, &s);
	CHECK(!s.anchor);
	CHECK(kill_read_back(kdir, 3, w));
	dcast_producer_close(&p);
	tp_broker_kill(&kb, SIGTERM);
	cudaFree(dev);
	free(w);
}
#endif

int main(void)
{
	harness_broker b = {0};

	harness_init();
	REQUIRE(mkdtemp(dir) && (h = calloc(N_H, 2)));
	harness_fill(h, N_H, &seed);
	REQUIRE(harness_broker_start(&b, dir) == 0);
	int device = dcast_cuda_available();

	if (!device) {
		test_no_device(&b);
	} else {
#ifdef DCAST_HAVE_CUDA
		REQUIRE((d_host = calloc(N_D, 2)));
		test_device(&b, "dev_base", 1);
		test_device(&b, "host_base", 0);
		free(d_host);
		test_device_kill();
#endif
	}
	tp_broker_kill(&b, SIGTERM);
	free(h);
	return device ? check_done("test_producer_gpu") : check_skip("test_producer_gpu", "no CUDA device: the fallback checked (device tensors refused, naming them); the device path did not run");
}
