/* Producer: a broker that says what a broker must not (a test playing the
 * broker on a ROUTER socket, on a thread of its own; the producer is the
 * real library).
 *  - An ACK of the version in flight before its COMMIT went out does not
 *    settle it: wait() goes on waiting, and the ACK that follows the
 *    COMMIT settles it.
 *  - An ACK of a version never published moves nothing: the next
 *    publish() of a version above the real newest is sent and taken.
 *  - A session whose credit never comes back (a CREDIT lost): the version
 *    fails with DCAST_ETIMEDOUT, and the next publish() joins again (a
 *    second HELLO) and is taken under the new session's window.
 *  - A version refused by an ERROR before its COMMIT: the next publish()
 *    joins again too (the broker may hold the refused version open on
 *    the old session, refusing every later one there).
 *  - A version refused after its COMMIT that the broker took all the same:
 *    the next publish() joins again, learns the broker's newest version
 *    from the WELCOME and sends an anchor.
 * Each failed before the producer checked what it was told (tools/
 * fuzz_producer found them). */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>
#include "check.h"
#include "proc.h"
#include "dcast_wire.h"
#include "deltacast/producer.h"

#define MODEL "hostile"
#define ELEMS 65536
#define RANGE 16384 /* 32 KiB chunks */

enum { EARLY_ACK = 1, STINGY_FIRST = 2, ERROR_MID = 4, REFUSED_TAKEN = 8 };

static struct {
	void *ctx, *router;
	char ep[128];
	pthread_t thread;
	int mode;
	atomic_int stop, release, hellos;
	atomic_int early_sent;
	uint64_t held_ack;          /* a COMMIT's version, ACKed at `release` */
	uint64_t newest;            /* REFUSED_TAKEN: the newest version it took (WELCOME) */
	int v3_anchor;              /* REFUSED_TAKEN: version 3 came as an anchor */
	zmq_msg_t rid;
	int has_rid;
} F;

static void say_to(const dcast_msg *m)
{
	if (F.has_rid)
		dcast_wire_send(F.router, zmq_msg_data(&F.rid), zmq_msg_size(&F.rid), m, NULL, 0);
}

static void ack(uint64_t version)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_ACK);
	strcpy(m.u.ack.model, MODEL);
	m.u.ack.version = version;
	say_to(&m);
}

static void credit(uint64_t bytes)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_CREDIT);
	m.u.credit.bytes = bytes;
	say_to(&m);
}

/* HELLO: WELCOME, then the window (two chunks) as the first CREDIT. */
static void on_hello(dcast_wire_in *in)
{
	dcast_msg m;

	if (F.has_rid)
		zmq_msg_close(&F.rid);
	zmq_msg_init(&F.rid);
	zmq_msg_copy(&F.rid, &in->rid);
	F.has_rid = 1;
	atomic_fetch_add(&F.hellos, 1);
	dcast_msg_init(&m, DCAST_MSG_WELCOME);
	strcpy(m.u.welcome.model, MODEL);
	m.u.welcome.version = m.u.welcome.anchor_version = F.newest;
	m.u.welcome.heartbeat_ms = 60000;
	m.u.welcome.run = 0x1234;
	say_to(&m);
	credit(2 * RANGE * 2);
}

/* A CHUNK: its credit back (not on the first connection with STINGY_FIRST),
 * and with EARLY_ACK an ACK of its version at once, the first time. */
static void on_chunk(dcast_wire_in *in)
{
	if (!(F.mode & STINGY_FIRST) || atomic_load(&F.hellos) > 1)
		credit(zmq_msg_size(&in->payload));
	if ((F.mode & EARLY_ACK) && !atomic_exchange(&F.early_sent, 1))
		ack(in->msg.u.chunk.version);
	if ((F.mode & ERROR_MID) && !atomic_exchange(&F.early_sent, 1)) {
		dcast_msg m;
		dcast_msg_init(&m, DCAST_MSG_ERROR);
		m.u.error.code = DCAST_ECORRUPT;
		m.u.error.version = in->msg.u.chunk.version;
		strcpy(m.u.error.text, "refused mid-version (the version stays open here)");
		say_to(&m);
	}
}

/* REFUSED_TAKEN: version 2 is taken, but its producer told it was
 * refused; a delta on 1 after it is refused for its base. */
static void refused_taken(const dcast_commit *c)
{
	dcast_msg m;

	if (c->version == 3)
		F.v3_anchor = (int)c->anchor;
	if (c->version == 1 || (c->version == 3 && c->anchor)) {
		F.newest = c->version;
		ack(c->version);
		return;
	}
	F.newest = c->version == 2 ? 2 : F.newest;
	dcast_msg_init(&m, DCAST_MSG_ERROR);
	m.u.error.code = c->version == 2 ? DCAST_EIO : DCAST_EVERSION;
	m.u.error.version = c->version;
	strcpy(m.u.error.text, c->version == 2 ? "refused after its COMMIT (taken all the same)"
					       : "delta on 1, the newest is 2");
	say_to(&m);
}

static void on_commit(dcast_wire_in *in)
{
	if (F.mode & REFUSED_TAKEN) {
		refused_taken(&in->msg.u.commit);
		return;
	}
	if (F.mode & EARLY_ACK && !F.held_ack)
		F.held_ack = in->msg.u.commit.version; /* ACKed at `release` */
	else
		ack(in->msg.u.commit.version);
}

static void *broker_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&F.stop)) {
		dcast_wire_in in;
		zmq_pollitem_t it = {F.router, 0, ZMQ_POLLIN, 0};

		if (atomic_exchange(&F.release, 0)) { /* the held ACK, then one never deserved */
			ack(F.held_ack);
			ack(1000);
		}
		if (zmq_poll(&it, 1, 20) <= 0)
			continue;
		if (dcast_wire_recv(F.router, 1, &in, ZMQ_DONTWAIT) == 0) {
			if (in.msg.type == DCAST_MSG_HELLO)
				on_hello(&in);
			else if (in.msg.type == DCAST_MSG_CHUNK)
				on_chunk(&in);
			else if (in.msg.type == DCAST_MSG_COMMIT)
				on_commit(&in);
		}
		dcast_wire_in_close(&in);
	}
	return NULL;
}

static void broker_start(int mode)
{
	size_t len = sizeof(F.ep);

	memset(&F, 0, sizeof(F));
	F.mode = mode;
	F.newest = DCAST_VERSION_NONE;
	REQUIRE((F.ctx = zmq_ctx_new()) && (F.router = zmq_socket(F.ctx, ZMQ_ROUTER)));
	REQUIRE(zmq_bind(F.router, "tcp://127.0.0.1:*") == 0);
	REQUIRE(zmq_getsockopt(F.router, ZMQ_LAST_ENDPOINT, F.ep, &len) == 0);
	REQUIRE(pthread_create(&F.thread, NULL, broker_main, NULL) == 0);
}

static void broker_stop(void)
{
	int zero = 0;

	atomic_store(&F.stop, 1);
	pthread_join(F.thread, NULL);
	if (F.has_rid)
		zmq_msg_close(&F.rid);
	zmq_setsockopt(F.router, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_close(F.router);
	zmq_ctx_term(F.ctx);
}

static dcast_producer *producer(uint16_t *w)
{
	dcast_producer_opts o;
	dcast_producer *p = NULL;
	uint64_t shape[1] = {ELEMS};

	dcast_producer_opts_init(&o);
	o.range_elems = RANGE;
	o.ack_timeout_ms = 400;
	o.close_timeout_ms = 0;
	REQUIRE(dcast_producer_open(F.ep, MODEL, 0, 1, &o, &p) == 0);
	REQUIRE(dcast_producer_register(p, "w", DCAST_DTYPE_BF16, 1, shape, w, DCAST_MEM_HOST, 0, ELEMS) == 0);
	return p;
}

static void early_and_unpublished_acks(uint16_t *w)
{
	dcast_producer *p;

	broker_start(EARLY_ACK);
	p = producer(w);
	CHECK(dcast_producer_publish(p, 1) == 0);
	CHECK(dcast_producer_wait(p, 1, 300) == DCAST_ETIMEDOUT); /* the early ACK settled nothing */
	atomic_store(&F.release, 1);
	CHECK(dcast_producer_wait(p, 1, 5000) == 0);
	w[7] ^= 1;
	CHECK(dcast_producer_publish(p, 2) == 0); /* not above "1000": that ACK was dropped */
	CHECK(dcast_producer_wait(p, 2, 5000) == 0);
	CHECK(dcast_producer_broker_version(p) == 2);
	dcast_producer_close(&p);
	broker_stop();
}

static void credit_lost(uint16_t *w)
{
	dcast_producer *p;

	broker_start(STINGY_FIRST);
	p = producer(w);
	CHECK(dcast_producer_publish(p, 1) == 0); /* an anchor: sent from the baseline */
	CHECK(dcast_producer_wait(p, 1, 5000) == DCAST_ETIMEDOUT);
	CHECK(strstr(dcast_last_error(), "no credit") != NULL);
	CHECK(atomic_load(&F.hellos) == 1);
	w[9] ^= 1;
	CHECK(dcast_producer_publish(p, 2) == 0);
	CHECK(dcast_producer_wait(p, 2, 5000) == 0);
	CHECK(atomic_load(&F.hellos) == 2);
	dcast_producer_close(&p);
	broker_stop();
}

/* A version refused mid-version: the next one comes on a new session
 * (the broker may hold the refused one open on the old). */
static void refused_mid_version(uint16_t *w)
{
	dcast_producer *p;

	broker_start(ERROR_MID);
	p = producer(w);
	CHECK(dcast_producer_publish(p, 1) == 0);
	CHECK(dcast_producer_wait(p, 1, 5000) == DCAST_ECORRUPT);
	CHECK(atomic_load(&F.hellos) == 1);
	w[11] ^= 1;
	CHECK(dcast_producer_publish(p, 2) == 0);
	CHECK(dcast_producer_wait(p, 2, 5000) == 0);
	CHECK(atomic_load(&F.hellos) == 2);
	dcast_producer_close(&p);
	broker_stop();
}

/* A version refused after its COMMIT went out, which the broker took all
 * the same (its ACK lost): the next version comes on a new session, whose
 * WELCOME names 2, so it goes as an anchor; on the old session every delta
 * on 1 would be refused. */
static void refused_after_commit(uint16_t *w)
{
	dcast_producer *p;

	broker_start(REFUSED_TAKEN);
	p = producer(w);
	CHECK(dcast_producer_publish(p, 1) == 0 && dcast_producer_wait(p, 1, 5000) == 0);
	w[13] ^= 1;
	CHECK(dcast_producer_publish(p, 2) == 0);
	CHECK(dcast_producer_wait(p, 2, 5000) == DCAST_EIO);
	w[14] ^= 1;
	CHECK(dcast_producer_publish(p, 3) == 0);
	CHECK(dcast_producer_wait(p, 3, 5000) == 0);
	CHECK(F.v3_anchor == 1);
	CHECK(atomic_load(&F.hellos) == 2);
	dcast_producer_close(&p);
	broker_stop();
}

int main(void)
{
	static uint16_t w[ELEMS];

	alarm(60);
	tp_install();
	for (uint32_t i = 0; i < ELEMS; i++)
		w[i] = (uint16_t)(0x3c00 + i % 1024);
	early_and_unpublished_acks(w);
	credit_lost(w);
	refused_mid_version(w);
	refused_after_commit(w);
	return check_done("test_producer_hostile");
}
