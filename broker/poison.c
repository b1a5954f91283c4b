/* A poisoned version: the fold (fold.c) found a committed version bad, and
 * here it is cut off from everyone who would take it: the consumers of
 * its model (cursors stop before it), its producers (through b->outcome,
 * which ingest.c registers, so this file names no file above it) and the
 * data dir (the mark kept in the model's segment). */
#include <stdio.h>
#include "broker.h"
#include "dcast_common.h"
#include "durable.h" /* --data-dir: the poison mark */

/* Each consumer of m gets ERROR(DCAST_EPOISONED, version, text), and one
 * streaming a version at or after it stops there (its cursor stays on the
 * version before). */
static void consumers_poisoned(struct broker *b, const struct broker_model *m, uint64_t version,
			       const char *text)
{
	dcast_msg e;

	dcast_msg_init(&e, DCAST_MSG_ERROR);
	e.u.error.code = DCAST_EPOISONED;
	e.u.error.version = version;
	snprintf(e.u.error.text, sizeof(e.u.error.text), "%s", text);
	for (uint64_t i = 0; i < b->cons.hi; i++) {
		struct broker_peer *p = &b->cons.arr[i];

		if (!p->used || p->model != m)
			continue;
		if (p->cur && p->cur->version >= version) { /* stops mid-version */
			broker_version_put(p->cur);
			p->cur = NULL;
			p->next_chunk = 0;
		}
		snprintf(e.u.error.model, sizeof(e.u.error.model), "%s", p->want);
		broker_send_msg(b, b->consumers, p, &e);
	}
}

/* The read cache keeps nothing of `version` and what follows it. */
static void uncache_from(struct broker_model *m, uint64_t version)
{
	for (uint32_t i = 0; i < m->n_log; i++)
		if (m->log[i]->version >= version)
			broker_version_uncache(m->log[i]);
	for (uint32_t i = 0; i < m->n_tail; i++)
		if (m->tail[i]->version >= version)
			broker_version_uncache(m->tail[i]);
}

void broker_version_poison(struct broker *b, struct broker_model *m, uint64_t version, int code,
			   const char *why)
{
	char text[DCAST_MAX_TEXT + 1];

	if (m->poisoned != DCAST_VERSION_NONE && m->poisoned <= version)
		return;
	m->poisoned = version;
	b->stats.versions_poisoned++;
	snprintf(text, sizeof(text), "model %s version %llu poisoned (%s: %s): neither it nor any "
		 "version after it is served; consumers stay on the version before it until the "
		 "next anchor", m->name, (unsigned long long)version, dcast_errname(code), why);
	DCAST_LOG_E("%s%s", text, m->relayed ? "" : "; asking its producers for an anchor");
	if (broker_durable_poison(b, m, version, text))
		DCAST_LOG_E("model %s: the poison mark of version %llu is not kept on disk (%s): "
			    "a restart serves the version again", m->name,
			    (unsigned long long)version, dcast_last_error());
	uncache_from(m, version);
	consumers_poisoned(b, m, version, text);
	if (b->outcome[m->relayed != 0].poisoned) /* a relay's upstream decides what comes */
		b->outcome[m->relayed != 0].poisoned(b, m, version, text);
}
