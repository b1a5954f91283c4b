/* Applying one whole version to the live tensors, transactionally: every
 * chunk is checked against the manifest, its payload against its checksum,
 * then written with its old values saved in the pool's undo region; then
 * the COMMIT digests are checked.  Any failure undoes the chunks written so
 * far in reverse order, or, when the old values did not fit in the undo
 * region (anchors, huge deltas), restores the previous version from the
 * local checkpoint. */
#include <inttypes.h>
#include <string.h>
#include "consumer_impl.h"
#include "dcast_common.h"

/* Bytes of old values k saves at apply (a resolved chunk has its own). */
static uint64_t undo_bytes(const cs_chunk *k)
{
	if (k->res)
		return 0;
	return (k->info.encoding == DCAST_ENC_DENSE ? k->info.count : k->info.changed) * k->info.elem_size;
}

/* Write k (old values to old unless NULL); *p is the payload it wrote. */
static int write_chunk(dcast_consumer *c, const cs_version *v, const cs_chunk *k, unsigned char *old,
		       const unsigned char **p, const uint32_t **pos)
{
	int err;

	*pos = NULL;
	if (k->res) { /* resolved ahead: no payload to read or decode */
		*p = NULL;
		if (!cs_dbatch_chunk(c, k)) /* a device chunk is written with the batch */
			cs_resolved_scatter(c, k, 0);
		return 0;
	}
	if ((err = cs_chunk_payload(c, v, k, p)) || k->file_off == CS_IN_PLACE)
		return err; /* in place: written as it arrived */
	if (old && k->info.encoding == DCAST_ENC_DENSE) {
		memcpy(old, cs_chunk_dst(c, k), undo_bytes(k));
		old = NULL;
	}
	if (c->tensors[k->tensor].n_views) /* their update takes the positions decoded here */
		return cs_views_write_host(c, k, *p, old, pos);
	return cs_tensor_apply(&c->tensors[k->tensor], &k->info, *p, k->start, old);
}

/* Write back the old values of chunks [0, n); 0 when every one came back. */
static int undo_chunks(dcast_consumer *c, const cs_version *v, uint32_t n, unsigned char *undo, uint64_t undo_off)
{
	int failed = 0;

	for (uint32_t i = n; i-- > 0;) {
		const cs_chunk *k = &v->chunks[i];
		const unsigned char *p;
		undo_off -= undo_bytes(k);
		if (k->res) {
			if (!cs_dbatch_chunk(c, k))
				cs_resolved_scatter(c, k, 1);
			continue;
		}
		if (k->info.encoding == DCAST_ENC_DENSE) {
			memcpy(cs_chunk_dst(c, k), undo + undo_off, undo_bytes(k));
			continue;
		}
		if (cs_chunk_payload(c, v, k, &p) || dcast_codec_revert(&k->info, p, cs_chunk_dst(c, k), undo + undo_off)) {
			DCAST_LOG_E("consumer %s: undo of version %" PRIu64 " chunk %u failed: %s", c->model,
				    v->version, i, dcast_last_error());
			failed = 1;
		}
	}
	return failed;
}

/* v's batch of device chunks resolved ahead (devbatch.c), or NULL. */
static unsigned char *batch_of(const dcast_consumer *c, const cs_version *v)
{
	for (uint32_t i = 0; i < v->n_chunks; i++)
		if (v->chunks[i].res && cs_dbatch_chunk(c, &v->chunks[i]))
			return v->res;
	return NULL;
}

/* The batch's segments of v's chunks before chunk `end`. */
static uint64_t segs_before(const dcast_consumer *c, const cs_version *v, uint32_t end)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < v->n_chunks && i < end; i++)
		n += v->chunks[i].res && cs_dbatch_chunk(c, &v->chunks[i]);
	return n;
}

/* The batch's first segs segments written back from its undo buffer: 0
 * when they came back (or there is none). */
static int undo_batch(dcast_consumer *c, const cs_version *v, unsigned char *batch, uint64_t segs)
{
	if (!batch || !segs || !cs_dbatch_scatter(c, batch, 1, segs))
		return 0;
	DCAST_LOG_E("consumer %s: undo of version %" PRIu64 "'s device changes failed: %s", c->model, v->version,
		    dcast_last_error());
	return 1;
}

/* The first `segs` segments of v's batch (devbatch.c) and the first n
 * chunks were written: back to the version before v from the old values
 * kept in memory.  Returns err, its detail saying what became of the
 * tensors; *torn is set when they hold part of v (no old values kept, or
 * not all came back): the caller's recovery policy (cs_ckpt_recover)
 * takes over. */
static int rollback(dcast_consumer *c, const cs_version *v, unsigned char *undo, uint32_t n, uint64_t off,
		    uint64_t segs, int err, int *torn)
{
	char why[512];

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	if (undo && !undo_batch(c, v, batch_of(c, v), segs) && !undo_chunks(c, v, n, undo, off))
		return dcast_fail(err, "%s (version %" PRIu64 " refused; tensors kept at the previous version)",
				  why, v->version);
	*torn = 1;
	return dcast_fail(err, "%s", why);
}

/* How apply checks v's digests, chosen once per version. */
enum check_how {
	CHECK_NONE,     /* not asked to: the cached digests are forgotten */
	CHECK_AHEAD,    /* done before apply (verify.c), against the live base: nothing left */
	CHECK_WRITING,  /* digests moved by each chunk as it is written, compared at the end */
	CHECK_WHOLE,    /* every digest computed over its whole range after the writes */
};

/* verify 1 uses the check ahead when v had one against the version the
 * tensors hold and the cached digests it moved still describe them (a bind
 * or an anchor load since clears them). */
static enum check_how check_for(const dcast_consumer *c, const cs_version *v, int verify)
{
	if (!verify)
		return CHECK_NONE;
	if (verify == 2)
		return CHECK_WHOLE;
	return v->ahead.e && v->ahead_base == dcast_consumer_version(c) && c->dcache.n ? CHECK_AHEAD
										   : CHECK_WRITING;
}

/* A chunk of v writes device memory outside the batch (its old values
 * are not kept). */
static int device_unbatched(const dcast_consumer *c, const cs_version *v)
{
	if (!c->device_tensors)
		return 0;
	for (uint32_t i = 0; i < v->n_chunks; i++) {
		const cs_chunk *k = &v->chunks[i];
		if (c->tensors[k->tensor].mem == DCAST_MEM_CUDA && cs_chunk_writes(k) && !k->res)
			return 1;
	}
	return 0;
}

/* Old values of v fit in the undo region (a device chunk's: in the
 * batch's device copy)?  Else NULL: the checkpoint restores the previous
 * version (anchors, device tensors not resolved ahead, large deltas). */
static unsigned char *undo_for(dcast_consumer *c, const cs_version *v)
{
	uint64_t need = 0;

	for (uint32_t i = 0; i < v->n_chunks; i++)
		need += undo_bytes(&v->chunks[i]);
	if (v->anchor || device_unbatched(c, v) || need > c->pool.region_bytes - v->res_bytes)
		return NULL;
	return cs_pool_undo_take(&c->pool, v->version) + v->res_bytes; /* after v's resolved arrays */
}

/* Every chunk of v that writes was resolved ahead (its old values are in
 * its arrays) and no tensor it names has bound slices to update.  *cost:
 * the scatters' work for cs_par_for. */
static int all_resolved(const dcast_consumer *c, const cs_version *v, uint64_t *cost)
{
	*cost = 0;
	for (uint32_t i = 0; i < v->n_chunks; i++) {
		const cs_chunk *k = &v->chunks[i];
		if (c->tensors[k->tensor].n_views || (cs_chunk_writes(k) && !k->res))
			return 0;
		*cost += k->info.changed * CS_CHANGE_COST;
	}
	return 1;
}

typedef struct scatter_run {
	dcast_consumer *c;
	const cs_version *v;
} scatter_run;

static void scatter_one(void *arg, unsigned i)
{
	scatter_run *r = arg;

	if (r->v->chunks[i].res && !cs_dbatch_chunk(r->c, &r->v->chunks[i]))
		cs_resolved_scatter(r->c, &r->v->chunks[i], 0);
}

/* Write v's chunks in order, old values to undo unless NULL, moving the
 * digests in n unless NULL; refuse_at: the test fault's chunk.  *done:
 * chunks written (to undo on failure), *off: undo bytes they used. */
static int write_chunks(dcast_consumer *c, cs_version *v, unsigned char *undo, uint32_t refuse_at,
			cs_dcache *n, uint32_t *done, uint64_t *off)
{
	uint64_t cost;
	int err = 0;
	uint32_t i;

	if (!n && refuse_at == UINT32_MAX && all_resolved(c, v, &cost)) {
		/* chunks never overlap (cs_sort_chunks) and a scatter cannot fail */
		cs_par_for(v->n_chunks, cost, scatter_one, &(scatter_run){ c, v });
		*done = v->n_chunks;
		return 0;
	}
	for (i = 0; !err && i < v->n_chunks; i++) {
		const cs_chunk *k = &v->chunks[i];
		const unsigned char *p;
		const uint32_t *pos;
		if (i == refuse_at)
			err = dcast_fail(DCAST_ECORRUPT, "version %" PRIu64 " chunk %u: refused by the test "
					 "fault aheadfail", v->version, i);
		if (err || (err = write_chunk(c, v, k, undo ? undo + *off : NULL, &p, &pos)))
			break;
		if ((err = cs_views_chunk(c, k, pos))) {
			*off += undo_bytes(k), i++; /* written: undone with the others */
			break;
		}
		if (n)
			cs_verify_written(c, n, k, p, undo ? undo + *off : NULL);
		*off += undo_bytes(k);
	}
	*done = i;
	return err;
}

/* Two strategies, each chosen once: how v is checked (check_for), and
 * how a failure is undone (undo_for: old values kept in memory, or the
 * caller restores the tensors from the checkpoint).  verify: 0 none, 1
 * moves the cached digests by the changes, 2 computes every digest whole.
 * On failure the tensors are back at the previous version from the old
 * values kept in memory, or *torn says they are not (the caller's
 * recovery: cs_ckpt_recover). */
int cs_apply_version(dcast_consumer *c, cs_version *v, int verify, int *torn)
{
	enum check_how how = check_for(c, v, verify);
	int checking = how == CHECK_WRITING || how == CHECK_WHOLE, err;
	unsigned char *undo, *batch;
	cs_dcache next = {0};
	uint64_t off = 0, segs;
	uint32_t i = 0, refuse_at;

	*torn = 0;
	if (how != CHECK_AHEAD || !cs_resolved_valid(c, v))
		cs_resolved_drop(v); /* apply decodes every chunk */
	if ((err = cs_sort_chunks(c, v)))
		return err;
	refuse_at = cs_fault_apply(c, v, how == CHECK_AHEAD); /* the test seam: UINT32_MAX unless armed */
	if (checking && (err = cs_verify_plan(c, v, how == CHECK_WHOLE, &next)))
		return err;
	if (how == CHECK_NONE)
		cs_dcache_clear(&c->dcache); /* it would no longer describe the tensors */
	undo = undo_for(c, v);
	batch = batch_of(c, v); /* device chunks: one launch, before the host's */
	segs = segs_before(c, v, refuse_at);
	if (!(err = batch ? cs_dbatch_scatter(c, batch, 0, segs) : 0))
		err = write_chunks(c, v, undo, refuse_at, checking ? &next : NULL, &i, &off);
	if (!err && checking)
		err = cs_verify_finish(c, v, &next);
	if (err) {
		cs_dcache_clear(&next);
		err = rollback(c, v, undo, i, off, segs, err, torn);
		if (!*torn && cs_views_refresh(c)) /* they may hold some of v */
			DCAST_LOG_E("consumer %s: bound slices not brought back after version %" PRIu64
				    " failed: %s", c->model, v->version, dcast_last_error());
		return err;
	}
	if (how == CHECK_AHEAD)
		cs_verify_ahead_done(c, v);
	return 0;
}
