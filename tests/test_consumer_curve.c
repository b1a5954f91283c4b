/* The consumer over CURVE: a broker started with --curve-secret and a
 * --consumer-keys list admits a consumer whose key is listed (it receives
 * the anchor bit-exact) and never sends anything to one whose key is not;
 * incomplete or malformed key options fail at open with a clear error. */
#include <sys/stat.h>
#include <zmq.h>
#include "check.h"
#include "consumer_harness.h"

#define BUDGET (1u << 20)

static char root[] = "/tmp/dcast-consumer-curve-XXXXXX";

typedef struct keypair {
	char pub[41], sec[41];
} keypair;

static void write_file(const char *dir, const char *name, const char *text, char *path, size_t cap)
{
	snprintf(path, cap, "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	REQUIRE(f && fputs(text, f) >= 0 && fputc('\n', f) != EOF && fclose(f) == 0);
}

static dcast_consumer *open_with(const h_broker *b, const keypair *server, const keypair *me, const char *dir)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;

	dcast_consumer_opts_init(&o);
	o.curve_server_key = server->pub;
	o.curve_public_key = me->pub;
	o.curve_secret_key = me->sec;
	CHECK(dcast_consumer_open(b->consumers, "m_curve", dir, BUDGET, &o, &c) == 0);
	return c;
}

int main(void)
{
	keypair broker, prod, cons, stranger;
	char sec_path[512], pkeys[512], ckeys[512], dir[512];
	h_broker b;
	h_model m;
	dcast_producer_opts po;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	dcast_event ev;
	h_seen s = {0};

	if (zmq_has("curve") != 1)
		TEST_SKIP("libzmq without CURVE");
	REQUIRE(mkdtemp(root));
	keypair *all[] = {&broker, &prod, &cons, &stranger};
	for (int i = 0; i < 4; i++)
		REQUIRE(zmq_curve_keypair(all[i]->pub, all[i]->sec) == 0);
	write_file(root, "broker.key", broker.sec, sec_path, sizeof(sec_path));
	write_file(root, "producers", prod.pub, pkeys, sizeof(pkeys));
	write_file(root, "consumers", cons.pub, ckeys, sizeof(ckeys));
	char *extra[] = {"--curve-secret", sec_path, "--producer-keys", pkeys, "--consumer-keys", ckeys, NULL};
	REQUIRE(h_broker_start_args(&b, extra) == 0);

	h_model_init(&m, 17, 1);
	dcast_producer_opts_init(&po);
	po.range_elems = h_range_elems;
	po.curve_server_key = broker.pub;
	po.curve_public_key = prod.pub;
	po.curve_secret_key = prod.sec;
	REQUIRE(dcast_producer_open(b.producers, "m_curve", 0, 1, &po, &p) == 0);
	for (int t = 0; t < H_TENSORS; t++)
		REQUIRE(dcast_producer_register(p, m.name[t], m.dtype[t], m.ndim[t], m.shape[t], m.cur[t],
						DCAST_MEM_HOST, 0, m.bytes[t] / (t == 1 ? 4 : 2)) == 0);
	REQUIRE(h_publish(p, &m, 1, 100) == 0);

	/* listed key: the anchor, bit-exact */
	snprintf(dir, sizeof(dir), "%s/listed", root);
	c = open_with(&b, &broker, &cons, dir);
	REQUIRE(c);
	CHECK(h_drive(c, &m, 1, &s) == 0);
	CHECK(h_equal(c, &m, 1));
	dcast_consumer_close(&c);

	/* unlisted key: refused by the broker's ZAP handler, nothing arrives */
	snprintf(dir, sizeof(dir), "%s/stranger", root);
	c = open_with(&b, &broker, &stranger, dir);
	REQUIRE(c);
	for (int i = 0; i < 20; i++)
		CHECK(dcast_consumer_poll(c, 50, &ev) == 0);
	CHECK(dcast_consumer_tensor_count(c) == 0);
	CHECK(dcast_consumer_version(c) == DCAST_VERSION_NONE);
	{
		dcast_consumer_stats st;
		dcast_consumer_stats_get(c, &st);
		CHECK(st.total_bytes_received == 0);
	}
	dcast_consumer_close(&c);

	/* options that cannot work fail at open */
	dcast_consumer_opts o;
	dcast_consumer_opts_init(&o);
	o.curve_server_key = "short";
	o.curve_public_key = cons.pub;
	o.curve_secret_key = cons.sec;
	CHECK_ERR(dcast_consumer_open(b.consumers, "m_curve", dir, BUDGET, &o, &c), DCAST_EINVAL);
	CHECK(strstr(dcast_last_error(), "40 Z85") != NULL);
	dcast_consumer_opts_init(&o);
	o.curve_secret_key = cons.sec;
	CHECK_ERR(dcast_consumer_open(b.consumers, "m_curve", dir, BUDGET, &o, &c), DCAST_EINVAL);
	CHECK(strstr(dcast_last_error(), "curve_server_key") != NULL);

	dcast_producer_close(&p);
	h_model_free(&m);
	h_broker_stop(&b);
	check_remove_dir(root);
	return check_done("test_consumer_curve");
}
