/* The outcome of the pending version: the broker's ACK of exactly it, or a
 * failure (the baseline rolled back to the last acknowledged state), each
 * remembered for wait().  Below the connection (conn.c reports ACKs and
 * what a re-join found) and the waits (settle.c). */
#include <string.h>
#include "producer_shared.h"

static void remember(dcast_producer *p, uint64_t version, int err)
{
	p->history[p->n_history++ % PROD_HISTORY] = (prod_outcome){version, err};
	prod_progress_end(p);
}

/* The pending version's progress: what the broker has taken back in
 * credit (it stored those chunks) since the attempt began. */
void prod_progress_taken(dcast_producer *p)
{
	uint64_t back = prod_credit_back(p);

	if (p->pending_version != DCAST_VERSION_NONE && back >= p->progress.credit_from)
		PROD_PROGRESS_SET(p, bytes_taken, back - p->progress.credit_from);
}

uint64_t prod_credit_back(const dcast_producer *p)
{
	return p->conn.credit_granted - p->conn.credit_window;
}

void prod_progress_end(dcast_producer *p)
{
	PROD_PROGRESS_SET(p, end_ms, dcast_now_ms());
	PROD_PROGRESS_SET(p, active, 0);
}

/* Only an ACK naming the pending version settles it. */
void prod_version_acked(dcast_producer *p, uint64_t version)
{
	if (p->pending_version == DCAST_VERSION_NONE || version != p->pending_version)
		return;
	if (p->pending_anchor)
		p->conn.need_anchor = 0;
	DCAST_LOG_D("producer %s: version %llu acknowledged %.2f ms after publish", p->model,
		    (unsigned long long)version, prod_since_publish_ms(p));
	/* the broker has it all, whether or not its last credit came back yet */
	PROD_PROGRESS_SET(p, bytes_taken, __atomic_load_n(&p->progress.bytes_sent, __ATOMIC_RELAXED));
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

/* The baseline holds the broker's `version` (fetched, or the caller's copy
 * checked against its digests): the next version is a delta on it. */
void prod_baseline_adopted(dcast_producer *p, uint64_t version)
{
	p->acked_version = version;
	p->baseline_valid = 1;
	p->stats.baseline_version = version;
}
