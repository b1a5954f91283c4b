/* The consumer against a broker whose MANIFEST it can never take (a ROUTER
 * socket in this test, speaking the wire format itself, answering every
 * HELLO with WELCOME and that MANIFEST).  Every refusal that re-joins goes
 * through one back-off: the first re-joins at once, the same cause again
 * in a row is reported as persistent (an ERROR event, a log line at E
 * level) and the next HELLO waits 100 ms, doubling to 30 s.  Two causes:
 *   grid 0     a MANIFEST that does not decode (grid[0] = 0): it once
 *              re-joined about 90 times a second, for ever;
 *   too large  a MANIFEST of a 1 PiB tensor, refused with DCAST_ENOMEM: it
 *              once never joined again;
 *   one chunk  an anchor in 8 chunks whose 4th always fails its checksum:
 *              persistent, as the two above.
 * And one that is not persistent: an anchor damaged on the way, at another
 * chunk after each HELLO (a lossy link), is re-joined at once every time;
 * it once backed off toward 30 s as if the log held it damaged.
 * The HELLOs are counted and timed by the fake broker as they arrive; the
 * test waits on the consumer's events and the HELLOs, never on a sleep. */
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>
#include "check.h"
#include "dcast_common.h"
#include "dcast_wire.h"
#include "deltacast/codec.h"
#include "deltacast/consumer.h"
#include "deltacast/log.h"

#define MODEL "refusals"
#define MAX_HELLOS 64

#define CHUNKS 8
#define CHUNK_ELEMS 64

typedef struct fake {
	void *router;
	char ep[128];
	void *manifest;           /* the header frame sent after each WELCOME */
	size_t manifest_len;
	int chunks;               /* anchor chunks sent after it (0: none) */
	int moving;               /* the damaged chunk: the HELLO's number mod CHUNKS, else 3 */
	int hellos;
	uint64_t hello_ms[MAX_HELLOS];
} fake;

static void *ctx;
static _Atomic int e_persists; /* E lines saying a refusal persists */

/* Every log line to stderr; those at E level that say "persists" counted. */
static void log_line(int level, const char *msg, void *arg)
{
	(void)arg;
	if (level == DCAST_LOG_ERROR && strstr(msg, "persists"))
		e_persists++;
	fprintf(stderr, "%c %s\n", "EWID"[level & 3], msg);
}

static void fake_open(fake *f)
{
	size_t len = sizeof(f->ep);

	REQUIRE((f->router = zmq_socket(ctx, ZMQ_ROUTER)));
	REQUIRE(zmq_bind(f->router, "tcp://127.0.0.1:*") == 0);
	REQUIRE(zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->ep, &len) == 0);
}

static void fake_close(fake *f)
{
	zmq_close(f->router);
	free(f->manifest);
}

/* A MANIFEST of one tensor, encoded. */
static void manifest_of(fake *f, const dcast_tensor_desc *t)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	strcpy(m.u.manifest.model, MODEL);
	m.u.manifest.n_tensors = 1;
	m.u.manifest.tensors = (dcast_tensor_desc *)t;
	REQUIRE(dcast_msg_encode(&m, &f->manifest, &f->manifest_len) == 0);
}

/* Anchor chunk i of version 1 (elements i * CHUNK_ELEMS...), its checksum
 * spoilt when damaged. */
static void send_chunk(fake *f, const zmq_msg_t *rid, int i, int damaged)
{
	uint16_t w[CHUNK_ELEMS];
	zmq_msg_t p;
	dcast_msg m;

	for (int k = 0; k < CHUNK_ELEMS; k++)
		w[k] = (uint16_t)(0x3c00 + i * CHUNK_ELEMS + k);
	dcast_msg_init(&m, DCAST_MSG_CHUNK);
	strcpy(m.u.chunk.model, MODEL);
	m.u.chunk.version = 1, m.u.chunk.base_version = DCAST_VERSION_NONE, m.u.chunk.anchor = 1;
	m.u.chunk.seq = (uint32_t)i, m.u.chunk.start = (uint64_t)i * CHUNK_ELEMS;
	m.u.chunk.count = m.u.chunk.changed = CHUNK_ELEMS, m.u.chunk.elem_size = 2;
	m.u.chunk.encoding = DCAST_ENC_DENSE;
	m.u.chunk.payload_bytes = sizeof(w);
	dcast_chunk_seal(&m.u.chunk, w);
	m.u.chunk.checksum ^= (uint64_t)damaged;
	REQUIRE(zmq_msg_init_size(&p, sizeof(w)) == 0);
	memcpy(zmq_msg_data(&p), w, sizeof(w));
	REQUIRE(dcast_wire_send(f->router, zmq_msg_data((zmq_msg_t *)rid), zmq_msg_size((zmq_msg_t *)rid), &m,
				&p, 0) == 0);
}

/* WELCOME (no version: nothing for the consumer to wait for) and the
 * MANIFEST, then the anchor chunks if any, to the consumer whose HELLO
 * came with routing id rid. */
static void answer(fake *f, const zmq_msg_t *rid)
{
	int bad = f->moving ? f->hellos % CHUNKS : 3;

	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_WELCOME);
	strcpy(m.u.welcome.model, MODEL);
	m.u.welcome.version = m.u.welcome.anchor_version = DCAST_VERSION_NONE;
	m.u.welcome.heartbeat_ms = 60000; /* no silence or stall re-joins in this test */
	m.u.welcome.run = 0x1234;
	REQUIRE(dcast_wire_send(f->router, zmq_msg_data((zmq_msg_t *)rid), zmq_msg_size((zmq_msg_t *)rid), &m,
				NULL, 0) == 0);
	REQUIRE(zmq_send(f->router, zmq_msg_data((zmq_msg_t *)rid), zmq_msg_size((zmq_msg_t *)rid),
			 ZMQ_SNDMORE) >= 0);
	REQUIRE(zmq_send(f->router, f->manifest, f->manifest_len, 0) >= 0);
	for (int i = 0; i < f->chunks; i++)
		send_chunk(f, rid, i, i == bad);
}

/* Take what came within wait_ms; answer and time each HELLO. */
static void fake_serve(fake *f, int wait_ms)
{
	zmq_pollitem_t it = {f->router, 0, ZMQ_POLLIN, 0};
	dcast_wire_in in;

	if (zmq_poll(&it, 1, wait_ms) <= 0)
		return;
	while (dcast_wire_recv(f->router, 1, &in, ZMQ_DONTWAIT) != DCAST_EBUSY) {
		if (in.msg.type == DCAST_MSG_HELLO && f->hellos < MAX_HELLOS) {
			f->hello_ms[f->hellos++] = dcast_now_ms();
			answer(f, &in.rid); /* after the count: the first HELLO's damage is at chunk 1 */
		}
		dcast_wire_in_close(&in);
	}
	dcast_wire_in_close(&in);
}

/* Serve until the consumer has reported `want` persistent refusals of
 * `code` and the fake broker has seen `hellos` HELLOs (20 s at most).
 * Returns the persistent refusals seen. */
static int run_until(fake *f, dcast_consumer *c, int code, int want, int hellos)
{
	uint64_t end = dcast_now_ms() + 20000;
	int persistent = 0;
	dcast_event ev;

	while ((persistent < want || f->hellos < hellos) && dcast_now_ms() < end) {
		fake_serve(f, 20);
		while (dcast_consumer_poll(c, 0, &ev) == 0 && ev.type != DCAST_EV_NONE) {
			if (ev.type != DCAST_EV_ERROR || !strstr(ev.text, "persist"))
				continue;
			CHECK_ERR(ev.code, code);
			if (!persistent++)
				fprintf(stderr, "persistent: %s\n", ev.text);
			if (persistent == want)
				CHECK(f->hellos <= 12); /* at most a handful of re-joins to get here */
		}
	}
	return persistent;
}

/* The gap before HELLO k+1 is at least the back-off after refusal k:
 * none after the first, then 100 ms doubling. */
static void check_gaps(const fake *f, const char *what)
{
	for (int k = 1; k + 1 <= f->hellos && k < 8; k++) {
		uint64_t gap = f->hello_ms[k] - f->hello_ms[k - 1];
		uint64_t least = k < 2 ? 0 : k > 10 ? 30000 : 100ull << (k - 2);
		fprintf(stderr, "%s: HELLO %d after %" PRIu64 " ms (back-off %" PRIu64 " ms)\n", what, k + 1, gap,
			least);
		CHECK(gap + 2 >= least); /* 2: the clock's and the poll's rounding */
	}
}

/* A fresh consumer and directory against a fake broker sending `t` and
 * `chunks` anchor chunks. */
static void start(fake *f, char *dir, const dcast_tensor_desc *t, int chunks)
{
	REQUIRE(mkdtemp(dir));
	fake_open(f);
	manifest_of(f, t);
	f->chunks = chunks;
	e_persists = 0;
}

static void finish(fake *f, dcast_consumer **c, const char *dir)
{
	CHECK(dcast_consumer_version(*c) == DCAST_VERSION_NONE);
	dcast_consumer_close(c);
	fake_close(f);
	check_remove_dir(dir);
}

/* One cause: persistent refusals until the back-off reaches 800 ms. */
static void cause(const dcast_tensor_desc *t, int code, const char *what, int chunks)
{
	char dir[] = "/tmp/dcast-test-refusals-XXXXXX";
	dcast_consumer *c = NULL;
	fake f = {0};

	start(&f, dir, t, chunks);
	if (!strcmp(what, "grid 0")) { /* grid [2] sent as [0]: no encoder writes it */
		unsigned char *p = memmem(f.manifest, f.manifest_len, "\xa4grid\x91\x02", 7);
		dcast_msg m;
		REQUIRE(p);
		p[6] = 0;
		CHECK_ERR(dcast_msg_decode(f.manifest, f.manifest_len, &m), code);
		fprintf(stderr, "%s: the MANIFEST decodes as: %s\n", what, dcast_last_error());
	}
	REQUIRE(dcast_consumer_open(f.ep, MODEL, dir, 4 << 20, NULL, &c) == 0);
	/* refusals 2..5 are persistent, backed off 100, 200, 400, 800 ms */
	CHECK(run_until(&f, c, code, 4, 6) >= 4);
	CHECK(e_persists >= 4); /* each also an E line */
	fprintf(stderr, "%s: %d HELLOs in %" PRIu64 " ms\n", what, f.hellos,
		f.hellos ? f.hello_ms[f.hellos - 1] - f.hello_ms[0] : 0);
	CHECK(f.hellos == 6);
	check_gaps(&f, what);
	finish(&f, &c, dir);
}

/* Damage at another chunk after each HELLO: every refusal is a first one,
 * so 12 HELLOs come without a back-off and nothing is called persistent. */
static void moving_damage(const dcast_tensor_desc *t)
{
	char dir[] = "/tmp/dcast-test-refusals-XXXXXX";
	dcast_consumer *c = NULL;
	fake f = {.moving = 1};

	start(&f, dir, t, CHUNKS);
	REQUIRE(dcast_consumer_open(f.ep, MODEL, dir, 4 << 20, NULL, &c) == 0);
	CHECK(run_until(&f, c, DCAST_ECHECKSUM, 0, 12) == 0);
	CHECK(e_persists == 0);
	fprintf(stderr, "moving damage: %d HELLOs in %" PRIu64 " ms\n", f.hellos,
		f.hello_ms[f.hellos - 1] - f.hello_ms[0]);
	CHECK(f.hellos >= 12);
	finish(&f, &c, dir);
}

int main(void)
{
	dcast_tensor_desc grid0 = {.name = "w", .dtype = DCAST_DTYPE_BF16, .ndim = 1, .shape = {64}, .grid = {2}};
	dcast_tensor_desc huge = {.name = "w", .dtype = DCAST_DTYPE_F32, .ndim = 1, .shape = {1ull << 48}};
	dcast_tensor_desc chunked = {.name = "w", .dtype = DCAST_DTYPE_BF16, .ndim = 1, .shape = {CHUNKS * CHUNK_ELEMS}};

	alarm(90);
	dcast_log_set_handler(log_line, NULL);
	REQUIRE((ctx = zmq_ctx_new()));
	cause(&grid0, DCAST_EFIELD_RANGE, "grid 0", 0);
	cause(&huge, DCAST_ENOMEM, "too large", 0);
	cause(&chunked, DCAST_ECHECKSUM, "one chunk", CHUNKS);
	moving_damage(&chunked);
	zmq_ctx_term(ctx);
	return check_done("test_consumer_refusals");
}
