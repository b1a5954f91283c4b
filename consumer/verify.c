/* Digest verification in O(changed).  A COMMIT digest is XXH3 of the
 * per-1-MiB-block XXH3 hashes of its range (docs/protocol.md, "Checksum and
 * digest"), so the consumer keeps the block hashes of the live tensors at
 * the applied version (c->dcache, one entry per COMMIT digest range) and,
 * after an apply, hashes again only the blocks that overlap a chunk which
 * wrote something, each as soon as the last chunk over it is written (while
 * its bytes are still in cache); every other block hash is reused and the
 * digests are combined from the block hashes.  The new cache replaces the
 * old one only when every digest matched.  verify_digests = 2 hashes every
 * block of every version (no reuse).  Device tensors are hashed whole by
 * the CUDA digest, without reuse. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include "consumer_impl.h"
#include "dcast_common.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the digest combines block hashes as little-endian u64"
#endif

void cs_dcache_clear(cs_dcache *d)
{
	free(d->e);
	free(d->hash);
	free(d->todo);
	memset(d, 0, sizeof(*d));
}

static int key_cmp(const dcast_range_digest *a, const dcast_range_digest *b)
{
	if (a->tensor != b->tensor)
		return a->tensor < b->tensor ? -1 : 1;
	if (a->start != b->start)
		return a->start < b->start ? -1 : 1;
	return a->count < b->count ? -1 : a->count > b->count;
}

static int entry_cmp(const void *a, const void *b)
{
	return key_cmp(&((const cs_dentry *)a)->d, &((const cs_dentry *)b)->d);
}

/* The cached entry of the same range, or NULL. */
static const cs_dentry *cache_find(const cs_dcache *d, const dcast_range_digest *key)
{
	uint32_t lo = 0, hi = d->n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		int r = key_cmp(&d->e[mid].d, key);
		if (!r)
			return &d->e[mid];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* Did a chunk of v (sorted by tensor, start) write elements [lo, hi) of tensor t? */
static int written(const cs_version *v, uint32_t t, uint64_t lo, uint64_t hi)
{
	uint32_t a = 0, b = v->n_chunks;

	while (a < b) { /* first chunk of t that ends after lo */
		uint32_t mid = a + (b - a) / 2;
		const cs_chunk *k = &v->chunks[mid];
		if (k->tensor < t || (k->tensor == t && k->start + k->info.count <= lo))
			a = mid + 1;
		else
			b = mid;
	}
	for (; a < v->n_chunks && v->chunks[a].tensor == t && v->chunks[a].start < hi; a++)
		if (v->chunks[a].info.encoding == DCAST_ENC_DENSE || v->chunks[a].info.changed)
			return 1;
	return 0;
}

static uint64_t blocks_of(const cs_tensor *t, const dcast_range_digest *d)
{
	return (d->count * t->elem_size + CS_DIGEST_BLOCK - 1) / CS_DIGEST_BLOCK;
}

static int check_entry(const dcast_consumer *c, const dcast_range_digest *d, uint32_t i)
{
	const cs_tensor *t = d->tensor < c->n_tensors ? &c->tensors[d->tensor] : NULL;
	uint64_t elems = t ? dcast_tensor_elems(&t->desc) : 0;

	if (!t || d->start > elems || d->count > elems - d->start)
		return dcast_fail(DCAST_EFIELD_RANGE, "COMMIT.digests[%u]: range outside the manifest", i);
	return 0;
}

/* Entries sorted by range, each with its slice of the block hash array. */
static int plan_entries(dcast_consumer *c, const cs_version *v, cs_dcache *n)
{
	const dcast_commit *m = &v->commit;
	uint64_t blocks = 0;
	int err = 0;

	n->e = calloc(m->n_digests ? m->n_digests : 1, sizeof(*n->e));
	if (!n->e)
		return dcast_fail(DCAST_ENOMEM, "digest table of version %" PRIu64, v->version);
	n->n = m->n_digests;
	for (uint32_t i = 0; !err && i < m->n_digests; i++)
		if (!(err = check_entry(c, &m->digests[i], i)))
			n->e[i].d = m->digests[i];
	if (err)
		return err;
	qsort(n->e, n->n, sizeof(*n->e), entry_cmp);
	for (uint32_t i = 0; i < n->n; i++) {
		const cs_tensor *t = &c->tensors[n->e[i].d.tensor];
		n->e[i].first = blocks;
		n->e[i].nblocks = t->mem == DCAST_MEM_HOST ? blocks_of(t, &n->e[i].d) : 0;
		blocks += n->e[i].nblocks;
	}
	n->nh = blocks;
	n->hash = malloc((blocks ? blocks : 1) * sizeof(*n->hash));
	n->todo = malloc(blocks ? blocks : 1);
	if (!n->hash || !n->todo)
		return dcast_fail(DCAST_ENOMEM, "%" PRIu64 " block hashes of version %" PRIu64, blocks, v->version);
	return 0;
}

/* Which blocks of entry e must be hashed again; the others take the cached hash. */
static void plan_blocks(const dcast_consumer *c, const cs_version *v, cs_dcache *n, const cs_dentry *e,
			int full)
{
	const cs_dentry *old = full ? NULL : cache_find(&c->dcache, &e->d);
	uint64_t per = CS_DIGEST_BLOCK / c->tensors[e->d.tensor].elem_size;

	for (uint64_t j = 0; j < e->nblocks; j++) {
		uint64_t lo = e->d.start + j * per, hi = lo + per;
		if (hi > e->d.start + e->d.count)
			hi = e->d.start + e->d.count;
		int again = !old || written(v, e->d.tensor, lo, hi);
		n->todo[e->first + j] = (uint8_t)again;
		if (!again)
			n->hash[e->first + j] = c->dcache.hash[old->first + j];
	}
}

int cs_verify_plan(dcast_consumer *c, const cs_version *v, int full, cs_dcache *n)
{
	int err;

	memset(n, 0, sizeof(*n));
	c->verify_bytes = 0;
	if ((err = plan_entries(c, v, n))) {
		cs_dcache_clear(n);
		return err;
	}
	for (uint32_t i = 0; i < n->n; i++)
		plan_blocks(c, v, n, &n->e[i], full);
	return 0;
}

/* Hash pending blocks in range order while they lie before (tensor, byte
 * `limit`); every chunk that could still write them comes later. */
static void hash_until(dcast_consumer *c, cs_dcache *n, uint32_t tensor, uint64_t limit)
{
	for (; n->cur_e < n->n; n->cur_e++, n->cur_b = 0) {
		const cs_dentry *e = &n->e[n->cur_e];
		const cs_tensor *t = &c->tensors[e->d.tensor];
		uint64_t base = e->d.start * t->elem_size, end = base + e->d.count * t->elem_size;
		for (; n->cur_b < e->nblocks; n->cur_b++) {
			uint64_t off = base + (uint64_t)n->cur_b * CS_DIGEST_BLOCK;
			uint64_t len = end - off < CS_DIGEST_BLOCK ? end - off : CS_DIGEST_BLOCK;
			if (e->d.tensor > tensor || (e->d.tensor == tensor && off + len > limit))
				return;
			if (!n->todo[e->first + n->cur_b])
				continue;
			n->hash[e->first + n->cur_b] = dcast_checksum(t->ptr + off, len);
			c->verify_bytes += len;
		}
	}
}

void cs_verify_written(dcast_consumer *c, cs_dcache *n, const cs_version *v, uint32_t i)
{
	const cs_chunk *k = &v->chunks[i], *next = i + 1 < v->n_chunks ? &v->chunks[i + 1] : NULL;

	if (!n->e)
		return;
	if (next && next->tensor == k->tensor)
		hash_until(c, n, k->tensor, next->start * c->tensors[k->tensor].elem_size);
	else
		hash_until(c, n, k->tensor, UINT64_MAX);
}

static int entry_digest(dcast_consumer *c, const cs_dentry *e, const cs_dcache *n, uint64_t *out)
{
	const cs_tensor *t = &c->tensors[e->d.tensor];

	if (t->mem != DCAST_MEM_HOST) {
		c->verify_bytes += e->d.count * t->elem_size;
		return cs_tensor_digest(t, e->d.start * t->elem_size, e->d.count * t->elem_size, out);
	}
	*out = dcast_checksum(n->hash + e->first, (size_t)e->nblocks * sizeof(uint64_t));
	return 0;
}

static int compare_digests(dcast_consumer *c, const cs_version *v, cs_dcache *n)
{
	int err = 0;

	for (uint32_t i = 0; !err && i < n->n; i++) {
		const cs_dentry *e = &n->e[i];
		uint64_t got = 0;
		if ((err = entry_digest(c, e, n, &got)))
			break;
		if (got != e->d.digest)
			err = dcast_fail(DCAST_EDIGEST, "version %" PRIu64 ": tensor %s [%" PRIu64 ", +%" PRIu64
					 ") digest differs from the producer's", v->version,
					 c->tensors[e->d.tensor].desc.name, e->d.start, e->d.count);
	}
	free(n->todo);
	n->todo = NULL;
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

	hash_until(c, n, UINT32_MAX, UINT64_MAX);
	if ((err = compare_digests(c, v, n))) {
		cs_dcache_clear(n);
		return err;
	}
	install(c, n);
	return 0;
}

/* ---- checking ahead, before apply ---- */

#define AHEAD_MAX_RANGE_BYTES (16u << 20) /* larger chunk ranges are checked at apply */
#define AHEAD_NO 1000                     /* not an error: check at apply instead */

/* The copy a chunk range is patched in: a quarter of the staging budget,
 * 16 MiB at most (allocated at the first check ahead). */
static uint64_t ahead_buf_bytes(const dcast_consumer *c)
{
	return c->budget / 4 < AHEAD_MAX_RANGE_BYTES ? c->budget / 4 : AHEAD_MAX_RANGE_BYTES;
}

static int ahead_possible(const dcast_consumer *c, const cs_version *v)
{
	if (c->fault_kind == CS_FAULT_DIGEST && c->fault_version == v->version)
		return 0; /* the test hook exercises the check at apply and its rollback */
	return c->opts.verify_digests == 1 && !v->anchor && !c->device_tensors && v->state == CS_V_READY &&
	       !v->ahead_tried && v->base_version == dcast_consumer_version(c) && v->commit.n_digests;
}

/* Append k's idx32 record (docs/protocol.md, "1: idx32") for element i. */
static int put_idx32(const unsigned char *to, uint64_t i, unsigned es, unsigned char *out, uint64_t cap,
		     uint64_t *used)
{
	uint32_t pos = (uint32_t)i;

	if (*used + 4 + es > cap)
		return 0;
	memcpy(out + *used, &pos, 4);
	memcpy(out + *used + 4, to + i * es, es);
	*used += 4 + es;
	return 1;
}

/* The idx32 payload of every element where `to` differs from `from`, into
 * out (cap bytes); 0 when it does not fit.  Compares 8 bytes at a time. */
static int changes_idx32(const unsigned char *from, const unsigned char *to, uint64_t count, unsigned es,
			 unsigned char *out, uint64_t cap, uint64_t *n)
{
	uint64_t used = 0, words = count * es / 8;

	for (uint64_t w = 0; w < words; w++) {
		uint64_t a, b;
		memcpy(&a, from + w * 8, 8);
		memcpy(&b, to + w * 8, 8);
		if (a == b)
			continue;
		for (uint64_t i = w * 8 / es; i < (w + 1) * 8 / es; i++)
			if (memcmp(from + i * es, to + i * es, es) && !put_idx32(to, i, es, out, cap, &used))
				return 0;
	}
	for (uint64_t i = words * 8 / es; i < count; i++)
		if (memcmp(from + i * es, to + i * es, es) && !put_idx32(to, i, es, out, cap, &used))
			return 0;
	*n = used / (4 + es);
	return 1;
}

/* Write k's changes kept in idx32 form into the live tensor (host memory),
 * their old values to old (NULL: not kept), per element size so that each
 * element moves as one load and store.  Positions are checked first. */
static inline __attribute__((always_inline)) void scatter_es(const unsigned char *rec, uint64_t n,
							   unsigned char *dst, unsigned char *old, unsigned es)
{
	for (uint64_t i = 0; i < n; i++, rec += 4 + es) {
		uint32_t pos;
		memcpy(&pos, rec, 4);
		if (old)
			memcpy(old + i * es, dst + (uint64_t)pos * es, es);
		memcpy(dst + (uint64_t)pos * es, rec + 4, es);
	}
}

int cs_ahead_write(dcast_consumer *c, const cs_chunk *k, unsigned char *old)
{
	const cs_tensor *t = &c->tensors[k->tensor];
	unsigned char *dst = t->ptr + k->start * t->elem_size;
	unsigned es = t->elem_size;

	for (uint64_t i = 0; i < k->ahead_changed; i++) {
		uint32_t pos;
		memcpy(&pos, k->ahead + i * (4 + es), 4);
		if (pos >= k->info.count)
			return dcast_fail(DCAST_ECORRUPT, "tensor %s: checked change %" PRIu64 " at %u outside its "
					  "chunk of %" PRIu64, t->desc.name, i, pos, k->info.count);
	}
	if (es == 2)
		scatter_es(k->ahead, k->ahead_changed, dst, old, 2);
	else if (es == 4)
		scatter_es(k->ahead, k->ahead_changed, dst, old, 4);
	else
		scatter_es(k->ahead, k->ahead_changed, dst, old, 1);
	return 0;
}

void cs_ahead_revert(dcast_consumer *c, const cs_chunk *k, const unsigned char *old)
{
	const cs_tensor *t = &c->tensors[k->tensor];
	unsigned es = t->elem_size;

	for (uint64_t i = 0; i < k->ahead_changed; i++) {
		uint32_t pos;
		memcpy(&pos, k->ahead + i * (4 + es), 4);
		memcpy(t->ptr + (k->start + pos) * es, old + i * es, es);
	}
}

/* The first entry of tensor t that ends after element `lo`, or n->n; AHEAD_NO
 * when an entry sticks out of [lo, hi) (then a block mixes two chunks). */
static int entries_within(const cs_dcache *n, uint32_t t, uint64_t lo, uint64_t hi, uint32_t *first)
{
	uint32_t a = 0, b = n->n;

	while (a < b) {
		uint32_t mid = a + (b - a) / 2;
		const dcast_range_digest *d = &n->e[mid].d;
		if (d->tensor < t || (d->tensor == t && d->start + d->count <= lo))
			a = mid + 1;
		else
			b = mid;
	}
	*first = a;
	for (; a < n->n && n->e[a].d.tensor == t && n->e[a].d.start < hi; a++)
		if (n->e[a].d.start < lo || n->e[a].d.start + n->e[a].d.count > hi)
			return AHEAD_NO;
	return 0;
}

/* Hash the blocks of the entries inside chunk k from its patched copy. */
static void hash_copy(dcast_consumer *c, cs_dcache *n, const cs_chunk *k, uint32_t first,
		      const unsigned char *copy)
{
	unsigned es = k->info.elem_size;

	for (uint32_t i = first; i < n->n && n->e[i].d.tensor == k->tensor &&
	     n->e[i].d.start < k->start + k->info.count; i++) {
		const cs_dentry *e = &n->e[i];
		uint64_t base = (e->d.start - k->start) * es, end = base + e->d.count * es;
		for (uint32_t j = 0; j < e->nblocks; j++) {
			uint64_t off = base + (uint64_t)j * CS_DIGEST_BLOCK;
			uint64_t len = end - off < CS_DIGEST_BLOCK ? end - off : CS_DIGEST_BLOCK;
			n->hash[e->first + j] = dcast_checksum(copy + off, len);
			n->todo[e->first + j] = 0;
			c->verify_bytes += len;
		}
	}
}

/* Patch a copy of chunk k's range, hash its blocks, keep its changes in
 * idx32 form at *used in the undo region when they fit below `cap`. */
static int ahead_chunk(dcast_consumer *c, cs_version *v, cs_dcache *n, cs_chunk *k, uint64_t cap,
		       uint64_t *used)
{
	const cs_tensor *t = &c->tensors[k->tensor];
	uint64_t bytes = k->info.count * t->elem_size;
	const unsigned char *p, *live = t->ptr + k->start * t->elem_size;
	unsigned char *out = cs_pool_undo(&c->pool) + *used;
	uint32_t first;
	int err;

	if (k->info.encoding != DCAST_ENC_DENSE && !k->info.changed)
		return 0;
	if (bytes > ahead_buf_bytes(c) || entries_within(n, k->tensor, k->start, k->start + k->info.count, &first))
		return AHEAD_NO;
	if (!c->ahead_buf && !(c->ahead_buf = malloc(ahead_buf_bytes(c))))
		return AHEAD_NO;
	memcpy(c->ahead_buf, live, bytes);
	if ((err = cs_chunk_payload(c, v, k, &p)) || (err = dcast_codec_apply(&k->info, p, c->ahead_buf, NULL)))
		return err;
	hash_copy(c, n, k, first, c->ahead_buf);
	if (changes_idx32(live, c->ahead_buf, k->info.count, t->elem_size, out, cap - *used, &k->ahead_changed)) {
		k->ahead = out;
		*used += k->ahead_changed * (4 + t->elem_size);
	}
	return 0;
}

/* Undo region bytes the old values of v take at apply, at most. */
static uint64_t undo_need(const cs_version *v)
{
	uint64_t need = 0;

	for (uint32_t i = 0; i < v->n_chunks; i++)
		need += (v->chunks[i].info.encoding == DCAST_ENC_DENSE ? v->chunks[i].info.count
								      : v->chunks[i].info.changed) * v->chunks[i].info.elem_size;
	return need;
}

static void ahead_forget(cs_version *v)
{
	cs_dcache_clear(&v->ahead);
	for (uint32_t i = 0; i < v->n_chunks; i++)
		v->chunks[i].ahead = NULL;
}

int cs_verify_ahead(dcast_consumer *c, cs_version *v)
{
	uint64_t need, used = 0;
	cs_dcache n;
	int err;

	if (!ahead_possible(c, v))
		return 0;
	v->ahead_tried = 1;
	if (c->fault_kind == CS_FAULT_PREDIGEST && c->fault_version == v->version) {
		c->fault_kind = CS_FAULT_NONE; /* test hook: the check ahead must refuse v */
		v->commit.digests[0].digest ^= 1;
	}

	if ((err = cs_sort_chunks(c, v)) || (err = cs_verify_plan(c, v, 0, &n)))
		return err == DCAST_ENOMEM ? 0 : err;
	need = undo_need(v);
	c->ahead_owner = v->version; /* the undo region is ours now */
	for (uint32_t i = 0; !err && i < v->n_chunks; i++)
		err = ahead_chunk(c, v, &n, &v->chunks[i], need < c->pool.region_bytes ? c->pool.region_bytes - need : 0,
				  &used);
	if (!err) {
		hash_until(c, &n, UINT32_MAX, UINT64_MAX); /* blocks v does not write: as they are */
		err = compare_digests(c, v, &n);
	}
	if (err) {
		cs_dcache_clear(&n);
		ahead_forget(v);
		c->ahead_owner = DCAST_VERSION_NONE;
		return err == AHEAD_NO ? 0 : err;
	}
	v->ahead = n;
	v->ahead_base = dcast_consumer_version(c);
	v->ahead_bytes = used;
	v->ahead_hashed = c->verify_bytes;
	return 0;
}

void cs_verify_ahead_done(dcast_consumer *c, cs_version *v)
{
	install(c, &v->ahead);
	c->verify_bytes = v->ahead_hashed;
	ahead_forget(v);
	c->ahead_owner = DCAST_VERSION_NONE;
}
