/* The consumer's device path for deltas (consumer/devbatch.c) on machines
 * without a GPU: DELTACAST_DEVICE_TWIN=1 sends host tensors through it,
 * run by the batch's CPU twin.  A delta checked ahead is decoded into one
 * batch, its digests moved from the old values the batch gathered, and
 * applied as one scatter: versions bit-exact (bf16, f32, and an f64 tensor
 * of 8-byte values); a wrong COMMIT digest refused before READY with the
 * live weights untouched; an apply cut off halfway (fault aheadfail)
 * rolled back from the batch's undo buffer, bit-exact (also beside dense
 * chunks, undone from the host undo region); a delta whose
 * payload is damaged under a valid checksum (sent by a fake broker; idx32,
 * compact, compact2) refused before READY with the CPU decoder's error
 * code, the live tensor untouched.  dcast_consumer_apply_async takes the
 * same path: through the twin it is apply exactly (same bytes, versions,
 * rollback and errors; the event it is given never touched).
 * tests/test_consumer_gpu.c runs the same on a CUDA device. */
#include <stdlib.h>
#include "check.h"
#include "consumer_harness.h"
#include "dcast_wire.h"
#include "batch_cases.h"
#include "deltacast/codec.h"

#define BUDGET (8u << 20)

static char root[] = "/tmp/dcast-consumer-devbatch-XXXXXX";

static const char *dir_for(const char *name)
{
	static char path[256];
	snprintf(path, sizeof(path), "%s/%s", root, name);
	return path;
}

/* A consumer of `model`, with `fault` (DELTACAST_CONSUMER_FAULT) armed
 * unless NULL. */
static dcast_consumer *open_faulted(const h_broker *b, const char *model, const char *fault)
{
	dcast_consumer *c = NULL;

	if (fault)
		setenv("DELTACAST_CONSUMER_FAULT", fault, 1);
	CHECK(dcast_consumer_open(b->consumers, model, dir_for(model), BUDGET, NULL, &c) == 0);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	return c;
}

/* The f32 tensor of m as f64 (two 4-byte wire elements a value, low word
 * first): same bytes, half the values. */
static void make_f64(h_model *m)
{
	m->dtype[1] = DCAST_DTYPE_F64;
	m->shape[1][1] /= 2;
}

/* What apply_async is given as its event: without a device it must stay
 * as it is (the call is apply exactly). */
#define EVENT_BYTE 0xA5
static unsigned char untouched_event[64];

static int event_untouched(void)
{
	for (size_t i = 0; i < sizeof(untouched_event); i++)
		if (untouched_event[i] != EVENT_BYTE)
			return 0;
	return 1;
}

static int apply_sync(dcast_consumer *c, uint64_t version, void *arg)
{
	(void)arg;
	return dcast_consumer_apply(c, version);
}

static int apply_async(dcast_consumer *c, uint64_t version, void *arg)
{
	return dcast_consumer_apply_async(c, version, NULL, arg);
}

/* Versions 1-2 applied, then 3 and 4 published while 2 is live, so that 3
 * is checked ahead with `fault` armed for it (with `dense`, 3 also
 * rewrites the first two chunks whole: written outside the batch, undone
 * from the host undo region) and applied by `apply`; the consumer must
 * end bit-exact at 4. */
static void run_ahead_by(const h_broker *b, const char *model, uint64_t seed, int f64, int dense,
			 const char *fault, h_apply_fn apply, h_seen *s)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;

	h_model_init(&m, seed, 1);
	if (f64)
		make_f64(&m);
	REQUIRE(h_producer_open(b, model, &m, &p) == 0);
	REQUIRE(h_publish(p, &m, 1, 100) == 0 && h_publish(p, &m, 2, 100) == 0);
	c = open_faulted(b, model, fault);
	REQUIRE(c);
	CHECK(h_drive(c, &m, 2, s) == 0 && h_equal(c, &m, 2));
	for (uint64_t i = 0; dense && i < h_range_elems * 2 * 2; i++) /* random bits: dense is smallest */
		m.cur[0][i] = (unsigned char)h_rand(&m.rng);
	REQUIRE(h_publish(p, &m, 3, 100) == 0 && h_publish(p, &m, 4, 100) == 0);
	CHECK(h_drive_by(c, &m, 4, s, apply, untouched_event) == 0);
	CHECK(dcast_consumer_version(c) == 4 && h_equal(c, &m, 4));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

static void run_ahead_dense(const h_broker *b, const char *model, uint64_t seed, int f64, int dense,
			    const char *fault, h_seen *s)
{
	run_ahead_by(b, model, seed, f64, dense, fault, apply_sync, s);
}

static void run_ahead(const h_broker *b, const char *model, uint64_t seed, int f64, const char *fault, h_seen *s)
{
	run_ahead_dense(b, model, seed, f64, 0, fault, s);
}

static void test_versions(const h_broker *b)
{
	h_seen s = {0};

	run_ahead(b, "m_batch", 101, 0, NULL, &s);
	CHECK(s.errors == 0 && s.apply_failures == 0);
}

static void test_f64(const h_broker *b)
{
	h_seen s = {0};

	run_ahead(b, "m_batch64", 103, 1, NULL, &s);
	CHECK(s.errors == 0 && s.apply_failures == 0);
}

/* Version 3's COMMIT digest is wrong: refused when checked ahead, before
 * READY, the live tensors still version 2; fetched again and healed. */
static void test_digest_refused(const h_broker *b)
{
	h_seen s = {0};

	run_ahead(b, "m_batchdigest", 107, 0, "predigest:3", &s);
	CHECK(s.errors >= 1 && s.last_error == DCAST_EDIGEST);
	CHECK(s.apply_failures == 0 && s.untouched_bad == 0);
}

/* Version 3's apply is cut off at a chunk in its second half: the batch's
 * segments written are undone from its undo buffer, the tensors are
 * version 2 again bit for bit, and the consumer heals. */
static void test_cut_rolled_back(const h_broker *b)
{
	h_seen s = {0};

	run_ahead(b, "m_batchcut", 109, 1, "aheadfail:3", &s);
	CHECK(s.apply_failures >= 1 && s.last_apply_error == DCAST_ECORRUPT);
	CHECK(s.untouched_ok >= 1 && s.untouched_bad == 0);
}

/* The same with version 3's first two chunks dense: the batch's segments
 * and the dense chunks both undone, bit-exact. */
static void test_cut_with_dense(const h_broker *b)
{
	h_seen s = {0};

	run_ahead_dense(b, "m_batchcutdense", 113, 0, 1, "aheadfail:3", &s);
	CHECK(s.apply_failures >= 1 && s.last_apply_error == DCAST_ECORRUPT);
	CHECK(s.untouched_ok >= 1 && s.untouched_bad == 0);
}

/* ---- apply_async through the twin: apply exactly ---- */

/* The versions of test_versions and test_f64 (same seeds, so the same
 * producer bytes), applied by apply_async: bit-exact at 4, nothing
 * refused, the event untouched. */
static void test_async_versions(const h_broker *b)
{
	h_seen s = {0};

	run_ahead_by(b, "m_async", 101, 0, 0, NULL, apply_async, &s);
	run_ahead_by(b, "m_async64", 103, 1, 0, NULL, apply_async, &s);
	CHECK(s.errors == 0 && s.apply_failures == 0);
	CHECK(event_untouched());
}

/* test_cut_with_dense's cut, applied by apply_async: the same error, the
 * batch and the dense chunks undone bit for bit. */
static void test_async_cut(const h_broker *b)
{
	h_seen s = {0};

	run_ahead_by(b, "m_asynccut", 113, 0, 1, "aheadfail:3", apply_async, &s);
	CHECK(s.apply_failures >= 1 && s.last_apply_error == DCAST_ECORRUPT);
	CHECK(s.untouched_ok >= 1 && s.untouched_bad == 0);
	CHECK(event_untouched());
}

/* apply(version) and apply_async(version) refuse alike: same code, same
 * text (a version not staged, one applied already); a NULL consumer. */
static void check_same_refusal(dcast_consumer *c, uint64_t version)
{
	char want[512];
	int err = dcast_consumer_apply(c, version);

	snprintf(want, sizeof(want), "%s", dcast_last_error());
	CHECK(err != 0);
	CHECK_ERR(dcast_consumer_apply_async(c, version, NULL, untouched_event), err);
	CHECK(!strcmp(dcast_last_error(), want));
	fprintf(stderr, "both refused as: %s\n", want);
}

static void test_async_errors(const h_broker *b)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;
	h_seen s = {0};

	REQUIRE(h_model_start(b, "m_asyncerr", 127, 1, 100, &m, &p) == 0);
	c = open_faulted(b, "m_asyncerr", NULL);
	REQUIRE(c);
	CHECK(h_drive(c, &m, 1, &s) == 0);
	check_same_refusal(c, 99); /* never staged */
	check_same_refusal(c, 1);  /* applied already */
	CHECK_ERR(dcast_consumer_apply_async(NULL, 2, NULL, NULL), DCAST_EINVAL);
	CHECK(strstr(dcast_last_error(), "apply_async") && strstr(dcast_last_error(), "NULL consumer"));
	CHECK(dcast_consumer_version(c) == 1 && h_equal(c, &m, 1));
	CHECK(event_untouched());
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

/* ---- a damaged payload under a valid checksum, from a fake broker ---- */

#define FAKE_N 64

typedef struct fake_broker {
	void *ctx, *router;
	zmq_msg_t rid;
	char ep[128];
} fake_broker;

static void fake_send(fake_broker *f, dcast_msg *m, const void *payload, size_t len)
{
	zmq_msg_t p;

	REQUIRE(zmq_msg_init_size(&p, len) == 0);
	if (len)
		memcpy(zmq_msg_data(&p), payload, len);
	REQUIRE(dcast_wire_send(f->router, zmq_msg_data(&f->rid), zmq_msg_size(&f->rid), m, len ? &p : NULL, 0) == 0);
	if (!len)
		zmq_msg_close(&p);
}

/* Take the consumer's HELLO, answer WELCOME and a one-tensor MANIFEST. */
static void fake_join(fake_broker *f)
{
	dcast_tensor_desc t = {.name = "w", .dtype = DCAST_DTYPE_BF16, .ndim = 1, .shape = {FAKE_N}};
	dcast_wire_in in;
	dcast_msg m;

	for (;;) {
		REQUIRE(dcast_wire_recv(f->router, 1, &in, 0) == 0);
		if (in.msg.type == DCAST_MSG_HELLO)
			break;
		dcast_wire_in_close(&in);
	}
	zmq_msg_init(&f->rid);
	zmq_msg_copy(&f->rid, &in.rid);
	dcast_wire_in_close(&in);
	dcast_msg_init(&m, DCAST_MSG_WELCOME);
	strcpy(m.u.welcome.model, "fake");
	m.u.welcome.version = m.u.welcome.anchor_version = DCAST_VERSION_NONE;
	m.u.welcome.heartbeat_ms = 60000;
	m.u.welcome.run = 0x77;
	fake_send(f, &m, NULL, 0);
	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	strcpy(m.u.manifest.model, "fake");
	m.u.manifest.n_tensors = 1;
	m.u.manifest.tensors = &t;
	fake_send(f, &m, NULL, 0);
}

/* Version v of tensor w as one CHUNK (info, payload) and its COMMIT with
 * `digest`. */
static void fake_version(fake_broker *f, uint64_t v, const dcast_chunk_info *info, const void *payload,
			 uint64_t digest)
{
	dcast_range_digest d = {0, 0, FAKE_N, digest};
	uint64_t base = v > 1 ? v - 1 : DCAST_VERSION_NONE;
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_CHUNK);
	strcpy(m.u.chunk.model, "fake");
	m.u.chunk.version = v;
	m.u.chunk.base_version = base;
	m.u.chunk.anchor = v == 1;
	m.u.chunk.count = info->count, m.u.chunk.elem_size = info->elem_size, m.u.chunk.changed = info->changed;
	m.u.chunk.encoding = info->encoding, m.u.chunk.payload_bytes = info->payload_bytes;
	dcast_chunk_seal(&m.u.chunk, payload);
	fake_send(f, &m, payload, info->payload_bytes);
	dcast_msg_init(&m, DCAST_MSG_COMMIT);
	strcpy(m.u.commit.model, "fake");
	m.u.commit.version = v;
	m.u.commit.base_version = base;
	m.u.commit.anchor = v == 1, m.u.commit.parts = 1, m.u.commit.chunks = 1;
	m.u.commit.bytes = info->payload_bytes;
	m.u.commit.n_digests = 1;
	m.u.commit.digests = &d;
	fake_send(f, &m, NULL, 0);
}

/* The next event of `type` within 10 s (others counted in *ready when
 * they are READY events). */
static int next_event(dcast_consumer *c, int type, dcast_event *ev, int *ready)
{
	for (int i = 0; i < 100; i++) {
		if (dcast_consumer_poll(c, 100, ev))
			return 0;
		*ready += ev->type == DCAST_EV_VERSION_READY && type != DCAST_EV_VERSION_READY;
		if (ev->type == type)
			return 1;
	}
	return 0;
}

/* Anchor 1, then delta 2 as `delta` and `bad`, a payload whose checksum
 * is right and whose structure is not. */
static void check_damaged_refused(const char *name, const dcast_chunk_info *delta, const unsigned char *bad)
{
	fake_broker f = {0};
	size_t len = sizeof(f.ep);
	uint16_t w1[FAKE_N];
	unsigned char scratch[FAKE_N * 2];
	dcast_chunk_info dense = {DCAST_ENC_DENSE, 2, FAKE_N, FAKE_N, sizeof(w1)};
	char dir[256];
	dcast_consumer *c = NULL;
	dcast_event ev;
	uint64_t d1;
	int ready = 0;
	void *ptr;

	for (int i = 0; i < FAKE_N; i++)
		w1[i] = (uint16_t)(i * 7 + 1);
	REQUIRE(dcast_ldigest(0, 0, w1, FAKE_N, 2, &d1) == 0);
	memcpy(scratch, w1, sizeof(w1));
	int want = dcast_codec_apply(delta, bad, scratch, NULL); /* the CPU's verdict */
	REQUIRE(want != 0);
	snprintf(dir, sizeof(dir), "%s/%s", root, name);
	REQUIRE((f.ctx = zmq_ctx_new()) && (f.router = zmq_socket(f.ctx, ZMQ_ROUTER)));
	REQUIRE(zmq_bind(f.router, "tcp://127.0.0.1:*") == 0);
	REQUIRE(zmq_getsockopt(f.router, ZMQ_LAST_ENDPOINT, f.ep, &len) == 0);
	REQUIRE(dcast_consumer_open(f.ep, "fake", dir, BUDGET, NULL, &c) == 0);
	fake_join(&f);
	fake_version(&f, 1, &dense, w1, d1);
	CHECK(next_event(c, DCAST_EV_VERSION_READY, &ev, &ready) && ev.version == 1);
	CHECK_ERR(dcast_consumer_apply(c, 1), 0);
	fake_version(&f, 2, delta, bad, d1);
	CHECK(next_event(c, DCAST_EV_ERROR, &ev, &ready) && ev.version == 2);
	CHECK_ERR(ev.code, want);
	fprintf(stderr, "refused as: %s\n", ev.text);
	CHECK(ready == 0 && dcast_consumer_ready_version(c) == DCAST_VERSION_NONE); /* never READY */
	CHECK(dcast_consumer_tensor(c, "w", &ptr, NULL, NULL) == 0 && !memcmp(ptr, w1, sizeof(w1)));
	dcast_consumer_close(&c);
	zmq_msg_close(&f.rid);
	zmq_close(f.router);
	zmq_ctx_term(f.ctx);
}

/* A compact (v1 or v2, enc) payload with a bit of its stream flipped
 * where the decoder refuses it (decoded on the device path, by the twin
 * here). */
static void damaged_compact(int enc, const char *name)
{
	unsigned char cpt[512], scratch[FAKE_N * 2];
	dcast_chunk_info delta;
	uint16_t w1[FAKE_N], w2[FAKE_N];
	uint64_t rng = 5;

	for (int i = 0; i < FAKE_N; i++)
		w1[i] = w2[i] = (uint16_t)(i * 7 + 1);
	for (int i = 0; i < FAKE_N; i += 5)
		w2[i] ^= 3;
	REQUIRE(dcast_codec_encode(w2, w1, FAKE_N, 2, enc, 0, cpt, sizeof(cpt), &delta) == 0);
	for (int tries = 0; tries < 1000; tries++) { /* a flip in the stream that the decoder refuses */
		unsigned char was[512];
		memcpy(was, cpt, delta.payload_bytes);
		cpt[delta.payload_bytes - 1 - bc_rnd(&rng) % 4] ^= (unsigned char)(1u << (bc_rnd(&rng) % 8));
		memcpy(scratch, w1, sizeof(w1));
		if (dcast_codec_apply(&delta, cpt, scratch, NULL) == DCAST_ECORRUPT)
			break;
		memcpy(cpt, was, delta.payload_bytes);
	}
	check_damaged_refused(name, &delta, cpt);
}

/* idx32 whose positions go down (3 then 2); compact and compact2 damaged. */
static void test_damaged_refused(void)
{
	unsigned char idx[12] = {3, 0, 0, 0, 0x11, 0x22, 2, 0, 0, 0, 0x33, 0x44};
	dcast_chunk_info delta = {DCAST_ENC_IDX32, 2, FAKE_N, 2, sizeof(idx)};

	check_damaged_refused("fake_idx32", &delta, idx);
	damaged_compact(DCAST_ENC_COMPACT, "fake_compact");
	damaged_compact(DCAST_ENC_COMPACT2, "fake_compact2");
}

int main(void)
{
	h_broker b;

	setenv("DELTACAST_DEVICE_TWIN", "1", 1); /* before the library first asks */
	memset(untouched_event, EVENT_BYTE, sizeof(untouched_event));
	REQUIRE(mkdtemp(root));
	REQUIRE(h_broker_start_args(&b, NULL) == 0);
	test_versions(&b);
	test_f64(&b);
	test_digest_refused(&b);
	test_cut_rolled_back(&b);
	test_cut_with_dense(&b);
	test_async_versions(&b);
	test_async_cut(&b);
	test_async_errors(&b);
	h_broker_stop(&b);
	test_damaged_refused();
	check_remove_dir(root);
	return check_done("test_consumer_devbatch");
}
