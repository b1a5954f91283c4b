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
#include "dcast_wire.h"

static int up_send(struct broker_upstream *u, const dcast_msg *m)
{
	u->last_send_ms = dcast_now_ms();
	return dcast_wire_send(u->sock, NULL, 0, m, NULL, ZMQ_DONTWAIT);
}

static void relay_hello(struct broker *b, struct broker_upstream *u, const char *why)
{
	struct broker_model *m = u->model;
	dcast_msg h;

	if (m->pending)
		broker_pending_abort(b, m, why);
	dcast_msg_init(&h, DCAST_MSG_HELLO);
	h.u.hello.role = DCAST_ROLE_CONSUMER;
	snprintf(h.u.hello.model, sizeof(h.u.hello.model), "%s", m->name);
	h.u.hello.have_version = broker_model_newest(m);
	h.u.hello.window_bytes = b->cfg.upstream_window_bytes;
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

int broker_relay_open(struct broker *b)
{
	b->outcome[1] = (struct broker_outcome){relay_acked, NULL};
	for (uint32_t i = 0; b->cfg.upstream && i < b->cfg.n_upstream_models; i++) {
		struct broker_upstream *u = &b->up[i];

		if (!(u->model = broker_model_get(b, b->cfg.upstream_models[i], 1)))
			return DCAST_EBUSY;
		u->model->relayed = 1;
		u->model->run = 0; /* none until the upstream's WELCOME names it */
		if (!(u->sock = zmq_socket(b->ctx, ZMQ_DEALER)))
			return dcast_fail(DCAST_EZMQ, "upstream socket: %s", zmq_strerror(errno));
		b->n_up++;
		if (broker_socket_setup(b, u->sock, "upstream"))
			return DCAST_EZMQ;
		if (zmq_connect(u->sock, b->cfg.upstream))
			return dcast_fail(DCAST_EZMQ, "--upstream %s: connect: %s", b->cfg.upstream,
					  zmq_strerror(errno));
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

static int relay_chunk(struct broker *b, struct broker_upstream *u, dcast_wire_in *in)
{
	struct broker_model *m = u->model;
	const dcast_chunk *c = &in->msg.u.chunk;
	int rc;

	if (!m->pending && (rc = broker_pending_open(b, m, c, 1)))
		return rc;
	if ((rc = broker_pending_chunk(b, m, 0, in)))
		return rc;
	u->credit_owed += c->payload_bytes;
	return 0;
}

/* The ACK upstream goes out from broker_version_ack (relay_acked). */
static int relay_commit(struct broker *b, struct broker_upstream *u, dcast_commit *c)
{
	int committed;

	return broker_pending_commit(b, u->model, 0, c, &committed);
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
			      msg->type == DCAST_MSG_COMMIT);
}

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
		return relay_chunk(b, u, in);
	case DCAST_MSG_COMMIT:
		return relay_commit(b, u, &msg->u.commit);
	case DCAST_MSG_HEARTBEAT:
		return 0;
	case DCAST_MSG_ERROR:
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
			   msg->type == DCAST_MSG_MANIFEST ? msg->u.manifest.model :
			   msg->type == DCAST_MSG_CHUNK ? msg->u.chunk.model :
			   msg->type == DCAST_MSG_COMMIT ? msg->u.commit.model : m->name;

	if (strcmp(name, m->name))
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.model: \"%s\", relaying \"%s\"",
				  dcast_msg_type_name((int)msg->type), name, m->name);
	return 0;
}

void broker_relay_msg(struct broker *b, struct broker_upstream *u)
{
	for (int i = 0; i < BROKER_RECV_BURST; i++) {
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

void broker_relay_timers(struct broker *b, uint64_t now_ms)
{
	uint64_t hb = b->cfg.heartbeat_ms;
	dcast_msg h;

	dcast_msg_init(&h, DCAST_MSG_HEARTBEAT);
	h.u.heartbeat.time_ms = now_ms;
	for (uint32_t i = 0; i < b->n_up; i++) {
		struct broker_upstream *u = &b->up[i];

		if (broker_silent(b, now_ms, u->last_recv_ms, 3 * hb)) {
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
	for (uint32_t i = 0; i < b->n_up; i++)
		if (b->up[i].sock)
			zmq_close(b->up[i].sock);
	b->n_up = 0;
}
