/* fuzz_producer: a live, seeded fuzzer of the producer library against a
 * broker that lies.  A real broker (deltacast-broker from
 * $DELTACAST_BUILD) keeps the log; between it and a real producer in this
 * process sits a proxy (a ROUTER facing the producer, a DEALER to the
 * broker per producer connection, on a thread of its own) that forwards
 * the producer's messages as they are (now and then on a new DEALER: the
 * broker's session lost, as after its restart) and damages what the
 * broker says back: messages dropped, repeated; ACK, CREDIT, WELCOME, ERROR and
 * HEARTBEAT fields changed; header bits flipped; and messages the broker
 * never sent dropped in: ACKs of the version in flight before its COMMIT
 * went out, ACKs of versions never published, ERRORs with any code, BYE,
 * WELCOMEs with other versions, runs and flags, CREDIT of 0 or 2^64 - 1,
 * HEARTBEATs naming versions not committed, messages a producer never
 * gets.
 *
 * Each round: a model of its own ("fp-R"), a producer on the proxy, and a
 * dirty phase of a few versions (publish, then wait); every call may fail,
 * but with an error that names its cause, and nothing may crash.  Then
 * the proxy forwards cleanly and the same producer publishes again: one
 * of six versions, a second apart after a failure, must be acknowledged
 * (the broker drops a version a lie left open after 3 s without progress,
 * --part-timeout-ms).  Last, a fresh consumer of the
 * real broker must reach that version, every version it applies equal bit
 * for bit to what the producer published under that number.  A crash, a
 * sanitizer report, an error without a text, a producer that does not
 * recover, or a consumer that does not reach the version bit-exact fails
 * the run, naming the seed and round (--seed S --start-round R replays
 * it).
 *
 *   fuzz_producer [--seed S] [--seconds T] [--rounds N] [--start-round R]
 *                 [--parts P] [--dir DIR]
 * --parts P (1 to 4): the model published by P producers, each part a
 * slice of every tensor (as tensor-parallel ranks publish), each on its
 * own connection through the proxy; a version is taken when every part's
 * wait() says so.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "../consumer_harness.h"
#include "dcast_common.h"
#include "dcast_wire.h"

#define MAX_PARTS 4          /* frames of one message forwarded */
#define MAX_BACKS 8          /* producer connections the proxy holds */
#define MAX_PRODUCERS 4      /* --parts */
#define DIRTY_MAX 10         /* versions of a dirty phase, at most */
#define CLEAN_TRIES 6        /* versions the clean phase may take */
#define CLEAN_PAUSE_MS 1000  /* after a failed one: a trainer's next step */
#define PART_TIMEOUT "3000"  /* the broker's --part-timeout-ms: a version a
				lie left open (a part told it was taken) is
				dropped within the honest phase */
#define VERSION_LAST 31      /* h_model keeps snapshots of 1..31 */
#define HUGE_VERSION (1ull << 40)

static struct {
	uint64_t seed, seconds, rounds, start_round, parts;
	const char *dir;
} o = {.seconds = 60, .rounds = UINT64_MAX, .parts = 1, .dir = "/tmp"};

/* The proxy: its sockets are its thread's; the main thread sets `dirty`
 * and `stop`, and reads the counters once the thread is joined or between
 * rounds (atomics). */
static struct {
	void *ctx, *front;
	char ep[128];
	const char *broker_ep;
	struct back {                      /* a DEALER to the broker per producer connection */
		unsigned char rid[256];
		size_t rid_len;
		void *sock;                /* NULL: free */
		uint64_t used;
	} backs[MAX_BACKS];
	uint64_t tick;
	pthread_t thread;
	atomic_int dirty, stop;
	atomic_uint_fast64_t seen_version; /* the newest CHUNK/COMMIT version from the producer */
	atomic_uint_fast64_t passed, damaged, forged, cuts;
	atomic_uint_fast64_t reseed;       /* set by the main thread: the round's seed */
	uint64_t rng;                      /* the proxy thread's */
	char model[DCAST_MAX_NAME + 1];
} P;

static uint64_t main_rng; /* the main thread's */

static uint64_t rnd(uint64_t n)
{
	return n ? h_rand(&P.rng) % n : 0;
}

static uint64_t main_rnd(uint64_t n)
{
	return n ? h_rand(&main_rng) % n : 0;
}

/* ---- what the proxy says that the broker did not ---- */

static uint64_t lie_version(void)
{
	uint64_t v = atomic_load(&P.seen_version);
	static const int64_t step[] = {0, 0, 1, -1, 2};

	if (rnd(8) == 0)
		return rnd(2) ? DCAST_VERSION_NONE : HUGE_VERSION + rnd(1000);
	if (v == DCAST_VERSION_NONE)
		return 1 + rnd(3);
	return v + (uint64_t)step[rnd(5)];
}

static void forge_welcome(dcast_msg *m)
{
	dcast_msg_init(m, DCAST_MSG_WELCOME);
	snprintf(m->u.welcome.model, sizeof(m->u.welcome.model), "%s", P.model);
	m->u.welcome.version = lie_version(); /* a lie no producer can see: kept near the truth */
	if (m->u.welcome.version != DCAST_VERSION_NONE && m->u.welcome.version >= HUGE_VERSION)
		m->u.welcome.version = 1 + rnd(2);
	m->u.welcome.anchor_version = rnd(2) ? m->u.welcome.version : DCAST_VERSION_NONE;
	m->u.welcome.need_anchor = (uint32_t)rnd(2);
	m->u.welcome.heartbeat_ms = (uint32_t)(rnd(3) ? 500 + rnd(2000) : rnd(3));
	m->u.welcome.run = rnd(2) ? 1 + rnd(UINT32_MAX) : 0;
}

static void forge_error(dcast_msg *m)
{
	dcast_msg_init(m, DCAST_MSG_ERROR);
	m->u.error.code = (uint32_t)(rnd(4) ? 1 + rnd(DCAST_ERR_COUNT - 1) : DCAST_ESTATE);
	m->u.error.version = rnd(3) ? lie_version() : DCAST_VERSION_NONE;
	snprintf(m->u.error.model, sizeof(m->u.error.model), "%s", P.model);
	snprintf(m->u.error.text, sizeof(m->u.error.text), "forged by fuzz_producer");
}

/* A message the broker never sent, for the producer now. */
static void forge(dcast_msg *m)
{
	static const uint64_t credits[] = {0, 1, UINT64_MAX, 1u << 20, UINT64_MAX / 2};

	switch (rnd(9)) {
	case 0:
	case 1: /* an ACK: of the version in flight, often before its COMMIT */
		dcast_msg_init(m, DCAST_MSG_ACK);
		snprintf(m->u.ack.model, sizeof(m->u.ack.model), "%s", P.model);
		m->u.ack.version = lie_version();
		break;
	case 2:
		forge_error(m);
		break;
	case 3:
		dcast_msg_init(m, DCAST_MSG_BYE);
		snprintf(m->u.bye.reason, sizeof(m->u.bye.reason), "forged");
		break;
	case 4:
		forge_welcome(m);
		break;
	case 5:
		dcast_msg_init(m, DCAST_MSG_CREDIT);
		m->u.credit.bytes = credits[rnd(5)];
		break;
	case 6:
		dcast_msg_init(m, DCAST_MSG_HEARTBEAT);
		m->u.heartbeat.version = lie_version();
		break;
	case 7: /* what a producer is never sent */
		dcast_msg_init(m, rnd(2) ? DCAST_MSG_BULK : DCAST_MSG_HELLO);
		break;
	default:
		dcast_msg_init(m, DCAST_MSG_ERROR);
		m->u.error.code = DCAST_ESTATE;
		m->u.error.version = DCAST_VERSION_NONE;
		snprintf(m->u.error.text, sizeof(m->u.error.text), "forged: session lost");
	}
}

/* One field of a message the broker sent, changed. */
static void mutate(dcast_msg *m)
{
	switch (m->type) {
	case DCAST_MSG_ACK:
		m->u.ack.version = rnd(2) ? lie_version() : m->u.ack.version + 1 + rnd(3);
		if (rnd(4) == 0)
			m->u.ack.part = (uint32_t)rnd(8);
		break;
	case DCAST_MSG_CREDIT:
		m->u.credit.bytes = rnd(2) ? m->u.credit.bytes * (2 + rnd(1u << 20)) : rnd(m->u.credit.bytes + 1);
		break;
	case DCAST_MSG_WELCOME:
		if (rnd(2))
			m->u.welcome.version = m->u.welcome.version + 1 - rnd(3); /* a lie no producer can see: kept near the truth */
	if (m->u.welcome.version != DCAST_VERSION_NONE && m->u.welcome.version >= HUGE_VERSION)
		m->u.welcome.version = 1 + rnd(2);
		else if (rnd(2))
			m->u.welcome.need_anchor ^= 1;
		else
			m->u.welcome.run ^= 1 + rnd(UINT32_MAX);
		break;
	case DCAST_MSG_ERROR:
		m->u.error.version = lie_version();
		break;
	case DCAST_MSG_HEARTBEAT:
		m->u.heartbeat.version = lie_version();
		break;
	default:
		break;
	}
}

/* ---- the proxy's thread ---- */

static int recv_parts(void *s, zmq_msg_t *part, int *n)
{
	int more = 1;

	for (*n = 0; more; (*n)++) {
		zmq_msg_t *p = &part[*n < MAX_PARTS ? *n : MAX_PARTS - 1];
		if (*n >= MAX_PARTS)
			zmq_msg_close(p);
		zmq_msg_init(p);
		if (zmq_msg_recv(p, s, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(p);
			return -1;
		}
		more = zmq_msg_more(p);
	}
	if (*n > MAX_PARTS)
		*n = MAX_PARTS;
	return 0;
}

static void close_parts(zmq_msg_t *part, int n, int from)
{
	for (int i = from; i < n; i++)
		zmq_msg_close(&part[i]);
}

/* Send parts[from..n) on s, after a routing id when rid is given; the
 * parts are copied, not consumed. */
static void send_parts(void *s, const void *rid, size_t rid_len, zmq_msg_t *part, int n, int from)
{
	if (rid)
		zmq_send(s, rid, rid_len, n > from ? ZMQ_SNDMORE : 0);
	for (int i = from; i < n; i++) {
		zmq_msg_t c;
		zmq_msg_init(&c);
		zmq_msg_copy(&c, &part[i]);
		if (zmq_msg_send(&c, s, i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
			zmq_msg_close(&c);
	}
}

/* A DEALER to the broker for the producer connection `rid`, found or
 * made (the least recently used one closed when all are taken: a
 * re-joined producer is a new connection).  NULL: none could be made. */
static struct back *back_for(const zmq_msg_t *rid)
{
	size_t len = zmq_msg_size((zmq_msg_t *)rid);
	struct back *k = &P.backs[0];
	int zero = 0;

	for (int i = 0; i < MAX_BACKS; i++) {
		struct back *b = &P.backs[i];
		if (b->sock && b->rid_len == len && !memcmp(b->rid, zmq_msg_data((zmq_msg_t *)rid), len)) {
			b->used = ++P.tick;
			return b;
		}
		k = !b->sock || (k->sock && b->used < k->used) ? b : k;
	}
	if (k->sock)
		zmq_close(k->sock);
	if (len > sizeof(k->rid) || !(k->sock = zmq_socket(P.ctx, ZMQ_DEALER)))
		return NULL;
	zmq_setsockopt(k->sock, ZMQ_LINGER, &zero, sizeof(zero));
	memcpy(k->rid, zmq_msg_data((zmq_msg_t *)rid), len);
	k->rid_len = len;
	k->used = ++P.tick;
	if (zmq_connect(k->sock, P.broker_ep)) {
		zmq_close(k->sock);
		k->sock = NULL;
	}
	return k->sock ? k : NULL;
}

static void send_msg(const struct back *b, const dcast_msg *m)
{
	if (dcast_wire_send(P.front, b->rid, b->rid_len, m, NULL, ZMQ_DONTWAIT) == 0)
		atomic_fetch_add(&P.forged, 1);
}

static void to_producer(const struct back *b, zmq_msg_t *part, int n)
{
	send_parts(P.front, b->rid, b->rid_len, part, n, 0);
}

/* The broker loses the session of b's producer: its next message goes on
 * a new connection, which the broker has not welcomed. */
static void cut(struct back *b)
{
	zmq_close(b->sock);
	b->sock = NULL;
	atomic_fetch_add(&P.cuts, 1);
}

static void note_version(const zmq_msg_t *hdr)
{
	dcast_msg m;

	if (dcast_msg_decode(zmq_msg_data((zmq_msg_t *)hdr), zmq_msg_size((zmq_msg_t *)hdr), &m))
		return;
	if (m.type == DCAST_MSG_CHUNK)
		atomic_store(&P.seen_version, m.u.chunk.version);
	else if (m.type == DCAST_MSG_COMMIT)
		atomic_store(&P.seen_version, m.u.commit.version);
	dcast_msg_free(&m);
}

/* The producer's message: to the broker as it is; its version noted, and
 * now and then a lie told to the producer at once (an ACK before the
 * COMMIT, above all). */
static void from_producer(void)
{
	zmq_msg_t part[MAX_PARTS];
	struct back *b;
	dcast_msg m;
	int n;

	if (recv_parts(P.front, part, &n))
		return;
	if (n >= 2 && (b = back_for(&part[0]))) {
		if (atomic_load(&P.dirty) && rnd(60) == 0) {
			cut(b);
			b = back_for(&part[0]);
		}
		if (b)
			send_parts(b->sock, NULL, 0, part, n, 1);
		note_version(&part[1]);
		if (b && atomic_load(&P.dirty) && rnd(12) == 0) {
			forge(&m);
			send_msg(b, &m);
		}
	}
	close_parts(part, n, 0);
}

/* Flip one bit of the header frame and send it on. */
static void send_flipped(const struct back *b, zmq_msg_t *part, int n)
{
	zmq_msg_t c;

	zmq_msg_init_size(&c, zmq_msg_size(&part[0]));
	memcpy(zmq_msg_data(&c), zmq_msg_data(&part[0]), zmq_msg_size(&c));
	if (zmq_msg_size(&c))
		((unsigned char *)zmq_msg_data(&c))[rnd(zmq_msg_size(&c))] ^= (unsigned char)(1u << rnd(8));
	zmq_msg_close(&part[0]);
	part[0] = c;
	to_producer(b, part, n);
}

/* The broker's message, damaged or not, to b's producer. */
static void damage(const struct back *b, zmq_msg_t *part, int n)
{
	uint64_t r = rnd(100);
	dcast_msg m;

	atomic_fetch_add(&P.damaged, 1);
	if (r < 15) /* dropped */
		return;
	if (r < 30) { /* repeated */
		to_producer(b, part, n);
		to_producer(b, part, n);
		return;
	}
	if (r < 40) {
		send_flipped(b, part, n);
		return;
	}
	if (r < 70 && n == 1 && !dcast_msg_decode(zmq_msg_data(&part[0]), zmq_msg_size(&part[0]), &m)) {
		mutate(&m);
		send_msg(b, &m);
		dcast_msg_free(&m);
		return;
	}
	forge(&m); /* something before it */
	send_msg(b, &m);
	to_producer(b, part, n);
}

static void from_broker(const struct back *b)
{
	zmq_msg_t part[MAX_PARTS];
	int n;

	if (recv_parts(b->sock, part, &n))
		return;
	if (atomic_load(&P.dirty) && rnd(3) == 0)
		damage(b, part, n);
	else {
		to_producer(b, part, n);
		atomic_fetch_add(&P.passed, 1);
	}
	close_parts(part, n, 0);
}

/* One wait for the sockets, and what they hold handled. */
static void proxy_turn(void)
{
	zmq_pollitem_t it[1 + MAX_BACKS] = {{P.front, 0, ZMQ_POLLIN, 0}};
	struct back *of[1 + MAX_BACKS];
	int n = 1;

	for (int i = 0; i < MAX_BACKS; i++)
		if (P.backs[i].sock) {
			of[n] = &P.backs[i];
			it[n++] = (zmq_pollitem_t){P.backs[i].sock, 0, ZMQ_POLLIN, 0};
		}
	if (zmq_poll(it, n, 50) <= 0)
		return;
	if (it[0].revents & ZMQ_POLLIN)
		from_producer();
	for (int i = 1; i < n; i++)
		if ((it[i].revents & ZMQ_POLLIN) && of[i]->sock == it[i].socket)
			from_broker(of[i]);
}

static void *proxy_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&P.stop)) {
		uint64_t seed = atomic_exchange(&P.reseed, 0);
		if (seed)
			P.rng = seed;
		proxy_turn();
	}
	for (int i = 0; i < MAX_BACKS; i++)
		if (P.backs[i].sock)
			zmq_close(P.backs[i].sock);
	return NULL;
}

static int proxy_start(const char *broker_ep)
{
	size_t len = sizeof(P.ep);
	int zero = 0;

	P.broker_ep = broker_ep;
	P.seen_version = DCAST_VERSION_NONE;
	if (!(P.ctx = zmq_ctx_new()) || !(P.front = zmq_socket(P.ctx, ZMQ_ROUTER)) ||
	    zmq_setsockopt(P.front, ZMQ_LINGER, &zero, sizeof(zero)) ||
	    zmq_bind(P.front, "tcp://127.0.0.1:*") || zmq_getsockopt(P.front, ZMQ_LAST_ENDPOINT, P.ep, &len))
		return -1;
	return pthread_create(&P.thread, NULL, proxy_main, NULL);
}

static void proxy_stop(void)
{
	atomic_store(&P.stop, 1);
	pthread_join(P.thread, NULL);
	zmq_close(P.front);
	zmq_ctx_term(P.ctx);
}

/* ---- a round ---- */

/* The producers of a round: parts of one model, each a slice of every
 * tensor. */
struct team {
	dcast_producer *p[MAX_PRODUCERS];
	uint32_t n;
};

/* Part k of t->n: its slice of each of m's tensors registered. */
static int open_part(const char *model, h_model *m, struct team *t, uint32_t k)
{
	dcast_producer_opts op;
	int err;

	dcast_producer_opts_init(&op);
	op.range_elems = h_range_elems;
	op.connect_timeout_ms = 2000;
	op.ack_timeout_ms = 2000;
	op.reconnect_backoff_ms = 20;
	op.close_timeout_ms = 200;
	op.encode_threads = 2;
	if ((err = dcast_producer_open(P.ep, model, k, t->n, &op, &t->p[k])))
		return err;
	for (int i = 0; i < H_TENSORS && !err; i++) {
		uint64_t esize = dcast_dtype_size(m->dtype[i]) * dcast_dtype_lanes(m->dtype[i]);
		uint64_t elems = m->bytes[i] / esize, at = elems * k / t->n, end = elems * (k + 1) / t->n;
		err = dcast_producer_register(t->p[k], m->name[i], m->dtype[i], m->ndim[i], m->shape[i],
					      m->cur[i] + at * esize, DCAST_MEM_HOST, at, end - at);
	}
	return err;
}

static void close_team(struct team *t)
{
	for (uint32_t k = 0; k < t->n; k++)
		dcast_producer_close(&t->p[k]);
}

static int open_team(const char *model, h_model *m, struct team *t)
{
	int err = 0;

	for (uint32_t k = 0; k < t->n && !err; k++)
		err = open_part(model, m, t, k);
	if (err)
		close_team(t);
	return err;
}

/* The broker's newest version as the parts count it: the highest. */
static uint64_t team_broker_version(const struct team *t)
{
	uint64_t b = DCAST_VERSION_NONE;

	for (uint32_t k = 0; k < t->n; k++) {
		uint64_t v = dcast_producer_broker_version(t->p[k]);
		if (v != DCAST_VERSION_NONE && (b == DCAST_VERSION_NONE || v > b))
			b = v;
	}
	return b;
}

/* An error must say what it is. */
static int named(int rc, const char *call, uint64_t v)
{
	const char *e = dcast_last_error();

	if (!rc || (e && e[0]))
		return 0;
	tp_say("fuzz_producer: %s(%" PRIu64 ") returned %s with no text", call, v, dcast_errname(rc));
	return -1;
}

/* One part's publish of a version and its wait, on a thread of its own
 * (tensor-parallel ranks publish at once): its result and its text. */
struct part_call {
	dcast_producer *p;
	uint64_t v;
	int wait_ms, rc, bad;
	char text[DCAST_MAX_TEXT + 1];
};

static void *part_main(void *arg)
{
	struct part_call *c = arg;

	c->rc = dcast_producer_publish(c->p, c->v);
	c->bad |= named(c->rc, "publish", c->v);
	if (!c->rc) {
		c->rc = dcast_producer_wait(c->p, c->v, c->wait_ms);
		c->bad |= named(c->rc, "wait", c->v);
	}
	snprintf(c->text, sizeof(c->text), "%s", c->rc ? dcast_last_error() : "");
	return NULL;
}

/* Publish version v of m (its step taken, its snapshot kept) from every
 * part at once, each then waiting up to wait_ms; the first part's error
 * (its text in dcast_last_error()), each checked for a text. */
static int publish(struct team *t, h_model *m, uint64_t v, int wait_ms, int *bad)
{
	struct part_call c[MAX_PRODUCERS];
	pthread_t th[MAX_PRODUCERS];
	int started[MAX_PRODUCERS], first = -1;

	h_model_step(m, 100);
	h_model_snap(m, v);
	for (uint32_t k = 0; k < t->n; k++) {
		c[k] = (struct part_call){.p = t->p[k], .v = v, .wait_ms = wait_ms};
		started[k] = t->n > 1 && !pthread_create(&th[k], NULL, part_main, &c[k]);
		if (!started[k])
			part_main(&c[k]);
	}
	for (uint32_t k = 0; k < t->n; k++) {
		if (started[k])
			pthread_join(th[k], NULL);
		*bad |= c[k].bad;
		first = first < 0 && c[k].rc ? (int)k : first;
	}
	if (first < 0)
		return 0;
	dcast_fail(c[first].rc, "part %d: %s", first, c[first].text);
	return c[first].rc;
}

/* The dirty phase: versions published while the proxy lies; the next
 * version to publish. */
static uint64_t dirty_phase(struct team *p, h_model *m, uint64_t n, int *bad)
{
	uint64_t v = 1;

	atomic_store(&P.dirty, 1);
	for (uint64_t k = 0; k < n && v + CLEAN_TRIES <= VERSION_LAST && !*bad; k++, v++)
		publish(p, m, v, 300 + (int)main_rnd(1500), bad);
	atomic_store(&P.dirty, 0);
	return v;
}

/* The clean phase: one of CLEAN_TRIES versions acknowledged; *acked it. */
static int clean_phase(struct team *p, h_model *m, uint64_t v, uint64_t *acked, int *bad)
{
	uint64_t b;
	int rc = -1;

	for (int k = 0; k < CLEAN_TRIES && rc && !*bad; k++, v++) {
		if (v > VERSION_LAST)
			break;
		rc = publish(p, m, v, 20000, bad);
		if (rc) {
			tp_say("fuzz_producer: clean version %" PRIu64 ": %s: %s", v, dcast_errname(rc),
			       dcast_last_error());
			tp_sleep_ms(CLEAN_PAUSE_MS);
		} else {
			*acked = v;
		}
		b = team_broker_version(p); /* a WELCOME's lie is the broker's word */
		if (rc == DCAST_EVERSION && b != DCAST_VERSION_NONE && b > v && b < VERSION_LAST)
			v = b;
	}
	return rc;
}

/* A fresh consumer of the real broker reaches `version`, each version it
 * applies bit-exact. */
static int consumer_check(const char *consumers, const char *model, const h_model *m, uint64_t version,
			  const char *dir)
{
	dcast_consumer *c = NULL;
	h_seen seen = {0};
	int rc;

	if ((rc = dcast_consumer_open(consumers, model, dir, 1u << 22, NULL, &c))) {
		tp_say("fuzz_producer: consumer open: %s", dcast_last_error());
		return -1;
	}
	rc = h_drive(c, m, version, &seen);
	if (rc || seen.untouched_bad || !h_equal(c, m, version)) {
		tp_say("fuzz_producer: the consumer holds %" PRId64 ", wanted %" PRIu64 " bit-exact (%d refusals "
		    "with other tensors, last error %s)", (int64_t)dcast_consumer_version(c), version,
		    seen.untouched_bad, dcast_errname(seen.last_error));
		rc = -1;
	}
	dcast_consumer_close(&c);
	return rc;
}

static int round_run(const tp_broker *b, uint64_t round)
{
	char model[64], dir[600], cmd[700];
	struct team p = {.n = (uint32_t)o.parts};
	uint64_t acked = DCAST_VERSION_NONE, v;
	h_model m;
	int bad = 0;

	main_rng = (o.seed * 0x9e3779b97f4a7c15ull) ^ (round + 1) * 0xbf58476d1ce4e5b9ull;
	atomic_store(&P.reseed, main_rng ^ 0x94d049bb133111ebull);
	snprintf(model, sizeof(model), "fp-%" PRIu64, round);
	snprintf(P.model, sizeof(P.model), "%s", model);
	snprintf(dir, sizeof(dir), "%s/fuzz_producer.%d.%" PRIu64, o.dir, (int)getpid(), round);
	atomic_store(&P.seen_version, DCAST_VERSION_NONE);
	h_model_init(&m, o.seed + round, 1);
	if (open_team(model, &m, &p)) {
		tp_say("fuzz_producer: round %" PRIu64 ": producer open: %s", round, dcast_last_error());
		h_model_free(&m);
		return -1;
	}
	v = dirty_phase(&p, &m, 2 + main_rnd(DIRTY_MAX - 1), &bad);
	if (!bad && clean_phase(&p, &m, v, &acked, &bad))
		bad = 1;
	close_team(&p);
	if (!bad && consumer_check(b->consumers, model, &m, acked, dir))
		bad = 1;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (!bad && system(cmd) != 0)
		tp_say("fuzz_producer: could not remove %s", dir);
	h_model_free(&m);
	return bad ? -1 : 0;
}

static int parse(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (tp_arg_u64(argc, argv, &i, "--seed", &o.seed) || tp_arg_u64(argc, argv, &i, "--seconds", &o.seconds) ||
		    tp_arg_u64(argc, argv, &i, "--rounds", &o.rounds) ||
		    tp_arg_u64(argc, argv, &i, "--start-round", &o.start_round) ||
		    tp_arg_u64(argc, argv, &i, "--parts", &o.parts))
			continue;
		if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
			o.dir = argv[++i];
			continue;
		}
		fprintf(stderr, "usage: fuzz_producer [--seed S] [--seconds T] [--rounds N] [--start-round R] "
				"[--parts P] [--dir DIR]\n");
		return -1;
	}
	if (o.parts < 1 || o.parts > MAX_PRODUCERS) {
		fprintf(stderr, "fuzz_producer: --parts %" PRIu64 ": 1 to %d\n", o.parts, MAX_PRODUCERS);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	/* a model per round, removed once idle: a long run outlasts --max-models */
	static char *const broker_args[] = {"--max-models", "256", "--model-idle-s", "1",
					    "--part-timeout-ms", PART_TIMEOUT, NULL};
	uint64_t end, round, failed = 0;
	tp_broker b;

	if (parse(argc, argv))
		return 2;
	setenv("DELTACAST_LOG", getenv("DELTACAST_LOG") ? getenv("DELTACAST_LOG") : "error", 0);
	tp_install();
	if (h_broker_start_args(&b, broker_args) || proxy_start(b.producers))
		return 2;
	end = dcast_now_ms() + o.seconds * 1000;
	for (round = o.start_round; round < o.start_round + o.rounds && dcast_now_ms() < end && !failed; round++)
		if (round_run(&b, round)) {
			tp_say("fuzz_producer: FAILED in round %" PRIu64 ": replay with --seed %" PRIu64
			    " --start-round %" PRIu64 " --rounds 1 (broker log %s)", round, o.seed, round, b.log);
			failed = 1;
		}
	proxy_stop();
	if (!failed && kill(b.pid, 0)) {
		tp_say("fuzz_producer: the broker is gone");
		failed = 1;
	}
	check_failures += (int)failed; /* h_broker_stop shows the log's tail */
	h_broker_stop(&b);
	printf("fuzz_producer: seed %" PRIu64 ", %" PRIu64 " parts, %" PRIu64 " rounds, %" PRIu64 " messages passed, %" PRIu64
	       " damaged, %" PRIu64 " forged, %" PRIu64 " sessions cut: %s\n", o.seed, o.parts, round - o.start_round,
	       (uint64_t)P.passed, (uint64_t)P.damaged, (uint64_t)P.forged, (uint64_t)P.cuts,
	       failed ? "FAILED" : "ok");
	return failed ? 1 : 0;
}
