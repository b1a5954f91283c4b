/* The producer's connection to the broker: a DEALER socket with a monitor
 * (so a dead broker is seen at once, not only by silence), HELLO/WELCOME,
 * bounded re-joins, and the handling of everything the broker sends. */
#include <errno.h>
#include <string.h>
#include <time.h>
#include "producer_shared.h"

#define PROD_DRAIN_BURST 1024 /* messages handled per poll */

static int zfail(const char *what)
{
	return dcast_fail(DCAST_EZMQ, "producer: %s: %s", what, zmq_strerror(errno));
}

int prod_conn_curve(const dcast_producer *p, void *s)
{
	if (!p->curve_server[0])
		return 0;
	if (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, p->curve_server, PROD_KEY_LEN) ||
	    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, p->curve_public, PROD_KEY_LEN) ||
	    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, p->curve_secret, PROD_KEY_LEN))
		return dcast_fail(DCAST_EINVAL, "producer: CURVE keys refused by ZeroMQ: %s",
				  zmq_strerror(errno));
	return 0;
}

/* The monitor reports disconnects and refused handshakes on a PAIR socket. */
static int open_monitor(dcast_producer *p)
{
	char addr[64];
	int ev = ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
		 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_SUCCEEDED;

	snprintf(addr, sizeof(addr), "inproc://dcast-producer-%p-%u", (void *)p,
		 p->conn.generation);
	if (zmq_socket_monitor(p->conn.sock, addr, ev))
		return zfail("zmq_socket_monitor");
	if (!(p->conn.mon = zmq_socket(p->zctx, ZMQ_PAIR)))
		return zfail("monitor socket");
	if (zmq_connect(p->conn.mon, addr))
		return zfail("monitor connect");
	return 0;
}

static int open_socket(dcast_producer *p)
{
	int one = 1, rc;

	if (!(p->conn.sock = zmq_socket(p->zctx, ZMQ_DEALER)))
		return zfail("zmq_socket");
	if ((rc = dcast_wire_socket_opts(p->conn.sock)))
		return rc;
	if (zmq_setsockopt(p->conn.sock, ZMQ_IMMEDIATE, &one, sizeof(one)))
		return zfail("ZMQ_IMMEDIATE");
	if ((rc = prod_conn_curve(p, p->conn.sock)) || (rc = open_monitor(p)))
		return rc;
	if (zmq_connect(p->conn.sock, p->endpoint))
		return dcast_fail(DCAST_EINVAL, "producer: cannot connect to \"%s\": %s",
				  p->endpoint, zmq_strerror(errno));
	return 0;
}

void prod_conn_close(dcast_producer *p, int send_bye)
{
	prod_conn *c = &p->conn;

	if (send_bye && c->sock && c->up) {
		dcast_msg m;
		dcast_msg_init(&m, DCAST_MSG_BYE);
		snprintf(m.u.bye.reason, sizeof(m.u.bye.reason), "producer closing");
		dcast_wire_send(c->sock, NULL, 0, &m, NULL, ZMQ_DONTWAIT);
	}
	if (c->sock) {
		zmq_socket_monitor(c->sock, NULL, 0);
		zmq_close(c->sock);
	}
	if (c->mon)
		zmq_close(c->mon);
	c->sock = c->mon = NULL;
	c->up = c->manifest_sent = 0;
	c->credit_granted = c->credit_used = c->credit_window = 0;
}

static void on_welcome(dcast_producer *p, const dcast_welcome *w)
{
	p->conn.up = !p->conn.drop_why; /* a stray one does not undo a drop */
	p->conn.broker_version = w->version;
	p->conn.hb_version = DCAST_VERSION_NONE; /* this connection's HEARTBEATs only */
	p->conn.run = w->run;
	p->conn.anchor_version = w->anchor_version;
	memcpy(p->conn.consumers, w->consumers, sizeof(p->conn.consumers));
	p->conn.need_anchor = (int)w->need_anchor;
	p->conn.heartbeat_ms = w->heartbeat_ms ? w->heartbeat_ms : 1000;
}

/* A version this producer has passed to publish() (pending or done). */
static int published(const dcast_producer *p, uint64_t version)
{
	uint64_t last = p->last_version, pending = p->pending_version;

	return version != DCAST_VERSION_NONE &&
	       ((last != DCAST_VERSION_NONE && version <= last) ||
		(pending != DCAST_VERSION_NONE && version <= pending));
}

/* The broker ACKs only a version whose COMMIT it took: an ACK of a
 * version never published, or of the pending one before its COMMIT went
 * out, is logged and dropped, so that it moves neither the broker's
 * newest version (which publish() must stay above) nor the baseline. */
static void on_ack(dcast_producer *p, uint64_t version)
{
	const char *why = !published(p, version) ? "which this producer never published"
			  : version == p->pending_version && !p->commit_sent ? "before its COMMIT went out"
			  : NULL;

	if (why) {
		DCAST_LOG_W("producer %s part %u: ignoring an ACK of version %lld, %s", p->model,
			    p->part, (long long)version, why);
		return;
	}
	if (p->conn.broker_version == DCAST_VERSION_NONE || version > p->conn.broker_version)
		p->conn.broker_version = version;
	prod_version_acked(p, version);
}

static void on_error(dcast_producer *p, const dcast_error_msg *e)
{
	if (e->code == DCAST_ESTATE && e->version == DCAST_VERSION_NONE && p->conn.up) {
		/* The broker does not know this connection (it dropped us after a
		 * silence, or restarted): the next call joins again.  Kept as a
		 * refusal, it would fail whatever version came next. */
		DCAST_LOG_W("producer %s part %u: broker lost our session (%s); joining again", p->model,
			    p->part, e->text);
		p->conn.up = 0;
		return;
	}
	DCAST_LOG_W("producer %s part %u: broker ERROR %s: %s", p->model, p->part,
		    dcast_errname((int)e->code), e->text);
	p->conn.peer_err = (int)e->code;
	p->conn.peer_err_version = e->version;
	snprintf(p->conn.peer_err_text, sizeof(p->conn.peer_err_text), "%s", e->text);
}

static void handle(dcast_producer *p, const dcast_msg *m)
{
	switch (m->type) {
	case DCAST_MSG_WELCOME:
		on_welcome(p, &m->u.welcome);
		break;
	case DCAST_MSG_CREDIT:
		if (!p->conn.credit_granted)
			p->conn.credit_window = m->u.credit.bytes;
		p->conn.credit_granted += m->u.credit.bytes;
		prod_progress_taken(p);
		break;
	case DCAST_MSG_ACK:
		on_ack(p, m->u.ack.version);
		break;
	case DCAST_MSG_ERROR:
		on_error(p, &m->u.error);
		break;
	case DCAST_MSG_BYE:
		DCAST_LOG_W("producer %s: broker said BYE: %s", p->model, m->u.bye.reason);
		p->conn.up = 0;
		break;
	case DCAST_MSG_HEARTBEAT:
		p->conn.hb_version = m->u.heartbeat.version;
		p->conn.hb_ms = dcast_now_ms();
		break;
	default:
		DCAST_LOG_W("producer %s: ignoring unexpected %s from the broker", p->model,
			    dcast_msg_type_name((int)m->type));
	}
}

/* Read the monitor's pending events: [u16 event, u32 value] + endpoint. */
static void drain_monitor(dcast_producer *p)
{
	for (int i = 0; i < PROD_DRAIN_BURST; i++) {
		zmq_msg_t ev, addr;
		uint16_t id;

		zmq_msg_init(&ev);
		if (zmq_msg_recv(&ev, p->conn.mon, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&ev);
			return;
		}
		memcpy(&id, zmq_msg_data(&ev), sizeof(id));
		zmq_msg_close(&ev);
		zmq_msg_init(&addr);
		zmq_msg_recv(&addr, p->conn.mon, 0);
		zmq_msg_close(&addr);
		if (id == ZMQ_EVENT_DISCONNECTED && !p->conn.handshaken)
			p->conn.dropped_in_handshake++;
		if (id == ZMQ_EVENT_DISCONNECTED)
			p->conn.up = 0;
		if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
			p->conn.handshaken = 1;
		if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH || id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
			p->conn.auth_failed = id;
	}
}

static void drain_socket(dcast_producer *p)
{
	for (int i = 0; i < PROD_DRAIN_BURST; i++) {
		dcast_wire_in in;
		int rc = dcast_wire_recv(p->conn.sock, 0, &in, ZMQ_DONTWAIT);

		if (rc == DCAST_EBUSY) {
			dcast_wire_in_close(&in);
			return;
		}
		if (rc)
			DCAST_LOG_W("producer %s: dropping a bad message from the broker: %s",
				    p->model, dcast_last_error());
		else
			handle(p, &in.msg);
		dcast_wire_in_close(&in);
	}
}

/* The broker refuses us: a handshake failure the monitor reported (libzmq
 * reports a mechanism mismatch only when the peer's greeting arrived before
 * it hung up), or every connection dropped before its handshake ended. */
static int handshake_refused(const dcast_producer *p)
{
	return p->conn.auth_failed || p->conn.dropped_in_handshake >= PROD_HANDSHAKE_DROPS;
}

static int lost(dcast_producer *p)
{
	if (p->conn.auth_failed)
		return dcast_fail(DCAST_EAUTH, "producer: broker at %s: the CURVE handshake failed "
				  "(%s)", p->endpoint, !p->curve_server[0]
				  ? "it wants CURVE: set curve_server_key and the producer's keys"
				  : p->conn.auth_failed == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
				  ? "it refused our key: is curve_public_key in its --producer-keys?"
				  : "does the broker use CURVE (--curve-secret)?");
	if (p->conn.dropped_in_handshake >= PROD_HANDSHAKE_DROPS)
		return dcast_fail(DCAST_EAUTH, "producer: broker at %s closed %u connections during "
				  "the handshake (%s)", p->endpoint, p->conn.dropped_in_handshake,
				  p->curve_server[0] ? "CURVE: is curve_server_key its public key?"
				  : "it wants CURVE? set curve_server_key and the producer's keys");
	return dcast_fail(DCAST_ECLOSED, "producer: connection to the broker at %s lost",
			  p->endpoint);
}

/* Keep the broker from taking a long wait for a departure. */
static void maybe_heartbeat(dcast_producer *p)
{
	uint64_t now = dcast_now_ms();
	dcast_msg m;

	if (!p->conn.up || now - p->conn.last_send_ms < p->conn.heartbeat_ms)
		return;
	dcast_msg_init(&m, DCAST_MSG_HEARTBEAT);
	m.u.heartbeat.time_ms = now;
	m.u.heartbeat.version = p->acked_version;
	if (!dcast_wire_send(p->conn.sock, NULL, 0, &m, NULL, ZMQ_DONTWAIT))
		p->conn.last_send_ms = now;
}

int prod_conn_poll(dcast_producer *p, int timeout_ms)
{
	zmq_pollitem_t it[2] = {{p->conn.sock, 0, ZMQ_POLLIN, 0}, {p->conn.mon, 0, ZMQ_POLLIN, 0}};

	if (!p->conn.sock)
		return lost(p);
	if (zmq_poll(it, 2, timeout_ms) < 0 && errno != EINTR)
		return zfail("zmq_poll");
	drain_socket(p);
	drain_monitor(p);
	maybe_heartbeat(p);
	return p->conn.up ? 0 : lost(p);
}

int prod_conn_take_error(dcast_producer *p, uint64_t version)
{
	int code = p->conn.peer_err;

	if (!code)
		return 0;
	if (p->conn.peer_err_version != DCAST_VERSION_NONE && p->conn.peer_err_version != version)
		return 0;
	p->conn.peer_err = 0;
	return dcast_fail(code, "broker at %s refused version %llu: %s", p->endpoint,
			  (unsigned long long)version, p->conn.peer_err_text);
}

static int wait_out(dcast_producer *p, uint64_t deadline_ms)
{
	zmq_pollitem_t it[2] = {{p->conn.sock, 0, ZMQ_POLLIN | ZMQ_POLLOUT, 0},
				{p->conn.mon, 0, ZMQ_POLLIN, 0}};
	uint64_t now = dcast_now_ms();

	if (now >= deadline_ms)
		return dcast_fail(DCAST_ETIMEDOUT, "producer: broker at %s takes no messages",
				  p->endpoint);
	if (zmq_poll(it, 2, (long)(deadline_ms - now > 100 ? 100 : deadline_ms - now)) < 0 &&
	    errno != EINTR)
		return zfail("zmq_poll");
	drain_socket(p);
	drain_monitor(p);
	return 0;
}

int prod_conn_send(dcast_producer *p, const dcast_msg *m, zmq_msg_t *payload,
		   uint64_t deadline_ms)
{
	for (;;) {
		int rc = dcast_wire_send(p->conn.sock, NULL, 0, m, payload, ZMQ_DONTWAIT);

		if (rc == 0) {
			p->conn.last_send_ms = dcast_now_ms();
			return 0;
		}
		if (rc != DCAST_EBUSY)
			return rc;
		if ((rc = wait_out(p, deadline_ms)))
			return rc;
		if (handshake_refused(p) || (!p->conn.up && m->type != DCAST_MSG_HELLO))
			return lost(p); /* a refused handshake never lets the HELLO out */
	}
}

static int send_hello(dcast_producer *p, uint64_t deadline_ms)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HELLO);
	m.u.hello.role = DCAST_ROLE_PRODUCER;
	memcpy(m.u.hello.model, p->model, sizeof(p->model));
	m.u.hello.part = p->part;
	m.u.hello.parts = p->parts;
	m.u.hello.have_version = p->acked_version;
	memcpy(m.u.hello.client, p->client, sizeof(p->client));
	p->conn.credit_granted = p->conn.credit_used = p->conn.credit_window = 0;
	return prod_conn_send(p, &m, NULL, deadline_ms);
}

/* A version whose COMMIT went out before the connection broke: taken if the
 * re-joined broker's newest version is exactly it; to be sent again if the
 * broker's newest is older (it never committed it, or lost it); failed when
 * no connection came back, or the broker moved past it (we cannot tell). */
static void settle_pending(dcast_producer *p)
{
	uint64_t v = p->pending_version, b = p->conn.broker_version;

	if (v == DCAST_VERSION_NONE || !p->commit_sent)
		return; /* mid-publish: publish() retries or fails it */
	if (p->conn.up && b == v) {
		prod_version_acked(p, v);
	} else if (p->conn.up && (b == DCAST_VERSION_NONE || b < v)) {
		p->resend = 1;
	} else if (p->conn.up) {
		prod_version_failed(p, DCAST_EVERSION, "the re-joined broker's newest version "
				    "is above it; whether it was taken is unknown");
		p->conn.up = 1; /* this session is new: its WELCOME is the broker's state */
		p->conn.drop_why = NULL;
	} else {
		prod_version_failed(p, DCAST_ECLOSED, "connection to the broker lost before its ACK");
	}
}

static int await_welcome(dcast_producer *p, uint64_t deadline_ms)
{
	int rc;

	while (!p->conn.up) {
		uint64_t now = dcast_now_ms();

		if (now >= deadline_ms)
			return dcast_fail(DCAST_ECLOSED, "producer: no WELCOME from the broker at %s "
					  "within %u ms (is it running and reachable?)", p->endpoint,
					  p->opts.connect_timeout_ms);
		zmq_pollitem_t it[2] = {{p->conn.sock, 0, ZMQ_POLLIN, 0},
					{p->conn.mon, 0, ZMQ_POLLIN, 0}};
		if (zmq_poll(it, 2, (long)(deadline_ms - now)) < 0 && errno != EINTR)
			return zfail("zmq_poll");
		drain_socket(p);
		drain_monitor(p);
		if (handshake_refused(p))
			return lost(p);
		if ((rc = prod_conn_take_error(p, DCAST_VERSION_NONE)))
			return rc;
	}
	return 0;
}

int prod_conn_join(dcast_producer *p)
{
	uint64_t deadline = dcast_now_ms() + p->opts.connect_timeout_ms;
	int rc;

	prod_conn_close(p, 0);
	p->conn.generation++;
	p->conn.drop_why = NULL;
	p->conn.auth_failed = p->conn.peer_err = 0;
	p->conn.handshaken = p->conn.dropped_in_handshake = 0;
	if ((rc = open_socket(p)) || (rc = send_hello(p, deadline)) ||
	    (rc = await_welcome(p, deadline))) {
		if (rc == DCAST_ETIMEDOUT)
			rc = dcast_fail(DCAST_ECLOSED, "producer: broker at %s took no HELLO within "
					"%u ms (is it running?)", p->endpoint,
					p->opts.connect_timeout_ms);
		prod_conn_close(p, 0);
		return rc;
	}
	settle_pending(p);
	return 0;
}

int prod_conn_rejoin(dcast_producer *p, const char *why)
{
	uint32_t backoff = p->opts.reconnect_backoff_ms;
	char first[256], last[512] = "no attempt made";
	int rc = DCAST_ECLOSED;

	snprintf(first, sizeof(first), "%s", why);
	DCAST_LOG_W("producer %s part %u: %s; re-joining (at most %u tries)", p->model, p->part,
		    first, p->opts.max_reconnects);
	prod_conn_close(p, 0);
	for (uint32_t i = 0; i < p->opts.max_reconnects; i++) {
		dcast_sleep_ms(backoff);
		backoff = backoff * 2 > PROD_BACKOFF_MAX_MS ? PROD_BACKOFF_MAX_MS : backoff * 2;
		if (!(rc = prod_conn_join(p))) {
			p->stats.total_reconnects++;
			return 0;
		}
		snprintf(last, sizeof(last), "%s", dcast_last_error());
	}
	settle_pending(p);
	if (rc == DCAST_EAUTH)
		return dcast_fail(rc, "%s", last);
	return dcast_fail(DCAST_ECLOSED, "%s; %u re-join(s) failed, the last: %s", first,
			  p->opts.max_reconnects, last);
}
