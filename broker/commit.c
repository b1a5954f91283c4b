/* The commit pipeline: what happens to a version once it is whole (all
 * its parts, or the upstream's COMMIT) and in the log, and what start-up
 * puts back into the log.  It calls down into durability (queue the write;
 * the ACK follows its completion) and the anchor folder; log.c stays a
 * data structure that calls nobody. */
#include "broker.h"
#include "dcast_common.h"
#include "durable.h" /* --data-dir (broker/durable.c) */
#include "fold.h"    /* broker-made anchors (broker/fold.c) */

/* Hook: the anchor folder keeps the log an anchor replaces. */
void broker_version_entering(struct broker *b, struct broker_model *m, struct broker_version *v)
{
	if (v->anchor)
		broker_fold_anchor_coming(b, m, v);
}

/* Hook: durability (queued; ACK on completion) and the anchor folder add
 * their calls here. */
int broker_version_committed(struct broker *b, struct broker_model *m,
			     struct broker_version *v)
{
	int rc;

	DCAST_LOG_I("model %s: version %llu committed (%s, %u chunks, %llu bytes)", m->name,
		    (unsigned long long)v->version, v->anchor ? "anchor" : "delta", v->n_chunks,
		    (unsigned long long)v->payload_bytes);
	rc = broker_durable_commit(b, m, v, 1); /* --data-dir: ACK once durable */
	broker_fold_committed(b, m, v); /* broker-made anchors: queued, folded later */
	return rc; /* it is in the log either way: the fold must see it */
}

/* Hook: durability re-inserts the versions on disk here. */
int broker_log_restore(struct broker *b)
{
	int rc = broker_durable_restore(b); /* --data-dir: replay segments */

	return rc ? rc : broker_fold_open(b); /* broker-made anchors: fold the restored logs */
}
