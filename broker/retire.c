/* Removing models: a name holds one of the --max-models slots (and, with
 * --data-dir, its segments and run file, restored at every start) until it
 * is removed, by an operator (admin.c: `deltacast model delete`) or by
 * idle expiry (--model-idle-s).  A removed model is gone everywhere at
 * once for its peers and its slot; its files are deleted by the durable
 * writer in order after the model's queued writes, and a producer HELLO
 * may create the name again as a new run, so a consumer holding the old
 * run's state drops it and takes the new run's anchor (run.c).
 * docs/operations.md, "Removing models". */
#include <string.h>
#include "broker.h"
#include "dcast_common.h"
#include "durable.h" /* --data-dir: the writer deletes the files */
#include "fold.h"

/* ERROR(DCAST_ENOTFOUND, text) to every peer of m in s, then drop it: its
 * next message gets DCAST_ESTATE and it joins again. */
static void peers_evict(struct broker *b, struct broker_peers *s, void *sock, uint32_t *connected,
			const struct broker_model *m, const char *text)
{
	for (uint64_t i = 0; i < s->hi; i++) {
		struct broker_peer *p = &s->arr[i];

		if (!p->used || p->model != m)
			continue;
		dcast_wire_send_error(sock, p->rid, p->rid_len, DCAST_ENOTFOUND, m->name,
				      DCAST_VERSION_NONE, text);
		DCAST_LOG_I("%s %s of %s: dropped: the model was removed",
			    s == &b->prod ? "producer" : "consumer", p->client, m->name);
		broker_peer_forget(s, p);
		(*connected)--;
	}
}

static void table_remove(struct broker *b, const struct broker_model *m)
{
	for (uint32_t i = 0; i < b->n_models; i++)
		if (b->models[i] == m) {
			memmove(b->models + i, b->models + i + 1,
				(b->n_models - i - 1) * sizeof(*b->models));
			b->n_models--;
			return;
		}
	DCAST_ASSERT(0 && "removed model not in the table");
}

/* What the model holds in memory goes now; the struct itself may wait
 * for the durable writer. */
static void model_empty(struct broker_model *m)
{
	broker_log_clear(m);
	broker_fold_free(m);
	broker_manifest_put(m->manifest);
	m->manifest = NULL;
	broker_segfile_put(m->segfile);
	m->segfile = NULL;
}

int broker_model_remove(struct broker *b, struct broker_model *m, int expired, const char *why)
{
	char text[DCAST_MAX_TEXT + 1];

	DCAST_ASSERT(!m->deleting);
	if (m->relayed)
		return dcast_fail(DCAST_ESTATE, "model %s is relayed from --upstream (its "
				  "--upstream-model flag keeps it): not removed", m->name);
	m->deleting = 1;
	if (broker_durable_on(b) && broker_durable_drop(b, m, 1)) {
		m->deleting = 0;
		return DCAST_ENOMEM;
	}
	snprintf(text, sizeof(text), "model %s %s: %s; a producer HELLO creates it again as a new run",
		 m->name, expired ? "expired" : "deleted", why);
	DCAST_LOG_I("model %s: removed (%s): %s; version %lld, %u versions in its log%s", m->name,
		    expired ? "expired" : "deleted", why, (long long)broker_model_newest(m), m->n_log,
		    broker_durable_on(b) ? "; its files are being deleted" : "");
	broker_pending_abort(b, m, text);
	peers_evict(b, &b->prod, b->producers, &b->stats.producers_connected, m, text);
	peers_evict(b, &b->cons, b->consumers, &b->stats.consumers_connected, m, text);
	table_remove(b, m);
	broker_run_forget(b, m);
	model_empty(m);
	if (expired)
		b->stats.models_expired++;
	else
		b->stats.models_deleted++;
	if (!broker_durable_on(b))
		broker_model_free(m);
	return 0;
}

void broker_model_clear(struct broker *b, struct broker_model *m)
{
	broker_pending_abort(b, m, NULL);
	if (broker_durable_on(b) && broker_durable_drop(b, m, 0))
		DCAST_LOG_E("model %s: segments of the earlier run not deleted: %s", m->name,
			    dcast_last_error());
	for (uint64_t i = 0; i < b->cons.hi; i++)
		if (b->cons.arr[i].used && b->cons.arr[i].model == m)
			broker_peer_reset(&b->cons.arr[i]);
	model_empty(m);
	m->need_anchor = 0;
	m->durable_version = m->lost_version = m->poisoned = DCAST_VERSION_NONE;
	m->clears++;
}

/* Every model with a peer on it is active now. */
static void models_touch(struct broker_peers *s, uint64_t now_ms)
{
	for (uint64_t i = 0; i < s->hi; i++)
		if (s->arr[i].used && s->arr[i].model)
			s->arr[i].model->active_ms = now_ms;
}

void broker_models_idle(struct broker *b, uint64_t now_ms)
{
	uint64_t idle_ms = b->cfg.model_idle_s * 1000;
	char why[128];

	if (!idle_ms || b->late_turn)
		return;
	models_touch(&b->prod, now_ms);
	models_touch(&b->cons, now_ms);
	for (uint32_t i = b->n_models; i-- > 0;) {
		struct broker_model *m = b->models[i];

		if (m->relayed || m->pending || now_ms - m->active_ms < idle_ms)
			continue;
		snprintf(why, sizeof(why), "no producer, no consumer and no version for %llu s "
			 "(--model-idle-s %llu)", (unsigned long long)((now_ms - m->active_ms) / 1000),
			 (unsigned long long)b->cfg.model_idle_s);
		if (broker_model_remove(b, m, 1, why))
			DCAST_LOG_W("model %s: not expired: %s", m->name, dcast_last_error());
	}
}
