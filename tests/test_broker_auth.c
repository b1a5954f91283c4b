/* CURVE + ZAP over real processes: with --curve-secret and --producer-keys
 * a listed producer publishes and a CURVE consumer receives it, while an
 * unlisted producer key and a plain (no CURVE) producer are refused and
 * logged; a key whose --producer-keys line lists other models is refused at
 * HELLO with DCAST_EAUTH naming key, model and list, and welcomed for its
 * own model; key lists without --curve-secret, and a malformed model list,
 * fail at start-up. */
#include "broker_harness.h"

static char dir[] = "/tmp/dcast_test_auth_XXXXXX";

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	REQUIRE(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* A key pair: the secret in a file, the public returned. */
static void keypair(const char *name, char *pub, char *path, size_t cap)
{
	char sec[41], text[128];

	REQUIRE(zmq_curve_keypair(pub, sec) == 0);
	snprintf(path, cap, "%s/%s.key", dir, name);
	snprintf(text, sizeof(text), "# %s secret key\n%s\n", name, sec);
	write_file(path, text);
}

int main(void)
{
	static struct h_client good, bad, plain, cons, lim, lim2;
	tp_broker br = {0};
	char srv_pub[41], srv_key[300], good_pub[41], good_key[300], bad_pub[41], bad_key[300];
	char cons_pub[41], cons_key[300], keys[300], text[512], lim_pub[41], lim_key[300];
	uint32_t rng = 99;
	uint64_t v;

	h_init();
	REQUIRE(mkdtemp(dir));
	keypair("server", srv_pub, srv_key, sizeof(srv_key));
	keypair("good", good_pub, good_key, sizeof(good_key));
	keypair("bad", bad_pub, bad_key, sizeof(bad_key));
	keypair("consumer", cons_pub, cons_key, sizeof(cons_key));
	keypair("limited", lim_pub, lim_key, sizeof(lim_key));
	snprintf(keys, sizeof(keys), "%s/producers.keys", dir);
	snprintf(text, sizeof(text), "# admitted producers\n%s a, b\n", good_pub);
	write_file(keys, text);
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);

	/* Key lists without --curve-secret: refused at start-up. */
	br.extra[br.n_extra++] = "--producer-keys";
	br.extra[br.n_extra++] = keys;
	br.pport = 1; /* any: the broker exits before binding */
	CHECK(tp_broker_try(&br) != 0);
	CHECK(check_file_has(br.log, "need --curve-secret"));
	br.extra[br.n_extra++] = "--curve-secret";
	br.extra[br.n_extra++] = srv_key;
	CHECK(tp_broker_try(&br) != 0); /* "a,b" lists with a space */
	CHECK(check_file_has(br.log, "line 2: \"a, b\" is not a model list"));
	snprintf(text, sizeof(text), "# admitted producers\n%s *  # any model\n%s other/model,x\n",
		 good_pub, lim_pub);
	write_file(keys, text);
	br.pport = br.cport = 0;
	br.with_metrics = 1;
	REQUIRE(h_broker_start(&br) == 0);
	CHECK(check_file_has(br.log, srv_pub));

	/* An unlisted key and a plain client: refused, logged, no WELCOME. */
	h_client_open_curve(&bad, br.pport, "secure/model", srv_pub, bad_key);
	h_hello(&bad, DCAST_ROLE_PRODUCER, DCAST_VERSION_NONE);
	CHECK(tp_wait_log(br.log, bad_pub, 1, 10000));
	CHECK(check_file_has(br.log, "refused producers peer"));
	v = tp_metric_now(br.mport, "deltacast_auth_refused_total");
	CHECK(v != UINT64_MAX && v >= 1); /* counted before its line is written */
	h_client_open(&plain, br.pport, "secure/model");
	h_hello(&plain, DCAST_ROLE_PRODUCER, DCAST_VERSION_NONE);

	/* The listed producer publishes; a CURVE consumer receives it. */
	h_client_open_curve(&good, br.pport, "secure/model", srv_pub, good_key);
	REQUIRE(h_producer_join(&good) == 0);
	h_mutate(&good, &rng, 1);
	CHECK(h_client_publish(&good, 1, 1, 100) == 0);
	h_mutate(&good, &rng, 20);
	CHECK(h_client_publish(&good, 2, 0, 100) == 0);
	h_client_open_curve(&cons, br.cport, "secure/model", srv_pub, cons_key);
	CHECK(h_consume_until(&cons, DCAST_VERSION_NONE, 2, 100) == 0);
	CHECK(cons.errors == 0 && cons.digest_mismatch == 0);
	CHECK(memcmp(cons.state, good.state, sizeof(good.state)) == 0);

	/* A key tied to other models: refused at HELLO, welcomed for its own. */
	h_client_open_curve(&lim, br.pport, "secure/model", srv_pub, lim_key);
	h_hello(&lim, DCAST_ROLE_PRODUCER, DCAST_VERSION_NONE);
	CHECK(h_pump(&lim, 0, h_done_error, 50) && !lim.welcomed);
	CHECK(lim.last_error_code == DCAST_EAUTH);
	snprintf(text, sizeof(text), "producer key %s may not publish model \"secure/model\" "
		 "(its --producer-keys line allows: other/model,x)", lim_pub);
	CHECK(check_file_has(br.log, text));
	h_client_open_curve(&lim2, br.pport, "other/model", srv_pub, lim_key);
	CHECK(h_producer_join(&lim2) == 0);

	/* The refused ones never got a WELCOME (they have had the whole
	 * exchange above to get one; count, not time). */
	CHECK(!bad.welcomed && bad.last_ack == DCAST_VERSION_NONE);
	h_pump(&bad, 0, h_done_welcomed, 1);
	h_pump(&plain, 0, h_done_welcomed, 1);
	CHECK(!bad.welcomed && !plain.welcomed);
	CHECK(tp_metric_now(br.mport, "deltacast_versions_committed_total") == 2);
	CHECK(tp_metric_now(br.mport, "deltacast_versions_aborted_total") == 0);
	CHECK(tp_metric_now(br.mport, "deltacast_model_version{model=\"secure/model\"}") == 2);

	h_client_close(&good);
	h_client_close(&bad);
	h_client_close(&plain);
	h_client_close(&cons);
	h_client_close(&lim);
	h_client_close(&lim2);
	return h_finish(&br, dir, "test_broker_auth");
}
