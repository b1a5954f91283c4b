/* Consumer side: HELLO/CREDIT/ACK/BYE from consumers, and fan-out.  Each
 * consumer has its own cursor (the version it is streaming, the next chunk)
 * and credit; per loop turn it gets at most BROKER_BURST_MSGS messages,
 * sent with ZMQ_DONTWAIT, so a consumer that stops (credit spent, pipe full)
 * holds only its own cursor.  Payload frames go out as zmq_msg_copy of the
 * log's messages (N consumers share one copy), or, once durable with
 * --data-dir, read from the segment file, one read shared by the consumers
 * about to take the same chunk (ondisk.c's read cache).  docs/protocol.md,
 * "Consumer and broker". */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "broker.h"
#include "bulk.h"
#include "dcast_common.h"
#include "fold.h"

/* PUMP_DISK: the next chunk waits for room under the cap of bytes read
 * from disk and not yet sent (ondisk.c); retried soon, as a full pipe. */
enum pump { PUMP_IDLE, PUMP_MORE, PUMP_BLOCKED, PUMP_GONE, PUMP_DISK };

#define CREDIT_MAX (1ull << 62) /* a consumer's credit in total: no wrap, ever */

static void consumer_drop(struct broker *b, struct broker_peer *p, const char *why)
{
	DCAST_LOG_I("consumer %s of %s: %s (had version %lld)", p->client, p->want, why,
		    (long long)p->have_version);
	broker_peer_forget(&b->cons, p);
	b->stats.consumers_connected--;
}

static int send_err(struct broker *b, const char *what)
{
	(void)b;
	if (errno == EAGAIN)
		return PUMP_BLOCKED;
	if (errno == EHOSTUNREACH)
		return PUMP_GONE;
	DCAST_LOG_W("send %s: %s", what, zmq_strerror(errno));
	return PUMP_GONE;
}

/* [rid, copy of hdr, payload] or [rid, raw header]; payload is sent as it
 * is (ZeroMQ takes its content). */
static int send_parts(struct broker *b, struct broker_peer *p, zmq_msg_t *hdr,
		      zmq_msg_t *payload, const void *raw, size_t raw_len)
{
	void *s = b->consumers;
	zmq_msg_t h;

	if (zmq_send(s, p->rid, p->rid_len, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0)
		return send_err(b, "routing id");
	if (raw) {
		zmq_msg_init_size(&h, raw_len);
		memcpy(zmq_msg_data(&h), raw, raw_len);
	} else {
		zmq_msg_init(&h);
		zmq_msg_copy(&h, hdr);
	}
	/* After the routing id the pipe has room: ROUTER_MANDATORY checked it. */
	if (zmq_msg_send(&h, s, ZMQ_DONTWAIT | (payload ? ZMQ_SNDMORE : 0)) < 0) {
		zmq_msg_close(&h);
		return send_err(b, "header");
	}
	if (payload && zmq_msg_send(payload, s, ZMQ_DONTWAIT) < 0)
		return send_err(b, "payload");
	p->last_send_ms = dcast_now_ms();
	return PUMP_MORE;
}

/* One multipart message [rid, copy of hdr, payload] or a raw header; the
 * payload message (broker_chunk_payload's) is consumed, sent or not. */
static int send_frames(struct broker *b, struct broker_peer *p, zmq_msg_t *hdr,
		       zmq_msg_t *payload, const void *raw, size_t raw_len)
{
	int rc = send_parts(b, p, hdr, payload, raw, raw_len);

	if (payload)
		zmq_msg_close(payload); /* empty once sent */
	return rc;
}

/* The version to stream after p->have_version: the next delta if
 * have_version is in the log, else the newest anchor if it is newer. */
static struct broker_version *next_version(const struct broker_model *m, uint64_t have)
{
	int i;

	if (have != DCAST_VERSION_NONE && broker_log_tail_next(m, have))
		return broker_log_tail_next(m, have); /* past a damaged segment record */
	if (!m->n_log)
		return NULL;
	if (have == DCAST_VERSION_NONE)
		return m->log[0];
	i = broker_log_find(m, have);
	if (i >= 0)
		return (uint32_t)i + 1 < m->n_log ? m->log[i + 1] : NULL;
	if (broker_fold_next(m, have)) /* superseded by a broker-made anchor (fold.c) */
		return broker_fold_next(m, have);
	if (broker_fold_holds(m, have))
		return NULL; /* the producer's anchor is being made a delta for it (fold.c) */
	return m->log[0]->version > have ? m->log[0] : NULL;
}

/* next_version, unless it is poisoned (commit.c): nothing then. */
static struct broker_version *next_servable(const struct broker_model *m, uint64_t have)
{
	struct broker_version *v = next_version(m, have);

	return v && broker_version_servable(m, v) ? v : NULL;
}

/* --cut-through: the model's open version (ingest.c keeps it numbered for
 * consumers, pd->cut), for a consumer that has the newest committed one;
 * NULL without cut-through, without an open version, past a poisoned
 * version (an anchor then waits for its COMMIT, which clears the mark),
 * or for an anchor to a consumer that holds a version when producer
 * anchors are made into deltas (it waits for the delta). */
static struct broker_version *next_open(const struct broker_model *m, uint64_t have)
{
	struct broker_version *v = m->pending ? m->pending->cut : NULL;

	if (!v || have != broker_model_newest(m))
		return NULL;
	if (v->anchor && have != DCAST_VERSION_NONE && broker_fold_makes_deltas(m))
		return NULL; /* a delta may be made of it at its COMMIT for `have` (fold.h) */
	return broker_version_servable(m, v) ? v : NULL;
}

/* The version a consumer at `have` streams next: a committed one, else the
 * open one (--cut-through), else none. */
static struct broker_version *next_stream(const struct broker_model *m, uint64_t have)
{
	struct broker_version *v = next_servable(m, have);

	return v ? v : next_open(m, have);
}

static int send_manifest(struct broker *b, struct broker_peer *p, struct broker_manifest *mf)
{
	int rc = send_frames(b, p, NULL, NULL, mf->enc, mf->enc_len);

	if (rc == PUMP_MORE) {
		broker_manifest_put(p->manifest_sent);
		p->manifest_sent = mf;
		mf->refs++;
	}
	return rc;
}

/* A message of the pump's own (not kept in the log), encoded and sent;
 * *due cleared once it went. */
static int send_own(struct broker *b, struct broker_peer *p, const dcast_msg *m, int *due)
{
	void *enc;
	size_t len;
	int rc;

	if (dcast_msg_encode(m, &enc, &len)) {
		DCAST_LOG_W("consumer %s: %s: %s", p->client, dcast_msg_type_name((int)m->type),
			    dcast_last_error());
		return PUMP_GONE;
	}
	rc = send_frames(b, p, NULL, NULL, enc, len);
	free(enc);
	if (rc == PUMP_MORE)
		*due = 0;
	return rc;
}

/* The WELCOME that answers a HELLO: the first message of the stream, sent
 * by the pump so that a full pipe delays it, as any other, rather than
 * dropping it (the consumer would drop what follows, waiting for it). */
static int send_welcome(struct broker *b, struct broker_peer *p)
{
	dcast_msg w;

	broker_welcome_init(b, p->model, &w);
	snprintf(w.u.welcome.model, sizeof(w.u.welcome.model), "%s", p->want);
	return send_own(b, p, &w, &p->welcome_due);
}

/* An ERROR to p, model named as p asked: code, version, the text after
 * fmt. */
static void error_init(dcast_msg *e, const struct broker_peer *p, int code, uint64_t version,
		       const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void error_init(dcast_msg *e, const struct broker_peer *p, int code, uint64_t version,
		       const char *fmt, ...)
{
	va_list ap;

	dcast_msg_init(e, DCAST_MSG_ERROR);
	e->u.error.code = (uint32_t)code;
	snprintf(e->u.error.model, sizeof(e->u.error.model), "%s", p->want);
	e->u.error.version = version;
	va_start(ap, fmt);
	vsnprintf(e->u.error.text, sizeof(e->u.error.text), fmt, ap);
	va_end(ap);
}

/* ERROR(DCAST_EABORTED, version) to a consumer that was sent chunks of an
 * open version since dropped (broker_cut_abort): sent by the pump, before
 * anything else, so that a full pipe delays it rather than losing it. */
static int send_aborted(struct broker *b, struct broker_peer *p)
{
	dcast_msg e;

	error_init(&e, p, DCAST_EABORTED, p->abort_version, "model %s version %llu was aborted "
		   "before its COMMIT: drop what was received of it; the stream goes on after "
		   "version %lld", p->want, (unsigned long long)p->abort_version,
		   (long long)p->have_version);
	return send_own(b, p, &e, &p->abort_due);
}

/* ERROR(DCAST_EPOISONED) to a consumer whose HELLO said it holds a
 * version the model has poisoned (that version or one before it): it was
 * away when the others were told (poison.c), as a relay restarted on its
 * data dir, or a consumer that re-joins.  A relay cuts the version off in
 * its own log; a library consumer learns that its weights are one.  Sent
 * once, after the WELCOME and before any version. */
static int send_poisoned(struct broker *b, struct broker_peer *p)
{
	const struct broker_model *m = p->model;
	dcast_msg e;

	if (m->poisoned == DCAST_VERSION_NONE || p->have_version == DCAST_VERSION_NONE ||
	    p->have_version < m->poisoned) {
		p->poison_due = 0;
		return PUMP_MORE;
	}
	error_init(&e, p, DCAST_EPOISONED, m->poisoned, "model %s version %llu was poisoned before "
		   "this join, which holds version %llu: neither it nor any version after it is "
		   "served; the next anchor replaces them", p->want, (unsigned long long)m->poisoned,
		   (unsigned long long)p->have_version);
	return send_own(b, p, &e, &p->poison_due);
}

/* A chunk larger than the consumer's whole window can never be sent: say
 * so (once per version and HELLO) instead of waiting for credit forever. */
static int window_too_small(struct broker *b, struct broker_peer *p, const struct broker_version *v,
			    uint64_t len)
{
	dcast_msg e;

	if (p->too_large_told == v->version + 1)
		return PUMP_IDLE;
	p->too_large_told = v->version + 1;
	error_init(&e, p, DCAST_ETOO_LARGE, v->version, "version %llu has a chunk of %llu payload "
		   "bytes, more than this consumer's whole window (HELLO.window_bytes %llu): it can "
		   "never be sent; raise the staging budget", (unsigned long long)v->version,
		   (unsigned long long)len, (unsigned long long)p->window_bytes);
	DCAST_LOG_W("consumer %s of %s: %s", p->client, p->want, e.u.error.text);
	broker_send_msg(b, b->consumers, p, &e);
	return PUMP_IDLE;
}

/* Payload bytes sent to p and not yet credited back (its credit starts at
 * its window and grows by what it has taken in); 0 when it granted more. */
static uint64_t unacked_bytes(const struct broker_peer *p)
{
	uint64_t owed = p->sent_bytes + p->window_bytes;

	return owed > p->credit_bytes ? owed - p->credit_bytes : 0;
}

/* The debug tier (DCAST_DEBUG_ASSERT), at both ends of a grant and of a
 * send: payload sent to p never above the credit it granted (what it may
 * still take is never negative), the credit never below its window nor
 * above the cap on grants, what is in flight never above the window. */
static int check_consumer_credit(const struct broker_peer *p)
{
	DCAST_ASSERT(p->sent_bytes <= p->credit_bytes && p->credit_bytes >= p->window_bytes);
	DCAST_ASSERT(p->credit_bytes <= CREDIT_MAX && unacked_bytes(p) <= p->window_bytes);
	return 1;
}

/* Where q's stream of v starts from now (its next chunk, 0 when v is the
 * version it takes next), or -1 when q is not about to take v. */
static int64_t stream_from(const struct broker_peer *q, const struct broker_version *v)
{
	if (q->cur == v)
		return q->next_chunk;
	if (!q->cur && q->model && !q->model->held && next_stream(q->model, q->have_version) == v)
		return 0;
	return -1;
}

/* Consumers other than p that will take chunk i of v within their window
 * (as far ahead as their credit lets them be sent): those a chunk read
 * from disk for p is kept for, so that the read cache holds no more than
 * what their credit would hold in flight anyway.  O(consumers), once per
 * read. */
static uint32_t others_wanting(const struct broker *b, const struct broker_peer *p,
			       const struct broker_version *v, uint32_t i)
{
	uint64_t len = v->chunks[i].payload_len ? v->chunks[i].payload_len : 1;
	uint32_t n = 0;

	for (uint64_t k = 0; k < b->cons.hi; k++) {
		const struct broker_peer *q = &b->cons.arr[k];
		int64_t from = q->used && q != p && q->model == p->model ? stream_from(q, v) : -1;

		if (from >= 0 && from <= i && (i - (uint64_t)from) * len < q->window_bytes)
			n++;
	}
	return n;
}

/* ch's payload for p: shared through the read cache when it is on disk.
 * An open version's chunk (a spill file's) is read for p alone: the cache
 * keeps chunk addresses, and an open version's chunk list still grows. */
static int chunk_payload(struct broker *b, struct broker_peer *p, struct broker_chunk *ch,
			 zmq_msg_t *out)
{
	uint32_t others = 0;

	if (p->cur->open)
		return broker_chunk_payload(ch, out);
	if (ch->file && !ch->cache_slot && b->cfg.read_cache_bytes)
		others = others_wanting(b, p, p->cur, p->next_chunk);
	return broker_chunk_serve(ch, others, out);
}

/* One step of a consumer's stream: its WELCOME, a MANIFEST, a CHUNK or a
 * COMMIT. */
static int pump_one(struct broker *b, struct broker_peer *p)
{
	struct broker_version *v = p->cur;
	struct broker_chunk *ch;
	zmq_msg_t payload;
	uint64_t len;
	int rc;

	if (p->welcome_due)
		return send_welcome(b, p);
	if (p->abort_due)
		return send_aborted(b, p);
	if (!p->model)
		return PUMP_IDLE; /* waits for a producer to create it */
	if (p->model->held)
		return PUMP_IDLE; /* a relay's restored log, maybe an earlier run's (relay.c) */
	if (p->poison_due)
		return send_poisoned(b, p);
	if (p->bulk_token)
		return PUMP_IDLE; /* cur goes over --bulk (bulk.c), which hands the stream back */
	if (!v) {
		if (!(v = next_stream(p->model, p->have_version))) {
			struct broker_manifest *mf = p->model->manifest;
			return mf && mf != p->manifest_sent ? send_manifest(b, p, mf) : PUMP_IDLE;
		}
		DCAST_ASSERT(p->have_version == DCAST_VERSION_NONE || v->version > p->have_version);
		p->cur = v;
		v->refs++;
		p->next_chunk = 0;
	}
	if (v->manifest != p->manifest_sent)
		return send_manifest(b, p, v->manifest);
	if (broker_bulk_wanted(b, p, v))
		return broker_bulk_offer(b, p) ? PUMP_BLOCKED : PUMP_IDLE;
	if (p->next_chunk == v->n_chunks && v->open)
		return PUMP_IDLE; /* the next chunk accepted, or the COMMIT, wakes it */
	if (p->next_chunk == v->n_chunks) {
		DCAST_ASSERT(!v->open); /* a COMMIT only for a committed version */
		if ((rc = send_frames(b, p, &v->commit_hdr, NULL, NULL, 0)) != PUMP_MORE)
			return rc;
		p->have_version = v->version;
		p->cur = NULL;
		broker_version_put(v);
		return PUMP_MORE;
	}
	DCAST_ASSERT(p->next_chunk < v->n_chunks); /* never past what was accepted */
	ch = &v->chunks[p->next_chunk];
	len = ch->payload_len;
	if (len > p->window_bytes)
		return window_too_small(b, p, v, len);
	DCAST_DEBUG_ASSERT(check_consumer_credit(p));
	if (p->sent_bytes + len > p->credit_bytes)
		return PUMP_IDLE; /* waits for CREDIT */
	if (!broker_chunk_readable(ch, unacked_bytes(p)))
		return PUMP_DISK;
	if ((rc = chunk_payload(b, p, ch, &payload))) {
		DCAST_LOG_E("consumer %s of %s: version %llu chunk %u: %s", p->client, p->want,
			    (unsigned long long)v->version, p->next_chunk, dcast_last_error());
		return PUMP_GONE;
	}
	if ((rc = send_frames(b, p, &ch->hdr, &payload, NULL, 0)) != PUMP_MORE)
		return rc;
	p->sent_bytes += len;
	p->next_chunk++;
	DCAST_ASSERT(p->sent_bytes <= p->credit_bytes && p->next_chunk <= v->n_chunks);
	DCAST_DEBUG_ASSERT(check_consumer_credit(p));
	b->stats.chunks_out++;
	b->stats.bytes_out += len;
	b->stats.cut_through_chunks += (uint64_t)v->open;
	return PUMP_MORE;
}

static void consumer_pump(struct broker *b, struct broker_peer *p)
{
	int rc = PUMP_MORE;

	for (int i = 0; i < BROKER_BURST_MSGS && rc == PUMP_MORE; i++)
		rc = pump_one(b, p);
	p->blocked = rc == PUMP_BLOCKED;
	if (rc == PUMP_MORE)
		b->fanout_more = 1;
	else if (rc == PUMP_BLOCKED || rc == PUMP_DISK)
		b->fanout_blocked = 1;
	else if (rc == PUMP_GONE)
		consumer_drop(b, p, "unreachable");
}

void broker_fanout(struct broker *b)
{
	b->fanout_more = b->fanout_blocked = 0;
	broker_read_cache_sweep();
	for (uint64_t i = 0; i < b->cons.hi; i++)
		if (b->cons.arr[i].used)
			consumer_pump(b, &b->cons.arr[i]);
}

void broker_cut_abort(struct broker *b, struct broker_model *m, struct broker_version *open)
{
	int sent = 0;

	DCAST_ASSERT(open->open);
	for (uint64_t i = 0; i < b->cons.hi; i++) {
		struct broker_peer *p = &b->cons.arr[i];

		if (!p->used || p->model != m || p->cur != open)
			continue;
		if (p->next_chunk) {
			p->abort_due = 1;
			p->abort_version = open->version;
			sent = 1;
		}
		p->cur = NULL;
		p->next_chunk = 0;
		broker_version_put(open);
	}
	b->stats.cut_through_aborted += (uint64_t)sent;
}

void broker_rewelcome(struct broker *b, const struct broker_model *m)
{
	for (uint64_t i = 0; i < b->cons.hi; i++)
		if (b->cons.arr[i].used && b->cons.arr[i].model == m)
			b->cons.arr[i].welcome_due = 1;
}

/* Consumers that said HELLO for `m` before it existed stream it from now on. */
static void attach_waiting(struct broker *b, struct broker_model *m)
{
	for (uint64_t i = 0; i < b->cons.hi; i++) {
		struct broker_peer *p = &b->cons.arr[i];

		if (p->used && !p->model && !strcmp(p->want, m->name)) {
			p->model = m;
			DCAST_LOG_I("consumer %s: model %s now exists; streaming it", p->client, m->name);
		}
	}
}

void broker_model_announce(struct broker *b, struct broker_model *m)
{
	attach_waiting(b, m);
	broker_rewelcome(b, m); /* those that waited learn the run */
}

static void consumer_hello(struct broker *b, struct broker_peer *p, dcast_wire_in *in)
{
	const dcast_hello *h = &in->msg.u.hello;
	struct broker_model *m = NULL;
	int rc = DCAST_EBUSY;

	if (h->role != DCAST_ROLE_CONSUMER)
		rc = dcast_fail(DCAST_EFIELD_RANGE, "HELLO.role: producer on the consumer endpoint");
	else
		rc = 0;
	m = broker_model_get(b, h->model, 0); /* only producers create models */
	if (!rc && !p && !(p = broker_peer_find(&b->cons, &in->rid, 1)))
		rc = DCAST_EBUSY;
	if (rc) {
		broker_refuse(b, b->consumers, &in->rid, rc, h->model, DCAST_VERSION_NONE);
		return;
	}
	if (!p->want[0])
		b->stats.consumers_connected++;
	b->stats.consumer_joins++;
	broker_peer_reset(p);
	p->role = DCAST_ROLE_CONSUMER;
	p->model = m;
	snprintf(p->want, sizeof(p->want), "%.*s", DCAST_MAX_NAME, h->model);
	p->have_version = p->acked_version = h->have_version;
	p->credit_bytes = p->window_bytes = h->window_bytes;
	p->too_large_told = 0;
	p->sent_bytes = 0;
	p->bulk_ok = (int)h->bulk;
	DCAST_DEBUG_ASSERT(check_consumer_credit(p));
	p->last_recv_ms = dcast_now_ms();
	snprintf(p->client, sizeof(p->client), "%s", h->client);
	DCAST_LOG_I("consumer %s of %s joined, has version %lld, window %llu%s", p->client, p->want,
		    (long long)h->have_version, (unsigned long long)h->window_bytes,
		    m ? "" : " (no such model yet: it waits for a producer to create it)");
	p->welcome_due = 1;
	p->abort_due = 0; /* a HELLO starts its stream again */
	p->poison_due = h->have_version != DCAST_VERSION_NONE;
	consumer_pump(b, p);
}

/* A CREDIT: p may take `bytes` more payload (its total capped). */
static void consumer_grant(struct broker_peer *p, uint64_t bytes)
{
	uint64_t credit0 = p->credit_bytes;

	DCAST_DEBUG_ASSERT(check_consumer_credit(p));
	p->credit_bytes += bytes;
	if (p->credit_bytes > CREDIT_MAX)
		p->credit_bytes = CREDIT_MAX;
	DCAST_DEBUG_ASSERT(check_consumer_credit(p) &&
			   p->credit_bytes == (credit0 + bytes < CREDIT_MAX ? credit0 + bytes : CREDIT_MAX));
}

static int consumer_dispatch(struct broker *b, struct broker_peer *p, const dcast_msg *msg)
{
	switch (msg->type) {
	case DCAST_MSG_CREDIT:
		if (msg->u.credit.model[0] && strcmp(msg->u.credit.model, p->want))
			return dcast_fail(DCAST_EFIELD_RANGE, "CREDIT.model: \"%s\", HELLO said \"%s\"",
					  msg->u.credit.model, p->want);
		consumer_grant(p, msg->u.credit.bytes);
		return 0;
	case DCAST_MSG_ACK:
		if (strcmp(msg->u.ack.model, p->want))
			return dcast_fail(DCAST_EFIELD_RANGE, "ACK.model: \"%s\", HELLO said \"%s\"",
					  msg->u.ack.model, p->want);
		p->acked_version = msg->u.ack.version;
		return 0;
	case DCAST_MSG_HEARTBEAT:
		return 0;
	case DCAST_MSG_ERROR:
		DCAST_LOG_W("consumer %s: ERROR %s: %s", p->client,
			    dcast_errname((int)msg->u.error.code), msg->u.error.text);
		return 0;
	default:
		(void)b;
		return dcast_fail(DCAST_EMSG_TYPE, "%s: not expected from a consumer",
				  dcast_msg_type_name((int)msg->type));
	}
}

void broker_consumer_msg(struct broker *b, dcast_wire_in *in)
{
	struct broker_peer *p = broker_peer_find(&b->cons, &in->rid, 0);
	int rc;

	if (in->msg.type == DCAST_MSG_HELLO) {
		consumer_hello(b, p, in);
		return;
	}
	if (!p) {
		broker_refuse_unjoined(b, b->consumers, in);
		return;
	}
	p->last_recv_ms = dcast_now_ms();
	if (in->msg.type == DCAST_MSG_BYE) {
		consumer_drop(b, p, "said BYE");
		return;
	}
	if ((rc = consumer_dispatch(b, p, &in->msg)))
		broker_refuse(b, b->consumers, &in->rid, rc, p->want, DCAST_VERSION_NONE);
}

void broker_consumer_timers(struct broker *b, uint64_t now_ms)
{
	uint64_t hb = b->cfg.heartbeat_ms;
	dcast_msg h;

	dcast_msg_init(&h, DCAST_MSG_HEARTBEAT);
	h.u.heartbeat.time_ms = now_ms;
	for (uint64_t i = 0; i < b->cons.hi; i++) {
		struct broker_peer *p = &b->cons.arr[i];

		if (!p->used)
			continue;
		if (broker_silent(b, now_ms, p->last_recv_ms, 3 * hb)) {
			b->stats.peers_timed_out++;
			consumer_drop(b, p, "silent for 3 heartbeats");
			continue;
		}
		if (now_ms - p->last_send_ms >= hb && !p->blocked) {
			h.u.heartbeat.version = broker_model_offered(p->model);
			broker_send_msg(b, b->consumers, p, &h);
		}
	}
}
