/* Digest verification in O(changed).  A COMMIT digest is additive (a sum
 * of one mixed term per element, docs/protocol.md, "Checksum and digest"),
 * so the consumer keeps the digest of each COMMIT digest range of the live
 * version (c->dcache) and checks a delta by moving the cached value of
 * each range it writes by h(new) - h(old) of every changed element: the
 * payload names the positions and new values, the old ones come from the
 * live tensors before apply (checked ahead) or from the undo region after
 * it.  A range the version does not write must still equal its cached
 * value: O(#ranges).  A range is computed whole when there is no cached
 * value for it (anchors, the first version after a restart, a producer
 * with another range size), when its old values were not kept (device
 * tensors, deltas too large for the undo region), and for every range with
 * verify_digests 2.  The new cache replaces the old one only when every
 * digest matched. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "dcast_ranges.h"

static int entry_cmp(const void *a, const void *b)
{
	return dcast_range_key_cmp(&((const cs_dentry *)a)->d, &((const cs_dentry *)b)->d);
}

/* The cached entry of the same range, or NULL. */
static const cs_dentry *cache_find(const cs_dcache *d, const dcast_range_digest *key)
{
	uint32_t lo = 0, hi = d->n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		int r = dcast_range_key_cmp(&d->e[mid].d, key);
		if (!r)
			return &d->e[mid];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* v's digests sorted by range, each starting from its cached value (or
 * marked to be computed whole). */
static int plan_entries(dcast_consumer *c, const cs_version *v, int full, cs_dcache *n)
{
	const dcast_commit *m = &v->commit;
	int err = 0;

	n->e = calloc(m->n_digests ? m->n_digests : 1, sizeof(*n->e));
	if (!n->e)
		return dcast_fail(DCAST_ENOMEM, "digest table of version %" PRIu64, v->version);
	n->n = m->n_digests;
	for (uint32_t i = 0; !err && i < m->n_digests; i++)
		if (!(err = dcast_digest_fits(&m->digests[i], i, cs_tensor_descs(c))))
			n->e[i].d = m->digests[i];
	if (err)
		return err;
	qsort(n->e, n->n, sizeof(*n->e), entry_cmp);
	for (uint32_t i = 0; i < n->n; i++) {
		const cs_dentry *old = full || v->anchor ? NULL : cache_find(&c->dcache, &n->e[i].d);
		n->e[i].have = old ? old->d.digest : 0;
		n->e[i].full = !old;
	}
	return 0;
}

/* Every element v's chunks (sorted: cs_sort_chunks) write lies in one of
 * n's ranges, else none of it could be checked: a COMMIT that left a
 * range out would pass any damage there. */
static int chunks_held(const dcast_consumer *c, const cs_version *v, const cs_dcache *n)
{
	dcast_digest_cover cv = {n->n ? &n->e[0].d : NULL, sizeof(*n->e), n->n, 0};
	char why[512];

	for (uint32_t i = 0; i < v->n_chunks; i++) {
		const cs_chunk *k = &v->chunks[i];
		if (cs_chunk_writes(k) && dcast_digests_hold(&cv, cs_tensor_descs(c), k->tensor, k->start, k->info.count)) {
			snprintf(why, sizeof(why), "%s", dcast_last_error());
			return dcast_fail(DCAST_ECORRUPT, "version %" PRIu64 ": %s", v->version, why);
		}
	}
	return 0;
}

int cs_verify_plan(dcast_consumer *c, const cs_version *v, int full, cs_dcache *n)
{
	int err;

	memset(n, 0, sizeof(*n));
	c->verify_bytes = 0;
	if ((err = plan_entries(c, v, full, n)) || (err = chunks_held(c, v, n)))
		cs_dcache_clear(n);
	return err;
}

/* Tensor bytes read to move the digests by k's changes: old and new value
 * of each changed element (every element of a dense chunk). */
static uint64_t change_bytes(const cs_chunk *k)
{
	uint64_t n = k->info.encoding == DCAST_ENC_DENSE ? k->info.count : k->info.changed;
	return 2 * n * k->info.elem_size;
}

/* ---- resolved chunks: positions, old and new values, decoded once ---- */

static uint64_t res_size(const cs_chunk *k)
{
	return (k->info.changed * (4 + 2 * (uint64_t)k->info.elem_size) + 7) & ~(uint64_t)7;
}

static int resolvable(const dcast_consumer *c, const cs_chunk *k)
{
	const cs_tensor *t = &c->tensors[k->tensor];

	return cs_chunk_writes(k) && k->info.encoding != DCAST_ENC_DENSE && t->mem == DCAST_MEM_HOST &&
	       !t->n_views && k->file_off != CS_IN_PLACE && !cs_dbatch_tensor(c, t);
}

/* k's arrays at r (res_size(k) bytes): positions, old values, new ones. */
static void res_arrays(unsigned char *r, const cs_chunk *k, uint32_t **pos, unsigned char **old,
		       unsigned char **nv)
{
	*pos = (uint32_t *)r;
	*old = r + 4 * k->info.changed;
	*nv = *old + k->info.changed * k->info.elem_size;
}

/* A resolved chunk's changes: where its positions, old and new values are. */
typedef struct chunk_arrays {
	const uint32_t *pos;
	const unsigned char *old, *nv;
} chunk_arrays;

static chunk_arrays host_arrays(const cs_chunk *k)
{
	unsigned char *old, *nv;
	uint32_t *pos;

	res_arrays(k->res, k, &pos, &old, &nv);
	return (chunk_arrays){ pos, old, nv };
}

static chunk_arrays batch_arrays(const dcast_batch *b, uint64_t seg)
{
	const dcast_batch_seg *s = &b->seg[seg];

	return (chunk_arrays){ b->pos + s->first, b->old_vals + s->val_off, b->new_vals + s->val_off };
}

void cs_resolved_scatter(dcast_consumer *c, const cs_chunk *k, int undo)
{
	unsigned char *old, *nv;
	uint32_t *pos;

	DCAST_ASSERT(k->res && c->tensors[k->tensor].mem == DCAST_MEM_HOST);
	res_arrays(k->res, k, &pos, &old, &nv);
	dcast_codec_scatter(pos, undo ? old : nv, k->info.changed, k->info.elem_size, cs_chunk_dst(c, k));
}

int cs_resolved_valid(const dcast_consumer *c, const cs_version *v)
{
	if (cs_pool_undo_owner(&c->pool) != v->version)
		return 0; /* the undo region was reused since */
	for (uint32_t i = 0; i < v->n_chunks; i++)
		if (v->chunks[i].res && !resolvable(c, &v->chunks[i]) && !cs_dbatch_chunk(c, &v->chunks[i]))
			return 0; /* a slice bound since */
	return 1;
}

void cs_resolved_drop(cs_version *v)
{
	for (uint32_t i = 0; i < v->n_chunks; i++)
		v->chunks[i].res = NULL;
	v->res = NULL;
	v->res_bytes = 0;
}

void cs_ahead_forget(dcast_consumer *c)
{
	for (uint32_t i = 0; i < c->n_staged; i++) {
		cs_version *v = &c->staged[i];
		cs_resolved_drop(v);
		cs_dcache_clear(&v->ahead);
		v->ahead_tried = 0;
	}
}

/* First of the n increasing positions at or above p. */
static uint64_t pos_lower(const uint32_t *pos, uint64_t n, uint64_t p)
{
	uint64_t a = 0;

	while (a < n) {
		uint64_t mid = a + (n - a) / 2;
		if (pos[mid] < p)
			a = mid + 1;
		else
			n = mid;
	}
	return a;
}

/* Move e by k's resolved changes at positions [lo, hi); nonzero: not moved. */
static int move_resolved(const cs_chunk *k, const chunk_arrays *r, cs_dentry *e, uint64_t lo, uint64_t hi)
{
	unsigned es = k->info.elem_size;
	uint64_t a = pos_lower(r->pos, k->info.changed, lo), b = pos_lower(r->pos, k->info.changed, hi);

	return dcast_ldigest_update(&e->have, k->tensor, k->start, r->pos + a, r->old + a * es, r->nv + a * es, b - a,
				    es);
}

/* Move the entries chunk k overlaps by its changes (old: the values it
 * overwrote, or NULL when k is not applied yet; r: its resolved arrays
 * before apply, or NULL); an entry that cannot be moved (no old values
 * after apply) is computed whole instead. */
static void move_entries(dcast_consumer *c, cs_dcache *n, const cs_chunk *k, const unsigned char *payload,
			 const unsigned char *old, int applied, const chunk_arrays *r)
{
	const cs_tensor *t = &c->tensors[k->tensor];
	const unsigned char *range = t->ptr + k->start * t->elem_size;
	uint64_t end = k->start + k->info.count;
	int moved = 0;

	for (uint32_t i = cs_dcache_first(n, k->tensor, k->start); i < n->n && n->e[i].d.tensor == k->tensor &&
	     n->e[i].d.start < end; i++) {
		cs_dentry *e = &n->e[i];
		uint64_t lo = e->d.start > k->start ? e->d.start - k->start : 0;
		uint64_t hi = e->d.start + e->d.count < end ? e->d.start + e->d.count - k->start : k->info.count;
		if (e->full)
			continue;
		if (r && !applied)
			e->full = move_resolved(k, r, e, lo, hi) != 0;
		else
			e->full = (applied && !old) || t->mem != DCAST_MEM_HOST ||
				  dcast_ldigest_payload(&e->have, k->tensor, k->start, &k->info, payload, range, old,
							lo, hi);
		moved |= !e->full;
	}
	if (moved) /* ranges computed whole count their bytes at the end */
		c->verify_bytes += change_bytes(k);
}

void cs_verify_written(dcast_consumer *c, cs_dcache *n, const cs_chunk *k, const unsigned char *payload,
		       const unsigned char *old)
{
	if (n->e && cs_chunk_writes(k))
		move_entries(c, n, k, payload, old, 1, NULL);
}

/* ---- ranges computed whole: an anchor's, on several threads ---- */

typedef struct whole_job {
	const dcast_consumer *c;
	cs_dcache *n;
} whole_job;

/* Entry i computed whole when it is due and its tensor is in host memory
 * (full CS_FULL_DONE); device tensors are left to compare_digests. */
static void whole_one(void *arg, unsigned i)
{
	whole_job *j = arg;
	cs_dentry *e = &j->n->e[i];
	const cs_tensor *t = &j->c->tensors[e->d.tensor];

	if (e->full == CS_FULL_TODO && t->mem == DCAST_MEM_HOST &&
	    !dcast_ldigest(e->d.tensor, e->d.start, t->ptr + e->d.start * t->elem_size, e->d.count, t->elem_size,
			   &e->have))
		e->full = CS_FULL_DONE;
}

static uint64_t whole_host_bytes(const dcast_consumer *c, const cs_dcache *n)
{
	uint64_t bytes = 0;

	for (uint32_t i = 0; i < n->n; i++) {
		const cs_tensor *t = &c->tensors[n->e[i].d.tensor];
		if (n->e[i].full == CS_FULL_TODO && t->mem == DCAST_MEM_HOST)
			bytes += n->e[i].d.count * t->elem_size;
	}
	return bytes;
}

static int compare_digests(dcast_consumer *c, const cs_version *v, cs_dcache *n)
{
	int err = 0;

	/* O(model) for an anchor or verify 2, and the caller waits in apply() */
	cs_par_for(n->n, whole_host_bytes(c, n), whole_one, &(whole_job){ c, n });
	for (uint32_t i = 0; !err && i < n->n; i++) {
		cs_dentry *e = &n->e[i];
		const cs_tensor *t = &c->tensors[e->d.tensor];
		if (e->full) {
			c->verify_bytes += e->d.count * t->elem_size;
			if (e->full == CS_FULL_TODO &&
			    (err = cs_tensor_ldigest(t, e->d.tensor, e->d.start, e->d.count, &e->have)))
				break;
		}
		if (e->have != e->d.digest)
			err = dcast_fail(DCAST_EDIGEST, "version %" PRIu64 ": tensor %s [%" PRIu64 ", +%" PRIu64
					 ") digest differs from the producer's", v->version, t->desc.name, e->d.start,
					 e->d.count);
	}
	return err;
}

static void install(dcast_consumer *c, cs_dcache *n)
{
	cs_dcache_clear(&c->dcache);
	c->dcache = *n;
	memset(n, 0, sizeof(*n));
}

int cs_verify_finish(dcast_consumer *c, const cs_version *v, cs_dcache *n)
{
	int err;

	if ((err = compare_digests(c, v, n))) {
		cs_dcache_clear(n);
		return err;
	}
	install(c, n);
	return 0;
}

/* ---- checking ahead, before apply ---- */

static int ahead_possible(const dcast_consumer *c, const cs_version *v)
{
	if (cs_fault_holds_ahead(c, v))
		return 0; /* the test fault exercises the check at apply and its undo */
	return c->opts.verify_digests == 1 && !v->anchor && v->state == CS_V_READY &&
	       !v->ahead_tried && v->base_version == dcast_consumer_version(c) && v->commit.n_digests &&
	       c->dcache.n;
}

/* Every entry has a cached value to move (else apply computes them). */
static int all_cached(const cs_dcache *n)
{
	for (uint32_t i = 0; i < n->n; i++)
		if (n->e[i].full)
			return 0;
	return 1;
}

/* The entry of n that alone overlaps k, covering it whole, or NULL. */
static cs_dentry *sole_entry(cs_dcache *n, const cs_chunk *k)
{
	uint32_t i = cs_dcache_first(n, k->tensor, k->start);
	uint64_t end = k->start + k->info.count;
	cs_dentry *e = i < n->n ? &n->e[i] : NULL;

	if (!e || e->full || e->d.tensor != k->tensor || e->d.start > k->start || e->d.start + e->d.count < end)
		return NULL;
	if (i + 1 < n->n && n->e[i + 1].d.tensor == k->tensor && n->e[i + 1].d.start < end)
		return NULL;
	return e;
}

/* One chunk's part of the check ahead: planned on the caller's thread,
 * resolved on a cs_par_for thread, which writes only the chunk's arrays
 * and its job.  A chunk of a device tensor is decoded into its segment of
 * v's batch instead; the batch then resolves on the device. */
typedef struct res_job {
	const unsigned char *p; /* its payload, resident; NULL: not resolved */
	uint64_t off;           /* its arrays at v->res + off */
	cs_dentry *e;           /* the entry that alone holds it, or NULL */
	uint64_t moved;         /* e's move by its changes */
	int ok;                 /* resolved */
	int batched;            /* decoded into segment `seg` of the batch */
	uint64_t seg;
} res_job;

typedef struct res_run {
	const dcast_consumer *c;
	cs_version *v;
	res_job *jobs;
} res_run;

static void resolve_one(void *arg, unsigned i)
{
	res_run *r = arg;
	res_job *j = &r->jobs[i];
	cs_chunk *k = &r->v->chunks[i];
	unsigned char *old, *nv;
	uint32_t *pos;

	if (!j->p)
		return;
	if (j->batched) {
		j->ok = !cs_dbatch_decode(r->v->res, j->seg, k, j->p);
		return;
	}
	res_arrays(r->v->res + j->off, k, &pos, &old, &nv);
	j->ok = !dcast_codec_resolve(&k->info, j->p, cs_chunk_dst(r->c, k), pos, old, nv, k->tensor, k->start,
				     j->e ? &j->moved : NULL);
}

/* v's batch first in the undo region, when v has one (b mapped onto it);
 * an error when it cannot be made (apply then takes each chunk). */
static int ahead_batch(dcast_consumer *c, cs_version *v, dcast_batch *b, uint64_t *used)
{
	uint64_t bytes = cs_dbatch_bytes(c, v);

	*used = bytes;
	if (bytes > c->pool.region_bytes)
		return dcast_fail(DCAST_ENOMEM, "version %" PRIu64 ": its device changes exceed the undo region",
				  v->version);
	return bytes ? cs_dbatch_layout(c, v, cs_pool_undo_take(&c->pool, v->version), b) : 0;
}

/* Give each resident chunk that resolves within the undo region its place
 * there, in order (v->res taken when one does), device chunks in the batch
 * at its start; move the entries of every other chunk now, old values read
 * from the live tensors, which still hold v's base (those of a device
 * tensor cannot be: apply then checks v).  *cost: the resolves' work for
 * cs_par_for. */
static int ahead_plan(dcast_consumer *c, cs_version *v, cs_dcache *n, res_job *jobs, dcast_batch *b,
		      uint64_t *cost)
{
	uint64_t used = 0, seg = 0;
	int err = 0;

	if ((err = ahead_batch(c, v, b, &used)))
		return err;
	for (uint32_t i = 0; !err && i < v->n_chunks; i++) {
		cs_chunk *k = &v->chunks[i];
		const unsigned char *p;
		if (!cs_chunk_writes(k) || (err = cs_chunk_payload(c, v, k, &p)))
			continue;
		if (cs_dbatch_chunk(c, k)) {
			jobs[i] = (res_job){ .p = p, .e = sole_entry(n, k), .batched = 1, .seg = seg++ };
			*cost += k->info.changed * CS_CHANGE_COST;
			continue;
		}
		if (!k->resident || !resolvable(c, k) || used + res_size(k) > c->pool.region_bytes) {
			move_entries(c, n, k, p, NULL, 0, NULL); /* p may be the pool's scratch: now */
			continue;
		}
		jobs[i] = (res_job){ .p = p, .off = used, .e = sole_entry(n, k) };
		used += res_size(k);
		*cost += k->info.changed * CS_CHANGE_COST;
	}
	v->res = used ? cs_pool_undo_take(&c->pool, v->version) : NULL;
	v->res_bytes = used;
	return err;
}

/* A device chunk's move: its segment's, or (under several entries) from
 * the batch's values copied back. */
static void settle_batched(dcast_consumer *c, cs_dcache *n, const cs_chunk *k, const res_job *j,
			   const dcast_batch *b)
{
	chunk_arrays r = batch_arrays(b, j->seg);

	if (!j->e) {
		move_entries(c, n, k, j->p, NULL, 0, &r); /* counts its bytes */
		return;
	}
	j->e->have += b->seg[j->seg].move;
	c->verify_bytes += change_bytes(k);
}

/* The device's part: v's compact payloads decoded, old values, new ones
 * and moves of its batch, then each device chunk's entries moved (*refuse:
 * a payload the decoder refused). */
static int ahead_device(dcast_consumer *c, cs_version *v, cs_dcache *n, const res_job *jobs, dcast_batch *b,
			int *refuse)
{
	int values = 0, err;

	for (uint32_t i = 0; i < v->n_chunks; i++)
		values |= jobs[i].batched && !jobs[i].e;
	if ((err = cs_dbatch_resolve(c, v->res, values, refuse)))
		return err;
	for (uint32_t i = 0; i < v->n_chunks; i++)
		if (jobs[i].batched)
			settle_batched(c, n, &v->chunks[i], &jobs[i], b);
	return 0;
}

/* After the resolves, in chunk order: a chunk's sole entry takes its move;
 * a chunk resolved under several entries moves them from its arrays; one
 * that failed moves them from its payload, which marks them (apply names
 * the problem).  A device chunk that failed to decode refuses v: its
 * error (the decoder's) is returned, named on this thread. */
static int ahead_settle(dcast_consumer *c, cs_version *v, cs_dcache *n, const res_job *jobs)
{
	int err = 0;

	for (uint32_t i = 0; !err && i < v->n_chunks; i++) {
		const res_job *j = &jobs[i];
		cs_chunk *k = &v->chunks[i];
		if (!j->p)
			continue;
		if (j->batched) {
			k->res = j->ok ? v->res : NULL;
			err = j->ok ? 0 : cs_dbatch_decode(v->res, j->seg, k, j->p);
			continue;
		}
		k->res = j->ok ? v->res + j->off : NULL;
		if (!j->ok || !j->e) {
			chunk_arrays r = j->ok ? host_arrays(k) : (chunk_arrays){0};
			move_entries(c, n, k, j->p, NULL, 0, j->ok ? &r : NULL);
			continue;
		}
		j->e->have += j->moved;
		c->verify_bytes += change_bytes(k);
	}
	return err;
}

/* Move the digests by every chunk of v before it is applied, resolving on
 * several threads what fits in the undo region.  *refuse: the error is
 * a device chunk's payload's, which refuses v. */
static int ahead_chunks(dcast_consumer *c, cs_version *v, cs_dcache *n, int *refuse)
{
	res_job *jobs = calloc(v->n_chunks ? v->n_chunks : 1, sizeof(*jobs));
	uint64_t cost = 0;
	dcast_batch b = {0};
	int err;

	if (!jobs)
		return DCAST_ENOMEM; /* checked at apply */
	if (!(err = ahead_plan(c, v, n, jobs, &b, &cost))) {
		cs_par_for(v->n_chunks, cost, resolve_one, &(res_run){ c, v, jobs });
		*refuse = (err = ahead_settle(c, v, n, jobs)) != 0;
		if (!err && b.d.n_seg)
			err = ahead_device(c, v, n, jobs, &b, refuse);
	}
	free(jobs);
	return err || all_cached(n) ? err : DCAST_EINVAL; /* a payload that failed: apply names it */
}

int cs_verify_ahead(dcast_consumer *c, cs_version *v)
{
	cs_dcache n;
	int err, refuse = 0;

	if (!ahead_possible(c, v))
		return 0;
	v->ahead_tried = 1;
	if ((err = cs_sort_chunks(c, v)) || (err = cs_verify_plan(c, v, 0, &n)))
		return err == DCAST_ENOMEM ? 0 : err;
	if (!all_cached(&n) || (err = ahead_chunks(c, v, &n, &refuse)) || (err = compare_digests(c, v, &n))) {
		cs_dcache_clear(&n);
		cs_resolved_drop(v);
		return err == DCAST_EDIGEST || refuse ? err : 0; /* anything else: checked at apply */
	}
	v->ahead = n;
	v->ahead_base = dcast_consumer_version(c);
	v->ahead_hashed = c->verify_bytes;
	return 0;
}

void cs_verify_ahead_done(dcast_consumer *c, cs_version *v)
{
	install(c, &v->ahead);
	c->verify_bytes = v->ahead_hashed;
}
