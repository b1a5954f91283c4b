/* The consumer against a broker that breaks the protocol (a ROUTER socket
 * in this test, speaking the wire format itself).  First it sends CHUNKs
 * that do not fit the manifest: each is refused with the code the broker
 * gives it too (tests/chunk_fit_cases.h), in an ERROR event naming the
 * field, and the consumer re-joins.  Then, after anchor 7 is READY, it
 * sends anchor 5.  Staged versions must stay in increasing order (the
 * consumer asserts it), so anchor 5 is refused as the
 * peer's error, with an ERROR event naming both versions; version 7 stays
 * READY and applies bit-exact.  So is a CHUNK of version 5 that does not
 * fit the manifest, and one whose payload is damaged: a version not staged
 * is named by the message alone (its version field may be the damaged
 * one), so nothing staged is dropped for it.  Then delta 8, whose COMMIT
 * holds a digest for elements [0, 10) alone while its chunk writes
 * [10, 20): refused (DCAST_ECORRUPT, naming element 10), since nothing
 * could check what it writes, with the tensors left at 7; sent again
 * with the digests split there, it applies.  Nothing aborts. */
#include <stdint.h>
#include "check.h"
#include "chunk_fit_cases.h"
#include "dcast_wire.h"
#include "deltacast/codec.h"
#include "deltacast/consumer.h"
#include "proc.h"
#include "router_peer.h"

#define N 64
#define MODEL "hostile"

static void *router, *ctx;
static zmq_msg_t rid;

static void send_to(dcast_msg *m, const void *payload, size_t len)
{
	rp_send(router, &rid, m, payload, len);
}

/* The consumer's HELLO: keep its routing id, answer WELCOME and MANIFEST. */
static void welcome(void)
{
	dcast_wire_in in;

	do
		REQUIRE(dcast_wire_recv(router, 1, &in, 0) == 0);
	while (in.msg.type != DCAST_MSG_HELLO && (dcast_wire_in_close(&in), 1));
	zmq_msg_init(&rid);
	zmq_msg_copy(&rid, &in.rid);
	dcast_wire_in_close(&in);
	rp_welcome(router, &rid, MODEL);
}

/* An anchor of `version` holding w, as one CHUNK and its COMMIT. */
static void anchor(uint64_t version, const uint16_t *w)
{
	dcast_range_digest d;
	dcast_msg chunk, commit;

	rp_anchor(&chunk, &commit, &d, MODEL, version, w);
	send_to(&chunk, w, N * 2);
	send_to(&commit, NULL, 0);
}

/* The next event of type `type` within 10 s, into *ev. */
static int event(dcast_consumer *c, int type, dcast_event *ev)
{
	for (int i = 0; i < 100; i++)
		if (dcast_consumer_poll(c, 100, ev) == 0 && ev->type == type)
			return 1;
	return 0;
}

/* Each CHUNK that does not fit the manifest (version 1 + its index): an
 * ERROR event with the broker's code for it, then the re-join's HELLO. */
static void chunk_fit_refusals(dcast_consumer *c)
{
	for (unsigned i = 0; i < chunk_fit_n_cases; i++) {
		const chunk_fit_case *k = &chunk_fit_cases[i];
		const void *payload;
		dcast_event ev;
		dcast_msg m;

		chunk_fit_chunk(&m, k, MODEL, 1 + i, &payload);
		send_to(&m, payload, m.u.chunk.payload_bytes);
		CHECK(event(c, DCAST_EV_ERROR, &ev) && ev.version == 1 + i);
		fprintf(stderr, "%s: %s: %s\n", k->what, dcast_errname(ev.code), ev.text);
		CHECK_ERR(ev.code, k->code);
		CHECK(strstr(ev.text, k->named) != NULL);
		zmq_msg_close(&rid);
		welcome();
	}
}

/* After a refusal of version 5 (below READY 7, not staged): the re-join's
 * WELCOME, then a CHUNK of version 5 that does not fit, then one whose
 * payload is damaged; each is refused, naming version 5, and 7 stays READY. */
static void damaged_below_ready(dcast_consumer *c, const uint16_t *w)
{
	const chunk_fit_case *k = &chunk_fit_cases[0];
	const void *payload;
	uint16_t bad[N];
	dcast_event ev;
	dcast_msg m;

	zmq_msg_close(&rid);
	welcome();
	chunk_fit_chunk(&m, k, MODEL, 5, &payload);
	send_to(&m, payload, m.u.chunk.payload_bytes);
	CHECK(event(c, DCAST_EV_ERROR, &ev) && ev.version == 5);
	CHECK_ERR(ev.code, k->code);
	CHECK(dcast_consumer_ready_version(c) == 7);
	zmq_msg_close(&rid);
	welcome();
	memcpy(bad, w, sizeof(bad));
	dcast_msg_init(&m, DCAST_MSG_CHUNK);
	strcpy(m.u.chunk.model, MODEL);
	m.u.chunk.version = 5, m.u.chunk.base_version = DCAST_VERSION_NONE, m.u.chunk.anchor = 1;
	m.u.chunk.count = N, m.u.chunk.elem_size = 2, m.u.chunk.changed = N;
	m.u.chunk.encoding = DCAST_ENC_DENSE, m.u.chunk.payload_bytes = N * 2;
	dcast_chunk_seal(&m.u.chunk, bad);
	bad[3] ^= 0x100; /* damaged on the way */
	send_to(&m, bad, N * 2);
	CHECK(event(c, DCAST_EV_ERROR, &ev) && ev.version == 5);
	fprintf(stderr, "damaged chunk of 5 refused as: %s\n", ev.text);
	CHECK(dcast_consumer_ready_version(c) == 7);
}

/* Delta 8 on 7: elements [10, 20) of w7 set to w8's, dense; its COMMIT's
 * digests [0, 10) and, unless `cut`, [10, N), of w8. */
static void delta(const uint16_t *w8, int cut)
{
	dcast_range_digest d[2] = {{0, 0, 10, 0}, {0, 10, N - 10, 0}};
	dcast_msg chunk, commit;

	dcast_msg_init(&chunk, DCAST_MSG_CHUNK);
	strcpy(chunk.u.chunk.model, MODEL);
	chunk.u.chunk.version = 8, chunk.u.chunk.base_version = 7;
	chunk.u.chunk.start = 10, chunk.u.chunk.count = chunk.u.chunk.changed = 10, chunk.u.chunk.elem_size = 2;
	chunk.u.chunk.encoding = DCAST_ENC_DENSE, chunk.u.chunk.payload_bytes = 20;
	dcast_chunk_seal(&chunk.u.chunk, w8 + 10);
	send_to(&chunk, w8 + 10, 20);
	for (int i = 0; i < 2; i++)
		REQUIRE(dcast_ldigest(0, d[i].start, w8 + d[i].start, d[i].count, 2, &d[i].digest) == 0);
	dcast_msg_init(&commit, DCAST_MSG_COMMIT);
	strcpy(commit.u.commit.model, MODEL);
	commit.u.commit.version = 8, commit.u.commit.base_version = 7;
	commit.u.commit.parts = 1, commit.u.commit.chunks = 1, commit.u.commit.bytes = 20;
	commit.u.commit.n_digests = cut ? 1 : 2, commit.u.commit.digests = d;
	send_to(&commit, NULL, 0);
}

/* Delta 8 with no digest for what it writes: refused, the tensors kept
 * at 7; then whole, applied. */
static void delta_unchecked(dcast_consumer *c, const uint16_t *w7)
{
	uint16_t w8[N];
	dcast_event ev;
	void *ptr;

	memcpy(w8, w7, sizeof(w8));
	for (int i = 10; i < 20; i++)
		w8[i] ^= 0x40;
	zmq_msg_close(&rid);
	welcome();
	delta(w8, 1);
	CHECK(event(c, DCAST_EV_ERROR, &ev) && ev.version == 8);
	fprintf(stderr, "delta 8 without its digest refused as: %s\n", ev.text);
	CHECK_ERR(ev.code, DCAST_ECORRUPT);
	CHECK(strstr(ev.text, "no range holds element 10 of tensor w") != NULL);
	CHECK(dcast_consumer_version(c) == 7 && dcast_consumer_ready_version(c) == DCAST_VERSION_NONE);
	CHECK(dcast_consumer_tensor(c, "w", &ptr, NULL, NULL) == 0 && !memcmp(ptr, w7, N * 2));
	zmq_msg_close(&rid);
	welcome();
	delta(w8, 0);
	CHECK(event(c, DCAST_EV_VERSION_READY, &ev) && ev.version == 8);
	CHECK_ERR(dcast_consumer_apply(c, 8), 0);
	CHECK(dcast_consumer_tensor(c, "w", &ptr, NULL, NULL) == 0 && !memcmp(ptr, w8, sizeof(w8)));
}

int main(void)
{
	char dir[] = "/tmp/dcast-test-hostile-XXXXXX", ep[128];
	size_t len = sizeof(ep);
	uint16_t w7[N], w5[N];
	dcast_consumer *c = NULL;
	dcast_event ev;
	void *ptr;

	alarm(60);
	REQUIRE(mkdtemp(dir));
	for (int i = 0; i < N; i++)
		w7[i] = (uint16_t)(i * 7 + 1), w5[i] = (uint16_t)(i * 5 + 3);
	REQUIRE((ctx = zmq_ctx_new()) && (router = zmq_socket(ctx, ZMQ_ROUTER)));
	REQUIRE(zmq_bind(router, "tcp://127.0.0.1:*") == 0);
	REQUIRE(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len) == 0);
	REQUIRE(dcast_consumer_open(ep, MODEL, dir, 4 << 20, NULL, &c) == 0);
	welcome();
	chunk_fit_refusals(c);
	anchor(7, w7);
	CHECK(event(c, DCAST_EV_VERSION_READY, &ev) && ev.version == 7);
	anchor(5, w5); /* below the READY anchor 7: the broker's error */
	CHECK(event(c, DCAST_EV_ERROR, &ev) && ev.version == 5 && ev.code == DCAST_EVERSION);
	CHECK(strstr(ev.text, "not above the newest staged, 7") != NULL);
	fprintf(stderr, "refused as: %s\n", ev.text);
	CHECK(dcast_consumer_ready_version(c) == 7);
	damaged_below_ready(c, w5);
	CHECK_ERR(dcast_consumer_apply(c, 7), 0);
	CHECK(dcast_consumer_tensor(c, "w", &ptr, NULL, NULL) == 0 && !memcmp(ptr, w7, sizeof(w7)));
	delta_unchecked(c, w7);
	dcast_consumer_close(&c);
	zmq_msg_close(&rid);
	zmq_close(router);
	zmq_ctx_term(ctx);
	check_remove_dir(dir);
	return check_done("test_consumer_hostile");
}
