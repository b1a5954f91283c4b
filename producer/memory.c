/* The producer's memory, all allocated at the first publish: the baseline
 * (pinned host memory: mmap + mlock, best effort), the per-chunk digests,
 * the pool of encode slots handed to ZeroMQ (each holds a payload and the
 * baseline values its encoding overwrote), and the undo log that lets a
 * failed delta be taken back out of the baseline, or sent again. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include "producer_shared.h"

#define PROD_ALIGN 64
#define PROD_UNDO_MIN (1u << 20)

static size_t pad8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

static void pin(void *m, size_t bytes, const char *what)
{
	static int warned;

	if (mlock(m, bytes) && !warned) {
		warned = 1;
		DCAST_LOG_I("producer: %s not pinned (mlock: %s); using pageable memory", what,
			    strerror(errno));
	}
}

/* A mapping for the producer's memory; pinned at once when `pin_now`, else
 * by prod_mem_pin() once written (the kernel zeroes each page as it is
 * first touched, by whichever encoder thread touches it). */
static void *map_region(size_t bytes, const char *what, int pin_now)
{
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (m == MAP_FAILED) {
		dcast_fail(DCAST_ENOMEM, "producer: cannot map %zu bytes for the %s: %s", bytes,
			   what, strerror(errno));
		return NULL;
	}
	madvise(m, bytes, MADV_HUGEPAGE); /* fewer TLB misses when diffing; a hint only */
	if (pin_now)
		pin(m, bytes, what);
	return m;
}

/* Pin the baseline once its first version is in it (best effort): mlock
 * at setup would make the kernel zero the whole region on one thread
 * before the first anchor's copy; written first, the encoders fault its
 * pages in parallel. */
void prod_mem_pin(dcast_producer *p)
{
	if (p->base_pinned || !p->base_region)
		return;
	pin(p->base_region, p->base_region_bytes, "baseline");
	p->base_pinned = 1;
}

/* Fault the baseline's pages in (the kernel zeroes each), then pin it. */
void prod_mem_prefault(dcast_producer *p)
{
	if (p->base_pinned || !p->base_region)
		return;
#ifdef MADV_POPULATE_WRITE
	if (madvise(p->base_region, p->base_region_bytes, MADV_POPULATE_WRITE))
#endif
		memset(p->base_region, 0, p->base_region_bytes); /* kernels before 5.14 */
	prod_mem_pin(p);
}

/* Chunk ranges per tensor, offsets of the baselines kept in host memory;
 * returns the bytes of those. */
static int layout(dcast_producer *p, size_t *base_bytes, size_t *max_chunk_bytes)
{
	uint64_t r = p->opts.range_elems, chunks = 0, bytes = 0, model = 0;

	*max_chunk_bytes = 0;
	for (uint32_t i = 0; i < p->n_tensors; i++) {
		prod_tensor *t = &p->tensors[i];
		uint64_t n = (t->shard_count + r - 1) / r;
		size_t cb = dcast_codec_bound(t->shard_count < r ? t->shard_count : r, t->elem_size);

		t->first_chunk = (uint32_t)chunks;
		t->n_chunks = (uint32_t)n;
		chunks += n;
		if (chunks > DCAST_MAX_DIGESTS)
			return dcast_fail(DCAST_ETOO_LARGE, "producer: more than %d chunk ranges "
					  "(one digest each): raise range_elems", DCAST_MAX_DIGESTS);
		model += t->shard_count * t->elem_size;
		if (n && cb > *max_chunk_bytes)
			*max_chunk_bytes = cb;
		if (t->base_on_device)
			continue;
		bytes = (bytes + PROD_ALIGN - 1) & ~(uint64_t)(PROD_ALIGN - 1);
		t->base = (unsigned char *)(uintptr_t)bytes; /* offset until mapped */
		bytes += t->shard_count * t->elem_size;
	}
	p->n_chunks = (uint32_t)chunks;
	p->stats.model_bytes = model;
	*base_bytes = (size_t)bytes;
	return 0;
}

static int pool_setup(prod_pool *pool, size_t slot_bytes, uint64_t inflight_bytes)
{
	pthread_condattr_t ca;
	uint64_t n = slot_bytes ? inflight_bytes / slot_bytes : 2;

	n = n < 2 ? 2 : n > 4096 ? 4096 : n;
	pthread_mutex_init(&pool->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&pool->freed, &ca);
	pthread_condattr_destroy(&ca);
	if (!(pool->slots = calloc(n, sizeof(*pool->slots))))
		return dcast_fail(DCAST_ENOMEM, "producer: out of memory for encode slots");
	pool->n_slots = (uint32_t)n;
	pool->slot_bytes = slot_bytes;
	pool->free_head = UINT32_MAX;
	for (uint32_t i = 0; i < pool->n_slots; i++) {
		prod_slot *s = &pool->slots[i];
		size_t alloc = (slot_bytes + PROD_ALIGN - 1) & ~(size_t)(PROD_ALIGN - 1);

		if (slot_bytes && !(s->buf = aligned_alloc(PROD_ALIGN, alloc)))
			return dcast_fail(DCAST_ENOMEM, "producer: out of memory for %u encode slots "
					  "of %zu bytes", pool->n_slots, slot_bytes);
		s->pool = pool;
		s->next_free = pool->free_head;
		pool->free_head = i;
		pool->n_free++;
	}
	return 0;
}

int prod_mem_setup(dcast_producer *p)
{
	size_t bytes = 0, chunk_bytes = 0;
	int rc;

	prod_dev_alloc(p);
	if ((rc = layout(p, &bytes, &chunk_bytes)))
		return rc;
	if (bytes && !(p->base_region = map_region(bytes, "baseline", 0)))
		return DCAST_ENOMEM;
	p->base_region_bytes = bytes;
	for (uint32_t i = 0; i < p->n_tensors; i++)
		if (!p->tensors[i].base_on_device)
			p->tensors[i].base = p->base_region + (uintptr_t)p->tensors[i].base;
	if ((rc = prod_dev_map(p)))
		return rc;
	p->chunk_digest = calloc(p->n_chunks + 1, sizeof(*p->chunk_digest));
	p->commit_digests = calloc(p->n_chunks + 1, sizeof(*p->commit_digests));
	if (!p->chunk_digest || !p->commit_digests)
		return dcast_fail(DCAST_ENOMEM, "producer: out of memory for %u digests", p->n_chunks);
	if ((rc = pool_setup(&p->pool, chunk_bytes, p->opts.max_inflight_bytes)))
		return rc;
	p->undo.cap = p->opts.undo_bytes ? p->opts.undo_bytes : p->stats.model_bytes / 8;
	p->undo.cap = p->undo.cap < PROD_UNDO_MIN ? PROD_UNDO_MIN : p->undo.cap;
	if (!(p->undo.buf = map_region(p->undo.cap, "undo log", 1)))
		return DCAST_ENOMEM;
	return 0;
}

void prod_mem_free(dcast_producer *p)
{
	prod_dev_free(p);
	if (p->base_region)
		munmap(p->base_region, p->base_region_bytes);
	if (p->undo.buf)
		munmap(p->undo.buf, p->undo.cap);
	if (p->pool.slots) {
		for (uint32_t i = 0; i < p->pool.n_slots; i++)
			free(p->pool.slots[i].buf);
		free(p->pool.slots);
		pthread_mutex_destroy(&p->pool.lock);
		pthread_cond_destroy(&p->pool.freed);
	}
	free(p->chunk_digest);
	free(p->commit_digests);
	p->base_region = NULL;
	p->undo.buf = NULL;
	p->pool.slots = NULL;
	p->chunk_digest = NULL;
	p->commit_digests = NULL;
}

/* ZeroMQ calls this from its I/O thread once a payload is on the wire (or
 * dropped): the slot goes back to the pool. */
void prod_pool_free_cb(void *data, void *hint)
{
	prod_slot *s = hint;
	prod_pool *pool = s->pool;

	(void)data;
	pthread_mutex_lock(&pool->lock);
	s->next_free = pool->free_head;
	pool->free_head = (uint32_t)(s - pool->slots);
	pool->n_free++;
	pthread_cond_signal(&pool->freed);
	pthread_mutex_unlock(&pool->lock);
}

int prod_pool_get(prod_pool *pool, uint64_t deadline_ms, prod_slot **out)
{
	struct timespec ts = {(time_t)(deadline_ms / 1000), (long)(deadline_ms % 1000) * 1000000L};
	int rc = 0;

	pthread_mutex_lock(&pool->lock);
	while (pool->n_free == 0 && rc == 0)
		rc = pthread_cond_timedwait(&pool->freed, &pool->lock, &ts);
	if (pool->n_free) {
		*out = &pool->slots[pool->free_head];
		pool->free_head = (*out)->next_free;
		pool->n_free--;
		rc = 0;
	}
	pthread_mutex_unlock(&pool->lock);
	return rc ? DCAST_ETIMEDOUT : 0;
}

void prod_undo_reset(prod_undo *u)
{
	u->used = 0;
	u->n_records = 0;
	u->lost = 0;
}

/* Log the change a finished job made to the baseline: its payload (to send
 * it again) and the values it overwrote, which follow the payload in the
 * slot (DCAST_ENCODE_SAVE_OLD).  A log too small, or a change made on a
 * device (no old values), marks it lost: that version can be neither rolled
 * back nor re-sent as a delta. */
void prod_undo_record(dcast_producer *p, uint32_t chunk, const prod_job *job)
{
	prod_undo *u = &p->undo;
	const prod_tensor *t = &p->tensors[job->tensor];
	const dcast_chunk_info *info = &job->info;
	int dense = info->encoding == DCAST_ENC_DENSE;
	size_t old_len = (dense ? info->count : info->changed) * t->elem_size;
	size_t need = sizeof(prod_undo_rec) + pad8(info->payload_bytes) + pad8(old_len);
	prod_undo_rec *r = (prod_undo_rec *)(u->buf + u->used);

	if (u->lost || job->no_old || u->cap - u->used < need) {
		u->lost = 1;
		return;
	}
	r->tensor = job->tensor;
	r->chunk = chunk;
	r->off_elems = (uint64_t)(chunk - t->first_chunk) * p->opts.range_elems;
	r->info = *info;
	r->old_digest = p->chunk_digest[chunk];
	r->payload_len = info->payload_bytes;
	r->old_len = old_len;
	memcpy(r + 1, job->slot->buf, info->payload_bytes);
	memcpy((unsigned char *)(r + 1) + pad8(info->payload_bytes),
	       job->slot->buf + pad8(info->payload_bytes), old_len);
	u->used += need;
	u->n_records++;
}

/* The record at *at (start at 0), moving *at past it; its payload copy
 * follows it.  The caller counts records (u->n_records). */
const prod_undo_rec *prod_undo_next(const prod_undo *u, size_t *at)
{
	const prod_undo_rec *r = (const prod_undo_rec *)(u->buf + *at);

	*at += sizeof(*r) + pad8(r->payload_len) + pad8(r->old_len);
	return r;
}

/* Put back what the records of the version in flight changed. */
void prod_undo_rollback(dcast_producer *p)
{
	prod_undo *u = &p->undo;
	size_t at = 0;

	for (uint32_t i = 0; i < u->n_records; i++) {
		const prod_undo_rec *r = prod_undo_next(u, &at);
		prod_tensor *t = &p->tensors[r->tensor];
		unsigned char *base = t->base + r->off_elems * t->elem_size;
		const unsigned char *pl = (const unsigned char *)(r + 1);
		const unsigned char *old = pl + pad8(r->payload_len);

		if (r->info.encoding == DCAST_ENC_DENSE)
			memcpy(base, old, r->old_len);
		else
			dcast_codec_revert(&r->info, pl, base, old);
		p->chunk_digest[r->chunk] = r->old_digest;
	}
	prod_undo_reset(u);
}

/* Tensor i's baseline from host memory (its shard, wire order), with the
 * digests of its ranges: a baseline taken from the broker or the caller. */
int prod_base_fill(dcast_producer *p, uint32_t i, const unsigned char *src)
{
	prod_tensor *t = &p->tensors[i];
	int rc = prod_base_write(t, src, t->shard_count * t->elem_size);

	for (uint32_t k = 0; k < t->n_chunks && !rc; k++) {
		uint64_t off = (uint64_t)k * p->opts.range_elems;
		rc = dcast_ldigest(i, t->shard_off + off, src + off * t->elem_size,
				   prod_range_count(p, t, off), t->elem_size,
				   &p->chunk_digest[t->first_chunk + k]);
	}
	return rc;
}
