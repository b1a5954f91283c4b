/* Producer anchors made into deltas (fold.h, broker_fold_anchor_coming;
 * docs/operations.md, "Producer anchors as deltas").  An anchor that a
 * producer sends after the first costs every worker the whole model,
 * where those holding the version before it need only what changed.  The
 * log the anchor replaces is kept aside and folded into a state of its
 * own (unchecked: one copy per byte), each of the anchor's dense ranges
 * is encoded against it, checked and applied as a consumer would take
 * it, and the anchor's digests are reached from those V's COMMIT claims
 * (diff_check_begin); the delta joins the kept chain after V.  The work
 * runs in the fold's bounded shares per loop turn (fold.c's eventfd). */
#include <string.h>
#include "dcast_common.h"
#include "dcast_fit.h"
#include "deltacast/codec.h"
#include "durable.h"
#include "fold.h"
#include "foldint.h"

void fold_diff_drop(struct broker_fold *f)
{
	struct fold_diff *d = &f->diff;

	for (uint32_t i = 0; i < d->n_src; i++)
		broker_version_put(d->src[i]);
	free(d->src);
	broker_version_put(d->w);
	broker_version_put(d->v);
	fold_state_close(&d->st);
	fold_digests_free(&d->dg);
	fold_digests_free(&d->next);
	broker_segfile_put(d->sp.file); /* the delta's chunks hold theirs */
	free(d->buf);
	memset(d, 0, sizeof(*d));
}

/* The made delta is not made: consumers at V take W whole.  With
 * poison (W's bytes differ from its own digests: diff_w_bad) W is
 * poisoned, as the fold would find it at its next cut; a failed
 * allocation, read or write says nothing about W. */
static void diff_failed(struct broker *b, struct broker_model *m, struct broker_fold *f, int rc,
			int poison)
{
	char why[DCAST_MAX_TEXT / 2];
	uint64_t w = f->diff.w->version;

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	DCAST_LOG_W("model %s: anchor %llu goes whole to consumers at %llu: no delta made (%s): %s",
		    m->name, (unsigned long long)w, (unsigned long long)f->diff.base,
		    dcast_errname(rc), why);
	fold_diff_drop(f);
	b->stats.anchor_deltas_failed++;
	if (poison)
		broker_version_poison(b, m, w, rc, why);
}

/* Is any consumer of m at a version in [lo, hi]? */
static int consumers_inside(const struct broker *b, const struct broker_model *m, uint64_t lo,
			    uint64_t hi)
{
	for (uint64_t i = 0; i < b->cons.hi; i++) {
		const struct broker_peer *p = &b->cons.arr[i];

		if (p->used && p->model == m && p->have_version != DCAST_VERSION_NONE &&
		    p->have_version >= lo && p->have_version <= hi)
			return 1;
	}
	return 0;
}

static int manifest_same(const struct broker_manifest *a, const struct broker_manifest *b)
{
	return a == b || (a->enc_len == b->enc_len && !memcmp(a->enc, b->enc, a->enc_len));
}

/* The log's versions join the kept chain (as a made anchor's do), so that
 * consumers behind V go on with deltas to V, then to the made delta. */
static void chain_keep(struct broker_fold *f, const struct broker_model *m)
{
	if (!fold_old_continues(f, m))
		fold_old_free(f);
	fold_old_reserve(f, m->n_log);
	for (uint32_t i = 0; i < m->n_log; i++) {
		m->log[i]->refs++;
		fold_old_keep(f, m->log[i]);
	}
}

/* Take the log as it is, before the anchor w replaces it.  0, or
 * DCAST_ENOMEM. */
static int diff_arm(const struct broker *b, struct broker_model *m, struct broker_fold *f,
		    struct broker_version *w)
{
	struct fold_diff *d = &f->diff;

	if (!(d->src = malloc(m->n_log * sizeof(*d->src))))
		return DCAST_ENOMEM;
	for (uint32_t i = 0; i < m->n_log; i++) {
		d->src[i] = m->log[i];
		d->src[i]->refs++;
	}
	d->n_src = m->n_log;
	d->w = w;
	w->refs++;
	d->base = broker_model_newest(m);
	d->sp.dir = broker_durable_on(b) ? b->cfg.data_dir : NULL;
	return 0;
}

/* w is committed: the delta's version, the state, and the work queued. */
static int diff_start(struct broker *b, struct broker_model *m, struct broker_fold *f)
{
	struct fold_diff *d = &f->diff;
	struct broker_manifest *mf = d->src[d->n_src - 1]->manifest;
	int rc;

	d->started = 1;
	d->t0_ns = dcast_now_ns();
	if (!(d->v = fold_made_version(d->w->version, d->base, mf, d->w->n_chunks, d->w)))
		return dcast_fail(DCAST_ENOMEM, "a delta of up to %u chunks", d->w->n_chunks);
	if ((rc = fold_state_open(&d->st, mf, d->sp.dir)))
		return rc;
	DCAST_LOG_I("model %s: anchor %llu: making a delta from %llu for the consumers there",
		    m->name, (unsigned long long)d->w->version, (unsigned long long)d->base);
	fold_signal(b);
	return 0;
}

/* Room for a payload of one of w's chunks, encoded. */
static int diff_buf(struct fold_diff *d, const dcast_chunk *c)
{
	size_t need = dcast_codec_bound(c->count, c->elem_size);
	uint8_t *p;

	if (need <= d->buf_cap)
		return 0;
	if (!(p = realloc(d->buf, need)))
		return dcast_fail(DCAST_ENOMEM, "a delta chunk of %zu bytes", need);
	d->buf = p;
	d->buf_cap = need;
	return 0;
}

/* The CHUNK header of made chunk `seq`, encoded into ch->hdr. */
static int diff_header(const char *model, const struct fold_diff *d, const dcast_chunk *c,
		       const dcast_chunk_info *info, struct broker_chunk *ch)
{
	dcast_msg hm;

	dcast_msg_init(&hm, DCAST_MSG_CHUNK);
	snprintf(hm.u.chunk.model, sizeof(hm.u.chunk.model), "%s", model);
	hm.u.chunk.version = d->v->version;
	hm.u.chunk.base_version = d->base;
	hm.u.chunk.anchor = 0;
	hm.u.chunk.seq = d->v->n_chunks;
	hm.u.chunk.tensor = c->tensor;
	hm.u.chunk.start = c->start;
	hm.u.chunk.count = c->count;
	hm.u.chunk.elem_size = c->elem_size;
	hm.u.chunk.encoding = info->encoding;
	hm.u.chunk.changed = info->changed;
	hm.u.chunk.payload_bytes = info->payload_bytes;
	hm.u.chunk.checksum = dcast_chunk_checksum(&hm.u.chunk, ch->payload_sum);
	return fold_frame_encode(&hm, &ch->hdr);
}

/* W's chunk header, checked: a dense range of the state's tensors. */
static int diff_source(const struct fold_diff *d, const struct broker_chunk *ch, dcast_chunk *c)
{
	int rc = fold_stored_chunk(ch, d->st.mf, c);

	if (!rc && (!c->anchor || c->encoding != DCAST_ENC_DENSE))
		rc = dcast_fail(DCAST_ECORRUPT, "anchor %llu: a stored chunk is not dense",
				(unsigned long long)d->w->version);
	return rc;
}

/* One made chunk: `cur`, W's range, encoded against the state's V, then
 * checked, applied and kept as a consumer would take it (none when
 * nothing in the range changed). */
static int diff_encode(const char *model, struct fold_diff *d, const dcast_chunk *c,
		       const uint8_t *cur)
{
	struct broker_chunk *ch;
	dcast_chunk_info info;
	uint8_t *range;
	int rc;

	/* one made chunk at most per chunk of W: the room made_version gave */
	DCAST_ASSERT(d->v->n_chunks < d->next_chunk && d->next_chunk <= d->v->cap_chunks);
	ch = &d->v->chunks[d->v->n_chunks];
	if ((rc = diff_buf(d, c)) ||
	    (rc = fold_state_get(&d->st, c->tensor, c->start, c->count, &range)) ||
	    (rc = dcast_codec_encode(cur, range, c->count, c->elem_size, -1, 0, d->buf, d->buf_cap,
				     &info)))
		return rc;
	if (!info.changed)
		return 0;
	ch->payload_sum = dcast_checksum(d->buf, info.payload_bytes);
	ch->payload_len = info.payload_bytes;
	if ((rc = diff_header(model, d, c, &info, ch)))
		return rc;
	d->v->n_chunks++; /* its frames are the version's to free from here */
	if ((rc = fold_check_chunk(&d->next, &(dcast_chunk){.tensor = c->tensor, .start = c->start,
			.count = c->count, .elem_size = c->elem_size, .encoding = info.encoding,
			.changed = info.changed, .payload_bytes = info.payload_bytes}, d->buf, range)) ||
	    (rc = dcast_codec_apply(&info, d->buf, range, NULL)) || (rc = fold_state_put(&d->st)))
		return rc;
	d->v->payload_bytes += info.payload_bytes;
	return fold_made_payload(model, "delta", d->v->version, &d->sp, ch, d->buf, info.payload_bytes);
}

/* W's next chunk into the delta; *bytes: its dense size. */
static int diff_chunk(const char *model, struct fold_diff *d, uint64_t *bytes)
{
	const struct broker_chunk *src = &d->w->chunks[d->next_chunk++];
	zmq_msg_t payload;
	dcast_chunk c;
	int rc;

	*bytes = src->payload_len;
	if ((rc = diff_source(d, src, &c)) || (rc = broker_chunk_payload(src, &payload)))
		return rc;
	if (zmq_msg_size(&payload) != (size_t)c.count * c.elem_size)
		rc = dcast_fail(DCAST_EPAYLOAD_SIZE, "anchor %llu chunk %u: %zu payload bytes",
				(unsigned long long)d->w->version, d->next_chunk - 1,
				zmq_msg_size(&payload));
	else
		rc = diff_encode(model, d, &c, zmq_msg_data(&payload));
	zmq_msg_close(&payload);
	return rc;
}

/* The delta is whole and checked: after V in the kept chain. */
static int diff_publish(struct broker *b, struct broker_model *m, struct broker_fold *f)
{
	struct fold_diff *d = &f->diff;
	struct broker_version *v = d->v;
	int rc;

	if ((rc = broker_commit_frame(v, m->name)))
		return rc;
	if (!f->n_old || f->old[f->n_old - 1]->version != d->base)
		return dcast_fail(DCAST_EVERSION, "the versions before it are no longer kept");
	fold_old_reserve(f, 1);
	if (f->n_old == f->cap_old)
		return dcast_fail(DCAST_ENOMEM, "the kept chain");
	v->mem_bytes = broker_version_mem(v);
	f->old[f->n_old++] = v;
	f->old_bytes += v->mem_bytes;
	d->v = NULL; /* the chain's reference now */
	b->stats.anchor_deltas++;
	b->stats.anchor_delta_bytes_saved += d->w->payload_bytes > v->payload_bytes ?
					     d->w->payload_bytes - v->payload_bytes : 0;
	DCAST_LOG_I("model %s: anchor %llu goes to consumers at %llu as a delta of %u chunks, "
		    "%llu bytes (the anchor's %llu), digests equal, made in %.1f ms", m->name,
		    (unsigned long long)v->version, (unsigned long long)d->base, v->n_chunks,
		    (unsigned long long)v->payload_bytes, (unsigned long long)d->w->payload_bytes,
		    (double)(dcast_now_ns() - d->t0_ns) / 1e6);
	fold_diff_drop(f);
	return 0;
}

/* The log is folded (unchecked: O(memcpy) per byte, no digest computed
 * whole): W's check starts from the digests V's COMMIT claims and moves
 * by each made chunk's changes, O(changed), as a consumer at V checks
 * it.  It ends equal to W's digests only if the state's digests were V's
 * (a fold gone wrong fails it) and the delta takes V to W. */
static int diff_check_begin(struct fold_diff *d)
{
	int rc = fold_digests_claimed(&d->dg, d->src[d->n_src - 1], d->st.mf);

	if (rc)
		return rc; /* V's claim, not W's: nothing poisoned */
	d->checking = 1;
	return fold_check_begin(&d->next, &d->dg, d->v, d->st.mf);
}

/* W's check failed (DCAST_EDIGEST): is W at fault?  Its digests do not
 * fit its tensors (the check never began), or, every made chunk applied
 * so that the state holds W's bytes, a range's digest computed whole
 * differs from W's own.  Otherwise the state was not V (a version of the
 * kept log is not what its COMMIT claims) and W is not poisoned.  O(model),
 * on this path only; a failed read says nothing (0). */
static int diff_w_bad(struct fold_diff *d)
{
	if (!d->next.want)
		return 1;
	if (d->next_chunk < d->w->n_chunks)
		return 0;
	for (uint32_t i = 0; i < d->w->n_digests; i++) {
		const dcast_range_digest *r = &d->w->digests[i];
		uint64_t got = 0;

		if (fold_state_digest(&d->st, r->tensor, r->start, r->count, &got))
			return 0;
		if (got != r->digest)
			return 1;
	}
	return 0;
}

/* --anchor-delta-max-ms: DCAST_ETIMEDOUT once more time than that has
 * passed since W's commit (the consumers at V have waited for the delta
 * that long), else 0.  The test fault slowfold delays each share first. */
static int diff_late(const struct broker *b, const struct fold_diff *d)
{
	uint64_t max = b->cfg.anchor_delta_max_ms, ms;

	if (b->cfg.fault_slowfold_ms)
		dcast_sleep_ms(b->cfg.fault_slowfold_ms);
	ms = (dcast_now_ns() - d->t0_ns) / 1000000;
	if (!max || ms <= max)
		return 0;
	return dcast_fail(DCAST_ETIMEDOUT, "not made within --anchor-delta-max-ms %llu (%llu ms since "
			  "its commit, %u of its %u chunks encoded)", (unsigned long long)max,
			  (unsigned long long)ms, d->next_chunk, d->w->n_chunks);
}

/* A bounded share of the delta's work: fold the log as it was, then
 * encode W's chunks, then check W's digests and publish.  Returns 1 while
 * work remains. */
int fold_diff_turn(struct broker *b, struct broker_model *m, struct broker_fold *f)
{
	struct fold_diff *d = &f->diff;
	uint64_t spent = 0, bytes;
	int rc;

	if (!d->started)
		return 0;
	DCAST_ASSERT(d->w && d->v && d->v->base_version == d->base && !d->v->anchor &&
		     d->folded <= d->n_src && d->next_chunk <= d->w->n_chunks);
	rc = diff_late(b, d);
	for (int i = 0; !rc && i < FOLD_VERSIONS_PER_TURN && d->folded < d->n_src; i++)
		rc = fold_applied(&d->st, d->src[d->folded++]);
	if (!rc && d->folded == d->n_src && !d->checking)
		rc = diff_check_begin(d);
	while (!rc && d->checking && spent < FOLD_STEP_BYTES && d->next_chunk < d->w->n_chunks) {
		rc = diff_chunk(m->name, d, &bytes);
		spent += bytes;
	}
	if (!rc && (!d->checking || d->next_chunk < d->w->n_chunks))
		return 1;
	if (!rc && !(rc = fold_check_end(&d->next, &d->st)) && !(rc = diff_publish(b, m, f)))
		return 0;
	diff_failed(b, m, f, rc, rc == DCAST_EDIGEST && d->checking && diff_w_bad(d));
	return 0;
}

/* v is committed: the made delta armed for it starts; one armed for an
 * anchor that never made it into the log goes. */
void fold_diff_committed(struct broker *b, struct broker_model *m, struct broker_fold *f,
			   struct broker_version *v)
{
	int rc;

	if (!f->diff.w || f->diff.started)
		return;
	if (f->diff.w != v) {
		fold_diff_drop(f);
		return;
	}
	if ((rc = diff_start(b, m, f)))
		diff_failed(b, m, f, rc, 0);
}

void broker_fold_anchor_coming(struct broker *b, struct broker_model *m, struct broker_version *w)
{
	struct broker_fold *f = m->fold;
	uint64_t lo;

	if (!f || !f->make_deltas || !w->anchor || !m->n_log || !m->log[0]->anchor ||
	    m->poisoned != DCAST_VERSION_NONE)
		return;
	if (f->diff.w) {
		DCAST_LOG_I("model %s: anchor %llu overtakes the delta being made for %llu", m->name,
			    (unsigned long long)w->version, (unsigned long long)f->diff.w->version);
		fold_diff_drop(f);
	}
	lo = fold_old_continues(f, m) ? f->old[0]->version : m->log[0]->version;
	if (!manifest_same(m->log[m->n_log - 1]->manifest, w->manifest) ||
	    !consumers_inside(b, m, lo, broker_model_newest(m)))
		return;
	if (diff_arm(b, m, f, w)) {
		DCAST_LOG_W("model %s: anchor %llu goes whole: out of memory", m->name,
			    (unsigned long long)w->version);
		fold_diff_drop(f);
		return;
	}
	chain_keep(f, m);
}

int broker_fold_holds(const struct broker_model *m, uint64_t have)
{
	return m->fold && m->fold->diff.started && have == m->fold->diff.base;
}

int broker_fold_makes_deltas(const struct broker_model *m)
{
	return m->fold && m->fold->make_deltas;
}
