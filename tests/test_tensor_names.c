/* A tensor name that a consumer cannot take is refused on every side by one
 * rule (dcast_tensor_name_check): "__metadata__" is the key a safetensors
 * header keeps for its metadata, so no consumer can write such a tensor to
 * its anchor file.  The broker used to ACK a version of it, and every
 * consumer failed at its anchor, re-joined and was sent the whole model
 * again, without end.  Here, with real processes over loopback:
 *   - the producer library refuses the name at registration;
 *   - a real broker refuses a MANIFEST naming it (ERROR naming the tensor
 *     and the rule), stores nothing of it (the CHUNK after it is refused as
 *     coming before any MANIFEST), and serves the model once a good
 *     producer publishes it;
 *   - the consumer library refuses such a MANIFEST from a broker that
 *     sends one anyway (a ROUTER in this test): it drops it, says why, and
 *     joins again. */
#include "broker_harness.h"
#include "deltacast/consumer.h"
#include "deltacast/log.h"
#include "deltacast/producer.h"

#define RESERVED "__metadata__"

/* A MANIFEST header of one BF16 tensor of 64 elements named `name`, which
 * the encoder refuses: encoded under a stand-in name of the same length,
 * then the name's bytes put in its place.  *out is malloc'd. */
static size_t manifest_named(const char *model, const char *name, void **out)
{
	dcast_tensor_desc t = {.dtype = DCAST_DTYPE_BF16, .ndim = 1, .shape = {64}};
	size_t len, n = strlen(name);
	dcast_msg m;
	char *at;

	memset(t.name, 'Q', n);
	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	snprintf(m.u.manifest.model, sizeof(m.u.manifest.model), "%s", model);
	m.u.manifest.n_tensors = 1;
	m.u.manifest.tensors = &t;
	REQUIRE(dcast_msg_encode(&m, out, &len) == 0);
	REQUIRE((at = memmem(*out, len, t.name, n)) != NULL);
	memcpy(at, name, n);
	return len;
}

static void test_producer(const tp_broker *br)
{
	static uint16_t w[64];
	uint64_t shape[1] = {64};
	dcast_producer *p = NULL;

	REQUIRE(dcast_producer_open(br->producers, "names/lib", 0, 1, NULL, &p) == 0);
	CHECK_ERR(dcast_producer_register(p, RESERVED, DCAST_DTYPE_BF16, 1, shape, w, DCAST_MEM_HOST,
					  0, 64), DCAST_EINVAL);
	printf("register: %s\n", dcast_last_error());
	CHECK(strstr(dcast_last_error(), "\"" RESERVED "\" is reserved") != NULL);
	CHECK_ERR(dcast_producer_register(p, "\xff\xc3(", DCAST_DTYPE_BF16, 1, shape, w,
					  DCAST_MEM_HOST, 0, 64), DCAST_EINVAL);
	CHECK(strstr(dcast_last_error(), "\\xff\\xc3(\" is not UTF-8") != NULL);
	CHECK_ERR(dcast_producer_register(p, "w", DCAST_DTYPE_BF16, 1, shape, w, DCAST_MEM_HOST,
					  0, 64), 0);
	CHECK_ERR(dcast_producer_publish(p, 1), 0);
	CHECK_ERR(dcast_producer_wait(p, 1, 10000), 0);
	dcast_producer_close(&p);
}

/* The ERROR code answering what `c` sent last, its text into text. */
static int error_answer(struct h_client *c, char *text, size_t cap)
{
	for (int i = 0; i < 50; i++) {
		dcast_wire_in in;
		int code = -1;

		if (dcast_wire_recv(c->sock, 0, &in, 0) == 0 && in.msg.type == DCAST_MSG_ERROR) {
			code = (int)in.msg.u.error.code;
			snprintf(text, cap, "%s", in.msg.u.error.text);
		}
		dcast_wire_in_close(&in);
		if (code >= 0)
			return code;
	}
	return -1;
}

static void test_broker(const tp_broker *br)
{
	static struct h_client raw, good, cons;
	char text[DCAST_MAX_TEXT + 1] = "";
	uint32_t rng = 5;
	void *hdr;
	size_t len;

	h_client_open(&raw, br->pport, "names/raw");
	h_hello(&raw, DCAST_ROLE_PRODUCER, DCAST_VERSION_NONE);
	REQUIRE(h_pump(&raw, 0, h_done_welcomed, 50));
	len = manifest_named("names/raw", RESERVED, &hdr);
	REQUIRE(zmq_send(raw.sock, hdr, len, 0) == (int)len);
	free(hdr);
	CHECK_ERR(error_answer(&raw, text, sizeof(text)), DCAST_EFIELD_RANGE);
	printf("broker: %s\n", text);
	CHECK(strstr(text, "MANIFEST.tensors[0].name: tensor name \"" RESERVED "\" is reserved"));
	CHECK_ERR(h_client_publish(&raw, 1, 1, 0), -1); /* its first CHUNK: */
	CHECK_ERR(error_answer(&raw, text, sizeof(text)), DCAST_ESTATE);
	CHECK(strstr(text, "CHUNK before MANIFEST") != NULL);
	h_client_close(&raw);

	h_client_open(&good, br->pport, "names/raw");
	REQUIRE(h_producer_join(&good) == 0);
	h_mutate(&good, &rng, 1);
	CHECK(h_client_publish(&good, 1, 1, 100) == 0);
	h_client_open(&cons, br->cport, "names/raw");
	CHECK(h_consume_until(&cons, DCAST_VERSION_NONE, 1, 100) == 0);
	CHECK(cons.manifest_seen && cons.errors == 0 && cons.digest_mismatch == 0);
	CHECK(memcmp(cons.state, good.state, sizeof(good.state)) == 0);
	h_client_close(&cons);
	h_client_close(&good);
}

/* ---- the consumer library against a broker that sends the name ---- */

static char refusal[1024];
static void log_line(int level, const char *msg, void *arg)
{
	(void)level, (void)arg;
	if (strstr(msg, RESERVED) && !refusal[0])
		snprintf(refusal, sizeof(refusal), "%s", msg);
}

/* The next HELLO on the ROUTER (10 s at most): 1 and its routing id in rid. */
static int next_hello(void *router, zmq_msg_t *rid)
{
	zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};

	for (int i = 0; i < 100; i++) {
		dcast_wire_in in;
		int hello;

		if (zmq_poll(&it, 1, 100) <= 0)
			continue;
		if (dcast_wire_recv(router, 1, &in, 0))
			continue;
		hello = in.msg.type == DCAST_MSG_HELLO;
		if (hello)
			zmq_msg_copy(rid, &in.rid);
		dcast_wire_in_close(&in);
		if (hello)
			return 1;
	}
	return 0;
}

static void test_consumer(void)
{
	char dir[] = "/tmp/dcast_test_names_cons_XXXXXX", ep[128];
	size_t ep_len = sizeof(ep), len;
	dcast_consumer *c = NULL;
	void *router, *hdr;
	zmq_msg_t rid;
	dcast_msg m;

	REQUIRE(mkdtemp(dir));
	REQUIRE((router = zmq_socket(h_ctx, ZMQ_ROUTER)) && zmq_bind(router, "tcp://127.0.0.1:*") == 0);
	REQUIRE(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &ep_len) == 0);
	dcast_log_set_handler(log_line, NULL);
	REQUIRE(dcast_consumer_open(ep, "names/cons", dir, 4 << 20, NULL, &c) == 0);
	zmq_msg_init(&rid);
	REQUIRE(next_hello(router, &rid));
	dcast_msg_init(&m, DCAST_MSG_WELCOME);
	strcpy(m.u.welcome.model, "names/cons");
	m.u.welcome.heartbeat_ms = 60000;
	m.u.welcome.run = 0x1234;
	REQUIRE(dcast_wire_send(router, zmq_msg_data(&rid), zmq_msg_size(&rid), &m, NULL, 0) == 0);
	len = manifest_named("names/cons", RESERVED, &hdr);
	REQUIRE(zmq_send(router, zmq_msg_data(&rid), zmq_msg_size(&rid), ZMQ_SNDMORE) >= 0);
	REQUIRE(zmq_send(router, hdr, len, 0) == (int)len);
	free(hdr);
	CHECK(next_hello(router, &rid)); /* dropped the MANIFEST and joined again */
	dcast_consumer_close(&c);
	dcast_log_set_handler(NULL, NULL);
	printf("consumer: %s\n", refusal);
	CHECK(strstr(refusal, "MANIFEST.tensors[0].name: tensor name \"" RESERVED "\" is reserved"));
	zmq_msg_close(&rid);
	zmq_close(router);
	check_remove_dir(dir);
}

int main(void)
{
	tp_broker br = {0};
	char dir[] = "/tmp/dcast_test_names_XXXXXX";

	alarm(120);
	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	REQUIRE(h_broker_start(&br) == 0);
	test_producer(&br);
	test_broker(&br);
	test_consumer();
	return h_finish(&br, dir, "test_tensor_names");
}
