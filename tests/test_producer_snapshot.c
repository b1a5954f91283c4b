/* An anchor of host tensors: publish() returns once the tensors are copied
 * into the producer's baseline, and the sender thread sends the version
 * from there.  The broker is stopped (SIGSTOP) before each publish and
 * grants a 1 MiB window against a 32 MiB model, so the publish must return
 * while the broker has taken nothing.
 *  (1) prepare() fixes the tensor table (a late register is refused) and
 *      sets up the baseline; publish returns with the version active and
 *      0 bytes taken; the
 *      trainer overwrites its tensor at once; the broker resumes; flush()
 *      is 0 and a consumer reads the published values, bit-exact.
 *  (2) a new producer's anchor: publish returns, then the broker dies and
 *      stays down; flush() reports the lost connection, naming the broker,
 *      and so do wait(), the progress (err) and the stats (failed_*).
 *  (3) the broker back (empty): the next publish goes as an anchor, and
 *      close() right after it flushes: a consumer reads it bit-exact. */
#include <stdint.h>
#include "check.h"
#include "deltacast/producer.h"
#include "producer_harness.h"

#define N (16u << 20) /* 32 MiB of bf16 in 512 KiB chunks; the window holds two */

static harness_broker b;
static uint16_t *w, *want;
static char dir[] = "/tmp/dcast-test-producer-snapshot-XXXXXX";
static const uint64_t shape[1] = {N};

static int read_back(uint64_t v)
{
	char out[256];

	snprintf(out, sizeof(out), "%s/v%llu.safetensors", dir, (unsigned long long)v);
	return !harness_read(&b, "snap", v, out) && harness_same_as_file(out, "w", want, N * 2ull);
}

static dcast_producer *open_producer(void)
{
	dcast_producer_opts o;

	dcast_producer_opts_init(&o);
	o.connect_timeout_ms = 1000;
	o.ack_timeout_ms = 10000;
	o.max_reconnects = 1;
	o.range_elems = 1u << 18;
	return harness_open_w(b.producers, "snap", &o, w, N);
}

/* publish(v) of an anchor into a stopped broker: it returns 0 with the
 * version still on its way; then the trainer's next step overwrites w. */
static void publish_stopped(dcast_producer *p, uint64_t v, uint64_t *seed)
{
	dcast_producer_progress pr;
	dcast_producer_stats s;

	memcpy(want, w, N * 2ull);
	tp_broker_kill(&b, SIGSTOP);
	CHECK_ERR(dcast_producer_publish(p, v), 0);
	dcast_producer_progress_get(p, &pr);
	CHECK(pr.active && pr.anchor && pr.version == v && pr.bytes_total == N * 2ull);
	CHECK(pr.bytes_taken == 0 && pr.bytes_sent < pr.bytes_total);
	dcast_producer_stats_get(p, &s);
	CHECK(s.version == v && s.anchor && s.payload_bytes == 0);
	harness_fill(w, N, seed);
}

static void check_failed(dcast_producer *p, uint64_t v)
{
	dcast_producer_progress pr;
	dcast_producer_stats s;

	CHECK_ERR(dcast_producer_flush(p, 20000), DCAST_ECLOSED);
	CHECK(strstr(dcast_last_error(), b.producers) != NULL);
	fprintf(stderr, "flush reported: %s\n", dcast_last_error());
	CHECK_ERR(dcast_producer_wait(p, v, 0), DCAST_ECLOSED);
	dcast_producer_progress_get(p, &pr);
	CHECK(!pr.active && pr.version == v && pr.err == DCAST_ECLOSED);
	dcast_producer_stats_get(p, &s);
	CHECK(s.failed_version == v && s.failed_err == DCAST_ECLOSED);
	CHECK(s.acked_version == DCAST_VERSION_NONE);
}

int main(void)
{
	dcast_producer *p, *q;
	dcast_producer_progress pr;
	dcast_producer_stats s;
	uint64_t seed = 7;

	harness_init();
	REQUIRE(mkdtemp(dir) && (w = calloc(N, 2)) && (want = calloc(N, 2)));
	b.extra[b.n_extra++] = "--producer-window-bytes";
	b.extra[b.n_extra++] = "1048576";
	REQUIRE(harness_broker_start(&b, dir) == 0);
	harness_fill(w, N, &seed);
	CHECK_ERR(dcast_producer_flush(NULL, 0), DCAST_EINVAL);

	/* (1), its baseline set up by prepare() first */
	p = open_producer();
	CHECK_ERR(dcast_producer_flush(p, 0), 0); /* nothing published yet */
	CHECK_ERR(dcast_producer_prepare(NULL), DCAST_EINVAL);
	CHECK_ERR(dcast_producer_prepare(p), 0);
	CHECK_ERR(dcast_producer_prepare(p), 0); /* a second call does nothing */
	CHECK_ERR(dcast_producer_register(p, "late", DCAST_DTYPE_BF16, 1, shape, want, DCAST_MEM_HOST, 0, N),
		  DCAST_ESTATE); /* the table is fixed */
	publish_stopped(p, 1, &seed);
	CHECK_ERR(dcast_producer_flush(p, 0), DCAST_ETIMEDOUT); /* still being sent */
	tp_broker_kill(&b, SIGCONT);
	CHECK_ERR(dcast_producer_flush(p, 20000), 0);
	dcast_producer_progress_get(p, &pr);
	CHECK(!pr.active && pr.err == 0 && pr.bytes_taken == N * 2ull);
	dcast_producer_stats_get(p, &s);
	CHECK(s.acked_version == 1 && s.payload_bytes == N * 2ull);
	CHECK(s.failed_version == DCAST_VERSION_NONE && s.failed_err == 0);
	CHECK(read_back(1));
	dcast_producer_close(&p);

	/* (2) */
	q = open_producer();
	publish_stopped(q, 2, &seed);
	tp_broker_kill(&b, SIGKILL);
	check_failed(q, 2);

	/* (3) */
	REQUIRE(tp_broker_start(&b) == 0);
	memcpy(want, w, N * 2ull);
	CHECK_ERR(dcast_producer_publish(q, 3), 0);
	harness_fill(w, N, &seed);
	dcast_producer_close(&q);
	CHECK(read_back(3));
	tp_broker_kill(&b, SIGTERM);
	free(w);
	free(want);
	return check_done("test_producer_snapshot");
}
