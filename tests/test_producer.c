/* Producer library against the real broker binary: argument and state
 * errors, a broker that is not there, then an anchor followed by deltas that
 * the test reader (tests/tools/producer_reader) receives bit-exact. */

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "check.h"
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"
#include "producer_harness.h"
#include "producer_shared.h" /* the encoders' slot pool: test_pool_dry */

#define N_A (3u << 20) /* 3 chunks of 1M elements */
#define N_B 1000u

static char dir[256];
static uint16_t *ta, *tb;

static void test_no_broker(void)
{
	dcast_producer_opts o;
	dcast_producer *p = (void *)1;

	dcast_producer_opts_init(&o);
	o.connect_timeout_ms = 300;
	/* port 1 on loopback: nothing listens there */
	CHECK_ERR(dcast_producer_open("tcp://127.0.0.1:1", "m", 0, 1, &o, &p), DCAST_ECLOSED);
	CHECK(p == NULL);
	CHECK(strstr(dcast_last_error(), "tcp://127.0.0.1:1") != NULL);
	CHECK_ERR(dcast_producer_open("tcp://127.0.0.1:1", "m", 2, 2, NULL, &p), DCAST_EINVAL);
	CHECK_ERR(dcast_producer_open("tcp://127.0.0.1:1", "", 0, 1, NULL, &p), DCAST_EINVAL);
	o.curve_server_key = "0123456789012345678901234567890123456789";
	CHECK_ERR(dcast_producer_open("tcp://127.0.0.1:1", "m", 0, 1, &o, &p), DCAST_EINVAL);
	CHECK(strstr(dcast_last_error(), "CURVE") != NULL);
	dcast_producer_opts_init(&o);
	o.range_elems = 0;
	CHECK_ERR(dcast_producer_open("tcp://127.0.0.1:1", "m", 0, 1, &o, &p), DCAST_EINVAL);
	dcast_producer_opts_init(&o);
	o.encode_threads = 65;
	CHECK_ERR(dcast_producer_open("tcp://127.0.0.1:1", "m", 0, 1, &o, &p), DCAST_EINVAL);
	CHECK(strstr(dcast_last_error(), "encode_threads") != NULL);
}

static void test_register_errors(dcast_producer *p)
{
	uint64_t shape[2] = {N_B / 10, 10}, bad[2] = {N_B, 10};

	CHECK_ERR(dcast_producer_register(p, "x", 99, 2, shape, tb, DCAST_MEM_HOST, 0, N_B),
		  DCAST_EDTYPE);
	CHECK_ERR(dcast_producer_register(p, "x", DCAST_DTYPE_BF16, 9, shape, tb, DCAST_MEM_HOST,
					  0, N_B), DCAST_ESHAPE);
	CHECK_ERR(dcast_producer_register(p, "x", DCAST_DTYPE_BF16, 2, shape, tb, DCAST_MEM_HOST,
					  1, N_B), DCAST_EINVAL);
	CHECK_ERR(dcast_producer_register(p, "x", DCAST_DTYPE_BF16, 2, shape, NULL, DCAST_MEM_HOST,
					  0, N_B), DCAST_EINVAL);
	CHECK_ERR(dcast_producer_register(p, "x", DCAST_DTYPE_BF16, 2, shape, tb, DCAST_MEM_CUDA, 0,
					  N_B), DCAST_ENODEVICE);
	CHECK(strstr(dcast_last_error(), "CUDA") != NULL);
	CHECK_ERR(dcast_producer_publish(p, 1), DCAST_ESTATE);
	CHECK_ERR(dcast_producer_register(p, "b", DCAST_DTYPE_BF16, 2, shape, tb, DCAST_MEM_HOST, 0,
					  N_B), 0);
	CHECK_ERR(dcast_producer_register(p, "b", DCAST_DTYPE_BF16, 2, bad, tb, DCAST_MEM_HOST, 0,
					  N_B * 10), DCAST_ESHAPE);
	CHECK_ERR(dcast_producer_register(p, "b", DCAST_DTYPE_F16, 2, shape, tb, DCAST_MEM_HOST, 0,
					  N_B), DCAST_ESHAPE);
}

static void publish_and_read(dcast_producer *p, harness_broker *b, uint64_t v, int anchor)
{
	dcast_producer_stats s;
	char out[512];

	CHECK_ERR(dcast_producer_publish(p, v), 0);
	CHECK_ERR(dcast_producer_wait(p, v, 20000), 0);
	dcast_producer_stats_get(p, &s);
	CHECK(s.version == v && s.anchor == anchor && s.acked_version == v);
	if (!anchor)
		CHECK(s.payload_bytes < s.model_bytes / 10); /* sparse: 0.1% changed */
	snprintf(out, sizeof(out), "%s/read-%llu.safetensors", dir, (unsigned long long)v);
	CHECK(harness_read(b, "unit", v, out) == 0);
	CHECK(harness_same_as_file(out, "a", ta, N_A * 2));
	CHECK(harness_same_as_file(out, "b", tb, N_B * 2));
}

/* encoders: opts.encode_threads (0 the default, 1 the caller alone) */
static void test_versions(harness_broker *b, uint32_t encoders)
{
	dcast_producer *p = NULL;
	uint64_t seed = 42, shape_a[1] = {N_A};
	dcast_producer_stats s;
	dcast_producer_opts o;

	dcast_producer_opts_init(&o);
	o.encode_threads = encoders;
	REQUIRE(dcast_producer_open(b->producers, "unit", 0, 1, &o, &p) == 0);
	test_register_errors(p);
	harness_fill(ta, N_A, &seed);
	harness_fill(tb, N_B, &seed);
	REQUIRE(dcast_producer_register(p, "a", DCAST_DTYPE_BF16, 1, shape_a, ta, DCAST_MEM_HOST, 0,
					N_A) == 0);
	publish_and_read(p, b, 1, 1);
	CHECK_ERR(dcast_producer_register(p, "late", DCAST_DTYPE_BF16, 1, shape_a, ta,
					  DCAST_MEM_HOST, 0, N_A), DCAST_ESTATE);
	harness_perturb(ta, N_A, 1000, &seed);
	publish_and_read(p, b, 2, 0);
	CHECK_ERR(dcast_producer_publish(p, 2), DCAST_EVERSION);
	CHECK(strstr(dcast_last_error(), "not above") != NULL);
	CHECK_ERR(dcast_producer_wait(p, 77, 0), DCAST_ENOTFOUND);
	/* nothing changed: a delta of no chunk at all, only the COMMIT */
	publish_and_read(p, b, 5, 0);
	dcast_producer_stats_get(p, &s);
	CHECK(s.chunks_sent == 0 && s.changed_elems == 0 && s.payload_bytes == 0);
	/* a change confined to tensor b and one chunk of a */
	harness_perturb(tb, N_B, 20000, &seed);
	ta[(2u << 20) + 5] ^= 0x10;
	publish_and_read(p, b, 6, 0);
	dcast_producer_stats_get(p, &s);
	CHECK(s.chunks_sent == 2);
	dcast_producer_close(&p);
	CHECK(p == NULL);
	dcast_producer_close(&p); /* no-op */
}

/* Hands a slot back to the pool, as ZeroMQ's thread does once a payload is
 * on the wire, once the test thread sleeps in its wait for one (its state
 * in /proc is S: blocked on a futex; at most 10 s of looking). */
typedef struct give_back_arg {
	prod_slot *slot;
	pid_t tid; /* the thread that waits */
} give_back_arg;

static int thread_sleeps(pid_t tid)
{
	char path[64], buf[256], *close_paren;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	if (!(f = fopen(path, "r")))
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	close_paren = strrchr(buf, ')'); /* "tid (comm) S ..." */
	return close_paren && close_paren[1] == ' ' && close_paren[2] == 'S';
}

static void *give_back(void *arg)
{
	give_back_arg *a = arg;

	for (uint64_t t0 = dcast_now_ms(); !thread_sleeps(a->tid) && dcast_now_ms() - t0 < 10000;)
		sched_yield();
	prod_pool_free_cb(a->slot->buf, a->slot);
	return NULL;
}

/* encode_threads 1: the publishing thread is the only encoder.  With every
 * slot in ZeroMQ's hands it must wait for one to come back and encode the
 * range itself; it used to wait on the encoders' condition, which nobody
 * else signals, for its whole timeout each time the pool ran dry (2.7-8 s
 * per delta of a model of 4721 small chunks, docs/benchmarks.md). */
static void test_pool_dry(harness_broker *b)
{
	static prod_slot *held[4096];
	dcast_producer *p = NULL;
	uint64_t seed = 7, shape_a[1] = {N_A};
	dcast_producer_opts o;
	prod_job *job = NULL;
	uint32_t n = 0;
	pthread_t th;

	dcast_producer_opts_init(&o);
	o.encode_threads = 1;
	REQUIRE(dcast_producer_open(b->producers, "dry", 0, 1, &o, &p) == 0);
	harness_fill(ta, N_A, &seed);
	REQUIRE(dcast_producer_register(p, "a", DCAST_DTYPE_BF16, 1, shape_a, ta, DCAST_MEM_HOST, 0,
					N_A) == 0);
	REQUIRE(dcast_producer_publish(p, 1) == 0 && dcast_producer_wait(p, 1, 30000) == 0);
	harness_perturb(ta, N_A, 1000, &seed);
	while (n < 4096 && prod_pool_get(&p->pool, 0, &held[n]) == 0)
		n++;
	REQUIRE(n >= 1 && n < 4096);
	prod_enc_start(p, 0, 0);
	give_back_arg a = {held[--n], (pid_t)syscall(SYS_gettid)};
	REQUIRE(pthread_create(&th, NULL, give_back, &a) == 0);
	CHECK_ERR(prod_enc_wait(p, 0, 20000, &job), 0); /* not DCAST_ETIMEDOUT */
	CHECK(job && job->done && job->rc == 0);
	pthread_join(th, NULL);
	prod_enc_stop(p);
	if (job && job->slot)
		prod_pool_free_cb(job->slot->buf, job->slot);
	while (n--)
		prod_pool_free_cb(held[n]->buf, held[n]);
	dcast_producer_close(&p);
}

int main(void)
{
	harness_broker b = {0};

	harness_init();
	snprintf(dir, sizeof(dir), "/tmp/dcast-test-producer-XXXXXX");
	REQUIRE(mkdtemp(dir));
	ta = calloc(N_A, 2);
	tb = calloc(N_B, 2);
	test_no_broker();
	REQUIRE(harness_broker_start(&b, dir) == 0);
	test_versions(&b, 0);
	test_pool_dry(&b);
	for (uint32_t n = 1; n <= 3; n += 2) { /* a fresh broker each time */
		tp_broker_kill(&b, SIGTERM);
		REQUIRE(tp_broker_start(&b) == 0);
		test_versions(&b, n);
	}
	tp_broker_kill(&b, SIGTERM);
	free(ta);
	free(tb);
	return check_done("test_producer");
}
