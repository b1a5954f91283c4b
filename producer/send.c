/* The wire side of publishing a version: CHUNK messages handed to ZeroMQ
 * zero-copy within the broker's credit (the slot returns to the pool when
 * the I/O thread is done with it), the MANIFEST and the COMMIT, and what the
 * broker says between chunks.  Also the re-send of a version whose COMMIT
 * went out but which a re-joined broker does not have: from the baseline
 * and the undo log, never from the caller's tensors. */
#include <string.h>
#include "producer_shared.h"

#define PROD_COPY_BYTES (64u << 10) /* a payload up to this is copied (payload_msg) */

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
	dcast_chunk_seal(c, payload);
}

/* A delta needs the broker's newest version to be our acknowledged one. */
int prod_need_anchor(const dcast_producer *p)
{
	return p->conn.need_anchor || p->acked_version == DCAST_VERSION_NONE ||
	       p->acked_version != p->conn.broker_version;
}

void prod_init_run(dcast_producer *p, uint64_t version, int anchor, prod_run *r)
{
	memset(r, 0, sizeof(*r));
	r->version = version;
	r->anchor = anchor;
	r->base_version = anchor ? DCAST_VERSION_NONE : p->acked_version;
	r->gen = p->conn.generation;
	r->progress_ms = dcast_now_ms();
}

int prod_check_broker(dcast_producer *p, const prod_run *r, int timeout_ms)
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
		if ((rc = prod_check_broker(p, r, PROD_POLL_MS)))
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
		if ((rc = prod_check_broker(p, r, 0)))
			return rc;
	}
	return 0;
}

/* The payload as a ZeroMQ message.  A large one goes zero-copy, and its
 * slot returns to the pool when the I/O thread is done with it; a small
 * one (PROD_COPY_BYTES at most) is copied, and its slot returns at once:
 * the slots are as large as the largest range, so there are few of them
 * (10 of 6.4 MB at the defaults), and a version of thousands of small
 * chunks otherwise waited for the I/O thread every tenth chunk.  The slot
 * is released in every case. */
static int payload_msg(zmq_msg_t *zm, uint64_t bytes, prod_slot *slot)
{
	if (bytes > PROD_COPY_BYTES) {
		if (!zmq_msg_init_data(zm, slot->buf, bytes, prod_pool_free_cb, slot))
			return 0;
	} else if (!zmq_msg_init_size(zm, bytes)) {
		if (bytes)
			memcpy(zmq_msg_data(zm), slot->buf, bytes);
		prod_pool_free_cb(slot->buf, slot);
		return 0;
	}
	prod_pool_free_cb(slot->buf, slot);
	return dcast_fail(DCAST_EZMQ, "producer: a message of %llu payload bytes: %s",
			  (unsigned long long)bytes, zmq_strerror(zmq_errno()));
}

int prod_send_slot(dcast_producer *p, prod_run *r, const prod_tensor *t, uint64_t off,
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
	if ((rc = payload_msg(&zm, info->payload_bytes, slot)))
		return rc;
	if ((rc = prod_conn_send(p, &m, &zm, dcast_now_ms() + p->opts.ack_timeout_ms))) {
		zmq_msg_close(&zm);
		return rc;
	}
	p->conn.credit_used += info->payload_bytes;
	r->seq++;
	r->bytes += info->payload_bytes;
	r->changed += info->changed;
	r->progress_ms = dcast_now_ms();
	return 0;
}

int prod_send_manifest(dcast_producer *p)
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

int prod_send_commit(dcast_producer *p, const prod_run *r)
{
	dcast_msg m;
	dcast_commit *c = &m.u.commit;
	int rc;

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
	if (!(rc = prod_conn_send(p, &m, NULL, dcast_now_ms() + p->opts.ack_timeout_ms)))
		p->commit_sent = 1;
	return rc;
}

/* Send the undo log's chunks again, in their order: the ranges of the
 * version encoded (and folded into the baseline) by an earlier attempt. */
int prod_replay_records(dcast_producer *p, prod_run *r)
{
	size_t at = 0;
	int rc;

	for (uint32_t i = 0; i < p->undo.n_records; i++) {
		const prod_undo_rec *u = prod_undo_next(&p->undo, &at);
		prod_slot *slot;

		if ((rc = prod_check_broker(p, r, 0)) || (rc = get_slot(p, r, &slot)))
			return rc;
		memcpy(slot->buf, u + 1, u->payload_len);
		if ((rc = prod_send_slot(p, r, &p->tensors[u->tensor], u->off_elems, &u->info, slot)))
			return rc;
	}
	return 0;
}

/* ---- the pending version again, after a re-join ----
 * Once publish returned, every range was encoded: the baseline holds the
 * pending version and the undo log its delta's payloads (unless it
 * overflowed).  The caller's tensors may have moved on, so a re-send comes
 * from these: the same delta when the broker still has its base, otherwise
 * the baseline as an anchor. */

static int resend_baseline_range(dcast_producer *p, prod_run *r, const prod_tensor *t,
				 uint32_t k)
{
	uint64_t off = (uint64_t)k * p->opts.range_elems, count = prod_range_count(p, t, off);
	dcast_chunk_info info = {DCAST_ENC_DENSE, t->elem_size, count, count,
				 count * t->elem_size};
	prod_slot *slot;
	int rc;

	if ((rc = prod_check_broker(p, r, 0)) || (rc = get_slot(p, r, &slot)))
		return rc;
	if ((rc = prod_base_read(t, off, slot->buf, info.payload_bytes))) {
		prod_pool_free_cb(slot->buf, slot);
		return rc;
	}
	return prod_send_slot(p, r, t, off, &info, slot);
}

static int resend_once(dcast_producer *p, prod_run *r)
{
	int rc;

	if (!p->conn.manifest_sent && (rc = prod_send_manifest(p)))
		return rc;
	for (uint32_t i = 0; r->anchor && i < p->n_tensors; i++)
		for (uint32_t k = 0; k < p->tensors[i].n_chunks; k++)
			if ((rc = resend_baseline_range(p, r, &p->tensors[i], k)))
				return rc;
	if (!r->anchor && (rc = prod_replay_records(p, r)))
		return rc;
	if ((rc = prod_check_broker(p, r, 0)))
		return rc;
	return prod_send_commit(p, r);
}

int prod_resend_pending(dcast_producer *p)
{
	int anchor = p->pending_anchor || p->undo.lost || prod_need_anchor(p), rc;
	prod_run r;

	p->resend = 0;
	if (++p->resends > p->opts.max_reconnects)
		return dcast_fail(DCAST_ECLOSED, "producer: version %llu sent %u times, never "
				  "acknowledged by the broker at %s",
				  (unsigned long long)p->pending_version, p->resends, p->endpoint);
	prod_init_run(p, p->pending_version, anchor, &r);
	if ((rc = resend_once(p, &r)) == PROD_RESTART) {
		prod_init_run(p, p->pending_version, 1, &r); /* the broker asked for an anchor */
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
