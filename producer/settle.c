/* dcast_producer_wait() and dcast_producer_flush(): how a published
 * version ends, as the caller sees it (an anchor the sender thread still
 * sends is waited for first).  Waiting re-joins a lost connection and
 * re-sends a version the re-joined broker does not have; the outcomes
 * themselves are outcome.c's, which keeps the latest for wait().  Also
 * close()'s bounded flush. */
#include <string.h>
#include "producer_shared.h"

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

/* No ACK by the deadline, though the broker's HEARTBEATs (the last within
 * timeout_ms) name the version committed: its durable write is still
 * going (a large anchor's fsync on a slow disk takes minutes), or the ACK
 * was lost on the way.  A re-join asks: a WELCOME naming the version as
 * the broker's newest settles it as taken (prod_conn_join).  1 when
 * settled so. */
static int ask_committed(dcast_producer *p, uint64_t version, uint64_t timeout_ms)
{
	const prod_conn *c = &p->conn;

	if (c->hb_version == DCAST_VERSION_NONE || c->hb_version < version ||
	    dcast_now_ms() - c->hb_ms > timeout_ms)
		return 0;
	DCAST_LOG_I("producer %s part %u: no ACK of version %llu yet, which the broker's heartbeats "
		    "name committed; asking it again", p->model, p->part, (unsigned long long)version);
	return !prod_conn_join(p) && p->pending_version != version;
}

/* One step of waiting for the pending version: errors from the broker, a
 * lost connection (re-join, and re-send if the broker lacks the version). */
static int wait_step(dcast_producer *p, uint64_t version, uint64_t deadline_ms, uint64_t timeout_ms)
{
	int rc;

	if ((rc = prod_conn_take_error(p, version)))
		return prod_fail_pending(p, rc);
	if (!p->conn.up && (rc = prod_conn_rejoin(p, "connection lost before the ACK")))
		return p->pending_version == version ? prod_fail_pending(p, rc) : rc;
	if (p->pending_version != version)
		return 0; /* settled by the re-join */
	if (p->resend && (rc = prod_resend_pending(p)))
		return p->conn.up || p->resends > p->opts.max_reconnects ? prod_fail_pending(p, rc)
									 : 0;
	if (dcast_now_ms() >= deadline_ms)
		return ask_committed(p, version, timeout_ms)
			       ? 0
			       : dcast_fail(DCAST_ETIMEDOUT, "wait: no ACK of version %llu from the "
					    "broker at %s yet", (unsigned long long)version, p->endpoint);
	uint64_t left = deadline_ms - dcast_now_ms();
	prod_conn_poll(p, (int)(left > PROD_POLL_MS ? PROD_POLL_MS : left));
	return 0;
}

/* An anchor the sender thread still sends: as long as it goes on (it
 * gives up after ack_timeout_ms without progress), as publish() itself
 * took before it returned; the timeout then bounds the wait for the ACK.
 * A poll (timeout 0) is answered at once. */
int dcast_producer_wait(dcast_producer *p, uint64_t version, int timeout_ms)
{
	uint64_t timeout = (uint64_t)(timeout_ms > 0 ? timeout_ms : 0), deadline;
	int rc;

	if (!p)
		return dcast_fail(DCAST_EINVAL, "wait: NULL producer");
	if ((rc = prod_sender_join(p, timeout ? -1 : 0)))
		return rc;
	deadline = dcast_now_ms() + timeout;
	while (version == p->pending_version)
		if ((rc = wait_step(p, version, deadline, timeout)))
			return rc;
	return settled(p, version);
}

int dcast_producer_flush(dcast_producer *p, int timeout_ms)
{
	if (!p)
		return dcast_fail(DCAST_EINVAL, "flush: NULL producer");
	if (p->last_version == DCAST_VERSION_NONE)
		return 0;
	return dcast_producer_wait(p, p->last_version, timeout_ms);
}

/* close(): the last version's sending ended, then its ACK awaited up to
 * opts.close_timeout_ms while the connection stays up (no re-join); what
 * is still pending then is abandoned. */
void prod_close_flush(dcast_producer *p)
{
	uint64_t v = p->last_version, deadline;

	prod_sender_free(p);
	deadline = dcast_now_ms() + p->opts.close_timeout_ms;
	while (v != DCAST_VERSION_NONE && v == p->pending_version && p->conn.up &&
	       !prod_conn_take_error(p, v) && dcast_now_ms() < deadline)
		prod_conn_poll(p, PROD_POLL_MS);
	if (v != DCAST_VERSION_NONE && v == p->pending_version)
		DCAST_LOG_W("producer %s part %u: closing with version %llu not acknowledged",
			    p->model, p->part, (unsigned long long)v);
}
