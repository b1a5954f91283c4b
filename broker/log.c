/* The broker's log per model: the newest anchor and every committed delta
 * after it, each version refcounted so that consumers mid-stream keep what
 * the log drops.  Retention does not cut the chain (that would strand every
 * consumer behind the cut): past --retain-versions or --retain-bytes the
 * model asks its producers for an anchor, which then replaces the log. */
#include <malloc.h>
#include <string.h>
#include "broker.h"
#include "dcast_common.h"

#define TRIM_EVERY_MS 1000

/* Nothing on its way: no fan-out under way and no open version. */
static int quiet(const struct broker *b)
{
	if (b->fanout_more || b->fanout_blocked)
		return 0;
	for (uint32_t i = 0; i < b->n_models; i++)
		if (b->models[i]->pending)
			return 0;
	return 1;
}

static uint64_t log_changes(const struct broker *b)
{
	return b->stats.versions_committed + b->stats.versions_aborted + b->stats.anchors_made +
	       b->stats.versions_to_disk;
}

int broker_heap_trim_due(const struct broker *b)
{
	return log_changes(b) != b->trim_seen;
}

void broker_heap_trim(struct broker *b, uint64_t now_ms)
{
	uint64_t seen = log_changes(b), t0;

	if (seen == b->trim_seen || now_ms - b->trim_ms < TRIM_EVERY_MS || !quiet(b))
		return;
	t0 = dcast_now_ns();
	malloc_trim(0);
	t0 = dcast_now_ns() - t0;
	b->trim_seen = seen;
	b->trim_ms = now_ms;
	b->stats.heap_trims++;
	if (t0 > b->stats.heap_trim_max_ns)
		b->stats.heap_trim_max_ns = t0;
}

/* ---- the debug tier (DCAST_DEBUG_ASSERT): each change of the log is
 * checked at both its ends; O(log length) per change, plus O(chunks) for
 * the version that enters ---- */

/* The log's invariant: an anchor first, then deltas each on the version
 * before it, versions strictly increasing, log_bytes the sum of their
 * mem_bytes; the versions kept past a damaged record each on the one
 * before.  (The open version is ingest.c's: check_pending.) */
static int check_log(const struct broker_model *m)
{
	uint64_t bytes = 0;

	for (uint32_t i = 0; i < m->n_log; i++) {
		const struct broker_version *v = m->log[i];
		DCAST_ASSERT(v->refs >= 1 && v->version != DCAST_VERSION_NONE);
		DCAST_ASSERT(i || v->anchor);
		DCAST_ASSERT(!i || v->anchor || v->base_version == m->log[i - 1]->version);
		DCAST_ASSERT(!i || v->version > m->log[i - 1]->version);
		bytes += v->mem_bytes;
	}
	DCAST_ASSERT(bytes == m->log_bytes && m->n_log <= m->cap_log);
	for (uint32_t i = 1; i < m->n_tail; i++)
		DCAST_ASSERT(m->tail[i]->base_version == m->tail[i - 1]->version);
	return 1;
}

/* A committed version against its COMMIT frame (what consumers are told):
 * the same number, base, anchor flag, chunk count and bytes; its chunks'
 * payloads sum to those bytes. */
static int check_version(const struct broker_version *v)
{
	zmq_msg_t *hdr = (zmq_msg_t *)&v->commit_hdr;
	uint64_t bytes = 0;
	dcast_msg c;

	for (uint32_t i = 0; i < v->n_chunks; i++)
		bytes += v->chunks[i].payload_len;
	DCAST_ASSERT(bytes == v->payload_bytes && v->manifest && v->refs >= 1);
	DCAST_ASSERT(v->anchor ? v->base_version == DCAST_VERSION_NONE : v->base_version < v->version);
	DCAST_ASSERT(!dcast_msg_decode(zmq_msg_data(hdr), zmq_msg_size(hdr), &c));
	DCAST_ASSERT(c.type == DCAST_MSG_COMMIT && c.u.commit.version == v->version &&
		     c.u.commit.base_version == v->base_version &&
		     c.u.commit.anchor == (uint32_t)v->anchor && c.u.commit.chunks == v->n_chunks &&
		     c.u.commit.bytes == v->payload_bytes && c.u.commit.n_digests == v->n_digests);
	dcast_msg_free(&c);
	return 1;
}

struct broker_model *broker_model_get(struct broker *b, const char *name, int create)
{
	struct broker_model *m;

	for (uint32_t i = 0; i < b->n_models; i++)
		if (!strcmp(b->models[i]->name, name))
			return b->models[i];
	if (!create)
		return NULL;
	if (b->n_models >= b->cfg.max_models) {
		dcast_fail(DCAST_EBUSY, "model \"%s\": broker already serves --max-models %llu models",
			   name, (unsigned long long)b->cfg.max_models);
		return NULL;
	}
	if (!(m = calloc(1, sizeof(*m)))) {
		dcast_fail(DCAST_ENOMEM, "model \"%s\": out of memory", name);
		return NULL;
	}
	snprintf(m->name, sizeof(m->name), "%s", name);
	pthread_mutex_init(&m->slab.mu, NULL);
	m->durable_version = m->lost_version = m->poisoned = DCAST_VERSION_NONE;
	m->run = broker_run_new();
	m->active_ms = dcast_now_ms();
	b->models[b->n_models++] = m;
	return m; /* the caller logs why it exists: a producer's HELLO, a restore, a relay */
}

struct broker_manifest *broker_manifest_new(dcast_manifest *src)
{
	struct broker_manifest *mf = calloc(1, sizeof(*mf));
	dcast_msg msg;

	if (!mf)
		return NULL;
	dcast_msg_init(&msg, DCAST_MSG_MANIFEST);
	msg.u.manifest = *src;
	if (dcast_msg_encode(&msg, &mf->enc, &mf->enc_len)) {
		free(mf);
		return NULL;
	}
	mf->m = *src;
	src->tensors = NULL;
	src->n_tensors = 0;
	mf->refs = 1;
	return mf;
}

void broker_manifest_put(struct broker_manifest *mf)
{
	if (!mf || --mf->refs)
		return;
	free(mf->m.tensors);
	free(mf->enc);
	free(mf);
}

uint64_t broker_version_mem(const struct broker_version *v)
{
	uint64_t bytes = sizeof(*v) + (uint64_t)v->n_digests * sizeof(*v->digests) +
			 zmq_msg_size((zmq_msg_t *)&v->commit_hdr) + 4 * BROKER_ALLOC_BYTES;

	for (uint32_t i = 0; i < v->n_chunks; i++)
		bytes += sizeof(v->chunks[i]) + 3 * BROKER_ALLOC_BYTES +
			 zmq_msg_size((zmq_msg_t *)&v->chunks[i].hdr) +
			 v->chunks[i].payload_len;
	return bytes;
}

void broker_version_put(struct broker_version *v)
{
	if (!v || --v->refs)
		return;
	for (uint32_t i = 0; i < v->n_chunks; i++) {
		broker_chunk_uncache(&v->chunks[i]);
		zmq_msg_close(&v->chunks[i].hdr);
		zmq_msg_close(&v->chunks[i].payload);
		broker_segfile_put(v->chunks[i].file);
	}
	free(v->chunks);
	zmq_msg_close(&v->commit_hdr);
	free(v->digests);
	broker_manifest_put(v->manifest);
	free(v);
}

void broker_model_free(struct broker_model *m)
{
	for (uint32_t i = 0; i < m->n_log; i++)
		broker_version_put(m->log[i]);
	free(m->log);
	broker_log_tail_clear(m);
	broker_segfile_put(m->segfile);
	DCAST_ASSERT(!m->fold); /* its owner freed it first (broker_fold_free) */
	broker_manifest_put(m->manifest);
	dcast_slab_pool_close(&m->slab);
	pthread_mutex_destroy(&m->slab.mu);
	free(m);
}

uint64_t broker_model_newest(const struct broker_model *m)
{
	return m && m->n_log ? m->log[m->n_log - 1]->version : DCAST_VERSION_NONE;
}

int broker_version_servable(const struct broker_model *m, const struct broker_version *v)
{
	return m->poisoned == DCAST_VERSION_NONE || v->version < m->poisoned;
}

/* A held log may be an earlier run's, and poisoned versions are never
 * served: announcing them would make consumers wait for (and re-join to
 * get) what is not served. */
uint64_t broker_model_offered(const struct broker_model *m)
{
	uint32_t n = m ? m->n_log : 0;

	if (!m || m->held)
		return DCAST_VERSION_NONE;
	while (n && !broker_version_servable(m, m->log[n - 1]))
		n--;
	return n ? m->log[n - 1]->version : DCAST_VERSION_NONE;
}

void broker_welcome_init(const struct broker *b, const struct broker_model *m, dcast_msg *w)
{
	int offered = m && m->n_log && !m->held && broker_version_servable(m, m->log[0]);

	dcast_msg_init(w, DCAST_MSG_WELCOME);
	snprintf(w->u.welcome.model, sizeof(w->u.welcome.model), "%s", m ? m->name : "");
	w->u.welcome.version = broker_model_offered(m);
	w->u.welcome.anchor_version = offered ? m->log[0]->version : DCAST_VERSION_NONE;
	w->u.welcome.heartbeat_ms = (uint32_t)b->cfg.heartbeat_ms;
	w->u.welcome.run = m ? m->run : 0;
}

void broker_welcome_producer_init(const struct broker *b, const struct broker_model *m,
				  dcast_msg *w)
{
	broker_welcome_init(b, m, w);
	snprintf(w->u.welcome.consumers, sizeof(w->u.welcome.consumers), "%s",
		 b->consumers_bound);
}

int broker_log_tail_append(struct broker_model *m, struct broker_version *v)
{
	const struct broker_version *last = m->n_tail ? m->tail[m->n_tail - 1] : NULL;
	uint64_t newest = broker_model_newest(m);
	struct broker_version **t;

	if (v->anchor || (last && v->base_version != last->version) ||
	    (newest != DCAST_VERSION_NONE && v->base_version <= newest))
		return dcast_fail(DCAST_EVERSION, "model %s: delta %llu on %llu does not follow the "
				  "versions kept past the damage", m->name,
				  (unsigned long long)v->version, (unsigned long long)v->base_version);
	DCAST_DEBUG_ASSERT(check_log(m) && check_version(v));
	if (!(t = realloc(m->tail, (m->n_tail + 1) * sizeof(*t))))
		return dcast_fail(DCAST_ENOMEM, "model %s: %u versions past the damage", m->name,
				  m->n_tail + 1);
	m->tail = t;
	m->tail[m->n_tail++] = v;
	DCAST_DEBUG_ASSERT(check_log(m) && m->tail[m->n_tail - 1] == v);
	return 0;
}

struct broker_version *broker_log_tail_next(const struct broker_model *m, uint64_t have)
{
	if (m->n_tail && m->tail[0]->base_version == have)
		return m->tail[0];
	for (uint32_t i = 0; i + 1 < m->n_tail; i++)
		if (m->tail[i]->version == have)
			return m->tail[i + 1];
	return NULL;
}

/* A version leaves the log: its frames in the read cache go too (nobody
 * starts it any more; a consumer mid-stream reads the rest). */
static void log_drop(struct broker_version *v)
{
	broker_version_uncache(v);
	broker_version_put(v);
}

void broker_log_tail_clear(struct broker_model *m)
{
	for (uint32_t i = 0; i < m->n_tail; i++)
		log_drop(m->tail[i]);
	free(m->tail);
	m->tail = NULL;
	m->n_tail = 0;
}

int broker_log_find(const struct broker_model *m, uint64_t version)
{
	for (uint32_t i = 0; i < m->n_log; i++)
		if (m->log[i]->version == version)
			return (int)i;
	return -1;
}

void broker_log_clear(struct broker_model *m)
{
	DCAST_DEBUG_ASSERT(check_log(m));
	for (uint32_t i = 0; i < m->n_log; i++)
		log_drop(m->log[i]);
	m->n_log = 0;
	m->log_bytes = 0;
	broker_log_tail_clear(m);
	DCAST_DEBUG_ASSERT(check_log(m) && !m->n_log && !m->n_tail);
}

static int log_reserve(struct broker_model *m)
{
	struct broker_version **n;
	uint32_t cap;

	if (m->n_log < m->cap_log)
		return 0;
	cap = m->cap_log ? m->cap_log * 2 : 16;
	if (!(n = realloc(m->log, cap * sizeof(*n))))
		return dcast_fail(DCAST_ENOMEM, "model %s: log of %u versions", m->name, cap);
	m->log = n;
	m->cap_log = cap;
	return 0;
}

void broker_log_need_anchor(struct broker *b, struct broker_model *m)
{
	dcast_msg w;

	m->need_anchor = 1;
	broker_welcome_producer_init(b, m, &w);
	w.u.welcome.need_anchor = 1;
	for (uint64_t i = 0; i < b->prod.hi; i++)
		if (b->prod.arr[i].used && b->prod.arr[i].model == m)
			broker_send_msg(b, b->producers, &b->prod.arr[i], &w);
}

/* Past retention: ask the producers for an anchor (WELCOME need_anchor). */
static void retention_check(struct broker *b, struct broker_model *m)
{
	if (m->need_anchor || (m->n_log <= b->cfg.retain_versions &&
			       m->log_bytes <= b->cfg.retain_bytes))
		return;
	DCAST_LOG_I("model %s: log holds %u versions, %llu bytes in memory: past retention, asking for an anchor",
		    m->name, m->n_log, (unsigned long long)m->log_bytes);
	broker_log_need_anchor(b, m);
}

/* May v enter the log next?  0, or DCAST_EVERSION naming why not. */
static int append_fits(const struct broker_model *m, const struct broker_version *v)
{
	uint64_t newest = broker_model_newest(m);

	if (newest != DCAST_VERSION_NONE && v->version <= newest)
		return dcast_fail(DCAST_EVERSION, "model %s: version %llu not above newest %llu",
				  m->name, (unsigned long long)v->version,
				  (unsigned long long)newest);
	if (!v->anchor && (newest == DCAST_VERSION_NONE || v->base_version != newest))
		return dcast_fail(DCAST_EVERSION, "model %s: delta %llu on base %llu, newest is %llu",
				  m->name, (unsigned long long)v->version,
				  (unsigned long long)v->base_version, (unsigned long long)newest);
	return 0;
}

int broker_log_append(struct broker *b, struct broker_model *m, struct broker_version *v)
{
	uint64_t bytes0 = m->log_bytes;
	uint32_t n0 = m->n_log;
	int rc;

	if ((rc = append_fits(m, v)) || (rc = log_reserve(m)))
		return rc;
	DCAST_DEBUG_ASSERT(check_log(m) && check_version(v));
	if (v->anchor) {
		if (m->n_log)
			DCAST_LOG_I("model %s: anchor %llu replaces %u older versions", m->name,
				    (unsigned long long)v->version, m->n_log);
		broker_log_clear(m);
		m->need_anchor = 0;
		m->poisoned = DCAST_VERSION_NONE; /* what it replaced goes with the log */
	}
	m->log[m->n_log++] = v;
	v->mem_bytes = broker_version_mem(v);
	m->log_bytes += v->mem_bytes;
	DCAST_DEBUG_ASSERT(check_log(m) && broker_model_newest(m) == v->version &&
			   m->n_log == (v->anchor ? 1 : n0 + 1) &&
			   m->log_bytes == (v->anchor ? 0 : bytes0) + v->mem_bytes);
	retention_check(b, m);
	return 0;
}

int broker_log_replace_anchor(struct broker *b, struct broker_model *m,
			      struct broker_version *anchor,
			      void (*keep)(void *arg, struct broker_version *v), void *arg)
{
	int at = broker_log_find(m, anchor->version);
	uint64_t newest = broker_model_newest(m);
	uint32_t n0 = m->n_log;

	(void)b;
	if (at <= 0)
		return dcast_fail(DCAST_EVERSION, "model %s: made anchor %llu is not a delta in the log",
				  m->name, (unsigned long long)anchor->version);
	DCAST_DEBUG_ASSERT(check_log(m) && anchor->anchor && check_version(anchor));
	for (int i = 0; i <= at; i++) {
		m->log_bytes -= m->log[i]->mem_bytes;
		broker_version_uncache(m->log[i]);
		if (keep)
			keep(arg, m->log[i]);
		else
			broker_version_put(m->log[i]);
	}
	m->log[0] = anchor;
	memmove(m->log + 1, m->log + at + 1, (m->n_log - (uint32_t)at - 1) * sizeof(*m->log));
	m->n_log -= (uint32_t)at;
	anchor->mem_bytes = broker_version_mem(anchor);
	m->log_bytes += anchor->mem_bytes;
	m->need_anchor = 0;
	DCAST_DEBUG_ASSERT(check_log(m) && m->log[0] == anchor && m->n_log == n0 - (uint32_t)at &&
			   broker_model_newest(m) == newest);
	return 0;
}
