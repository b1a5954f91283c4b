/* The outcome of the pending version: the broker's ACK of exactly it, or a
 * failure (the baseline rolled back to the last acknowledged state), each
 * remembered for wait().  Below the connection (conn.c reports ACKs and
 * what a re-join found) and the waits (settle.c). */
#include <string.h>
#include "producer_shared.h"

/* ---- the debug tier (DCAST_DEBUG_ASSERT): the baseline checked at both
 * ends of each of its steps (adopted, acknowledged, failed); O(ranges) ---- */

/* The baseline's range digests folded into one value, in range order. */
static uint64_t digests_fold(const dcast_producer *p)
{
	uint64_t h = 0;

	for (uint32_t j = 0; j < p->n_chunks; j++)
		h = (h ^ p->chunk_digest[j]) * 0x100000001b3ull;
	return h;
}

/* The baseline between versions: valid only at an acknowledged version,
 * and then exactly that version (its digests those it had when it became
 * valid); the version in flight, if any, above it; no undo log left over. */
static int check_baseline(const dcast_producer *p)
{
	int settled = p->pending_version == DCAST_VERSION_NONE;

	DCAST_ASSERT(!p->baseline_valid || p->acked_version != DCAST_VERSION_NONE);
	DCAST_ASSERT(settled || p->acked_version == DCAST_VERSION_NONE ||
		     p->pending_version > p->acked_version);
	DCAST_ASSERT(!settled || !p->baseline_valid || digests_fold(p) == p->base_fold);
	DCAST_ASSERT(!settled || !p->undo.n_records);
	return 1;
}

/* What a COMMIT of the pending version told the broker is the baseline:
 * each range's digest as it is now. */
static int check_published(const dcast_producer *p)
{
	for (uint32_t j = 0; p->commit_sent && j < p->n_chunks; j++)
		DCAST_ASSERT(p->commit_digests[j].digest == p->chunk_digest[j]);
	return 1;
}

/* The baseline became valid at acked_version: remember its digests. */
static void base_settled(dcast_producer *p)
{
	p->baseline_valid = 1;
#if defined(DCAST_DEBUG) && DCAST_DEBUG
	p->base_fold = digests_fold(p);
#endif
}

static void remember(dcast_producer *p, uint64_t version, int err)
{
	p->history[p->n_history++ % PROD_HISTORY] = (prod_outcome){version, err};
	PROD_PROGRESS_SET(p, err, (uint64_t)err);
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
	DCAST_DEBUG_ASSERT(check_baseline(p) && check_published(p));
	if (p->pending_anchor)
		p->conn.need_anchor = 0;
	DCAST_LOG_D("producer %s: version %llu acknowledged %.2f ms after publish", p->model,
		    (unsigned long long)version, prod_since_publish_ms(p));
	/* the broker has it all, whether or not its last credit came back yet */
	PROD_PROGRESS_SET(p, bytes_taken, __atomic_load_n(&p->progress.bytes_sent, __ATOMIC_RELAXED));
	p->acked_version = p->pending_version;
	p->pending_version = DCAST_VERSION_NONE;
	base_settled(p);
	p->resend = 0;
	prod_undo_reset(&p->undo);
	remember(p, p->acked_version, 0);
	DCAST_DEBUG_ASSERT(check_baseline(p) && p->acked_version == version);
}

/* A failed version ends its session: the next call joins again.  Before
 * its COMMIT went out the broker may hold it open, refusing every later
 * version of the session meanwhile ("version V while version W is open");
 * after it, the broker may have refused it for what the producer does not
 * know (its newest version, when the ACK of one was lost: every delta on
 * the older base is refused); and a failure for want of credit leaves the
 * session's count of it in doubt.  A new session drops the open version,
 * says the broker's newest in its WELCOME and starts from a fresh window. */
static void session_drop(dcast_producer *p)
{
	if (!p->conn.up)
		return;
	p->conn.drop_why = "the last version failed: a new session starts from the broker's state";
	p->conn.up = 0;
}

void prod_version_failed(dcast_producer *p, int err, const char *why)
{
	if (p->pending_version == DCAST_VERSION_NONE)
		return;
	DCAST_DEBUG_ASSERT(check_baseline(p));
	DCAST_LOG_W("producer %s part %u: version %llu failed (%s); baseline back at %lld%s",
		    p->model, p->part, (unsigned long long)p->pending_version, why,
		    (long long)p->acked_version, /* -1: none */
		    p->pending_anchor || p->undo.lost ? ", next version is an anchor" : "");
	if (p->pending_anchor || p->undo.lost)
		p->baseline_valid = 0;
	session_drop(p);
	prod_undo_rollback(p);
	p->failed_version = p->pending_version;
	p->failed_err = err;
	snprintf(p->failed_text, sizeof(p->failed_text), "version %llu failed: %s",
		 (unsigned long long)p->pending_version, why);
	remember(p, p->pending_version, err);
	p->pending_version = DCAST_VERSION_NONE;
	p->resend = 0;
	DCAST_DEBUG_ASSERT(check_baseline(p)); /* rolled back to acked_version, or invalid */
}

int prod_fail_pending(dcast_producer *p, int rc)
{
	char why[DCAST_MAX_TEXT];

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	prod_version_failed(p, rc > 0 ? rc : DCAST_EABORTED, why);
	return dcast_fail(rc, "%s", why);
}

/* The counters as the versions settled them (no sender thread running). */
void prod_stats_now(const dcast_producer *p, dcast_producer_stats *out)
{
	*out = p->stats;
	out->acked_version = p->acked_version;
	out->broker_version = p->conn.broker_version;
	out->failed_version = p->failed_version;
	out->failed_err = p->failed_version == DCAST_VERSION_NONE ? 0 : p->failed_err;
}

/* The baseline is about to be overwritten by an adopt's copies: it holds
 * no version until prod_baseline_adopted(), as before any adopt, so a copy
 * that fails half-way leaves the next version an anchor. */
void prod_baseline_dropped(dcast_producer *p)
{
	DCAST_DEBUG_ASSERT(p->pending_version == DCAST_VERSION_NONE &&
			   p->last_version == DCAST_VERSION_NONE && check_baseline(p));
	p->baseline_valid = 0;
	p->acked_version = DCAST_VERSION_NONE; /* only an adopt set it, before any publish */
	p->stats.baseline_version = DCAST_VERSION_NONE;
	DCAST_DEBUG_ASSERT(check_baseline(p));
}

/* The baseline holds the broker's `version` (fetched, or the caller's copy
 * checked against its digests): the next version is a delta on it.  The
 * copies went into a dropped baseline (prod_baseline_dropped). */
void prod_baseline_adopted(dcast_producer *p, uint64_t version)
{
	DCAST_DEBUG_ASSERT(p->pending_version == DCAST_VERSION_NONE &&
			   p->last_version == DCAST_VERSION_NONE && version != DCAST_VERSION_NONE);
	DCAST_DEBUG_ASSERT(!p->baseline_valid && p->acked_version == DCAST_VERSION_NONE);
	p->acked_version = version;
	base_settled(p);
	p->stats.baseline_version = version;
	DCAST_DEBUG_ASSERT(check_baseline(p) && p->acked_version == version);
}
