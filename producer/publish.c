/* Publishing a version: for each chunk range of each registered shard,
 * encode against the baseline into a free slot, fold the change into the
 * baseline (recording how to undo it), and hand the slot to ZeroMQ
 * zero-copy within the broker's credit, so the I/O thread sends chunk k
 * while chunk k+1 is encoded.  Then COMMIT with a digest per chunk range;
 * the broker's ACK (dcast_producer_wait) ends the version's undo log. */
#include <string.h>
#include "producer_impl.h"

#define PROD_RESTART (-1)   /* the broker asked for an anchor mid-version */
#define PROD_POLL_MS 100

typedef struct prod_run {
	uint64_t version, base_version;
	int anchor;
	uint32_t gen, seq;
	uint64_t bytes, changed;
	uint64_t progress_ms; /* last time credit or a slot came back */
} prod_run;

static void remember(dcast_producer *p, uint64_t version, int err)
{
	p->history[p->n_history++ % PROD_HISTORY] = (prod_outcome){version, err};
}

/* Only an ACK naming the pending version settles it. */
void prod_version_acked(dcast_producer *p, uint64_t version)
{
	if (p->pending_version == DCAST_VERSION_NONE || version != p->pending_version)
		return;
	if (p->pending_anchor)
		p->conn.need_anchor = 0;
	p->acked_version = p->pending_version;
	p->pending_version = DCAST_VERSION_NONE;
	p->baseline_valid = 1;
	p->resend = 0;
	prod_undo_reset(&p->undo);
	remember(p, p->acked_version, 0);
}

void prod_version_failed(dcast_producer *p, int err, const char *why)
{
	if (p->pending_version == DCAST_VERSION_NONE)
		return;
	DCAST_LOG_W("producer %s part %u: version %llu failed (%s); baseline back at %lld%s",
		    p->model, p->part, (unsigned long long)p->pending_version, why,
		    (long long)p->acked_version, /* -1: none */
		    p->pending_anchor || p->undo.lost ? ", next version is an anchor" : "");
	if (p->pending_anchor || p->undo.lost)
		p->baseline_valid = 0;
	prod_undo_rollback(p);
	p->failed_version = p->pending_version;
	p->failed_err = err;
	snprintf(p->failed_text, sizeof(p->failed_text), "version %llu failed: %s",
		 (unsigned long long)p->pending_version, why);
	remember(p, p->pending_version, err);
	p->pending_version = DCAST_VERSION_NONE;
	p->resend = 0;
}

/* Mark the version in flight failed with error `rc` (whose detail is the
 * thread's last error), keeping that detail for wait(). */
static int fail_pending(dcast_producer *p, int rc)
{
	char why[DCAST_MAX_TEXT];

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	prod_version_failed(p, rc > 0 ? rc : DCAST_EABORTED, why);
	return dcast_fail(rc, "%s", why);
}

static void fill_chunk_msg(const dcast_producer *p, const prod_run *r, const prod_tensor *t,
			   uint64_t off, const dcast_chunk_info *info, const void *payload,
			   dcast_msg *m)
{
	dcast_chunk *c = &m->u.chunk;

	dcast_msg_init(m, DCAST_MSG_CHUNK);
	memcpy(c->model, p->model, sizeof(p->model));
	c->version = r->version;
	c->base_version = r->base_version;
	c->anchor = (uint32_t)r->anchor;
	c->part = p->part;
	c->seq = r->seq;
	c->tensor = (uint32_t)(t - p->tensors);
	c->start = t->shard_off + off;
	c->count = info->count;
	c->elem_size = info->elem_size;
	c->encoding = info->encoding;
	c->changed = info->changed;
	c->payload_bytes = info->payload_bytes;
	c->checksum = dcast_checksum(payload, info->payload_bytes);
}

/* Between chunks: read what the broker sent; stop on its ERROR for this
 * version, a lost connection, or a request for an anchor. */
static int check_broker(dcast_producer *p, const prod_run *r, int timeout_ms)
{
	int rc = prod_conn_poll(p, timeout_ms);

	if (rc)
		return rc;
	if (p->conn.generation != r->gen)
		return dcast_fail(DCAST_ECLOSED, "producer: connection re-joined mid-version");
	if ((rc = prod_conn_take_error(p, r->version)))
		return rc;
	if (!r->anchor && p->conn.need_anchor)
		return PROD_RESTART;
	return 0;
}

static int wait_credit(dcast_producer *p, prod_run *r, uint64_t need)
{
	prod_conn *c = &p->conn;
	int rc;

	while (c->credit_granted - c->credit_used < need) {
		uint64_t have = c->credit_granted - c->credit_used;

		if (dcast_now_ms() - r->progress_ms > p->opts.ack_timeout_ms)
			return dcast_fail(DCAST_ETIMEDOUT, "producer: no credit from the broker at %s "
					  "for %u ms (have %llu bytes, chunk needs %llu; the broker's "
					  "window must hold one chunk)",
					  p->endpoint, p->opts.ack_timeout_ms,
					  (unsigned long long)have, (unsigned long long)need);
		if ((rc = check_broker(p, r, PROD_POLL_MS)))
			return rc;
		if (c->credit_granted - c->credit_used > have)
			r->progress_ms = dcast_now_ms();
	}
	return 0;
}

static int get_slot(dcast_producer *p, prod_run *r, prod_slot **slot)
{
	int rc;

	while (prod_pool_get(&p->pool, dcast_now_ms() + PROD_POLL_MS, slot)) {
		if (dcast_now_ms() - r->progress_ms > p->opts.ack_timeout_ms)
			return dcast_fail(DCAST_ETIMEDOUT, "producer: broker at %s has taken no data "
					  "for %u ms", p->endpoint, p->opts.ack_timeout_ms);
		if ((rc = check_broker(p, r, 0)))
			return rc;
	}
	return 0;
}

static int send_slot(dcast_producer *p, prod_run *r, const prod_tensor *t, uint64_t off,
		     const dcast_chunk_info *info, prod_slot *slot)
{
	dcast_msg m;
	zmq_msg_t zm;
	int rc;

	fill_chunk_msg(p, r, t, off, info, slot->buf, &m);
	if ((rc = wait_credit(p, r, info->payload_bytes))) {
		prod_pool_free_cb(slot->buf, slot);
		return rc;
	}
	if (zmq_msg_init_data(&zm, slot->buf, info->payload_bytes, prod_pool_free_cb, slot)) {
		prod_pool_free_cb(slot->buf, slot);
		return dcast_fail(DCAST_EZMQ, "producer: zmq_msg_init_data failed");
	}
	if ((rc = prod_conn_send(p, &m, &zm, dcast_now_ms() + p->opts.ack_timeout_ms))) {
		zmq_msg_close(&zm);
		return rc;
	}
	p->conn.credit_used += info->payload_bytes;
	r->seq++;
	r->bytes += info->payload_bytes;
	r->progress_ms = dcast_now_ms();
	return 0;
}

/* Encode one chunk range into `slot` and fold it into the baseline.
 * *send says whether there is anything to send. */
static int encode_range(dcast_producer *p, prod_run *r, prod_tensor *t, uint32_t k,
			prod_slot *slot, dcast_chunk_info *info, int *send)
{
	uint64_t off = (uint64_t)k * p->opts.range_elems;
	uint64_t count = t->shard_count - off < p->opts.range_elems ? t->shard_count - off
								      : p->opts.range_elems;
	size_t bytes = count * t->elem_size;
	const unsigned char *cur = t->ptr + off * t->elem_size;
	unsigned char *base = t->base + off * t->elem_size;
	uint32_t j = t->first_chunk + k;
	int rc;

	rc = dcast_codec_encode(cur, r->anchor ? NULL : base, count, t->elem_size, -1, 0, slot->buf,
				p->pool.slot_bytes, info);
	if (rc)
		return rc;
	*send = r->anchor || info->changed > 0;
	if (r->anchor)
		memcpy(base, slot->buf, bytes);
	else if (*send && (rc = prod_undo_apply(p, t, off, j, info, slot->buf)))
		return rc;
	if (*send)
		p->chunk_digest[j] = dcast_digest(base, bytes);
	r->changed += r->anchor ? count : info->changed;
	return 0;
}

static int publish_tensor(dcast_producer *p, prod_run *r, prod_tensor *t)
{
	for (uint32_t k = 0; k < t->n_chunks; k++) {
		dcast_chunk_info info;
		prod_slot *slot;
		int send = 0, rc;

		if ((rc = check_broker(p, r, 0)) || (rc = get_slot(p, r, &slot)))
			return rc;
		if ((rc = encode_range(p, r, t, k, slot, &info, &send))) {
			prod_pool_free_cb(slot->buf, slot);
			return rc;
		}
		if (!send) {
			prod_pool_free_cb(slot->buf, slot);
			continue;
		}
		if ((rc = send_slot(p, r, t, (uint64_t)k * p->opts.range_elems, &info, slot)))
			return rc;
		p->stats.chunks_sent = r->seq;
	}
	return 0;
}

static int send_manifest(dcast_producer *p)
{
	dcast_msg m;
	dcast_tensor_desc *d = malloc((p->n_tensors + 1) * sizeof(*d));
	int rc;

	if (!d)
		return dcast_fail(DCAST_ENOMEM, "producer: out of memory for the manifest");
	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	memcpy(m.u.manifest.model, p->model, sizeof(p->model));
	for (uint32_t i = 0; i < p->n_tensors; i++)
		d[i] = p->tensors[i].desc;
	m.u.manifest.n_tensors = p->n_tensors;
	m.u.manifest.tensors = d;
	rc = prod_conn_send(p, &m, NULL, dcast_now_ms() + p->opts.ack_timeout_ms);
	free(d);
	if (!rc)
		p->conn.manifest_sent = 1;
	return rc;
}

static int send_commit(dcast_producer *p, const prod_run *r)
{
	dcast_msg m;
	dcast_commit *c = &m.u.commit;

	dcast_msg_init(&m, DCAST_MSG_COMMIT);
	memcpy(c->model, p->model, sizeof(p->model));
	c->version = r->version;
	c->base_version = r->base_version;
	c->anchor = (uint32_t)r->anchor;
	c->part = p->part;
	c->parts = p->parts;
	c->chunks = r->seq;
	c->bytes = r->bytes;
	for (uint32_t j = 0; j < p->n_chunks; j++)
		p->commit_digests[j].digest = p->chunk_digest[j];
	c->n_digests = p->n_chunks;
	c->digests = p->commit_digests;
	return prod_conn_send(p, &m, NULL, dcast_now_ms() + p->opts.ack_timeout_ms);
}

/* One attempt at the whole version on the current connection. */
static int publish_once(dcast_producer *p, prod_run *r)
{
	int rc;

	if (!p->conn.manifest_sent && (rc = send_manifest(p)))
		return rc;
	for (uint32_t i = 0; i < p->n_tensors; i++)
		if ((rc = publish_tensor(p, r, &p->tensors[i])))
			return rc;
	if ((rc = check_broker(p, r, 0)))
		return rc;
	return send_commit(p, r);
}

/* A delta needs the broker's newest version to be our acknowledged one. */
static int need_anchor(const dcast_producer *p)
{
	return p->conn.need_anchor || p->acked_version == DCAST_VERSION_NONE ||
	       p->acked_version != p->conn.broker_version;
}

static void init_run(dcast_producer *p, uint64_t version, int anchor, prod_run *r)
{
	memset(r, 0, sizeof(*r));
	r->version = version;
	r->anchor = anchor;
	r->base_version = anchor ? DCAST_VERSION_NONE : p->acked_version;
	r->gen = p->conn.generation;
	r->progress_ms = dcast_now_ms();
}

static void start_run(dcast_producer *p, uint64_t version, prod_run *r)
{
	int anchor = !p->baseline_valid || need_anchor(p);

	init_run(p, version, anchor, r);
	prod_undo_reset(&p->undo);
	p->pending_version = version;
	p->pending_anchor = anchor;
	p->resend = 0;
	p->resends = 0;
}

/* ---- sending the pending version again after a re-join ----
 * Once publish returned, every range was encoded: the baseline holds the
 * pending version and the undo log its delta's payloads (unless it
 * overflowed).  The caller's tensors may have moved on, so a re-send comes
 * from these: the same delta when the broker still has its base, otherwise
 * the baseline as an anchor. */

static int resend_record(dcast_producer *p, prod_run *r, const prod_undo_rec *u)
{
	prod_slot *slot;
	int rc;

	if ((rc = check_broker(p, r, 0)) || (rc = get_slot(p, r, &slot)))
		return rc;
	memcpy(slot->buf, u + 1, u->payload_len);
	return send_slot(p, r, &p->tensors[u->tensor], u->off_elems, &u->info, slot);
}

static int resend_baseline_range(dcast_producer *p, prod_run *r, const prod_tensor *t,
				 uint32_t k)
{
	uint64_t off = (uint64_t)k * p->opts.range_elems;
	uint64_t count = t->shard_count - off < p->opts.range_elems ? t->shard_count - off
								      : p->opts.range_elems;
	dcast_chunk_info info = {DCAST_ENC_DENSE, t->elem_size, count, count,
				 count * t->elem_size};
	prod_slot *slot;
	int rc;

	if ((rc = check_broker(p, r, 0)) || (rc = get_slot(p, r, &slot)))
		return rc;
	memcpy(slot->buf, t->base + off * t->elem_size, info.payload_bytes);
	return send_slot(p, r, t, off, &info, slot);
}

static int resend_once(dcast_producer *p, prod_run *r)
{
	size_t at = 0;
	int rc;

	if (!p->conn.manifest_sent && (rc = send_manifest(p)))
		return rc;
	for (uint32_t i = 0; r->anchor && i < p->n_tensors; i++)
		for (uint32_t k = 0; k < p->tensors[i].n_chunks; k++)
			if ((rc = resend_baseline_range(p, r, &p->tensors[i], k)))
				return rc;
	for (uint32_t i = 0; !r->anchor && i < p->undo.n_records; i++)
		if ((rc = resend_record(p, r, prod_undo_next(&p->undo, &at))))
			return rc;
	if ((rc = check_broker(p, r, 0)))
		return rc;
	return send_commit(p, r);
}

int prod_resend_pending(dcast_producer *p)
{
	int anchor = p->pending_anchor || p->undo.lost || need_anchor(p), rc;
	prod_run r;

	p->resend = 0;
	if (++p->resends > p->opts.max_reconnects)
		return dcast_fail(DCAST_ECLOSED, "producer: version %llu sent %u times, never "
				  "acknowledged by the broker at %s",
				  (unsigned long long)p->pending_version, p->resends, p->endpoint);
	init_run(p, p->pending_version, anchor, &r);
	if ((rc = resend_once(p, &r)) == PROD_RESTART) {
		init_run(p, p->pending_version, 1, &r); /* the broker asked for an anchor */
		rc = resend_once(p, &r);
	}
	if (rc == PROD_RESTART)
		return dcast_fail(DCAST_ESTATE, "publish: broker keeps asking for an anchor");
	if (rc)
		return rc;
	DCAST_LOG_I("producer %s part %u: the broker did not have version %llu; sent it "
		    "again as %s", p->model, p->part, (unsigned long long)r.version,
		    r.anchor ? "an anchor" : "the same delta");
	p->pending_anchor = r.anchor;
	p->stats.total_resends++;
	return 0;
}

static void finish_stats(dcast_producer *p, const prod_run *r)
{
	dcast_producer_stats *s = &p->stats;

	s->version = r->version;
	s->anchor = r->anchor;
	s->chunks_total = p->n_chunks;
	s->chunks_sent = r->seq;
	s->changed_elems = r->changed;
	s->payload_bytes = r->bytes;
	s->total_payload_bytes += r->bytes;
}

/* Assign the fixed parts of the COMMIT digests: one per chunk range. */
static void digest_ranges(dcast_producer *p)
{
	uint64_t elems = 0;

	for (uint32_t i = 0; i < p->n_tensors; i++) {
		prod_tensor *t = &p->tensors[i];
		for (uint32_t k = 0; k < t->n_chunks; k++) {
			dcast_range_digest *d = &p->commit_digests[t->first_chunk + k];
			uint64_t off = (uint64_t)k * p->opts.range_elems;
			d->tensor = i;
			d->start = t->shard_off + off;
			d->count = t->shard_count - off < p->opts.range_elems ? t->shard_count - off
									    : p->opts.range_elems;
		}
		elems += t->shard_count;
	}
	p->stats.elems = elems;
}

static int freeze(dcast_producer *p)
{
	int rc;

	if (p->frozen)
		return 0;
	if (!p->n_tensors)
		return dcast_fail(DCAST_ESTATE, "publish: no tensors registered");
	if ((rc = prod_mem_setup(p))) {
		prod_mem_free(p);
		return rc;
	}
	digest_ranges(p);
	p->frozen = 1;
	return 0;
}

static int check_version(const dcast_producer *p, uint64_t v)
{
	uint64_t floor = p->acked_version, b = p->conn.broker_version;

	if (v == DCAST_VERSION_NONE)
		return dcast_fail(DCAST_EVERSION, "publish: version 2^64-1 is reserved");
	if (p->pending_version != DCAST_VERSION_NONE)
		floor = p->pending_version;
	if (floor != DCAST_VERSION_NONE && v <= floor)
		return dcast_fail(DCAST_EVERSION, "publish: version %llu is not above the last "
				  "published version %llu", (unsigned long long)v,
				  (unsigned long long)floor);
	if (b != DCAST_VERSION_NONE && v <= b)
		return dcast_fail(DCAST_EVERSION, "publish: version %llu is not above the broker's "
				  "newest committed version %llu", (unsigned long long)v,
				  (unsigned long long)b);
	return 0;
}

/* Before a new version: the previous one must be settled (acked or failed). */
static int settle_previous(dcast_producer *p, uint64_t version)
{
	uint64_t prev = p->pending_version;
	int rc;

	if (prev == DCAST_VERSION_NONE)
		return 0;
	rc = dcast_producer_wait(p, prev, (int)p->opts.ack_timeout_ms);
	if (rc == DCAST_ETIMEDOUT)
		return dcast_fail(rc, "publish %llu: previous version %llu still not acknowledged "
				  "after %u ms", (unsigned long long)version,
				  (unsigned long long)prev, p->opts.ack_timeout_ms);
	if (rc)
		DCAST_LOG_W("producer %s: version %llu was not taken (%s); version %llu goes "
			    "against %llu", p->model, (unsigned long long)prev, dcast_last_error(),
			    (unsigned long long)version, (unsigned long long)p->acked_version);
	return 0;
}

/* Make sure the broker still knows us: re-join a lost connection, and
 * re-HELLO after a silence the broker may have taken for a departure. */
static int ensure_joined(dcast_producer *p)
{
	uint64_t silent = dcast_now_ms() - p->conn.last_send_ms;

	if (p->conn.sock)
		prod_conn_poll(p, 0);
	if (!p->conn.up)
		return prod_conn_rejoin(p, "connection to the broker lost");
	if (silent > 2ull * p->conn.heartbeat_ms)
		return prod_conn_join(p);
	return 0;
}

static int retry_or_fail(dcast_producer *p, int rc, uint32_t *attempts)
{
	if (p->pending_version != DCAST_VERSION_NONE)
		rc = fail_pending(p, rc);
	if (rc == PROD_RESTART && ++*attempts <= p->opts.max_reconnects + 1)
		return 0;
	if (rc == DCAST_ECLOSED && ++*attempts <= p->opts.max_reconnects)
		return prod_conn_rejoin(p, dcast_last_error());
	return rc == PROD_RESTART ? dcast_fail(DCAST_ESTATE, "publish: broker keeps asking for "
					       "an anchor mid-version") : rc;
}

int dcast_producer_publish(dcast_producer *p, uint64_t version)
{
	uint32_t attempts = 0;
	prod_run r;
	int rc;

	if (!p)
		return dcast_fail(DCAST_EINVAL, "publish: NULL producer");
	if ((rc = freeze(p)) || (rc = settle_previous(p, version)) ||
	    (rc = check_version(p, version)))
		return rc;
	for (;;) {
		if ((rc = ensure_joined(p)) || (rc = check_version(p, version)))
			return rc;
		start_run(p, version, &r);
		if (!(rc = publish_once(p, &r)))
			break;
		if ((rc = retry_or_fail(p, rc, &attempts)))
			return rc;
	}
	finish_stats(p, &r);
	p->last_version = version;
	return 0;
}

/* The outcome of a version that is not pending. */
static int settled(const dcast_producer *p, uint64_t version)
{
	uint64_t n = p->n_history < PROD_HISTORY ? p->n_history : PROD_HISTORY;

	for (uint64_t i = 1; i <= n; i++) {
		const prod_outcome *o = &p->history[(p->n_history - i) % PROD_HISTORY];

		if (o->version != version)
			continue;
		if (!o->err)
			return 0;
		if (version == p->failed_version)
			return dcast_fail(p->failed_err, "%s", p->failed_text);
		return dcast_fail(o->err, "wait: version %llu failed (%s)",
				  (unsigned long long)version, dcast_errname(o->err));
	}
	if (p->n_history > PROD_HISTORY && version < p->history[p->n_history % PROD_HISTORY].version)
		return dcast_fail(DCAST_ENOTFOUND, "wait: version %llu is older than the last %d "
				  "published; its outcome is no longer kept",
				  (unsigned long long)version, PROD_HISTORY);
	return dcast_fail(DCAST_ENOTFOUND, "wait: version %llu was never published",
			  (unsigned long long)version);
}

/* One step of waiting for the pending version: errors from the broker, a
 * lost connection (re-join, and re-send if the broker lacks the version). */
static int wait_step(dcast_producer *p, uint64_t version, uint64_t deadline_ms)
{
	int rc;

	if ((rc = prod_conn_take_error(p, version)))
		return fail_pending(p, rc);
	if (!p->conn.up && (rc = prod_conn_rejoin(p, "connection lost before the ACK")))
		return p->pending_version == version ? fail_pending(p, rc) : rc;
	if (p->pending_version != version)
		return 0; /* settled by the re-join */
	if (p->resend && (rc = prod_resend_pending(p)))
		return p->conn.up || p->resends > p->opts.max_reconnects ? fail_pending(p, rc) : 0;
	if (dcast_now_ms() >= deadline_ms)
		return dcast_fail(DCAST_ETIMEDOUT, "wait: no ACK of version %llu from the "
				  "broker at %s yet", (unsigned long long)version, p->endpoint);
	uint64_t left = deadline_ms - dcast_now_ms();
	prod_conn_poll(p, (int)(left > PROD_POLL_MS ? PROD_POLL_MS : left));
	return 0;
}

int dcast_producer_wait(dcast_producer *p, uint64_t version, int timeout_ms)
{
	uint64_t deadline = dcast_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
	int rc;

	if (!p)
		return dcast_fail(DCAST_EINVAL, "wait: NULL producer");
	while (version == p->pending_version)
		if ((rc = wait_step(p, version, deadline)))
			return rc;
	return settled(p, version);
}
