/* A producer silent past the broker's patience (3 heartbeats, as a
 * trainer busy between publish() and wait() is) is dropped by the broker.
 * Its next heartbeat is answered ERROR DCAST_ESTATE ("HEARTBEAT before
 * HELLO"): the producer takes that as a lost session and joins again; the
 * next publish() succeeds and a consumer gets every version bit-exact.
 * Before, the refusal was kept and failed whatever version came next. */
#include "check.h"
#include "consumer_harness.h"

static char root[64] = "/tmp/dcast-psilence.XXXXXX";

int main(void)
{
	char dir[128];
	char *extra[] = {"--heartbeat-ms", "100", NULL};
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;
	dcast_producer *p = NULL;
	h_broker b;
	h_model m;
	h_seen seen = {0};

	REQUIRE(mkdtemp(root));
	REQUIRE(h_broker_start_args(&b, extra) == 0);
	h_model_init(&m, 81, 1);
	REQUIRE(h_producer_open(&b, "silent", &m, &p) == 0);
	h_model_snap(&m, 1);
	CHECK_ERR(dcast_producer_publish(p, 1), 0);
	/* The trainer computes and calls nothing: the broker drops it. */
	CHECK(tp_wait_log(b.log, "silent for 3 heartbeats", 1, 20000));
	CHECK_ERR(dcast_producer_wait(p, 1, 20000), 0);
	/* wait() sent a heartbeat the broker no longer takes. */
	CHECK(tp_wait_log(b.log, "HEARTBEAT before HELLO", 1, 20000));
	CHECK_ERR(h_publish(p, &m, 2, 100), 0);
	CHECK_ERR(h_publish(p, &m, 3, 100), 0);
	snprintf(dir, sizeof(dir), "%s/c", root);
	dcast_consumer_opts_init(&o);
	REQUIRE(dcast_consumer_open(b.consumers, "silent", dir, 8u << 20, &o, &c) == 0);
	CHECK(h_drive(c, &m, 3, &seen) == 0);
	CHECK(h_equal(c, &m, 3));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
	h_broker_stop(&b);
	return check_done("test_producer_silence");
}
