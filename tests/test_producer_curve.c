/* The producer against a CURVE broker (--curve-secret, --producer-keys): a
 * listed key publishes an anchor and a delta, each acknowledged; an
 * unlisted key, the wrong server key and a producer without CURVE are each
 * refused at open with a clear error (DCAST_EAUTH naming the handshake), and
 * the broker never admits them. */
#include <stdint.h>
#include <zmq.h>
#include "check.h"
#include "deltacast/producer.h"
#include "producer_harness.h"

#define N (1u << 20)

typedef struct keypair {
	char pub[41], sec[41];
} keypair;

static char dir[] = "/tmp/dcast-test-producer-curve-XXXXXX";

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	REQUIRE(f && fputs(text, f) >= 0 && fputc('\n', f) != EOF && fclose(f) == 0);
}

static int open_as(const harness_broker *b, const char *server_pub, const keypair *me,
		   dcast_producer **p)
{
	dcast_producer_opts o;

	dcast_producer_opts_init(&o);
	o.connect_timeout_ms = 2000;
	if (me) {
		o.curve_server_key = server_pub;
		o.curve_public_key = me->pub;
		o.curve_secret_key = me->sec;
	}
	return dcast_producer_open(b->producers, "curve", 0, 1, &o, p);
}

/* Refused at open: DCAST_EAUTH, the message names the broker and `hint`. */
static void refused(const harness_broker *b, const char *server_pub, const keypair *me,
		    const char *what, const char *hint)
{
	dcast_producer *p = NULL;
	int rc = open_as(b, server_pub, me, &p);

	fprintf(stderr, "%s: %s\n", what, dcast_last_error());
	CHECK_ERR(rc, DCAST_EAUTH);
	CHECK(p == NULL);
	CHECK(strstr(dcast_last_error(), "CURVE") != NULL);
	CHECK(strstr(dcast_last_error(), b->producers) != NULL);
	CHECK(strstr(dcast_last_error(), hint) != NULL);
}

int main(void)
{
	keypair server, listed, stranger;
	harness_broker b = {0};
	dcast_producer *p = NULL;
	dcast_producer_stats s;
	uint64_t seed = 3, shape[1] = {N};
	uint16_t *w = calloc(N, 2);

	if (zmq_has("curve") != 1)
		TEST_SKIP("libzmq without CURVE");
	harness_init();
	REQUIRE(mkdtemp(dir) && w);
	keypair *all[] = {&server, &listed, &stranger};
	for (int i = 0; i < 3; i++)
		REQUIRE(zmq_curve_keypair(all[i]->pub, all[i]->sec) == 0);
	static char key_path[256], list_path[256];

	snprintf(key_path, sizeof(key_path), "%s/broker.key", dir);
	snprintf(list_path, sizeof(list_path), "%s/producers", dir);
	b.extra[b.n_extra++] = "--curve-secret";
	b.extra[b.n_extra++] = key_path;
	b.extra[b.n_extra++] = "--producer-keys";
	b.extra[b.n_extra++] = list_path;
	write_file(key_path, server.sec);
	write_file(list_path, listed.pub);
	b.with_metrics = 1;
	REQUIRE(harness_broker_start(&b, dir) == 0);

	/* a listed key: anchor then delta, both acknowledged */
	REQUIRE(open_as(&b, server.pub, &listed, &p) == 0);
	harness_fill(w, N, &seed);
	REQUIRE(dcast_producer_register(p, "w", DCAST_DTYPE_BF16, 1, shape, w, DCAST_MEM_HOST, 0,
					N) == 0);
	CHECK_ERR(harness_publish(p, 1), 0);
	harness_perturb(w, N, 10000, &seed);
	CHECK_ERR(harness_publish(p, 2), 0);
	dcast_producer_stats_get(p, &s);
	CHECK(!s.anchor && s.acked_version == 2);
	/* the broker committed 2, a delta: the log's anchor is still 1 */
	CHECK(tp_metric_now(b.mport, "deltacast_model_version{model=\"curve\"}") == 2);
	CHECK(tp_metric_now(b.mport, "deltacast_model_anchor_version{model=\"curve\"}") == 1);
	dcast_producer_close(&p);

	/* refused: an unlisted key, the wrong server key, no CURVE at all */
	refused(&b, server.pub, &stranger, "unlisted key", "--producer-keys");
	refused(&b, stranger.pub, &listed, "wrong server key", "curve_server_key");
	refused(&b, NULL, NULL, "no CURVE", "wants CURVE");
	/* nothing of the refused ones reached the log: two versions, none dropped */
	CHECK(tp_metric_now(b.mport, "deltacast_versions_committed_total") == 2);
	CHECK(tp_metric_now(b.mport, "deltacast_versions_aborted_total") == 0);
	CHECK(tp_metric_now(b.mport, "deltacast_model_version{model=\"curve\"}") == 2);
	tp_broker_kill(&b, SIGTERM);
	free(w);
	return check_done("test_producer_curve");
}
