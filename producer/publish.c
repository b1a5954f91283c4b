/* Publishing a version: the encoder threads (encode.c) diff each chunk
 * range of each registered shard against the baseline, folding the change
 * into it; this thread takes the ranges in order as they finish, logs each
 * change in the undo log (so a failed version can be taken back out of the
 * baseline, or sent again) and hands its payload to ZeroMQ (send.c), whose
 * I/O thread sends range k while the following ranges are encoded.  Then
 * COMMIT with a digest per chunk range; the broker's ACK (settle.c) ends
 * the version's undo log.  A lost connection mid-version is re-joined and
 * the version sent again from seq 0: the ranges already encoded from the
 * undo log, then the rest, or everything as an anchor if the broker needs
 * one.  An anchor of host tensors is a snapshot: the encoders copy the
 * tensors into the baseline, publish() returns, and the sender thread
 * (sender.c) sends the version from the baseline (PROD_ENC_BASE). */
#include <string.h>
#include "producer_shared.h"

#define PROD_JOB_WAIT_MS 20
#define SET(f, v) PROD_PROGRESS_SET(p, f, v)
#define PROD_NO_RESUME UINT32_MAX /* a range failed to encode: start over */

/* Fold a finished job into the undo log and the digests. */
static void record_job(dcast_producer *p, const prod_run *r, uint32_t j, const prod_job *job)
{
	if (!r->anchor && job->info.changed)
		prod_undo_record(p, j, job);
	if (r->anchor || job->info.changed)
		p->chunk_digest[j] = job->digest;
}

static int await_job(dcast_producer *p, prod_run *r, uint32_t j, prod_job **job)
{
	int rc;

	while ((rc = prod_enc_wait(p, j, PROD_JOB_WAIT_MS, job)) == DCAST_ETIMEDOUT) {
		if (dcast_now_ms() - r->progress_ms > p->opts.ack_timeout_ms)
			return dcast_fail(DCAST_ETIMEDOUT, "producer: range %u not encoded after %u "
					  "ms (no encode slot came back: the broker at %s has taken "
					  "no data)", j, p->opts.ack_timeout_ms, p->endpoint);
		if ((rc = prod_check_broker(p, r, 0)))
			return rc;
	}
	return rc;
}

/* The broker's messages (an ERROR, a re-join) between two chunks: at most
 * once a millisecond, since a poll costs as much as sending a small chunk;
 * waits for credit or for the socket poll anyway, and the COMMIT is sent
 * after a last check. */
static int check_now_and_then(dcast_producer *p, prod_run *r)
{
	uint64_t now = dcast_now_ms();

	if (now == r->checked_ms)
		return 0;
	r->checked_ms = now;
	return prod_check_broker(p, r, 0);
}

/* Range j: wait for its encoding, record it, send it. */
static int take_job(dcast_producer *p, prod_run *r, uint32_t j)
{
	const prod_tensor *t;
	prod_slot *slot;
	prod_job *job;
	int rc;

	if ((rc = await_job(p, r, j, &job)))
		return rc;
	r->progress_ms = dcast_now_ms();
	record_job(p, r, j, job);
	p->resume_from = j + 1;
	SET(ranges_done, j + 1);
	if (!(slot = job->slot))
		return 0;
	job->slot = NULL;
	if ((rc = check_now_and_then(p, r))) {
		prod_pool_free_cb(slot->buf, slot);
		return rc;
	}
	t = &p->tensors[job->tensor];
	rc = prod_send_slot(p, r, t, (uint64_t)(j - t->first_chunk) * p->opts.range_elems, &job->info, slot);
	SET(bytes_sent, r->bytes);
	if (!rc && r->seq == 1)
		DCAST_LOG_D("producer %s: version %llu: first chunk sent, %.2f ms after publish", p->model,
			    (unsigned long long)r->version, prod_since_publish_ms(p));
	return rc;
}

/* After a failure: every claimed range is encoded (and in the baseline);
 * record those not taken yet so a rollback or a resume covers them.  A
 * device batch moved whole tensors' baselines, claimed ranges or not: no
 * undo log covers that, so the version goes again as an anchor. */
static void settle_unsent(dcast_producer *p, const prod_run *r, uint32_t claimed)
{
	int hole = 0;

	if (__atomic_load_n(&p->enc.dev_moved, __ATOMIC_RELAXED))
		p->undo.lost = 1;
	for (uint32_t j = p->resume_from; j < claimed; j++) {
		prod_job *job = &p->enc.jobs[j];

		if (job->rc)
			hole = 1;
		else
			record_job(p, r, j, job);
		if (job->slot)
			prod_pool_free_cb(job->slot->buf, job->slot);
		job->slot = NULL;
	}
	p->resume_from = hole ? PROD_NO_RESUME : claimed;
}

static prod_enc_mode run_mode(const prod_run *r)
{
	if (r->from_base)
		return PROD_ENC_BASE;
	return r->anchor ? PROD_ENC_ANCHOR : PROD_ENC_DELTA;
}

static int run_jobs(dcast_producer *p, prod_run *r)
{
	uint32_t j = p->resume_from, claimed;
	int rc = 0;

	prod_enc_start(p, run_mode(r), j);
	while (!rc && j < p->n_chunks)
		rc = take_job(p, r, j++);
	claimed = prod_enc_stop(p);
	if (rc)
		settle_unsent(p, r, claimed);
	return rc;
}

/* One attempt at the whole version on the current connection. */
static int publish_once(dcast_producer *p, prod_run *r)
{
	int rc;

	if (!p->conn.manifest_sent && (rc = prod_send_manifest(p)))
		return rc;
	if (!r->anchor && (rc = prod_replay_records(p, r)))
		return rc;
	if ((rc = run_jobs(p, r)) || (rc = prod_check_broker(p, r, 0)))
		return rc;
	DCAST_LOG_D("producer %s: version %llu: %u chunks sent, %.2f ms after publish", p->model,
		    (unsigned long long)r->version, r->seq, prod_since_publish_ms(p));
	return prod_send_commit(p, r);
}

/* A new attempt at the version, from its first range. */
static void progress_start(dcast_producer *p, const prod_run *r)
{
	SET(ranges_done, 0);
	SET(bytes_sent, 0);
	SET(bytes_taken, 0);
	p->progress.credit_from = prod_credit_back(p);
	SET(ranges_total, p->n_chunks);
	SET(bytes_total, r->anchor ? p->stats.model_bytes : 0);
	SET(anchor, (uint64_t)r->anchor);
}

static void start_run(dcast_producer *p, uint64_t version, int anchor, prod_run *r)
{
	p->publish_ns = dcast_now_ns();
	prod_init_run(p, version, anchor, r);
	prod_undo_reset(&p->undo);
	p->resume_from = 0;
	p->pending_version = version;
	p->pending_anchor = anchor;
	p->commit_sent = 0;
	p->resend = 0;
	p->resends = 0;
	SET(start_ms, dcast_now_ms());
	SET(version, version);
	SET(err, 0);
	progress_start(p, r);
	SET(active, 1);
}

/* The same version again after a failed attempt: resume a delta (the
 * ranges done go again from the undo log), or start over as an anchor. */
static void restart_run(dcast_producer *p, prod_run *r)
{
	int anchor = r->anchor || p->undo.lost || p->resume_from == PROD_NO_RESUME ||
		     prod_need_anchor(p), from_base = r->from_base;

	if (anchor) {
		prod_undo_reset(&p->undo);
		p->resume_from = 0;
	}
	prod_init_run(p, r->version, anchor, r);
	r->from_base = from_base;
	p->pending_anchor = anchor;
	progress_start(p, r);
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
			d->count = prod_range_count(p, t, off);
		}
		elems += t->shard_count;
	}
	p->stats.elems = elems;
}

int prod_freeze(dcast_producer *p)
{
	int rc;

	if (p->frozen)
		return 0;
	if (!p->n_tensors)
		return dcast_fail(DCAST_ESTATE, "publish: no tensors registered");
	if ((rc = prod_mem_setup(p)) || (rc = prod_enc_setup(p))) {
		prod_enc_free(p);
		prod_mem_free(p);
		return rc;
	}
	digest_ranges(p);
	p->frozen = 1;
	return 0;
}

int dcast_producer_prepare(dcast_producer *p)
{
	int rc;

	if (!p)
		return dcast_fail(DCAST_EINVAL, "prepare: NULL producer");
	if ((rc = prod_freeze(p)))
		return rc;
	prod_mem_prefault(p);
	return 0;
}

static int check_version(const dcast_producer *p, uint64_t v)
{
	uint64_t floor = p->acked_version, b = p->conn.broker_version;

	if (v == DCAST_VERSION_NONE)
		return dcast_fail(DCAST_EVERSION, "publish: version 2^64-1 is reserved");
	if (p->pending_version != DCAST_VERSION_NONE && p->pending_version != v)
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
		return prod_conn_rejoin(p, p->conn.drop_why ? p->conn.drop_why
							 : "connection to the broker lost");
	if (silent > 2ull * p->conn.heartbeat_ms)
		return prod_conn_join(p);
	return 0;
}

/* After a failed attempt: 0 to try again (re-joined if the connection was
 * lost), else the error that ends the version. */
static int retry(dcast_producer *p, int rc, uint32_t *attempts)
{
	if (rc == PROD_RESTART)
		return ++*attempts <= p->opts.max_reconnects + 1
			       ? 0
			       : dcast_fail(DCAST_ESTATE, "publish: broker keeps asking for an "
					    "anchor mid-version");
	if (rc != DCAST_ECLOSED || ++*attempts > p->opts.max_reconnects)
		return rc;
	if ((rc = prod_conn_rejoin(p, dcast_last_error())))
		return rc;
	return check_version(p, p->pending_version);
}

/* Send the version started by start_run(), re-joining and re-trying as
 * needed: from publish() itself, or from the sender thread (an anchor
 * snapshot).  On error the version is settled as failed. */
static int send_version(dcast_producer *p, prod_run *r)
{
	uint32_t attempts = 0;
	int rc;

	while ((rc = publish_once(p, r))) {
		if ((rc = retry(p, rc, &attempts)))
			return prod_fail_pending(p, rc);
		restart_run(p, r);
	}
	finish_stats(p, r);
	return 0;
}

/* An anchor whose bytes may come from a snapshot in the baseline: every
 * tensor in host memory (a CUDA tensor's anchor is sent from the device). */
static int snapshot_fits(const dcast_producer *p)
{
	for (uint32_t i = 0; i < p->n_tensors; i++)
		if (p->tensors[i].mem != DCAST_MEM_HOST)
			return 0;
	return 1;
}

/* Copy every tensor into the baseline (the encoders share the ranges);
 * one memcpy of the model in all, and nothing else. */
static void snapshot(dcast_producer *p)
{
	prod_job *job;

	prod_enc_start(p, PROD_ENC_SNAPSHOT, 0);
	for (uint32_t j = 0; j < p->n_chunks; j++)
		while (prod_enc_wait(p, j, PROD_JOB_WAIT_MS, &job) == DCAST_ETIMEDOUT)
			;
	prod_enc_stop(p);
}

/* What stats_get() shows while the sender thread sends r. */
static void shown_stats(dcast_producer *p, const prod_run *r)
{
	dcast_producer_stats *s = &p->sender.shown;

	prod_stats_now(p, s);
	s->version = r->version;
	s->anchor = 1;
	s->chunks_total = p->n_chunks;
	s->chunks_sent = s->payload_bytes = 0;
	s->changed_elems = s->elems;
}

/* The MANIFEST, when due, from publish() itself: an error in the caller's
 * registrations (a header over DCAST_MAX_HEADER_BYTES) is publish()'s to
 * return, as on the other paths; a lost connection is left to the sender
 * thread's re-join. */
static int manifest_first(dcast_producer *p)
{
	int rc;

	if (p->conn.manifest_sent || !(rc = prod_send_manifest(p)) || rc == DCAST_ECLOSED)
		return 0;
	return rc;
}

/* A host anchor: snapshot, then the sender thread sends it (the caller's
 * tensors are free again at return); without a thread, sent here. */
static int publish_snapshot(dcast_producer *p, prod_run *r)
{
	int rc;

	if ((rc = manifest_first(p)))
		return prod_fail_pending(p, rc);
	snapshot(p);
	r->from_base = 1;
	shown_stats(p, r);
	if (!prod_sender_start(p, r, send_version))
		return 0;
	DCAST_LOG_W("producer %s: %s; sending version %llu before returning", p->model,
		    dcast_last_error(), (unsigned long long)r->version);
	return send_version(p, r);
}

int dcast_producer_publish(dcast_producer *p, uint64_t version)
{
	prod_run r;
	int rc, anchor;

	if (!p)
		return dcast_fail(DCAST_EINVAL, "publish: NULL producer");
	if ((rc = prod_sender_join(p, -1)) || (rc = prod_freeze(p)) ||
	    (rc = settle_previous(p, version)) || (rc = check_version(p, version)) ||
	    (rc = ensure_joined(p)) || (rc = check_version(p, version)))
		return rc;
	anchor = !p->baseline_valid || prod_need_anchor(p);
	start_run(p, version, anchor, &r);
	if (anchor && snapshot_fits(p))
		rc = publish_snapshot(p, &r);
	else
		rc = send_version(p, &r);
	prod_mem_pin(p);
	if (!rc)
		p->last_version = version;
	return rc;
}
