/* Relay: with --upstream the broker is a consumer of another broker (one
 * DEALER per --upstream-model) and serves what it receives to its own
 * consumers, so brokers form a fan-out tree.  Upstream versions go through
 * the same open-version checks as producer parts (one part): manifest
 * ranges, every checksum, COMMIT counts.  On a gap, a bad message, an
 * upstream ERROR or 3 heartbeats of silence the relay re-joins with
 * HELLO(have_version = its newest). */
#include <errno.h>
#include <string.h>
#include "broker.h"
#include "dcast_common.h"
#include "dcast_curve.h" /* DCAST_Z85_KEY_LEN */
#include "dcast_wire.h"

#define RELAY_HANDSHAKE_DROPS 3        /* connections closed mid-handshake before an E line */
#define RELAY_REFUSED_LOG_MS 60000     /* the E line about refusals again at most this often */

static int up_send(struct broker_upstream *u, const dcast_msg *m)
{
	u->last_send_ms = dcast_now_ms();
	return dcast_wire_send(u->sock, NULL, 0, m, NULL, ZMQ_DONTWAIT);
}

static void relay_hello(struct broker *b, struct broker_upstream *u, const char *why)
{
	struct broker_model *m = u->model;
	dcast_msg h;

	broker_relay_bulk_close(b, u); /* the upstream drops its side at this HELLO */
	if (m->pending)
		broker_pending_abort(b, m, why);
	dcast_msg_init(&h, DCAST_MSG_HELLO);
	h.u.hello.role = DCAST_ROLE_CONSUMER;
	snprintf(h.u.hello.model, sizeof(h.u.hello.model), "%s", m->name);
	h.u.hello.have_version = broker_model_newest(m);
	h.u.hello.window_bytes = b->cfg.upstream_window_bytes;
	h.u.hello.bulk = (uint32_t)broker_relay_bulk_wanted(u);
	snprintf(h.u.hello.client, sizeof(h.u.hello.client), "relay");
	u->credit_owed = 0;
	u->joined = 0;
	u->hello_ms = u->last_recv_ms = dcast_now_ms();
	DCAST_LOG_I("relay %s: HELLO to %s with version %lld (%s)", m->name, b->cfg.upstream,
		    (long long)h.u.hello.have_version, why);
	if (up_send(u, &h))
		DCAST_LOG_W("relay %s: HELLO: %s", m->name, dcast_last_error());
}

/* The outcome of a version the upstream committed (b->outcome[1]): the
 * ACK goes upstream (with --data-dir once the version is durable). */
static void relay_acked(struct broker *b, struct broker_model *m, uint64_t version)
{
	dcast_msg a;

	dcast_msg_init(&a, DCAST_MSG_ACK);
	snprintf(a.u.ack.model, sizeof(a.u.ack.model), "%s", m->name);
	a.u.ack.version = version;
	for (uint32_t i = 0; i < b->n_up; i++)
		if (b->up[i].model == m)
			up_send(&b->up[i], &a);
}

/* The monitor of a new upstream DEALER, set before connect: a relay whose
 * key the upstream refuses says so (relay_watch) instead of waiting in
 * silence for a WELCOME that never comes.  Each socket gets its own inproc
 * address (gen): a closed monitor's may not be free again yet. */
static int relay_monitor_open(struct broker *b, void *sock, uint32_t i, uint32_t gen, void **mon)
{
	int zero = 0, ev = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
			   ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
			   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_DISCONNECTED;
	char addr[64];

	snprintf(addr, sizeof(addr), "inproc://dcast-relay-monitor-%u-%u", i, gen);
	if (zmq_socket_monitor(sock, addr, ev) || !(*mon = zmq_socket(b->ctx, ZMQ_PAIR)) ||
	    zmq_setsockopt(*mon, ZMQ_LINGER, &zero, sizeof(zero)) || zmq_connect(*mon, addr))
		return dcast_fail(DCAST_EZMQ, "upstream socket monitor: %s", zmq_strerror(errno));
	return 0;
}

static void relay_sockets_close(void *sock, void *mon)
{
	if (sock && mon)
		zmq_socket_monitor(sock, NULL, 0);
	if (sock)
		zmq_close(sock);
	if (mon)
		zmq_close(mon);
}

/* A DEALER to the upstream for b->up[i] (CURVE options by auth.c) and its
 * monitor, connected; on failure nothing is left open. */
static int relay_connect(struct broker *b, uint32_t i, void **sock, void **mon)
{
	struct broker_upstream *u = &b->up[i];
	int rc;

	*mon = NULL;
	if (!(*sock = zmq_socket(b->ctx, ZMQ_DEALER)))
		return dcast_fail(DCAST_EZMQ, "upstream socket: %s", zmq_strerror(errno));
	if (!(rc = broker_socket_setup(b, *sock, "upstream")) &&
	    !(rc = relay_monitor_open(b, *sock, i, u->generation++, mon)) &&
	    zmq_connect(*sock, b->cfg.upstream))
		rc = dcast_fail(DCAST_EZMQ, "--upstream %s: connect: %s", b->cfg.upstream,
				zmq_strerror(errno));
	if (rc) {
		relay_sockets_close(*sock, *mon);
		*sock = *mon = NULL;
	}
	return rc;
}

/* A failed handshake ends the DEALER's session for good (ZeroMQ does not
 * reconnect after it): a fresh socket tries again, at the pace of the
 * re-HELLOs, so a relay admitted later (a new key list upstream) joins.
 * If no fresh socket can be made, the old one stays. */
static void relay_reconnect(struct broker *b, struct broker_upstream *u)
{
	void *sock, *mon;

	if (relay_connect(b, (uint32_t)(u - b->up), &sock, &mon)) {
		DCAST_LOG_E("relay %s: %s", u->model->name, dcast_last_error());
		return;
	}
	relay_sockets_close(u->sock, u->mon);
	u->sock = sock;
	u->mon = mon;
	u->handshaken = u->failed = 0;
}

int broker_relay_open(struct broker *b)
{
	int rc;

	b->outcome[1] = (struct broker_outcome){relay_acked, NULL, NULL};
	for (uint32_t i = 0; b->cfg.upstream && i < b->cfg.n_upstream_models; i++) {
		struct broker_upstream *u = &b->up[i];

		if (!(u->model = broker_model_get(b, b->cfg.upstream_models[i], 1)))
			return DCAST_EBUSY;
		broker_relay_bulk_init(b, u);
		u->model->relayed = 1;
		u->model->run = 0; /* none until the upstream's WELCOME names it */
		if ((rc = relay_connect(b, i, &u->sock, &u->mon)))
			return rc;
		b->n_up++;
	}
	return 0;
}

/* A log restored from the data dir was relayed from some run of the
 * upstream's, kept in the data dir's run file; while the relay was down
 * the upstream may have moved to another run.  Until the upstream's
 * WELCOME says which run it serves (relay_adopt_run), the log is held:
 * nothing of it is served, so no consumer gets an earlier run's versions
 * under the new run's id. */
static void relay_restored(struct broker *b, struct broker_upstream *u)
{
	struct broker_model *m = u->model;
	int rc;

	if (!m->n_log && !m->manifest && m->lost_version == DCAST_VERSION_NONE)
		return; /* nothing restored: nothing to hold */
	m->held = 1;
	if ((rc = broker_run_load(b, m, &u->kept_run)))
		DCAST_LOG_W("relay %s: restored log of version %lld held, with no run id to match "
			    "(%s: %s): the upstream's WELCOME drops it", m->name,
			    (long long)broker_model_newest(m), dcast_errname(rc), dcast_last_error());
	else
		DCAST_LOG_I("relay %s: restored log of version %lld, relayed from run %016llx, held "
			    "until the upstream's WELCOME names its run", m->name,
			    (long long)broker_model_newest(m), (unsigned long long)u->kept_run);
}

void broker_relay_start(struct broker *b)
{
	for (uint32_t i = 0; i < b->n_up; i++) {
		relay_restored(b, &b->up[i]);
		relay_hello(b, &b->up[i], "start");
	}
}

static int relay_manifest(struct broker *b, struct broker_model *m, dcast_msg *msg)
{
	struct broker_manifest *mf;

	if (!(mf = broker_manifest_new(&msg->u.manifest)))
		return dcast_fail(DCAST_ENOMEM, "relay %s: manifest", m->name);
	if (m->manifest && m->manifest->enc_len == mf->enc_len &&
	    !memcmp(m->manifest->enc, mf->enc, mf->enc_len)) {
		broker_manifest_put(mf);
		return 0;
	}
	if (m->pending)
		broker_pending_abort(b, m, "upstream manifest changed");
	broker_manifest_put(m->manifest);
	m->manifest = mf;
	return 0;
}

/* A CHUNK from upstream; credit: it came through the window (not over
 * bulk), and is granted back. */
static int relay_chunk(struct broker *b, struct broker_upstream *u, dcast_wire_in *in, int credit)
{
	struct broker_model *m = u->model;
	const dcast_chunk *c = &in->msg.u.chunk;
	int rc;

	if (!m->pending && (rc = broker_pending_open(b, m, c, 1)))
		return rc;
	if ((rc = broker_pending_chunk(b, m, 0, in)))
		return rc;
	if (credit)
		u->credit_owed += c->payload_bytes;
	return 0;
}

/* The upstream dropped a version it had sent chunks of before its COMMIT
 * (its --cut-through): the open version here goes with it, and so, one
 * level down, at this relay's consumers.  The upstream's cursor is back
 * at its newest committed version, the stream goes on: no re-join.  An
 * abort of a version not open here (dropped already) is passed over. */
static int relay_aborted(struct broker *b, struct broker_upstream *u, const dcast_error_msg *e)
{
	struct broker_model *m = u->model;
	char why[DCAST_MAX_TEXT + 32];

	if (!m->pending || m->pending->version != e->version)
		return 0;
	snprintf(why, sizeof(why), "upstream aborted it: %s", e->text);
	broker_pending_abort(b, m, why);
	return 0;
}

/* The upstream's fold found a version bad: when this relay logged it, the
 * version is cut off here too (poison.c: from its consumers, its data
 * dir, its made anchors), as the relay's own fold would, instead of being
 * served on until every consumer below refuses its digest.  The relay
 * joins again only when its stream was inside that version or after it
 * (open here, or coming over bulk): the upstream stopped it there.  Else
 * it stays joined and waits for the next anchor; an upstream tells a
 * joiner that holds a poisoned version so after its WELCOME (fanout.c),
 * and a re-join would hear it again. */
static int relay_poisoned(struct broker *b, struct broker_upstream *u, const dcast_error_msg *e)
{
	struct broker_model *m = u->model;
	char why[DCAST_MAX_TEXT + 32];
	int inside = (m->pending && m->pending->version >= e->version) ||
		     (dcast_bulkrx_active(&u->bulk) && u->bulk.version >= e->version);

	if (broker_log_find(m, e->version) >= 0) {
		snprintf(why, sizeof(why), "the upstream poisoned it: %s", e->text);
		broker_version_poison(b, m, e->version, DCAST_EPOISONED, why);
	}
	if (!inside) {
		DCAST_LOG_W("relay %s: the upstream poisoned version %llu: %s", m->name,
			    (unsigned long long)e->version, e->text);
		return 0;
	}
	return dcast_fail(DCAST_ECLOSED, "upstream ERROR %s: %s", dcast_errname(DCAST_EPOISONED), e->text);
}

/* The ACK upstream goes out from broker_version_ack (relay_acked). */
static int relay_commit(struct broker *b, struct broker_upstream *u, dcast_commit *c)
{
	int committed;

	return broker_pending_commit(b, u->model, 0, c, &committed);
}

/* A COMMIT over ZeroMQ: after a failed bulk transfer, the version it
 * brought came this way; the next HELLO asks for bulk again. */
static int relay_commit_zmq(struct broker *b, struct broker_upstream *u, dcast_commit *c)
{
	int rc = relay_commit(b, u, c);

	if (!rc && u->bulk_off && u->bulk_addr_len) {
		u->bulk_off = 0;
		DCAST_LOG_I("relay %s: version %llu came over ZeroMQ; bulk on again", u->model->name,
			    (unsigned long long)c->version);
	}
	return rc;
}


/* The relay serves `run` from now on: its consumers learn it (those
 * welcomed with run 0 confirm it, those holding another run's state drop
 * it).  With drop, what it holds is another run's: it goes (log, segments,
 * consumers' cursors) and the relay joins again from nothing. */
static void relay_switch_run(struct broker *b, struct broker_upstream *u, uint64_t run, int drop)
{
	struct broker_model *m = u->model;

	DCAST_ASSERT(run && !m->held);
	if (drop)
		broker_model_clear(b, m);
	m->run = run;
	broker_run_save(b, m);
	broker_rewelcome(b, m);
	if (drop)
		relay_hello(b, u, "the upstream's run changed");
}

/* A held log (relay_restored) is served only if the upstream still serves
 * the run it was relayed from; without a kept run id nothing says it is,
 * so it is dropped too. */
static void relay_release(struct broker *b, struct broker_upstream *u, uint64_t run)
{
	struct broker_model *m = u->model;
	int same = u->kept_run == run;

	m->held = 0;
	if (same)
		DCAST_LOG_I("relay %s: upstream serves run %016llx, the run of the restored log: "
			    "serving it from version %lld", m->name, (unsigned long long)run,
			    (long long)broker_model_newest(m));
	else if (u->kept_run)
		DCAST_LOG_I("relay %s: upstream serves run %016llx, the restored log is of run "
			    "%016llx: it is dropped", m->name, (unsigned long long)run,
			    (unsigned long long)u->kept_run);
	else
		DCAST_LOG_W("relay %s: upstream serves run %016llx, and no run id was kept with the "
			    "restored log: it is dropped", m->name, (unsigned long long)run);
	relay_switch_run(b, u, run, !same);
}

/* A relay serves its upstream's run: its consumers must see the same
 * stream identity as the upstream's own.  When the upstream's run changes
 * (the model was removed and created again there, or the upstream restarted
 * without its data dir), what the relay holds belongs to the earlier run:
 * it is dropped, and the relay joins again from nothing, or it would serve
 * the old run's versions under the new run's id.  Run 0 (an upstream that
 * does not know its run yet, a relay itself) confirms nothing. */
static void relay_adopt_run(struct broker *b, struct broker_upstream *u, uint64_t run)
{
	struct broker_model *m = u->model;
	int stale = m->run && (m->n_log || m->manifest);

	if (!run)
		return;
	if (m->held) {
		relay_release(b, u, run);
		return;
	}
	if (run == m->run)
		return;
	DCAST_LOG_I("relay %s: upstream serves run %016llx (was %016llx)%s", m->name,
		    (unsigned long long)run, (unsigned long long)m->run,
		    stale ? ": the earlier run's log is dropped" : "");
	relay_switch_run(b, u, run, stale);
}

/* Sent before the WELCOME that answers our last HELLO: the stream of an
 * earlier HELLO, which that HELLO ended (the upstream resets our cursor
 * and credit).  Refusing it message by message would answer each with
 * another HELLO. */
static int stale(const struct broker_upstream *u, const dcast_msg *msg)
{
	return !u->joined && (msg->type == DCAST_MSG_MANIFEST || msg->type == DCAST_MSG_CHUNK ||
			      msg->type == DCAST_MSG_COMMIT || msg->type == DCAST_MSG_BULK);
}

static int relay_bulk(struct broker *b, struct broker_upstream *u, const dcast_bulk *m);

static int relay_dispatch(struct broker *b, struct broker_upstream *u, dcast_wire_in *in)
{
	dcast_msg *msg = &in->msg;

	if (stale(u, msg))
		return 0;
	switch (msg->type) {
	case DCAST_MSG_WELCOME:
		u->joined = 1;
		relay_adopt_run(b, u, msg->u.welcome.run);
		return 0;
	case DCAST_MSG_MANIFEST:
		return relay_manifest(b, u->model, msg);
	case DCAST_MSG_CHUNK:
		return relay_chunk(b, u, in, 1);
	case DCAST_MSG_COMMIT:
		return relay_commit_zmq(b, u, &msg->u.commit);
	case DCAST_MSG_BULK:
		return relay_bulk(b, u, &msg->u.bulk);
	case DCAST_MSG_HEARTBEAT:
		return 0;
	case DCAST_MSG_ERROR:
		if (msg->u.error.code == DCAST_EABORTED)
			return relay_aborted(b, u, &msg->u.error);
		if (msg->u.error.code == DCAST_EPOISONED)
			return relay_poisoned(b, u, &msg->u.error);
		return dcast_fail(DCAST_ECLOSED, "upstream ERROR %s: %s",
				  dcast_errname((int)msg->u.error.code), msg->u.error.text);
	case DCAST_MSG_BYE:
		return dcast_fail(DCAST_ECLOSED, "upstream said BYE: %s", msg->u.bye.reason);
	default:
		return dcast_fail(DCAST_EMSG_TYPE, "%s: not expected from an upstream broker",
				  dcast_msg_type_name((int)msg->type));
	}
}

static int model_matches(const struct broker_model *m, const dcast_msg *msg)
{
	const char *name = msg->type == DCAST_MSG_WELCOME ? msg->u.welcome.model :
			   msg->type == DCAST_MSG_BULK ? msg->u.bulk.model :
			   msg->type == DCAST_MSG_MANIFEST ? msg->u.manifest.model :
			   msg->type == DCAST_MSG_CHUNK ? msg->u.chunk.model :
			   msg->type == DCAST_MSG_COMMIT ? msg->u.commit.model : m->name;

	if (strcmp(name, m->name))
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.model: \"%s\", relaying \"%s\"",
				  dcast_msg_type_name((int)msg->type), name, m->name);
	return 0;
}

/* ---- the anchor over the upstream's --bulk (relaybulk.c reads it) ---- */

/* A CHUNK or the COMMIT of a bulk connection, taken as from the DEALER
 * but granting no credit (it came outside the window). */
static int relay_frame(struct broker *b, struct broker_upstream *u, dcast_wire_in *in)
{
	int rc = model_matches(u->model, &in->msg);

	if (rc)
		return rc;
	if (in->msg.type == DCAST_MSG_CHUNK)
		return relay_chunk(b, u, in, 0);
	DCAST_ASSERT(in->msg.type == DCAST_MSG_COMMIT); /* dcast_bulkrx lets no other through */
	return relay_commit(b, u, &in->msg.u.commit);
}

/* The transfer failed (dcast_last_error() says why): counted, bulk off
 * until a COMMIT comes over ZeroMQ, and the relay joins again so. */
static void relay_bulk_failed(struct broker *b, struct broker_upstream *u)
{
	char why[DCAST_MAX_TEXT + 96];

	snprintf(why, sizeof(why), "bulk transfer of version %llu failed: %s",
		 (unsigned long long)u->bulk.version, dcast_last_error());
	DCAST_LOG_W("relay %s: %s; bulk off until a version comes over ZeroMQ", u->model->name, why);
	b->stats.relay_bulk_failures++;
	u->bulk_off = 1;
	relay_hello(b, u, why); /* closes the connection, drops what was open */
}

/* A whole frame from the connection taken; after the COMMIT's the
 * transfer is over, and the DEALER is read again (broker_relay_events). */
static int relay_bulk_take(struct broker *b, struct broker_upstream *u, dcast_wire_in *in)
{
	uint64_t version = u->bulk.version, bytes = zmq_msg_size(&in->payload);
	int rc = relay_frame(b, u, in);

	if (rc)
		return rc;
	b->stats.relay_bulk_bytes += bytes;
	if (in->msg.type != DCAST_MSG_COMMIT)
		return 0;
	b->stats.relay_bulk_versions++;
	broker_relay_bulk_close(b, u);
	DCAST_LOG_I("relay %s: version %llu came over the bulk connection", u->model->name,
		    (unsigned long long)version);
	return 0;
}

/* The connection is ready: at most a burst of frames taken. */
static void relay_on_bulk(struct broker *b, int fd, void *arg)
{
	struct broker_upstream *u = arg;
	int rc = 0, got = 1;

	(void)fd;
	for (int i = 0; i < BROKER_RECV_BURST && !rc && got && dcast_bulkrx_active(&u->bulk); i++) {
		dcast_wire_in in;
		memset(&in, 0, sizeof(in));
		zmq_msg_init(&in.payload);
		if (!(rc = broker_relay_bulk_read(b, u, &in, &got)) && got)
			rc = relay_bulk_take(b, u, &in);
		dcast_wire_in_close(&in);
	}
	if (rc)
		relay_bulk_failed(b, u);
}

/* BULK: the anchor comes over a connection to the upstream's host; one
 * that cannot start fails the transfer at once. */
static int relay_bulk(struct broker *b, struct broker_upstream *u, const dcast_bulk *m)
{
	int rc = broker_relay_bulk_start(b, u, m, relay_on_bulk);

	if (rc && rc != DCAST_ESTATE) {
		b->stats.relay_bulk_failures++;
		u->bulk_off = 1;
	}
	return rc;
}

void broker_relay_msg(struct broker *b, struct broker_upstream *u)
{
	for (int i = 0; i < BROKER_RECV_BURST && broker_relay_events(u); i++) {
		dcast_wire_in in;
		int rc = dcast_wire_recv(u->sock, 0, &in, ZMQ_DONTWAIT);

		if (rc == DCAST_EBUSY) {
			dcast_wire_in_close(&in);
			return;
		}
		u->last_recv_ms = dcast_now_ms();
		if (!rc && !(rc = model_matches(u->model, &in.msg)))
			rc = relay_dispatch(b, u, &in);
		dcast_wire_in_close(&in);
		if (rc) {
			char why[DCAST_MAX_TEXT + 64];

			if (rc > 0 && rc < DCAST_ERR_COUNT)
				b->stats.errors[rc]++;
			snprintf(why, sizeof(why), "%s: %s", dcast_errname(rc), dcast_last_error());
			DCAST_LOG_W("relay %s: %s", u->model->name, why);
			relay_hello(b, u, why);
			return;
		}
	}
}

/* This relay's CURVE public key as the upstream sees it (from the socket,
 * set by auth.c), or what stands for none. */
static const char *our_key(const struct broker *b, void *sock, char *pub, size_t cap)
{
	size_t len = cap;

	if (!b->cfg.upstream_server_key)
		return "(none: a plain connection)";
	if (cap <= DCAST_Z85_KEY_LEN || zmq_getsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, &len))
		return "?";
	return pub;
}

/* Why the upstream's handshakes fail, with what the operator can change:
 * a monitor event (ZMQ_EVENT_HANDSHAKE_FAILED_*) and its value (a ZAP
 * status, a protocol error, an errno), or 0 for connections closed before
 * any handshake ended.  A CURVE server that cannot open our HELLO (made
 * for another server key) or speaks another mechanism only hangs up. */
static void refusal_text(const struct broker *b, void *sock, uint16_t event, uint32_t value,
			 char *out, size_t cap)
{
	char pub[DCAST_Z85_KEY_LEN + 1], what[96];
	const char *key = our_key(b, sock, pub, sizeof(pub));

	if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
		snprintf(out, cap, "upstream refused our key %s (ZAP status %u): is it listed in "
			 "the upstream's --consumer-keys?", key, value);
		return;
	}
	if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
		snprintf(what, sizeof(what), "protocol error 0x%x", value);
	else
		snprintf(what, sizeof(what), "the upstream closed the connection: %s",
			 event ? strerror((int)value) : "before the handshake ended");
	if (!b->cfg.upstream_server_key)
		snprintf(out, cap, "handshake failed (%s): does the upstream run --curve-secret? "
			 "then give --upstream-server-key and --upstream-curve-secret", what);
	else
		snprintf(out, cap, "CURVE handshake failed (%s): is --upstream-server-key %s the "
			 "upstream's public key, and does it run --curve-secret?", what,
			 b->cfg.upstream_server_key);
}

/* One refused connection: an E line at once, then at most one a minute
 * while the refusals go on (a fresh socket every 3 heartbeats,
 * relay_reconnect). */
static void relay_refused(struct broker *b, struct broker_upstream *u, uint16_t event,
			  uint32_t value)
{
	uint64_t now = dcast_now_ms();
	char why[384];

	u->refusals++;
	if (!event && u->refusals < RELAY_HANDSHAKE_DROPS)
		return; /* one dropped connection may be a restart upstream */
	if (u->refused_log_ms && now - u->refused_log_ms < RELAY_REFUSED_LOG_MS)
		return;
	u->refused_log_ms = now;
	refusal_text(b, u->sock, event, value, why, sizeof(why));
	DCAST_LOG_E("relay %s: upstream %s: %s (%u connection(s) refused, nothing relayed)",
		    u->model->name, b->cfg.upstream, why, u->refusals);
}

static void relay_event(struct broker *b, struct broker_upstream *u, uint16_t event,
			uint32_t value)
{
	char pub[DCAST_Z85_KEY_LEN + 1];

	switch (event) {
	case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
		DCAST_LOG_I("relay %s: handshake with upstream %s done (%s, our key %s)",
			    u->model->name, b->cfg.upstream,
			    b->cfg.upstream_server_key ? "CURVE" : "plain",
			    our_key(b, u->sock, pub, sizeof(pub)));
		u->handshaken = 1;
		u->refusals = 0;
		u->refused_log_ms = 0;
		return;
	case ZMQ_EVENT_DISCONNECTED:
		if (!u->handshaken && !u->failed)
			relay_refused(b, u, 0, 0);
		u->handshaken = u->failed = 0;
		return;
	default: /* ZMQ_EVENT_HANDSHAKE_FAILED_* */
		u->failed = 1;
		relay_refused(b, u, event, value);
	}
}

/* Read the monitor's events: [u16 event, u32 value] then the endpoint. */
static void relay_watch(struct broker *b, struct broker_upstream *u)
{
	for (int i = 0; i < BROKER_RECV_BURST; i++) {
		zmq_msg_t ev, addr;
		uint16_t event = 0;
		uint32_t value = 0;
		int ok;

		zmq_msg_init(&ev);
		if (zmq_msg_recv(&ev, u->mon, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&ev);
			return;
		}
		ok = zmq_msg_size(&ev) == 6 && zmq_msg_more(&ev);
		if (ok) {
			memcpy(&event, zmq_msg_data(&ev), sizeof(event));
			memcpy(&value, (char *)zmq_msg_data(&ev) + 2, sizeof(value));
		}
		zmq_msg_close(&ev);
		zmq_msg_init(&addr);
		if (ok)
			zmq_msg_recv(&addr, u->mon, 0);
		zmq_msg_close(&addr);
		if (ok)
			relay_event(b, u, event, value);
	}
}

void broker_relay_timers(struct broker *b, uint64_t now_ms)
{
	uint64_t hb = b->cfg.heartbeat_ms;
	dcast_msg h;

	dcast_msg_init(&h, DCAST_MSG_HEARTBEAT);
	h.u.heartbeat.time_ms = now_ms;
	for (uint32_t i = 0; i < b->n_up; i++) {
		struct broker_upstream *u = &b->up[i];

		relay_watch(b, u);
		if (broker_relay_bulk_quiet(b, u, now_ms))
			relay_bulk_failed(b, u);
		/* During a bulk transfer the DEALER is not read (broker_relay_events):
		 * the connection's own quiet limit stands for the upstream's silence. */
		if (!dcast_bulkrx_active(&u->bulk) && broker_silent(b, now_ms, u->last_recv_ms, 3 * hb)) {
			if (u->refusals && !u->handshaken)
				relay_reconnect(b, u);
			relay_hello(b, u, "upstream silent for 3 heartbeats");
			continue;
		}
		if (now_ms - u->last_send_ms >= hb) {
			h.u.heartbeat.version = broker_model_newest(u->model);
			up_send(u, &h);
		}
	}
}

void broker_relay_flush_credit(struct broker *b)
{
	dcast_msg cr;

	dcast_msg_init(&cr, DCAST_MSG_CREDIT);
	for (uint32_t i = 0; i < b->n_up; i++) {
		struct broker_upstream *u = &b->up[i];

		if (!u->credit_owed)
			continue;
		cr.u.credit.bytes = u->credit_owed;
		if (up_send(u, &cr) == 0)
			u->credit_owed = 0;
	}
}

void broker_relay_close(struct broker *b)
{
	for (uint32_t i = 0; i < b->n_up; i++) {
		broker_relay_bulk_close(b, &b->up[i]);
		relay_sockets_close(b->up[i].sock, b->up[i].mon);
		b->up[i].sock = b->up[i].mon = NULL;
	}
	b->n_up = 0;
}
