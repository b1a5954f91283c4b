/* The consumer with live tensors in CUDA memory (consumer/devmem.c).
 * Without a CUDA device (the development machines) it checks the fallback:
 * binding CUDA memory is refused with DCAST_ENODEVICE and a message naming
 * the tensor, and the consumer goes on with its own host tensors, bit-exact.
 * With a device (a GPU host, `make test-gpu`; the 2-core VM has none)
 * it binds cudaMalloc'd tensors, applies an anchor and deltas on the
 * device, forces a digest failure (the previous version comes back from
 * the local checkpoint, as device tensors keep no old values in memory)
 * and compares the device bytes with the producer's;
 * then binds a box of a tensor in device memory (a slice, as a worker
 * with another TP degree binds: runs copied, sparse changes applied by
 * the CUDA codec as idx32 payloads) through the same versions and the same
 * forced failure (the host copy rolls back, the slice is copied again).
 * Deltas checked ahead go as one batch (consumer/devbatch.c): a wrong
 * COMMIT digest is refused before READY with the device untouched, and
 * an apply cut off halfway is undone from the device undo buffer, with
 * 8-byte values too (tests/test_consumer_devbatch.c runs the same path
 * with the CPU twin everywhere).  dcast_consumer_apply_async scatters a
 * batch on a stream of the test's, held shut by a host function so that
 * the scatter is still pending when the call returns: its event is not
 * complete then, the next version's check ahead queues behind it (the
 * library's debug line says so) and is not refused, the device bytes are
 * the producer's after cudaEventSynchronize, and a close with a scatter
 * pending waits for it; an apply_async cut off halfway (aheadfail) is
 * undone bit for bit, the undo behind the scatter it undoes. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include "check.h"
#include "consumer_harness.h"
#include "deltacast/codec_cuda.h"
#include "deltacast/log.h"
#ifdef DCAST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define BUDGET (1u << 20)

static char root[] = "/tmp/dcast-consumer-gpu-XXXXXX";

static const char *dir_for(const char *name)
{
	static char path[256];
	snprintf(path, sizeof(path), "%s/%s", root, name);
	return path;
}

/* Open a consumer of `model` and poll until the manifest is known. */
static dcast_consumer *open_with_manifest(const h_broker *b, const char *model)
{
	dcast_consumer *c = NULL;
	dcast_event ev;

	if (dcast_consumer_open(b->consumers, model, dir_for(model), BUDGET, NULL, &c))
		return NULL;
	for (int i = 0; i < 300 && !dcast_consumer_tensor_count(c); i++)
		if (dcast_consumer_poll(c, 20, &ev))
			break;
	return c;
}

static void test_no_device(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_seen s = {0};

	REQUIRE(h_model_start(b, "m_nodev", 61, 1, 100, &m, &p) == 0);
	c = open_with_manifest(b, "m_nodev");
	REQUIRE(c && dcast_consumer_tensor_count(c) == H_TENSORS);
	CHECK_ERR(dcast_consumer_bind(c, m.name[0], m.cur[0], DCAST_MEM_CUDA, m.bytes[0]), DCAST_ENODEVICE);
	uint64_t off[2] = {0, 0}, ext[2] = {m.shape[0][0], m.shape[0][1]};
	CHECK_ERR(dcast_consumer_bind_slice(c, m.name[0], m.cur[0], DCAST_MEM_CUDA, 2, off, ext, m.bytes[0]),
		  DCAST_ENODEVICE);
	fprintf(stderr, "refused as: %s\n", dcast_last_error());
	CHECK(strstr(dcast_last_error(), "CUDA") && strstr(dcast_last_error(), m.name[0]));
	dcast_mem mem = DCAST_MEM_CUDA;
	CHECK(dcast_consumer_tensor(c, m.name[0], NULL, NULL, &mem) == 0 && mem == DCAST_MEM_HOST);
	CHECK(h_drive(c, &m, 1, &s) == 0 && h_equal(c, &m, 1));
	REQUIRE(h_publish(p, &m, 2, 100) == 0);
	CHECK(h_drive(c, &m, 2, &s) == 0 && h_equal(c, &m, 2));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

#ifdef DCAST_HAVE_CUDA
static int device_equal(void *const dev[H_TENSORS], const h_model *m, uint64_t v)
{
	int same = 1;

	for (int t = 0; t < H_TENSORS && same; t++) {
		unsigned char *host = malloc(m->bytes[t]);
		same = host && cudaMemcpy(host, dev[t], m->bytes[t], cudaMemcpyDeviceToHost) == cudaSuccess &&
		       !memcmp(host, m->snap[v][t], m->bytes[t]);
		free(host);
	}
	return same;
}

/* Device memory a consumer binds: how, and how it is compared with the
 * producer's version v. */
typedef struct dev_binding {
	void *dev[H_TENSORS];
	void (*bind)(struct dev_binding *d, dcast_consumer *c, const h_model *m);
	int (*equal)(const struct dev_binding *d, dcast_consumer *c, const h_model *m, uint64_t v);
} dev_binding;

/* Versions 1..4 into device memory bound by d; version 3's digest is made
 * wrong, so its apply fails and the previous version comes back (from the
 * checkpoint for device tensors, from the host copy for a slice), and the
 * broker sends it again. */
static void device_versions(const h_broker *b, const char *model, uint64_t seed, dev_binding *d)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_seen s = {0};

	REQUIRE(h_model_start(b, model, seed, 1, 100, &m, &p) == 0);
	setenv("DELTACAST_CONSUMER_FAULT", "digest:3", 1);
	c = open_with_manifest(b, model);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	REQUIRE(c);
	d->bind(d, c, &m);
	CHECK(h_drive(c, &m, 1, &s) == 0 && d->equal(d, c, &m, 1));
	for (uint64_t v = 2; v <= 4; v++) {
		REQUIRE(h_publish(p, &m, v, 100) == 0);
		CHECK(h_drive(c, &m, v, &s) == 0);
		CHECK(d->equal(d, c, &m, v));
	}
	CHECK(s.apply_failures >= 1); /* version 3's digest */
	dcast_consumer_close(&c);
	for (int t = 0; t < H_TENSORS; t++)
		cudaFree(d->dev[t]);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* Every tensor bound whole in device memory. */
static void bind_whole(dev_binding *d, dcast_consumer *c, const h_model *m)
{
	for (int t = 0; t < H_TENSORS; t++) {
		REQUIRE(cudaMalloc(&d->dev[t], m->bytes[t]) == cudaSuccess);
		CHECK(dcast_consumer_bind(c, m->name[t], d->dev[t], DCAST_MEM_CUDA, m->bytes[t]) == 0);
	}
}

static int whole_equal(const dev_binding *d, dcast_consumer *c, const h_model *m, uint64_t v)
{
	(void)c; /* h_equal: 0 on the device */
	return device_equal(d->dev, m, v);
}

/* Rows [10, 200) x columns [100, 612) of tensor 0 (bf16, 1024 wide). */
#define BOX_R0 10
#define BOX_R 190
#define BOX_C0 100
#define BOX_C 512

/* A box of tensor 0 bound in device memory, as a worker of another TP
 * degree binds its block (runs copied, sparse changes applied by the CUDA
 * codec as idx32 payloads). */
static void bind_box(dev_binding *d, dcast_consumer *c, const h_model *m)
{
	uint64_t off[2] = {BOX_R0, BOX_C0}, ext[2] = {BOX_R, BOX_C};

	REQUIRE(cudaMalloc(&d->dev[0], BOX_R * BOX_C * 2) == cudaSuccess);
	CHECK_ERR(dcast_consumer_bind_slice(c, m->name[0], d->dev[0], DCAST_MEM_CUDA, 2, off, ext,
					    BOX_R * BOX_C * 2), 0);
}

static int box_equal(const dev_binding *d, dcast_consumer *c, const h_model *m, uint64_t v)
{
	uint16_t *host = malloc(BOX_R * BOX_C * 2);
	const uint16_t *want = (const uint16_t *)m->snap[v][0];
	int same = host && cudaMemcpy(host, d->dev[0], BOX_R * BOX_C * 2, cudaMemcpyDeviceToHost) == cudaSuccess;

	for (uint64_t r = 0; same && r < BOX_R; r++)
		same = !memcmp(host + r * BOX_C, want + (BOX_R0 + r) * m->shape[0][1] + BOX_C0, BOX_C * 2);
	free(host);
	return same && h_equal(c, m, v); /* the host copy the box is fed from */
}

/* A stream and an event of the test's, for apply_async. */
typedef struct on_stream {
	cudaStream_t stream;
	cudaEvent_t event;
} on_stream;

/* apply, or with o apply_async on o's stream, its event waited for. */
static int apply_by(dcast_consumer *c, uint64_t version, const on_stream *o)
{
	int err;

	if (!o)
		return dcast_consumer_apply(c, version);
	err = dcast_consumer_apply_async(c, version, o->stream, o->event);
	return err || cudaEventSynchronize(o->event) == cudaSuccess ? err : DCAST_ECUDA;
}

/* Versions 1-2 on the device, then 3 and 4 published while 2 is live, so
 * that 3 is checked ahead as one batch (consumer/devbatch.c) with `fault`
 * armed for it; f64: tensor 1 holds 8-byte values.  predigest: 3 is
 * refused before READY and the device still holds 2 at the refusal;
 * aheadfail: 3's apply is cut off halfway and undone from the device undo
 * buffer (no checkpoint read), the device holding 2 bit for bit; with
 * `o`, applied by apply_async on its stream: the undo waits for the
 * scatter it undoes. */
static void device_ahead(const h_broker *b, const char *model, uint64_t seed, int f64, const char *fault,
			 const on_stream *o)
{
	dev_binding d = {.bind = bind_whole, .equal = whole_equal};
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_seen s = {0};
	dcast_event ev;
	h_model m;
	int refused = 0;

	h_model_init(&m, seed, 1);
	if (f64)
		m.dtype[1] = DCAST_DTYPE_F64, m.shape[1][1] /= 2;
	REQUIRE(h_producer_open(b, model, &m, &p) == 0);
	REQUIRE(h_publish(p, &m, 1, 100) == 0 && h_publish(p, &m, 2, 100) == 0);
	setenv("DELTACAST_CONSUMER_FAULT", fault, 1);
	c = open_with_manifest(b, model);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	REQUIRE(c);
	d.bind(&d, c, &m);
	CHECK(h_drive(c, &m, 2, &s) == 0 && device_equal(d.dev, &m, 2));
	REQUIRE(h_publish(p, &m, 3, 100) == 0 && h_publish(p, &m, 4, 100) == 0);
	for (int i = 0; i < 400 && dcast_consumer_version(c) < 4 && !dcast_consumer_poll(c, 100, &ev); i++) {
		if (ev.type == DCAST_EV_ERROR && ev.code == DCAST_EDIGEST && dcast_consumer_version(c) == 2) {
			refused++;
			CHECK(device_equal(d.dev, &m, 2));
		}
		if (ev.type != DCAST_EV_VERSION_READY || dcast_consumer_ready_version(c) == DCAST_VERSION_NONE)
			continue;
		if (apply_by(c, dcast_consumer_ready_version(c), o)) {
			s.apply_failures++;
			CHECK(device_equal(d.dev, &m, dcast_consumer_version(c)));
		}
	}
	CHECK(dcast_consumer_version(c) == 4 && device_equal(d.dev, &m, 4));
	CHECK(strstr(fault, "predigest") ? refused >= 1 && !s.apply_failures : s.apply_failures >= 1);
	dcast_consumer_close(&c);
	for (int t = 0; t < H_TENSORS; t++)
		cudaFree(d.dev[t]);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* ---- apply_async ---- */

/* Lines of the library counted as they come (its debug lines about a
 * pending scatter), waited on by the test. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int queued, waiting; /* "queued behind a pending scatter", "waiting for a pending" */
} lines = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};

static void count_line(int level, const char *msg, void *arg)
{
	(void)arg;
	pthread_mutex_lock(&lines.mu);
	lines.queued += strstr(msg, "queued behind a pending scatter") != NULL;
	lines.waiting += strstr(msg, "waiting for a pending device scatter") != NULL;
	pthread_cond_broadcast(&lines.cv);
	pthread_mutex_unlock(&lines.mu);
	if (level <= DCAST_LOG_INFO)
		fprintf(stderr, "%s\n", msg);
}

static struct timespec in_seconds(int s)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += s;
	return ts;
}

/* Wait (10 s at most) until *count > above; 1 when it is. */
static int line_seen(const int *count, int above)
{
	struct timespec ts = in_seconds(10);
	int rc = 0;

	pthread_mutex_lock(&lines.mu);
	while (*count <= above && rc == 0)
		rc = pthread_cond_timedwait(&lines.cv, &lines.mu, &ts);
	rc = *count > above;
	pthread_mutex_unlock(&lines.mu);
	return rc;
}

static int line_count(const int *count)
{
	int n;

	pthread_mutex_lock(&lines.mu);
	n = *count;
	pthread_mutex_unlock(&lines.mu);
	return n;
}

/* A host function on a stream that holds it shut until the gate opens
 * (30 s at most, so that a failed test ends). */
typedef struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int open;
} gate;

static void gate_hold(void *arg)
{
	gate *g = arg;
	struct timespec ts = in_seconds(30);

	pthread_mutex_lock(&g->mu);
	while (!g->open && pthread_cond_timedwait(&g->cv, &g->mu, &ts) == 0)
		;
	pthread_mutex_unlock(&g->mu);
}

static void gate_shut(gate *g, cudaStream_t stream)
{
	pthread_mutex_lock(&g->mu);
	g->open = 0;
	pthread_mutex_unlock(&g->mu);
	REQUIRE(cudaLaunchHostFunc(stream, gate_hold, g) == cudaSuccess);
}

static void gate_open(gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->open = 1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* Opens the gate once the library says it waits for a pending scatter. */
typedef struct opener {
	gate *g;
	int waiting_before, saw;
} opener;

static void *open_on_wait(void *arg)
{
	opener *o = arg;

	o->saw = line_seen(&lines.waiting, o->waiting_before);
	gate_open(o->g);
	return NULL;
}


/* Poll until the READY chain holds `n` versions (10 s at most). */
static int ready_count(dcast_consumer *c, uint32_t n)
{
	dcast_event ev;

	for (int i = 0; i < 100 && dcast_consumer_ready_versions(c, NULL, 0) < n; i++)
		if (dcast_consumer_poll(c, 100, &ev))
			return 0;
	return dcast_consumer_ready_versions(c, NULL, 0) >= n;
}

/* Version `v` (READY, checked ahead) by apply_async behind the shut gate:
 * it counts as applied at once while its scatter waits. */
static void apply_pending(dcast_consumer *c, gate *g, on_stream *o, uint64_t v)
{
	gate_shut(g, o->stream);
	CHECK_ERR(dcast_consumer_apply_async(c, v, o->stream, o->event), 0);
	CHECK(dcast_consumer_version(c) == v);
	CHECK(cudaEventQuery(o->event) == cudaErrorNotReady); /* the call did not wait */
	(void)cudaGetLastError(); /* not an error: nothing left for the next launch to find */
}

/* Versions 1-3 applied (3 as a batch, so its kernels are loaded before
 * any stream is held); 4 and 5 READY, 4 checked ahead; 4 applied by
 * apply_async with its scatter held: 5's check ahead queues behind it on
 * the device; the gate opens, 4 then 5 are exact on the device and
 * nothing was refused.  Then 6 applied the same way and the consumer
 * closed while its scatter waits: the close waits for it. */
static void device_async(const h_broker *b, const char *model, uint64_t seed)
{
	dev_binding d = {.bind = bind_whole, .equal = whole_equal};
	gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1};
	dcast_producer *p = NULL;
	dcast_consumer *c;
	on_stream o;
	h_seen s = {0};
	h_model m;
	int queued, level = dcast_log_get_level();

	dcast_log_set_handler(count_line, NULL);
	dcast_log_set_level(DCAST_LOG_DEBUG);
	REQUIRE(cudaStreamCreateWithFlags(&o.stream, cudaStreamNonBlocking) == cudaSuccess);
	REQUIRE(cudaEventCreateWithFlags(&o.event, cudaEventDisableTiming) == cudaSuccess);
	REQUIRE(h_model_start(b, model, seed, 2, 100, &m, &p) == 0);
	c = open_with_manifest(b, model);
	REQUIRE(c);
	d.bind(&d, c, &m);
	CHECK(h_drive(c, &m, 2, &s) == 0 && device_equal(d.dev, &m, 2));
	REQUIRE(h_publish(p, &m, 3, 100) == 0);
	CHECK(h_drive(c, &m, 3, &s) == 0 && device_equal(d.dev, &m, 3));
	REQUIRE(h_publish(p, &m, 4, 100) == 0 && h_publish(p, &m, 5, 100) == 0);
	REQUIRE(ready_count(c, 2));
	queued = line_count(&lines.queued);
	apply_pending(c, &g, &o, 4);
	CHECK(line_seen(&lines.queued, queued)); /* 5's check ahead, behind the scatter */
	gate_open(&g);
	CHECK(cudaEventSynchronize(o.event) == cudaSuccess && device_equal(d.dev, &m, 4));
	/* the check ahead holds the consumer's lock: 5 is applied once it is done */
	CHECK_ERR(dcast_consumer_apply_async(c, 5, o.stream, o.event), 0);
	CHECK(cudaEventSynchronize(o.event) == cudaSuccess && device_equal(d.dev, &m, 5));
	h_drain(c, &s);
	CHECK(s.errors == 0 && s.apply_failures == 0); /* 5 was checked against 4's values */

	REQUIRE(h_publish(p, &m, 6, 100) == 0);
	REQUIRE(ready_count(c, 1));
	pthread_t t;
	opener op = {&g, line_count(&lines.waiting), 0};
	apply_pending(c, &g, &o, 6);
	REQUIRE(pthread_create(&t, NULL, open_on_wait, &op) == 0);
	dcast_consumer_close(&c); /* with the scatter pending */
	pthread_join(t, NULL);
	CHECK(op.saw);
	CHECK(cudaEventSynchronize(o.event) == cudaSuccess && device_equal(d.dev, &m, 6));

	dcast_log_set_handler(NULL, NULL);
	dcast_log_set_level(level);
	CHECK(cudaEventDestroy(o.event) == cudaSuccess && cudaStreamDestroy(o.stream) == cudaSuccess);
	for (int i = 0; i < H_TENSORS; i++)
		CHECK(cudaFree(d.dev[i]) == cudaSuccess);
	dcast_producer_close(&p);
	h_model_free(&m);
}
#endif

int main(void)
{
	h_broker b;

	/* kernels loaded at start: loading one lazily may wait for every
	 * stream, the one device_async holds shut too */
	setenv("CUDA_MODULE_LOADING", "EAGER", 0);
	REQUIRE(mkdtemp(root));
	REQUIRE(h_broker_start_args(&b, NULL) == 0);
	int device = dcast_cuda_available();

	if (!device) {
		test_no_device(&b);
	} else {
#ifdef DCAST_HAVE_CUDA
		dev_binding whole = {.bind = bind_whole, .equal = whole_equal};
		dev_binding box = {.bind = bind_box, .equal = box_equal};
		device_versions(&b, "m_dev", 67, &whole);
		device_versions(&b, "m_devslice", 71, &box);
		on_stream o;
		REQUIRE(cudaStreamCreateWithFlags(&o.stream, cudaStreamNonBlocking) == cudaSuccess);
		REQUIRE(cudaEventCreateWithFlags(&o.event, cudaEventDisableTiming) == cudaSuccess);
		device_ahead(&b, "m_devahead", 73, 0, "predigest:3", NULL);
		device_ahead(&b, "m_devcut", 79, 1, "aheadfail:3", NULL);
		device_ahead(&b, "m_devcutasync", 89, 1, "aheadfail:3", &o);
		CHECK(cudaEventDestroy(o.event) == cudaSuccess && cudaStreamDestroy(o.stream) == cudaSuccess);
		device_async(&b, "m_devasync", 83);
#endif
	}
	h_broker_stop(&b);
	check_remove_dir(root);
	return device ? check_done("test_consumer_gpu") : check_skip("test_consumer_gpu", "no CUDA device: the fallback checked (device bindings refused, naming them); the device path did not run");
}
