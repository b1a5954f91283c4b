/* Broker-made anchors (fold.h).  The state (foldstate.h) exists only
 * while an anchor is being made: between cuts a committed version is only
 * counted (O(1)), and when the counts pass a trigger the log's chain, from
 * its anchor to the newest version, is queued and folded into a fresh
 * state, the anchor is cut, and the state is freed.  Without --data-dir
 * the state is a dense copy of the model in the heap for the length of
 * the cut; with --data-dir it is an unnamed file in the data dir, and the
 * heap holds only the range being worked on (a chunk's range, at most
 * BROKER_FOLD_RANGE_ELEMS for a digest or a made chunk), read and written
 * back with pread / pwrite.  So the broker holds about one log, not a log
 * and a model; each made anchor costs a replay of the chain, O(model),
 * once per trigger.  The commit hook only queues a reference;
 * the work runs from an eventfd in the poll set, which stays readable while
 * work remains, so each loop turn does a bounded share of it between the
 * sockets' bursts: at most FOLD_VERSIONS_PER_TURN deltas folded (each
 * O(changed) beyond copying its chunks' ranges in and out of a file state:
 * dcast_codec_apply on the range, no temporaries), or FOLD_STEP_BYTES of
 * an anchor cut (digest check, then dense chunks).
 * Folding pauses while a cut is under way so that the state stays at V.
 * Only publishing the made anchor (its durable write queued to the writer
 * thread when --data-dir is set, then the log swap) happens in one step,
 * with a log line of its duration.  A producer's anchor made into a delta
 * for the consumers on the log it replaces runs from the same turn, with
 * a state of its own (folddelta.c). */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include "broker.h"
#include "dcast_common.h"
#include "deltacast/codec.h"
#include "durable.h"
#include "fold.h"
#include "foldint.h"

static int fraction_parse(const char *s, double *out)
{
	char *end;

	errno = 0;
	*out = s ? strtod(s, &end) : 0.0;
	if (s && (!*s || *end || errno || !isfinite(*out) || *out < 0.0 ||
		  *out > FOLD_FRACTION_MAX))
		return dcast_fail(DCAST_EINVAL, "--anchor-fraction: \"%s\" is not a number in [0, 1000]",
				  s);
	return 0;
}

int broker_fold_config_check(const struct broker_config *cfg)
{
	double f;

	return fraction_parse(cfg->anchor_fraction, &f);
}

/* ---- the state ---- */

static void state_free(struct broker_fold *f)
{
	fold_state_close(&f->st);
	fold_digests_free(&f->dg);
}

/* A state for the tensors of mf (kept when the manifest is the same): in
 * a file of the data dir with --data-dir, else in the heap. */
static int state_alloc(const struct broker *b, struct broker_fold *f, struct broker_manifest *mf)
{
	if (f->st.mf == mf)
		return 0;
	state_free(f);
	return fold_state_open(&f->st, mf, broker_durable_on(b) ? b->cfg.data_dir : NULL);
}

/* A fold that failed on v: a version the fold finds bad is poisoned (an
 * allocation, or a read or write of the state file or a segment, that
 * failed says nothing about it). */
static void fold_failed(struct broker *b, struct broker_model *m, const struct broker_version *v,
			int rc)
{
	char why[DCAST_MAX_TEXT / 2];

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	DCAST_LOG_E("model %s: fold of version %llu failed (%s): %s; no broker-made anchors "
		    "until the next anchor", m->name, (unsigned long long)v->version,
		    dcast_errname(rc), why);
	if (rc != DCAST_ENOMEM && rc != DCAST_EIO)
		broker_version_poison(b, m, v->version, rc, why);
}

static void fold_version(struct broker *b, struct broker_model *m, struct broker_fold *f,
			 struct broker_version *v)
{
	int rc = 0;

	if (!broker_version_servable(m, v)) { /* poisoned: never folded into an anchor */
		f->version = DCAST_VERSION_NONE;
		return;
	}
	if (!v->anchor && (f->version == DCAST_VERSION_NONE || v->base_version != f->version ||
			   v->manifest != f->st.mf)) {
		if (f->version != DCAST_VERSION_NONE)
			DCAST_LOG_W("model %s: fold: delta %llu is not on the folded version %llu; "
				    "no broker-made anchors until the next anchor", m->name,
				    (unsigned long long)v->version, (unsigned long long)f->version);
		f->version = DCAST_VERSION_NONE;
		return;
	}
	if (v->anchor)
		rc = state_alloc(b, f, v->manifest);
	f->version = DCAST_VERSION_NONE; /* until every chunk is in */
	if (rc || (rc = fold_checked(&f->st, &f->dg, v))) {
		fold_failed(b, m, v, rc);
		return;
	}
	f->version = v->version;
	f->delta_bytes = v->anchor ? 0 : f->delta_bytes + v->payload_bytes;
	f->deltas = v->anchor ? 0 : f->deltas + 1;
}

/* ---- the superseded chain ---- */

/* Drop the chain once no connected consumer has a version inside it, or
 * when it passes the log's retention limits (those consumers then take the
 * anchor path). */
static void old_prune(struct broker *b, struct broker_model *m, struct broker_fold *f)
{
	uint64_t lo, hi;

	if (!f->n_old || f->diff.w) /* a made delta will join it */
		return;
	if (f->n_old > b->cfg.retain_versions || f->old_bytes > b->cfg.retain_bytes) {
		DCAST_LOG_I("model %s: versions superseded by made anchors pass retention: "
			    "consumers behind them take the anchor path", m->name);
		fold_old_free(f);
		return;
	}
	lo = f->old[0]->version;
	hi = f->old[f->n_old - 1]->version;
	for (uint64_t i = 0; i < b->cons.hi; i++) {
		const struct broker_peer *p = &b->cons.arr[i];

		if (p->used && p->model == m && p->have_version != DCAST_VERSION_NONE &&
		    p->have_version >= lo && p->have_version < hi)
			return;
	}
	DCAST_LOG_D("model %s: no consumer behind made anchor %llu: dropping %u superseded versions",
		    m->name, (unsigned long long)hi, f->n_old);
	fold_old_free(f);
}

struct broker_version *broker_fold_next(const struct broker_model *m, uint64_t have)
{
	const struct broker_fold *f = m->fold;

	for (uint32_t i = 0; f && i + 1 < f->n_old; i++)
		if (f->old[i]->version == have)
			return f->old[i + 1];
	return NULL;
}

/* ---- the cut ---- */

static void cut_drop(struct broker_fold *f)
{
	broker_version_put(f->cut.src);
	broker_version_put(f->cut.v);
	broker_segfile_put(f->cut.sp.file); /* the anchor's chunks hold theirs */
	memset(&f->cut, 0, sizeof(f->cut));
}

static uint32_t cut_chunks(const struct broker_manifest *mf)
{
	uint64_t n = 0;

	for (uint32_t t = 0; t < mf->m.n_tensors; t++)
		n += (dcast_tensor_elems(&mf->m.tensors[t]) + BROKER_FOLD_RANGE_ELEMS - 1) /
		     BROKER_FOLD_RANGE_ELEMS;
	return n > UINT32_MAX / 2 ? 0 : (uint32_t)n;
}

/* Set up the anchor of the state's version (src, in the log): every
 * allocation of the cut but the chunk frames happens here. */
static int cut_start(struct broker_model *m, struct broker_fold *f, struct broker_version *src)
{
	uint32_t n = cut_chunks(f->st.mf);
	struct broker_version *v;

	if (!n || !src->n_digests)
		return dcast_fail(DCAST_EDIGEST, "model %s: cannot cut version %llu: no digests (or "
				  "no chunks) to check it against", m->name,
				  (unsigned long long)src->version);
	if (!(v = fold_made_version(src->version, DCAST_VERSION_NONE, f->st.mf, n, src)))
		return dcast_fail(DCAST_ENOMEM, "model %s: anchor of %u chunks", m->name, n);
	v->n_chunks = n;
	f->cut = (struct fold_cut){.src = src, .v = v, .t0_ns = dcast_now_ns()};
	src->refs++;
	return 0;
}

/* One dense CHUNK of the state: tensor cut.tensor from cut.start. */
static int cut_chunk(const char *model, struct broker_fold *f, uint64_t *bytes)
{
	struct fold_cut *cut = &f->cut;
	struct broker_chunk *ch = &cut->v->chunks[cut->next_chunk];
	const dcast_tensor_desc *td = &f->st.mf->m.tensors[cut->tensor];
	uint64_t elems = dcast_tensor_elems(td), count = elems - cut->start;
	unsigned es = dcast_dtype_size((int)td->dtype);
	uint8_t *range;
	dcast_msg hm;
	int rc;

	if (count > BROKER_FOLD_RANGE_ELEMS)
		count = BROKER_FOLD_RANGE_ELEMS;
	*bytes = count * es;
	if ((rc = fold_state_get(&f->st, cut->tensor, cut->start, count, &range)) ||
	    (rc = fold_made_payload(model, "anchor", cut->v->version, &cut->sp, ch, range, *bytes)))
		return rc;
	dcast_msg_init(&hm, DCAST_MSG_CHUNK);
	snprintf(hm.u.chunk.model, sizeof(hm.u.chunk.model), "%s", model);
	hm.u.chunk.version = cut->v->version;
	hm.u.chunk.base_version = DCAST_VERSION_NONE;
	hm.u.chunk.anchor = 1;
	hm.u.chunk.seq = cut->next_chunk;
	hm.u.chunk.tensor = cut->tensor;
	hm.u.chunk.start = cut->start;
	hm.u.chunk.count = count;
	hm.u.chunk.elem_size = es;
	hm.u.chunk.encoding = DCAST_ENC_DENSE;
	hm.u.chunk.changed = count;
	hm.u.chunk.payload_bytes = *bytes;
	ch->payload_sum = dcast_checksum(range, *bytes);
	ch->payload_len = *bytes;
	hm.u.chunk.checksum = dcast_chunk_checksum(&hm.u.chunk, ch->payload_sum);
	cut->next_chunk++;
	cut->v->payload_bytes += *bytes;
	cut->start += count;
	if (cut->start == elems) {
		cut->tensor++;
		cut->start = 0;
	}
	return fold_frame_encode(&hm, &ch->hdr);
}

/* Check the state against the producer's digest `i` for V. */
static int cut_digest(struct broker_fold *f, uint32_t i, uint64_t *bytes)
{
	const dcast_range_digest *d = &f->cut.src->digests[i];
	const dcast_tensor_desc *td;
	uint64_t got = 0;
	int rc;

	if (fold_digest_fits(f->st.mf, d, i))
		return DCAST_EDIGEST;
	td = &f->st.mf->m.tensors[d->tensor];
	*bytes = d->count * dcast_dtype_size((int)td->dtype);
	if ((rc = fold_state_digest(&f->st, d->tensor, d->start, d->count, &got)))
		return rc;
	if (got != d->digest)
		return dcast_fail(DCAST_EDIGEST, "tensor %s [%llu, +%llu): the folded state's digest "
				  "differs from the producer's", td->name,
				  (unsigned long long)d->start, (unsigned long long)d->count);
	return 0;
}

/* A bounded share of the cut: digests first, then the chunks.  Returns 0
 * and sets *done, or an error (the cut is then dropped by the caller). */
static int cut_step(const char *model, struct broker_fold *f, int *done)
{
	struct fold_cut *cut = &f->cut;
	uint64_t spent = 0, bytes;
	int rc = 0;

	while (!rc && spent < FOLD_STEP_BYTES && cut->next_digest < cut->src->n_digests) {
		rc = cut_digest(f, cut->next_digest++, &bytes);
		spent += bytes;
	}
	while (!rc && spent < FOLD_STEP_BYTES && cut->next_chunk < cut->v->n_chunks) {
		rc = cut_chunk(model, f, &bytes);
		spent += bytes;
	}
	*done = !rc && cut->next_chunk == cut->v->n_chunks;
	return rc;
}

/* --data-dir: the anchor begins a new segment; the deltas after V, already
 * in the old segment, are written again after it so the new one is whole. */
static int cut_durable(struct broker *b, struct broker_model *m, struct broker_version *v, int at)
{
	int rc = broker_durable_commit(b, m, v, 0); /* queued: no ACK for these */

	for (uint32_t i = (uint32_t)at + 1; !rc && i < m->n_log; i++)
		rc = broker_durable_commit(b, m, m->log[i], 0);
	return rc;
}

/* Publish the finished anchor: its write queued, then in the log in place of V and
 * everything before it (kept aside for consumers still behind V). */
static int cut_publish(struct broker *b, struct broker_model *m, struct broker_fold *f)
{
	struct broker_version *v = f->cut.v;
	int at = broker_log_find(m, v->version), rc;
	uint64_t t1_ns;

	if (at <= 0 || m->log[at] != f->cut.src)
		return dcast_fail(DCAST_EVERSION, "version %llu is no longer a delta in the log",
				  (unsigned long long)v->version);
	if ((rc = broker_commit_frame(v, m->name)) || (rc = cut_durable(b, m, v, at)))
		return rc;
	if (!fold_old_continues(f, m))
		fold_old_free(f); /* a producer anchor came between: start a new chain */
	fold_old_reserve(f, (uint32_t)at + 1);
	f->cut.v = NULL; /* the log takes this reference */
	if ((rc = broker_log_replace_anchor(b, m, v, fold_old_keep, f))) {
		f->cut.v = v;
		return rc;
	}
	t1_ns = dcast_now_ns();
	b->stats.anchors_made++;
	DCAST_LOG_I("model %s: made anchor %llu (%u chunks, %llu bytes, digests equal) in %.1f ms; "
		    "it replaces %d versions", m->name, (unsigned long long)v->version, v->n_chunks,
		    (unsigned long long)v->payload_bytes, (double)(t1_ns - f->cut.t0_ns) / 1e6, at + 1);
	old_prune(b, m, f);
	return 0;
}

/* Advance the model's cut.  Returns 1 while it is still under way. */
static int cut_turn(struct broker *b, struct broker_model *m, struct broker_fold *f)
{
	int done = 0, rc = cut_step(m->name, f, &done);

	if (!rc && !done)
		return 1;
	if (!rc)
		rc = cut_publish(b, m, f);
	if (rc == DCAST_EDIGEST) {
		b->stats.anchor_digest_errors++;
		f->version = DCAST_VERSION_NONE;
	}
	if (rc == DCAST_EVERSION) /* a producer anchor overtook it: nothing lost */
		DCAST_LOG_I("model %s: made anchor %llu dropped: %s", m->name,
			    (unsigned long long)f->cut.src->version, dcast_last_error());
	else if (rc)
		DCAST_LOG_E("model %s: made anchor %llu not published (%s): %s%s", m->name,
			    (unsigned long long)f->cut.src->version, dcast_errname(rc),
			    dcast_last_error(), rc == DCAST_EDIGEST ?
			    "; no broker-made anchors until the next anchor" : "");
	cut_drop(f);
	return 0;
}

static int cut_due(const struct broker *b, const struct broker_fold *f)
{
	if (f->version == DCAST_VERSION_NONE || !f->deltas)
		return 0;
	if (b->fold.every && f->deltas >= b->fold.every)
		return 1;
	return b->fold.fraction > 0.0 &&
	       (double)f->delta_bytes > b->fold.fraction * (double)f->st.dense_bytes;
}

static void cut_maybe(const struct broker *b, struct broker_model *m, struct broker_fold *f)
{
	int at;

	if (!cut_due(b, f))
		return;
	at = broker_log_find(m, f->version);
	f->delta_bytes = f->deltas = 0; /* counted again from V, whatever happens */
	if (at <= 0)
		return; /* V is the log's anchor already, or gone */
	if (cut_start(m, f, m->log[at]))
		DCAST_LOG_E("model %s: %s", m->name, dcast_last_error());
	else if (broker_durable_on(b))
		f->cut.sp.dir = b->cfg.data_dir;
}

/* ---- the queue and the turn ---- */

static struct broker_fold *fold_get(struct broker_model *m)
{
	if (!m->fold && (m->fold = calloc(1, sizeof(*m->fold))))
		m->fold->version = DCAST_VERSION_NONE;
	return m->fold;
}

static void queue_clear(struct broker_fold *f)
{
	for (; f->q_n; f->q_n--, f->q_head = (f->q_head + 1) % FOLD_QUEUE)
		broker_version_put(f->queue[f->q_head]);
}

static void queue_push(struct broker_model *m, struct broker_fold *f, struct broker_version *v)
{
	if (f->q_n == FOLD_QUEUE) {
		DCAST_LOG_W("model %s: fold queue full (%d versions): no broker-made anchors until "
			    "the next anchor", m->name, FOLD_QUEUE);
		queue_clear(f);
		f->version = DCAST_VERSION_NONE;
	}
	f->queue[(f->q_head + f->q_n++) % FOLD_QUEUE] = v;
	v->refs++;
}

/* Without a state: count v (an anchor starts the count again). */
static void lazy_count(struct broker_fold *f, const struct broker_version *v)
{
	if (v->anchor) {
		f->pend_bytes = f->pend_deltas = 0;
		f->model_bytes = fold_manifest_bytes(v->manifest);
		f->broken = 0;
		return;
	}
	f->pend_deltas++;
	f->pend_bytes += v->payload_bytes;
}

static int lazy_due(const struct broker *b, const struct broker_fold *f)
{
	if (!f->pend_deltas || f->broken)
		return 0;
	if (b->fold.every && f->pend_deltas >= b->fold.every)
		return 1;
	return b->fold.fraction > 0.0 && (double)f->pend_bytes > b->fold.fraction * (double)f->model_bytes;
}

/* A trigger passed: fold the log's chain, from its anchor, into a state. */
static void rebuild(struct broker_model *m, struct broker_fold *f)
{
	f->pend_bytes = f->pend_deltas = 0;
	for (uint32_t j = 0; j < m->n_log; j++)
		queue_push(m, f, m->log[j]);
}

/* The cut is over and nothing is queued: free the state; what it folded
 * past its last anchor is counted for the next trigger. */
static void state_release(struct broker_fold *f)
{
	if (!f->st.mf || f->q_n || f->cut.v)
		return;
	f->broken = f->version == DCAST_VERSION_NONE; /* a fold or a cut failed (logged) */
	f->pend_bytes = f->version == DCAST_VERSION_NONE ? 0 : f->delta_bytes;
	f->pend_deltas = f->version == DCAST_VERSION_NONE ? 0 : f->deltas;
	f->model_bytes = f->st.dense_bytes;
	state_free(f);
	f->version = DCAST_VERSION_NONE;
	f->delta_bytes = f->deltas = 0;
}

void broker_fold_committed(struct broker *b, struct broker_model *m, struct broker_version *v)
{
	struct broker_fold *f;

	if (b->fold.efd < 0)
		return;
	if (!(f = fold_get(m))) {
		DCAST_LOG_E("model %s: fold state: out of memory; no broker-made anchors", m->name);
		return;
	}
	f->make_deltas = b->fold.deltas;
	fold_diff_committed(b, m, f, v);
	if (f->st.mf || f->q_n || f->cut.v) { /* a state is being made or used: fold v too */
		queue_push(m, f, v);
		fold_signal(b);
		return;
	}
	lazy_count(f, v);
	if (!lazy_due(b, f) || !m->n_log || !m->log[0]->anchor)
		return;
	rebuild(m, f);
	fold_signal(b);
}

/* Fold what is queued (versions that did not make it into the log are
 * skipped), then maybe start a cut.  Returns 1 while work remains. */
static int anchor_turn(struct broker *b, struct broker_model *m, struct broker_fold *f)
{
	if (f->cut.v) {
		int more = cut_turn(b, m, f);
		state_release(f);
		return more || f->q_n;
	}
	for (int i = 0; i < FOLD_VERSIONS_PER_TURN && f->q_n && !f->cut.v; i++) {
		struct broker_version *v = f->queue[f->q_head];
		int at = broker_log_find(m, v->version);

		f->q_head = (f->q_head + 1) % FOLD_QUEUE;
		f->q_n--;
		if (at >= 0 && m->log[at] == v)
			fold_version(b, m, f, v);
		broker_version_put(v);
		cut_maybe(b, m, f); /* at the version that passes the trigger, queued or not */
	}
	old_prune(b, m, f);
	state_release(f);
	return f->q_n || f->cut.v;
}

static int fold_turn(struct broker *b, struct broker_model *m, struct broker_fold *f)
{
	int more = fold_diff_turn(b, m, f);

	return anchor_turn(b, m, f) | more;
}

static void fold_ready(struct broker *b, int fd, void *arg)
{
	int more = 0;
	uint64_t n;

	(void)arg;
	for (uint32_t i = 0; i < b->n_models; i++)
		if (b->models[i]->fold)
			more |= fold_turn(b, b->models[i], b->models[i]->fold);
	if (!more && read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		DCAST_LOG_W("fold: eventfd read: %s", strerror(errno));
}

int broker_fold_open(struct broker *b)
{
	int fd, rc = fraction_parse(b->cfg.anchor_fraction, &b->fold.fraction);

	b->fold.efd = -1;
	b->fold.deltas = 0;
	b->fold.every = b->cfg.anchor_every;
	if (rc || (b->fold.fraction <= 0.0 && !b->fold.every))
		return rc;
	if ((fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
		return dcast_fail(DCAST_EIO, "fold: eventfd: %s", strerror(errno));
	if ((rc = broker_poll_add(b, fd, fold_ready, NULL))) {
		close(fd);
		return rc;
	}
	b->fold.efd = fd;
	b->fold.deltas = !b->cfg.no_anchor_deltas;
	for (uint32_t i = 0; i < b->n_models; i++) /* restored from --data-dir */
		for (uint32_t j = 0; j < b->models[i]->n_log; j++)
			broker_fold_committed(b, b->models[i], b->models[i]->log[j]);
	DCAST_LOG_I("broker-made anchors: every %llu versions, fraction %g of the model (0: off)",
		    (unsigned long long)b->fold.every, b->fold.fraction);
	return 0;
}

void broker_fold_close(struct broker *b)
{
	if (b->fold.efd < 0)
		return;
	broker_poll_del(b, b->fold.efd);
	close(b->fold.efd);
	b->fold.efd = -1;
}

uint64_t broker_fold_state_bytes(const struct broker *b)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < b->n_models; i++)
		n += b->models[i]->fold ? fold_state_heap_bytes(&b->models[i]->fold->st) +
					  fold_state_heap_bytes(&b->models[i]->fold->diff.st) : 0;
	return n;
}

void broker_fold_free(struct broker_model *m)
{
	struct broker_fold *f = m->fold;

	if (!f)
		return;
	queue_clear(f);
	cut_drop(f);
	fold_diff_drop(f);
	fold_old_free(f);
	free(f->old);
	state_free(f);
	free(f);
	m->fold = NULL;
}
