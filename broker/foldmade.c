/* What the fold's two products share (foldint.h): versions the broker
 * makes (made anchors in fold.c, made deltas in folddelta.c), their
 * frames and payloads, folding a stored version into a state, and the
 * kept chain of versions that a made anchor or a producer's anchor
 * replaced in the log, for the consumers still on them. */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include "dcast_common.h"
#include "dcast_fit.h"
#include "deltacast/codec.h"
#include "foldint.h"

void fold_signal(const struct broker *b)
{
	uint64_t one = 1;

	if (b->fold.efd >= 0 && write(b->fold.efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		DCAST_LOG_W("fold: eventfd write: %s", strerror(errno));
}

int fold_stored_chunk(const struct broker_chunk *ch, const struct broker_manifest *mf, dcast_chunk *c)
{
	dcast_msg msg;
	int rc, type;

	if ((rc = dcast_msg_decode(zmq_msg_data((zmq_msg_t *)&ch->hdr),
				   zmq_msg_size((zmq_msg_t *)&ch->hdr), &msg)))
		return rc;
	type = (int)msg.type;
	dcast_msg_free(&msg); /* a CHUNK owns nothing; its fields stay readable */
	if (type != DCAST_MSG_CHUNK)
		return dcast_fail(DCAST_ECORRUPT, "fold: stored chunk is not a CHUNK");
	*c = msg.u.chunk;
	if ((rc = dcast_chunk_fits(c, dcast_manifest_descs(&mf->m))))
		return dcast_fail(rc, "fold: stored %s", dcast_last_error());
	return 0;
}

/* Apply one stored chunk to the state (fold_stored_chunk: the log keeps
 * encoded frames); the digests in `next`, when given, move by its changes
 * first. */
static int fold_chunk(struct fold_state *st, struct fold_digests *next, const struct broker_chunk *ch)
{
	dcast_chunk c;
	dcast_chunk_info info;
	zmq_msg_t payload;
	uint8_t *range;
	int rc;

	if ((rc = fold_stored_chunk(ch, st->mf, &c)))
		return rc;
	info = (dcast_chunk_info){c.encoding, c.elem_size, c.count, c.changed, c.payload_bytes};
	if ((rc = broker_chunk_payload(ch, &payload))) /* from disk, one range at a time */
		return rc;
	rc = fold_state_get(st, c.tensor, c.start, c.count, &range);
	if (!rc && next)
		rc = fold_check_chunk(next, &c, zmq_msg_data(&payload), range);
	if (!rc)
		rc = dcast_codec_apply(&info, zmq_msg_data(&payload), range, NULL);
	if (!rc)
		rc = fold_state_put(st);
	zmq_msg_close(&payload);
	return rc;
}

/* Fold v's chunks into the state st, checked against v's digests; *dg,
 * the digests of st before, become v's. */
int fold_checked(struct fold_state *st, struct fold_digests *dg, const struct broker_version *v)
{
	struct fold_digests next;
	int rc = fold_check_begin(&next, dg, v, st->mf);

	for (uint32_t i = 0; !rc && i < v->n_chunks; i++)
		rc = fold_chunk(st, &next, &v->chunks[i]);
	if (!rc)
		rc = fold_check_end(&next, st);
	fold_digests_free(dg);
	if (rc)
		fold_digests_free(&next);
	*dg = next;
	return rc;
}

int fold_applied(struct fold_state *st, const struct broker_version *v)
{
	int rc = 0;

	for (uint32_t i = 0; !rc && i < v->n_chunks; i++)
		rc = fold_chunk(st, NULL, &v->chunks[i]);
	return rc;
}

int fold_old_continues(const struct broker_fold *f, const struct broker_model *m)
{
	return f->n_old && m->n_log && f->old[f->n_old - 1]->version == m->log[0]->version;
}

void fold_old_free(struct broker_fold *f)
{
	for (uint32_t i = 0; i < f->n_old; i++)
		broker_version_put(f->old[i]);
	f->n_old = 0;
	f->old_bytes = 0;
}

/* Room for n more versions in the chain (allocated when an anchor is made). */
void fold_old_reserve(struct broker_fold *f, uint32_t n)
{
	struct broker_version **o;

	if (f->n_old + n <= f->cap_old)
		return;
	if (!(o = realloc(f->old, (f->n_old + n) * sizeof(*o)))) {
		fold_old_free(f); /* lagging consumers take the anchor path instead */
		return;
	}
	f->old = o;
	f->cap_old = f->n_old + n;
}

/* keep() for broker_log_replace_anchor: the chain stays one run of deltas
 * from its first anchor on, so a later batch's (made) anchor is not kept. */
void fold_old_keep(void *arg, struct broker_version *v)
{
	struct broker_fold *f = arg;

	if (f->n_old < f->cap_old && !(f->n_old && v->anchor)) {
		f->old[f->n_old++] = v;
		f->old_bytes += v->mem_bytes;
	} else {
		broker_version_put(v);
	}
}

/* A made version (one reference) of `version` on `base` (NONE: an
 * anchor) with mf's tensors: room for n chunks, each set empty (none
 * counted yet), and a copy of src's digests.  NULL on no memory. */
struct broker_version *fold_made_version(uint64_t version, uint64_t base,
					   struct broker_manifest *mf, uint32_t n,
					   const struct broker_version *src)
{
	struct broker_version *v = calloc(1, sizeof(*v));

	if (!v)
		return NULL;
	v->refs = 1;
	v->version = version;
	v->base_version = base;
	v->anchor = base == DCAST_VERSION_NONE;
	v->manifest = mf;
	mf->refs++;
	zmq_msg_init(&v->commit_hdr);
	v->chunks = calloc(n ? n : 1, sizeof(*v->chunks));
	v->digests = malloc((src->n_digests ? src->n_digests : 1) * sizeof(*v->digests));
	if (!v->chunks || !v->digests) {
		broker_version_put(v);
		return NULL;
	}
	v->cap_chunks = n;
	for (uint32_t i = 0; i < n; i++) {
		zmq_msg_init(&v->chunks[i].hdr);
		zmq_msg_init(&v->chunks[i].payload);
	}
	if (src->n_digests)
		memcpy(v->digests, src->digests, src->n_digests * sizeof(*v->digests));
	v->n_digests = src->n_digests;
	return v;
}

/* Re-encode a frame initialised empty (so that a put always finds it set). */
int fold_frame_encode(const dcast_msg *msg, zmq_msg_t *out)
{
	int rc;

	zmq_msg_close(out);
	if ((rc = broker_frame_encode(msg, out)))
		zmq_msg_init(out);
	return rc;
}

/* A made chunk's payload (of `what` version): into the spill file with
 * --data-dir (the heap holds no dense copy then), else a frame of its
 * own; a failed spill write leaves the rest of the version in memory. */
int fold_made_payload(const char *model, const char *what, uint64_t version, struct fold_spill *sp,
			struct broker_chunk *ch, const uint8_t *data, uint64_t bytes)
{
	if (sp->dir && !broker_spill_write(sp->dir, &sp->file, &sp->end, data, bytes, &ch->file,
					   &ch->file_off))
		return 0;
	if (sp->dir)
		DCAST_LOG_W("model %s: made %s %llu: %s; its chunks stay in memory", model, what,
			    (unsigned long long)version, dcast_last_error());
	sp->dir = NULL;
	zmq_msg_close(&ch->payload);
	if (zmq_msg_init_size(&ch->payload, bytes)) {
		zmq_msg_init(&ch->payload);
		return dcast_fail(DCAST_ENOMEM, "made chunk of %llu bytes", (unsigned long long)bytes);
	}
	memcpy(zmq_msg_data(&ch->payload), data, bytes);
	return 0;
}
