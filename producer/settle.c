/* How a published version ends: the broker's ACK of exactly that version,
 * or a failure (the baseline rolled back to the last acknowledged state),
 * and dcast_producer_wait(), which re-joins a lost connection and re-sends
 * a version the re-joined broker does not have.  The outcomes of the latest
 * versions are kept for wait(). */
#include <string.h>
#include "producer_impl.h"

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

int prod_fail_pending(dcast_producer *p, int rc)
{
	char why[DCAST_MAX_TEXT];

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	prod_version_failed(p, rc > 0 ? rc : DCAST_EABORTED, why);
	return dcast_fail(rc, "%s", why);
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
		return prod_fail_pending(p, rc);
	if (!p->conn.up && (rc = prod_conn_rejoin(p, "connection lost before the ACK")))
		return p->pending_version == version ? prod_fail_pending(p, rc) : rc;
	if (p->pending_version != version)
		return 0; /* settled by the re-join */
	if (p->resend && (rc = prod_resend_pending(p)))
		return p->conn.up || p->resends > p->opts.max_reconnects ? prod_fail_pending(p, rc)
									 : 0;
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
