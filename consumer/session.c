/* The broker session, run by the consumer's own thread (session_main),
 * which alone touches the socket: HELLO / WELCOME, MANIFEST, CHUNK and
 * COMMIT handed to the version state machine (intake.c), an anchor's
 * frames read from a bulk connection instead (BULK, bulk.c), credit that
 * follows freed pool bytes, heartbeats, the folds it asks of the store
 * when due, and the re-join on a message that does not decode or a
 * stalled stream (docs/protocol.md, "Consumer and broker").  Messages that
 * arrive after a re-join's HELLO and before its WELCOME belong to the old
 * stream and are dropped.  A HELLO left without a WELCOME, or a broker
 * gone silent, gets a new socket: ZeroMQ gives up on a connection for
 * good after a protocol error (a damaged frame header, an oversized
 * frame), and such a socket would never reach the broker again. */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "store/store.h"
#include "dcast_wire.h"

#define RECV_BURST 64
/* Payload bytes a turn reads from a bulk connection, about (a frame is
 * read whole): a local one's preads never wait, and the turn holds the
 * consumer's lock. */
#define BULK_TURN_BYTES (32u << 20)

static int send_msg(dcast_consumer *c, const dcast_msg *m)
{
	int err = dcast_wire_send(c->ss.sock, NULL, 0, m, NULL, ZMQ_DONTWAIT);

	if (!err)
		c->ss.last_send_ms = dcast_now_ms();
	else if (err == DCAST_EBUSY)
		err = 0; /* not connected yet or queue full: heartbeat/rejoin retries */
	return err;
}

static int set_curve(dcast_consumer *c)
{
	const dcast_consumer_opts *o = &c->opts;

	if (!o->curve_server_key)
		return 0;
	if (zmq_setsockopt(c->ss.sock, ZMQ_CURVE_SERVERKEY, o->curve_server_key, 40) ||
	    zmq_setsockopt(c->ss.sock, ZMQ_CURVE_PUBLICKEY, o->curve_public_key, 40) ||
	    zmq_setsockopt(c->ss.sock, ZMQ_CURVE_SECRETKEY, o->curve_secret_key, 40))
		return dcast_fail(DCAST_EINVAL, "CURVE keys (Z85, 40 characters): %s", zmq_strerror(errno));
	return 0;
}

/* A new DEALER connected to the broker, in place of the old one (closed,
 * its queued messages dropped: linger 0). */
static int socket_open(dcast_consumer *c)
{
	int err;

	if (c->ss.sock)
		zmq_close(c->ss.sock);
	if (!(c->ss.sock = zmq_socket(c->ss.zctx, ZMQ_DEALER)))
		return dcast_fail(DCAST_EZMQ, "zmq socket: %s", zmq_strerror(errno));
	if ((err = dcast_wire_socket_opts(c->ss.sock)) || (err = set_curve(c)))
		return err;
	if (zmq_connect(c->ss.sock, c->endpoint))
		return dcast_fail(DCAST_EZMQ, "connect %s: %s", c->endpoint, zmq_strerror(errno));
	return 0;
}

/* The newest version we hold: the end of the READY chain, else the
 * applied one. */
static uint64_t held_version(const dcast_consumer *c)
{
	uint32_t n = cs_ready_chain(c);

	return n ? c->staged[n - 1].version : dcast_consumer_version(c);
}

/* HELLO never blocks: unsent (no peer, queue full) it is sent again, on a
 * new socket, when no WELCOME came (keepalive).  Session thread only. */
static int send_hello(dcast_consumer *c)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HELLO);
	m.u.hello.role = DCAST_ROLE_CONSUMER;
	snprintf(m.u.hello.model, sizeof(m.u.hello.model), "%s", c->model);
	m.u.hello.have_version = held_version(c); /* applied, or READY after it */
	m.u.hello.window_bytes = c->ss.window_bytes;
	snprintf(m.u.hello.client, sizeof(m.u.hello.client), "%s", c->opts.client ? c->opts.client : "");
	m.u.hello.bulk = (uint32_t)cs_bulk_wanted(c);
	c->ss.welcomed = 0;
	c->ss.hello_ms = dcast_now_ms();
	c->ob.hello_due = 0;
	c->ss.hellos++;
	return send_msg(c, &m);
}

static uint32_t ready_count(const dcast_consumer *c)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < c->n_staged; i++)
		n += c->staged[i].state == CS_V_READY;
	return n;
}

/* Every staging slot holds a READY version: the next message could only
 * begin another, so the socket is left unread until apply() frees a slot.
 * ZeroMQ's queue and the broker's credit hold the rest back (a log of
 * hundreds of small versions is taken 16 at a time, not refused and sent
 * again forever). */
static int intake_full(const dcast_consumer *c)
{
	return c->n_staged == CS_MAX_STAGED && c->staged[CS_MAX_STAGED - 1].state == CS_V_READY;
}

static int flush_credit(dcast_consumer *c)
{
	dcast_msg m;

	if (!c->ss.credit_pending || !c->ss.welcomed || ready_count(c) >= c->opts.max_staged)
		return 0;
	dcast_msg_init(&m, DCAST_MSG_CREDIT);
	m.u.credit.bytes = c->ss.credit_pending;
	c->ss.credit_pending = 0;
	c->ss.progress_ms = dcast_now_ms(); /* the broker may send again: not stalled yet */
	return send_msg(c, &m);
}


/* Is this chunk or commit for something we do not want?  Gives its credit back. */
static int unwanted(dcast_consumer *c, uint64_t version, uint64_t payload_bytes)
{
	uint64_t have = dcast_consumer_version(c);

	if ((have != DCAST_VERSION_NONE && version <= have) || version == c->ss.drop_version) {
		cs_credit_free(c, version, payload_bytes);
		return 1;
	}
	return 0;
}

static int on_chunk(dcast_consumer *c, dcast_wire_in *in)
{
	const dcast_chunk *h = &in->msg.u.chunk;

	if (unwanted(c, h->version, h->payload_bytes))
		return 0;
	c->ss.chunk_ms = dcast_now_ms();
	return cs_intake_chunk(c, h, &in->payload, cs_bulk_landed(c, &in->payload));
}

static int on_commit(dcast_consumer *c, dcast_wire_in *in)
{
	dcast_commit *m = &in->msg.u.commit;
	int ready, err;

	if (unwanted(c, m->version, 0)) {
		if (m->version == c->ss.drop_version)
			c->ss.drop_version = DCAST_VERSION_NONE;
		return 0;
	}
	err = cs_intake_commit(c, m, &ready);
	if (ready)
		c->ss.progress_ms = dcast_now_ms();
	if (ready && m->anchor && c->bulk.off && !cs_bulk_active(c)) {
		c->bulk.off = 0; /* the next HELLO asks again */
		DCAST_LOG_I("consumer %s: anchor %" PRIu64 " taken over ZeroMQ; bulk on again",
			    c->model, m->version);
	}
	return err;
}

/* A MANIFEST the consumer cannot take (unlike the tensors it holds, too
 * large for its memory) is refused and read again once (one damaged on
 * the way fails its sum as it is decoded: bad_message).  The same
 * refusal again is persistent, and backed off (cs_rejoin_refused); tensors
 * held are never replaced. */
static int on_manifest(dcast_consumer *c, dcast_wire_in *in)
{
	int err = cs_manifest_take(c, &in->msg.u.manifest);

	c->ss.progress_ms = dcast_now_ms();
	if (!err) {
		cs_refusal_clear(c, CS_REFUSED_MANIFEST);
		return 0;
	}
	if (err == DCAST_ESHAPE)
		dcast_fail(err, "MANIFEST of %s differs from the tensors this consumer holds (checkpoint in %s); "
			   "start with an empty directory", c->model, c->dir);
	DCAST_LOG_W("consumer %s: MANIFEST refused: %s; re-joining to read it again", c->model,
		    dcast_last_error());
	return cs_rejoin_refused(c, CS_REFUSED_MANIFEST, DCAST_VERSION_NONE, err);
}

/* An ERROR before the WELCOME answers our HELLO (a producer endpoint, a
 * refused key, a full broker): tell the caller, as an event. */
static int hello_refused(dcast_consumer *c, const dcast_error_msg *e)
{
	dcast_fail((int)e->code, "broker at %s (before its WELCOME): %s", c->endpoint, e->text);
	DCAST_LOG_W("consumer %s: %s", c->model, dcast_last_error());
	cs_event_push(c, DCAST_EV_ERROR, DCAST_VERSION_NONE, (int)e->code, dcast_last_error());
	return 0;
}

/* The broker found `version` bad after it committed it (docs/protocol.md,
 * "Poisoned versions"): neither it nor anything built on it is ever
 * served, so what we staged of them goes, and we wait for the next anchor
 * without re-joining for it. */
static int on_poisoned(dcast_consumer *c, const dcast_error_msg *e)
{
	uint64_t version = e->version;
	int held = version != DCAST_VERSION_NONE && c->n_staged &&
		   c->staged[c->n_staged - 1].version >= version;

	dcast_fail(DCAST_EPOISONED, "broker: %s", e->text);
	cs_event_push(c, DCAST_EV_ERROR, version, DCAST_EPOISONED, dcast_last_error());
	DCAST_LOG_W("consumer %s: the broker poisoned version %" PRIu64 "%s; waiting for the next "
		    "anchor", c->model, version, held ? ": dropping what was staged of it" : "");
	if (!held)
		return 0;
	cs_drop_from(c, version);
	return cs_rejoin(c); /* the stream was inside it */
}

static int bad_message(dcast_consumer *c, int err);

/* A bulk transfer of `version` failed (dcast_last_error() says why): what
 * was staged of it goes, bulk is off for this consumer until an anchor has
 * come over ZeroMQ (on_commit), and it joins again without x-bulk, so the
 * version comes over ZeroMQ. */
static int bulk_failed(dcast_consumer *c, uint64_t version)
{
	const cs_version *v = cs_version_find(c, version);

	DCAST_LOG_W("consumer %s: bulk transfer of version %" PRIu64 " failed: %s; bulk off until "
		    "an anchor comes over ZeroMQ, re-joining to take it so", c->model, version, dcast_last_error());
	c->stats.bulk_failures++;
	c->bulk.off = 1;
	if (v && v->state != CS_V_READY)
		cs_drop_from(c, version); /* before the close: its bytes freed are the bulk's */
	cs_bulk_close(c);
	return cs_rejoin(c);
}

/* BULK: the anchor comes over a TCP connection to the broker's host
 * (bulk_receive reads it); the socket is not read until its COMMIT frame
 * is through.  One not asked for is the peer's error. */
static int on_bulk(dcast_consumer *c, const dcast_bulk *b)
{
	if (!cs_bulk_wanted(c) || cs_bulk_active(c) || strcmp(b->model, c->model)) {
		dcast_fail(DCAST_ESTATE, "BULK of %s version %" PRIu64 " not asked for (%s)", b->model,
			   b->version, cs_bulk_active(c) ? "a bulk transfer is under way"
				       : strcmp(b->model, c->model) ? "another model" : "HELLO without x-bulk");
		return bad_message(c, DCAST_ESTATE);
	}
	c->ss.progress_ms = dcast_now_ms();
	if (cs_bulk_start(c, b))
		return bulk_failed(c, b->version);
	DCAST_LOG_I("consumer %s: version %" PRIu64 " over a bulk connection to port %u%s (%u chunks, %"
		    PRIu64 " bytes)", c->model, b->version, b->port,
		    c->bulk.rx.local ? ", by its unix socket" : "", b->chunks, b->bytes);
	return 0;
}

static int on_message(dcast_consumer *c, dcast_wire_in *in)
{
	dcast_msg *m = &in->msg;

	DCAST_LOG_D("consumer %s: %s (welcomed %d)", c->model, dcast_msg_type_name((int)m->type), c->ss.welcomed);
	if (m->type == DCAST_MSG_WELCOME && cs_run_check(c, m->u.welcome.run))
		return cs_rejoin(c); /* our state was another run's: ask for an anchor */
	if (m->type == DCAST_MSG_WELCOME) {
		c->ss.welcomed = 1;
		c->ss.broker_newest = m->u.welcome.version;
		c->ss.progress_ms = dcast_now_ms();
		c->ss.heartbeat_ms = c->opts.heartbeat_ms ? c->opts.heartbeat_ms
				  : m->u.welcome.heartbeat_ms ? m->u.welcome.heartbeat_ms : 1000;
		return 0;
	}
	if (m->type == DCAST_MSG_ERROR && m->u.error.code == DCAST_ESTATE) {
		/* The broker does not know us (it restarted, dropped us after a
		 * silence, or the connection was re-made): join again from the
		 * applied version.  One reply per message we sent bounds the rate. */
		DCAST_LOG_W("consumer %s: broker lost our session (%s); re-joining", c->model,
			    m->u.error.text);
		return cs_rejoin(c);
	}
	if (m->type == DCAST_MSG_ERROR && m->u.error.code == DCAST_EPOISONED)
		return on_poisoned(c, &m->u.error); /* true of any stream, the old one too */
	if (m->type == DCAST_MSG_ERROR && m->u.error.code == DCAST_EABORTED)
		return cs_intake_abort(c, m->u.error.version, m->u.error.text); /* any stream's */
	if (!c->ss.welcomed && m->type == DCAST_MSG_ERROR)
		return hello_refused(c, &m->u.error);
	if (!c->ss.welcomed)
		return 0; /* the old stream, before our re-join's WELCOME */
	switch (m->type) {
	case DCAST_MSG_MANIFEST: return on_manifest(c, in);
	case DCAST_MSG_CHUNK: return c->n_tensors ? on_chunk(c, in) : 0;
	case DCAST_MSG_COMMIT: return c->n_tensors ? on_commit(c, in) : 0;
	case DCAST_MSG_ERROR:
		dcast_fail((int)m->u.error.code, "broker: %s", m->u.error.text);
		cs_event_push(c, DCAST_EV_ERROR, m->u.error.version, (int)m->u.error.code, dcast_last_error());
		return 0;
	case DCAST_MSG_BYE: return cs_request_hello(c);
	case DCAST_MSG_BULK: return on_bulk(c, &m->u.bulk);
	case DCAST_MSG_HEARTBEAT:
		c->ss.broker_newest = m->u.heartbeat.version;
		return 0;
	default: return 0;
	}
}

/* The seam between the wire and the version state machine: a test fault
 * (fault.c) acts here, as if the broker had sent what it makes. */
static int deliver(dcast_consumer *c, dcast_wire_in *in)
{
	int n = cs_fault_wire(c, in), err = 0;

	for (int i = 0; i < n && !err; i++)
		err = on_message(c, in);
	return err;
}

/* A message from the broker that does not decode (err) leaves a hole in
 * the stream (a lost MANIFEST would leave every later CHUNK unusable):
 * join again, backed off when it persists.  Before the WELCOME we are
 * joining already. */
static int bad_message(dcast_consumer *c, int err)
{
	DCAST_LOG_W("consumer %s: dropped a bad message: %s%s", c->model, dcast_last_error(),
		    c->ss.welcomed ? "; re-joining" : "");
	return c->ss.welcomed ? cs_rejoin_refused(c, CS_REFUSED_MESSAGE, DCAST_VERSION_NONE, err) : 0;
}

static int receive_burst(dcast_consumer *c)
{
	int err = 0;

	for (int i = 0; i < RECV_BURST && !err && !intake_full(c) && !cs_bulk_active(c); i++) {
		dcast_wire_in in;
		int rc = dcast_wire_recv(c->ss.sock, 0, &in, ZMQ_DONTWAIT);
		if (rc == DCAST_EBUSY) {
			dcast_wire_in_close(&in);
			break;
		}
		c->ss.last_recv_ms = dcast_now_ms();
		if (rc == DCAST_EZMQ)
			err = rc;
		else if (rc)
			err = bad_message(c, rc);
		else
			err = deliver(c, &in);
		dcast_wire_in_close(&in);
	}
	return err;
}

/* A frame of the bulk connection, delivered as the socket's messages are
 * (a test fault may cut the connection after it); after the COMMIT's the
 * transfer is over: the connection closes, the socket is read again. */
static int bulk_deliver(dcast_consumer *c, dcast_wire_in *in)
{
	uint64_t version = c->bulk.rx.version;
	const cs_version *v;
	int err = deliver(c, in);

	if (err || !c->ss.welcomed)
		return err; /* re-joined: bulk_receive closes it */
	if (cs_fault_bulk_cut(c, in)) {
		dcast_fail(DCAST_EIO, "bulk: the connection was cut after a CHUNK of version %" PRIu64
			   " (test fault bulk_cut)", version);
		return bulk_failed(c, version);
	}
	if (in->msg.type != DCAST_MSG_COMMIT)
		return 0;
	v = cs_version_find(c, version);
	if (v && v->state == CS_V_READY)
		c->stats.bulk_versions++;
	cs_bulk_close(c);
	return 0;
}

/* Read the bulk connection while a transfer is under way; a re-join
 * meanwhile (any HELLO: the broker closes its side then) ends it. */
static int bulk_receive(dcast_consumer *c)
{
	uint64_t from = c->bulk.received;
	int err = 0, got = 1;

	for (int i = 0; i < RECV_BURST && !err && got && cs_bulk_active(c) &&
			c->bulk.received - from < BULK_TURN_BYTES; i++) {
		dcast_wire_in in;
		if (!c->ss.welcomed) {
			cs_bulk_close(c);
			break;
		}
		if ((err = cs_bulk_read(c, &in, &got, cs_intake_in_place_dest)))
			err = bulk_failed(c, c->bulk.rx.version);
		else if (got)
			err = bulk_deliver(c, &in);
		dcast_wire_in_close(&in);
	}
	return err;
}

/* The broker has a version newer than any we hold, we are not holding its
 * credit back, and nothing of the stream came for 3 heartbeats (a CREDIT or
 * MANIFEST lost on the way, a refused last version). */
static int stalled(const dcast_consumer *c, uint64_t now, uint64_t hb)
{
	uint64_t held = held_version(c);

	return c->ss.welcomed && c->ss.broker_newest != DCAST_VERSION_NONE &&
	       (held == DCAST_VERSION_NONE || c->ss.broker_newest > held) &&
	       ready_count(c) < c->opts.max_staged && now - c->ss.progress_ms > 3 * hb;
}

/* 1 when a staged version's COMMIT has not come commit_timeout_ms after
 * the last chunk taken (an open version a --cut-through broker sent ahead,
 * its producer stopped): said (log line, ERROR event, stats), and the
 * caller re-joins, which drops it and fetches it again if it committed
 * meanwhile.  Never while credit is held back for READY versions (nothing
 * can come then). */
static int commit_overdue(dcast_consumer *c, uint64_t now)
{
	const cs_version *v = c->n_staged ? &c->staged[c->n_staged - 1] : NULL;
	uint64_t last = c->ss.chunk_ms > c->ss.hello_ms ? c->ss.chunk_ms : c->ss.hello_ms;

	if (!c->ss.welcomed || !v || v->state == CS_V_READY ||
	    ready_count(c) >= c->opts.max_staged || now - last <= c->opts.commit_timeout_ms)
		return 0;
	dcast_fail(DCAST_ETIMEDOUT, "version %" PRIu64 ": no COMMIT %" PRIu64 " ms after its last "
		   "chunk (commit_timeout_ms %u); dropped, re-joining", v->version, now - last,
		   c->opts.commit_timeout_ms);
	DCAST_LOG_W("consumer %s: %s", c->model, dcast_last_error());
	cs_event_push(c, DCAST_EV_ERROR, v->version, DCAST_ETIMEDOUT, dcast_last_error());
	c->stats.commit_timeouts++;
	c->ss.chunk_ms = now;
	return 1;
}

/* A new socket, then HELLO (a re-join when welcomed: the broker has lost
 * us or we it); the old connection may be dead for good. */
static int reconnect(dcast_consumer *c)
{
	int err = socket_open(c);

	if (err)
		return err;
	return c->ss.welcomed ? cs_rejoin(c) : cs_request_hello(c);
}

/* A HEARTBEAT when nothing was sent for `every` ms (none while a HELLO is
 * about to go). */
static int heartbeat_if_due(dcast_consumer *c, uint64_t now, uint64_t every)
{
	dcast_msg m;

	if (now - c->ss.last_send_ms < every || c->ob.hello_due)
		return 0;
	dcast_msg_init(&m, DCAST_MSG_HEARTBEAT);
	m.u.heartbeat.time_ms = now;
	m.u.heartbeat.version = dcast_consumer_version(c);
	return send_msg(c, &m);
}

/* 1 when the bulk connection brought nothing for 3 heartbeats, and at
 * least DCAST_BULK_QUIET_MIN_MS, or its connect is unanswered after
 * DCAST_BULK_CONNECT_MS (said: dcast_last_error()). */
static int bulk_quiet(dcast_consumer *c, uint64_t now, uint64_t hb)
{
	uint64_t limit = dcast_bulkrx_quiet_limit(&c->bulk.rx, hb);

	if (!cs_bulk_active(c) || now - c->bulk.last_ms <= limit)
		return 0;
	dcast_bulkrx_quiet_fail(&c->bulk.rx, now - c->bulk.last_ms);
	return 1;
}

static int keepalive(dcast_consumer *c)
{
	uint64_t now = dcast_now_ms(), hb = c->ss.heartbeat_ms ? c->ss.heartbeat_ms : 1000;

	if (!c->ss.welcomed && !c->ob.hello_due && now - c->ss.hello_ms >= 3 * hb) {
		dcast_fail(DCAST_ETIMEDOUT, "no WELCOME from %s in %" PRIu64 " ms: no broker listening "
			   "there, or not its consumer endpoint; trying again", c->endpoint, now - c->ss.hello_ms);
		DCAST_LOG_W("consumer %s: %s", c->model, dcast_last_error());
		cs_event_push(c, DCAST_EV_ERROR, DCAST_VERSION_NONE, DCAST_ETIMEDOUT, dcast_last_error());
		return reconnect(c);
	}
	if (intake_full(c) || cs_bulk_active(c))
		c->ss.last_recv_ms = now; /* unread by choice, not silent */
	if (bulk_quiet(c, now, hb))
		return bulk_failed(c, c->bulk.rx.version);
	if (c->ss.welcomed && now - c->ss.last_recv_ms > 3 * hb) {
		DCAST_LOG_W("consumer %s: broker silent for %" PRIu64 " ms; reconnecting", c->model,
			    now - c->ss.last_recv_ms);
		c->ss.last_recv_ms = now;
		return reconnect(c);
	}
	if (commit_overdue(c, now))
		return cs_rejoin(c);
	if (stalled(c, now, hb)) {
		DCAST_LOG_W("consumer %s: broker has version %" PRIu64 ", we have %lld and got "
			    "nothing for %" PRIu64 " ms; re-joining", c->model, c->ss.broker_newest,
			    (long long)held_version(c), now - c->ss.progress_ms);
		return cs_rejoin(c);
	}
	return heartbeat_if_due(c, now, hb);
}

/* A READY event whose version is no longer READY: applied since (in a
 * chain with a later one), or dropped (an anchor that superseded it, a
 * bind that moved the host copy it was written into: fetched again, and
 * READY again then).  apply() could only refuse it, so it is not given. */
static int stale(dcast_consumer *c, const dcast_event *e)
{
	const cs_version *v;

	if (e->type != DCAST_EV_VERSION_READY)
		return 0;
	v = cs_version_find(c, e->version);
	return !v || v->state != CS_V_READY;
}

static int pop_event(dcast_consumer *c, dcast_event *ev)
{
	while (c->ev_count) {
		*ev = c->events[c->ev_head];
		c->ev_head = (c->ev_head + 1) % CS_EVENTS;
		c->ev_count--;
		if (!stale(c, ev))
			return 1;
	}
	memset(ev, 0, sizeof(*ev));
	ev->version = DCAST_VERSION_NONE;
	return 0;
}

/* What the caller left for the thread: the HELLO, then the newest ACK
 * (one ACK for several versions applied in one go: the broker keeps the
 * newest). */
static int flush_outbox(dcast_consumer *c)
{
	dcast_msg m;
	int err;

	if (c->ob.hello_due && dcast_now_ms() >= c->ob.hello_at_ms && (err = send_hello(c)))
		return err;
	if (c->ob.ack_due == DCAST_VERSION_NONE)
		return 0;
	dcast_msg_init(&m, DCAST_MSG_ACK);
	snprintf(m.u.ack.model, sizeof(m.u.ack.model), "%s", c->model);
	m.u.ack.version = c->ob.ack_due;
	c->ob.ack_due = DCAST_VERSION_NONE;
	return send_msg(c, &m);
}

void cs_session_failed(dcast_consumer *c, int err)
{
	c->ss.err_code = err;
	snprintf(c->ss.err_text, sizeof(c->ss.err_text), "%s", dcast_last_error());
	DCAST_LOG_W("consumer %s: %s", c->model, c->ss.err_text);
	pthread_cond_broadcast(&c->ev_cv); /* a poll() waiting hears of it now */
}

/* Fold when the policy asked for it (fold_due, set by an apply): on the
 * store's fold thread, so that this one heartbeats while the checkpoint is
 * written (O(model), but only every fold_every deltas or fold_fraction of
 * the model logged, not on every turn). */
static int fold_if_due(dcast_consumer *c)
{
	if (cs_store_folding(c->store) || !c->ss.fold_due)
		return 0;
	c->ss.fold_due = 0;
	return cs_store_fold_start(c, &c->lock);
}

/* Run one step of a turn; a step that held the thread past a heartbeat
 * without sending anything (the broker drops a consumer silent for three)
 * is logged with what it was doing. */
static int timed_step(dcast_consumer *c, const char *what, int (*step)(dcast_consumer *))
{
	uint64_t t0 = dcast_now_ms(), hb = c->ss.heartbeat_ms ? c->ss.heartbeat_ms : 1000;
	int err = step(c);
	uint64_t took = dcast_now_ms() - t0;

	if (took > hb && c->ss.last_send_ms < t0)
		DCAST_LOG_W("consumer %s: session thread busy %" PRIu64 " ms %s (heartbeat %" PRIu64
			    " ms): no heartbeat sent meanwhile", c->model, took, what, hb);
	return err;
}

/* One turn of the session thread, under `lock`: check ahead what is
 * staged, read what came (unless every slot is full), grant credit,
 * heartbeat, send what the caller left, fold when due. */
static int session_turn(dcast_consumer *c, int readable)
{
	int err = 0;

	err = timed_step(c, "checking a staged version", cs_check_next);
	if (!err && cs_bulk_active(c))
		err = timed_step(c, "receiving over the bulk connection", bulk_receive);
	else if (!err && readable)
		err = timed_step(c, "receiving", receive_burst);
	if (!err)
		err = cs_ckpt_progress(c); /* records written behind: their credit */
	if (!err)
		cs_intake_release(c); /* versions held while an anchor's file was written */
	if (!err)
		err = flush_credit(c);
	if (!err)
		err = cs_store_error(c->store);
	if (!err) /* a re-join drops what is staging */
		err = timed_step(c, "keeping the session alive", keepalive);
	if (!err)
		err = timed_step(c, "applying", cs_auto_apply);
	if (!err)
		err = flush_outbox(c);
	if (!err)
		err = timed_step(c, "folding the checkpoint", fold_if_due);
	return err;
}

static void drain_wake(dcast_consumer *c)
{
	uint64_t n;

	if (read(c->ob.wake_fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		DCAST_LOG_W("consumer %s: wake fd: %s", c->model, strerror(errno));
}

/* A HEARTBEAT from the session thread while a caller holds `lock`: the
 * socket is this thread's, and the message uses only what this thread
 * wrote itself (own_*) or what is atomic (the applied version). */
static void stalled_heartbeat(dcast_consumer *c)
{
	dcast_msg m;

	if (!c->ss.own_joined)
		return;
	dcast_msg_init(&m, DCAST_MSG_HEARTBEAT);
	m.u.heartbeat.time_ms = dcast_now_ms();
	m.u.heartbeat.version = dcast_consumer_version(c);
	dcast_wire_send(c->ss.sock, NULL, 0, &m, NULL, ZMQ_DONTWAIT); /* best effort */
}

/* Take `lock` for the next turn.  While a caller holds it for long work
 * (an anchor's apply, a restore), heartbeat every half interval so the
 * broker does not drop us as silent; and since we were not reading
 * meanwhile, the broker's silence (and a bulk connection's) is counted
 * again from the moment we listen (keepalive() would otherwise blame it for our own stall). */
static void lock_for_turn(dcast_consumer *c)
{
	uint64_t t0 = dcast_now_ms(), hb = c->ss.own_hb_ms ? c->ss.own_hb_ms : 1000;
	struct timespec ts;

	for (;;) {
		cs_deadline(&ts, (int)(hb / 2));
		if (pthread_mutex_timedlock(&c->lock, &ts) == 0)
			break;
		stalled_heartbeat(c);
	}
	if (dcast_now_ms() - t0 > hb)
		c->ss.last_recv_ms = c->ss.progress_ms = c->bulk.last_ms = dcast_now_ms();
}

/* Until a bulk connect under way is due to be given up
 * (DCAST_BULK_CONNECT_MS after it began); 0 when a payload is to be read
 * from the broker's file (nothing to wait for); else UINT64_MAX. */
static uint64_t bulk_wait_left(const dcast_consumer *c, uint64_t now)
{
	uint64_t end = c->bulk.last_ms + DCAST_BULK_CONNECT_MS + 1;

	if (cs_bulk_file_ready(c)) /* implies an active connection */
		return 0;
	if (!cs_bulk_active(c) || c->bulk.rx.connected)
		return UINT64_MAX;
	return end > now ? end - now : 1;
}

/* How long the thread waits after a turn: a quarter heartbeat (a whole
 * one after a failure), no longer than the writes behind allow (wb_ms,
 * cs_ckpt_wait_hint: their ring's fd is polled too), than a backed-off
 * HELLO is due (cs_rejoin_refused) or a bulk connect is to be given up. */
static int wait_ms(const dcast_consumer *c, int err, uint32_t hb, int wb_ms)
{
	uint64_t ms = err ? hb : wb_ms >= 0 && (uint64_t)wb_ms < hb / 4 ? (uint64_t)wb_ms : hb / 4;
	uint64_t now = dcast_now_ms(), bulk = bulk_wait_left(c, now);

	if (c->ob.hello_due && c->ob.hello_at_ms > now && c->ob.hello_at_ms - now < ms)
		ms = c->ob.hello_at_ms - now;
	return (int)(bulk < ms ? bulk : ms);
}

/* The wait's poll set in it[] (room for 4): the broker's socket (unless
 * the intake is full or a bulk transfer is under way), the wake-up fd, the
 * bulk connection when it has events to wait for, and the I/O ring's fd
 * (wfd, cs_ckpt_wait_hint) while writes run behind.  Returns how many. */
static int poll_set(const dcast_consumer *c, zmq_pollitem_t *it, int wfd)
{
	short bulk_ev = cs_bulk_events(c);
	int n = 0;

	it[n++] = (zmq_pollitem_t){c->ss.sock, 0, intake_full(c) || cs_bulk_active(c) ? 0 : ZMQ_POLLIN, 0};
	it[n++] = (zmq_pollitem_t){NULL, c->ob.wake_fd, ZMQ_POLLIN, 0};
	if (bulk_ev)
		it[n++] = (zmq_pollitem_t){NULL, c->bulk.rx.fd, bulk_ev, 0};
	if (wfd >= 0) /* a write's completion wakes the thread to reap it */
		it[n++] = (zmq_pollitem_t){NULL, wfd, ZMQ_POLLIN, 0};
	return n;
}

/* The session thread: turns, each followed by a wait (lock released) for
 * the socket, a wake-up or wait_ms, until close. */
static void *session_main(void *arg)
{
	dcast_consumer *c = arg;
	int readable = 0;

	pthread_mutex_lock(&c->lock);
	while (!atomic_load(&c->ss.stop)) {
		uint32_t hb = c->ss.heartbeat_ms ? c->ss.heartbeat_ms : 1000;
		int err = session_turn(c, readable), n, wfd, ms = wait_ms(c, err, hb, cs_ckpt_wait_hint(c, &wfd));
		zmq_pollitem_t it[4];
		int n_it = poll_set(c, it, wfd);

		if (err)
			cs_session_failed(c, err);
		c->ss.own_joined = c->ss.welcomed && !c->ob.hello_due;
		c->ss.own_hb_ms = hb;
		if (err || c->ev_count)
			pthread_cond_broadcast(&c->ev_cv);
		pthread_mutex_unlock(&c->lock);
		n = zmq_poll(it, n_it, ms);
		lock_for_turn(c);
		if (n < 0 && errno != EINTR)
			cs_session_failed(c, dcast_fail(DCAST_EZMQ, "zmq_poll: %s", zmq_strerror(errno)));
		readable = n > 0 && (it[0].revents & ZMQ_POLLIN);
		if (n > 0 && (it[1].revents & ZMQ_POLLIN))
			drain_wake(c);
	}
	pthread_cond_broadcast(&c->ev_cv);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

int cs_session_start(dcast_consumer *c)
{
	int err = socket_open(c);

	c->ss.last_recv_ms = dcast_now_ms();
	c->ss.broker_newest = DCAST_VERSION_NONE;
	c->ob.ack_due = DCAST_VERSION_NONE;
	c->ss.heartbeat_ms = c->opts.heartbeat_ms; /* until a WELCOME says (0: 1000) */
	if (err)
		return err;
	if ((c->ob.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
		return dcast_fail(DCAST_EIO, "eventfd: %s", strerror(errno));
	cs_request_hello(c);
	if ((err = pthread_create(&c->ss.thread, NULL, session_main, c)))
		return dcast_fail(DCAST_ENOMEM, "consumer session thread: %s", strerror(err));
	pthread_setname_np(c->ss.thread, "dcast-session"); /* top -H, /proc: best effort */
	c->ss.thread_started = 1;
	return 0;
}

void cs_session_stop(dcast_consumer *c)
{
	if (!c || !c->ss.thread_started)
		return;
	atomic_store(&c->ss.stop, 1);
	cs_wake(c);
	pthread_join(c->ss.thread, NULL);
	c->ss.thread_started = 0;
	cs_store_fold_stop(c->store); /* it takes `lock`, which nobody holds now */
}

/* Wait on ev_cv (lock held) until an event, a failure of the thread, or
 * the deadline; timeout_ms 0 does not wait, -1 waits for ever. */
static void wait_event(dcast_consumer *c, int timeout_ms)
{
	struct timespec ts;

	cs_deadline(&ts, timeout_ms < 0 ? 0 : timeout_ms);
	while (!c->ev_count && !c->ss.err_code && timeout_ms && c->ss.thread_started && !atomic_load(&c->ss.stop)) {
		int rc = timeout_ms < 0 ? pthread_cond_wait(&c->ev_cv, &c->lock)
					: pthread_cond_timedwait(&c->ev_cv, &c->lock, &ts);
		if (rc == ETIMEDOUT)
			break;
	}
}

int dcast_consumer_poll(dcast_consumer *c, int timeout_ms, dcast_event *ev)
{
	int err = 0;

	if (!c || !ev)
		return dcast_fail(DCAST_EINVAL, "dcast_consumer_poll: NULL argument");
	memset(ev, 0, sizeof(*ev));
	ev->version = DCAST_VERSION_NONE;
	pthread_mutex_lock(&c->lock);
	wait_event(c, timeout_ms);
	if (c->ss.err_code) {
		err = dcast_fail(c->ss.err_code, "%s", c->ss.err_text);
		c->ss.err_code = 0;
	} else {
		pop_event(c, ev);
	}
	pthread_mutex_unlock(&c->lock);
	return err;
}
