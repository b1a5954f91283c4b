/* The broker dies mid-publish.  (1) It stays down: publish returns a clear
 * error naming the broker, nothing is acknowledged, and once the broker is
 * back the same version publishes and reads back bit-exact.  (2) It comes
 * back while the producer is re-joining: publish re-sends the version from
 * its first chunk and succeeds.  The broker is stopped (SIGSTOP) before the
 * publish with a small credit window, and killed once its socket holds
 * chunks of the version (/proc/net/tcp): the kill always lands mid-version. */
#include <pthread.h>
#include <stdint.h>
#include "check.h"
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"
#include "producer_harness.h"

#define N (8u << 20) /* 16 MiB of bf16 in 512 KiB chunks, credit window 1 MiB: even
			    * the compact encoding of version 2 (~2.5 MB) outgrows it */
#define IN_FLIGHT (16u << 10) /* bytes waiting for the stopped broker: more than any
			       * control message, so chunks of the version */

static harness_broker b;
static int restart_after_kill;
static uint16_t *w;
static char dir[] = "/tmp/dcast-test-producer-kill-XXXXXX";

/* Kill the broker once its socket holds chunks of the version (*arg: 1 when
 * seen within 10 s); restart it when asked. */
static void *killer(void *arg)
{
	*(int *)arg = tp_wait_unread(b.pport, IN_FLIGHT, 10000);
	tp_broker_kill(&b, SIGKILL);
	if (restart_after_kill)
		tp_broker_start(&b);
	return NULL;
}

static int read_back(uint64_t v)
{
	char out[256];

	snprintf(out, sizeof(out), "%s/v%llu.safetensors", dir, (unsigned long long)v);
	return !harness_read(&b, "kill", v, out) && harness_same_as_file(out, "w", w, N * 2ull);
}

static int publish_with_kill(dcast_producer *p, uint64_t v, int restart)
{
	pthread_t th;
	int rc, in_flight = 0;

	restart_after_kill = restart;
	tp_broker_kill(&b, SIGSTOP);
	pthread_create(&th, NULL, killer, &in_flight);
	rc = dcast_producer_publish(p, v);
	if (!rc)
		rc = dcast_producer_wait(p, v, 20000);
	pthread_join(th, NULL);
	CHECK(in_flight);
	return rc;
}

int main(void)
{
	dcast_producer_opts o;
	dcast_producer *p = NULL;
	dcast_producer_stats s;
	uint64_t seed = 99;
	int rc;

	harness_init();
	REQUIRE(mkdtemp(dir) && (w = calloc(N, 2)));
	b.extra[b.n_extra++] = "--producer-window-bytes";
	b.extra[b.n_extra++] = "1048576";
	REQUIRE(harness_broker_start(&b, dir) == 0);
	dcast_producer_opts_init(&o);
	o.connect_timeout_ms = 1000;
	o.max_reconnects = 3;
	o.range_elems = 1u << 18;
	harness_fill(w, N, &seed);
	p = harness_open_w(b.producers, "kill", &o, w, N);

	/* (1) killed and not back */
	rc = publish_with_kill(p, 1, 0);
	CHECK_ERR(rc, DCAST_ECLOSED);
	CHECK(strstr(dcast_last_error(), b.producers) != NULL);
	fprintf(stderr, "error as reported: %s\n", dcast_last_error());
	dcast_producer_stats_get(p, &s);
	CHECK(s.acked_version == DCAST_VERSION_NONE);
	CHECK_ERR(dcast_producer_wait(p, 1, 0), DCAST_ECLOSED);
	REQUIRE(tp_broker_start(&b) == 0);
	CHECK_ERR(dcast_producer_publish(p, 1), 0);
	CHECK_ERR(dcast_producer_wait(p, 1, 20000), 0);
	CHECK(read_back(1));

	/* (2) killed mid-version (90% changed: more than the credit window) and
	 * back while re-joining */
	harness_perturb(w, N, 900000, &seed);
	rc = publish_with_kill(p, 2, 1);
	CHECK_ERR(rc, 0);
	dcast_producer_stats_get(p, &s);
	CHECK(s.total_reconnects >= 2 && s.acked_version == 2);
	CHECK(s.anchor); /* the restarted broker lost its state and asked for an anchor */
	CHECK(read_back(2));

	/* and a plain delta after all that */
	harness_perturb(w, N, 10000, &seed);
	CHECK_ERR(dcast_producer_publish(p, 3), 0);
	CHECK_ERR(dcast_producer_wait(p, 3, 20000), 0);
	dcast_producer_stats_get(p, &s);
	CHECK(!s.anchor);
	CHECK(read_back(3));
	dcast_producer_close(&p);
	tp_broker_kill(&b, SIGTERM);
	free(w);
	return check_done("test_producer_kill");
}
