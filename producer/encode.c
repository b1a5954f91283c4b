/* The producer's encoders: worker threads, and the publishing thread while
 * it waits for the range it sends next.  Each takes a free encode slot,
 * then the next chunk range of the version, diffs it against the baseline
 * (updating the baseline in O(changed) and keeping the values it overwrote
 * after the payload), moving the range's digest by the change in the same
 * pass (a full digest for anchors only), and marks the job done.  The
 * publishing thread sends the jobs in range order as they finish, so the
 * ranges after the one on the wire are being encoded meanwhile.  A slot is
 * always taken before a range, so the lowest unsent range always has one:
 * the pool cannot deadlock. */
#include <string.h>
#include <unistd.h>
#include "producer_shared.h"

#define ENC_SLOT_WAIT_MS 50

static uint64_t range_off(const dcast_producer *p, const prod_tensor *t, uint32_t j)
{
	return (uint64_t)(j - t->first_chunk) * p->opts.range_elems;
}

/* Range j dense into job->slot: from the tensor (copied into the baseline
 * on the way) or, for PROD_ENC_BASE, from the baseline itself. */
static int encode_dense(dcast_producer *p, int mode, const prod_tensor *t, uint64_t off,
			prod_job *job)
{
	uint64_t count = prod_range_count(p, t, off);
	unsigned char *base = t->base + off * t->elem_size;
	const unsigned char *src = mode == PROD_ENC_BASE ? base : t->ptr + off * t->elem_size;
	int rc;

	if ((rc = dcast_codec_encode(src, NULL, count, t->elem_size, -1,
				     DCAST_ENCODE_UPDATE_BASE | DCAST_ENCODE_SAVE_OLD, job->slot->buf,
				     p->pool.slot_bytes, &job->info)))
		return rc;
	if (mode == PROD_ENC_ANCHOR)
		memcpy(base, src, count * t->elem_size);
	return dcast_ldigest(job->tensor, t->shard_off + off, base, count, t->elem_size, &job->digest);
}

/* DCAST_ENCODE_COMPACT2 when DELTACAST_COMPACT2=1 is in the environment
 * (consumers that decode on GPUs: docs/operations.md), read once. */
static unsigned compact2_flag(void)
{
	static _Atomic int on = -1;
	int v = on;

	if (v < 0) {
		const char *e = getenv("DELTACAST_COMPACT2");
		on = v = e && !strcmp(e, "1");
	}
	return v ? DCAST_ENCODE_COMPACT2 : 0;
}

/* Encode range j into job->slot (the worker thread's whole job); a
 * snapshot only copies the range into the baseline (host tensors). */
static int encode_job(dcast_producer *p, int mode, uint32_t j, prod_job *job)
{
	const prod_tensor *t = &p->tensors[job->tensor];
	uint64_t off = range_off(p, t, j), count = prod_range_count(p, t, off);
	unsigned char *base = t->base + off * t->elem_size;
	const unsigned char *cur;

	if (t->mem == DCAST_MEM_CUDA) { /* snapshots are of host tensors only */
		DCAST_ASSERT(mode == PROD_ENC_DELTA || mode == PROD_ENC_ANCHOR);
		return prod_dev_encode(p, t, mode == PROD_ENC_ANCHOR, off, count, job);
	}
	if (mode == PROD_ENC_ANCHOR || mode == PROD_ENC_BASE)
		return encode_dense(p, mode, t, off, job);
	cur = t->ptr + off * t->elem_size; /* the caller's tensor */
	if (mode == PROD_ENC_SNAPSHOT) {
		DCAST_ASSERT(!job->slot);
		memcpy(base, cur, count * t->elem_size);
		return 0;
	}
	/* range j's digest at the last published state (chunk_digest, written by
	 * the publishing thread only between runs or after job j is done),
	 * moved by the change as the encoder copies it into the baseline */
	job->digest = p->chunk_digest[j];
	return dcast_codec_encode_digest(cur, base, count, t->elem_size, -1,
					 DCAST_ENCODE_UPDATE_BASE | DCAST_ENCODE_SAVE_OLD | compact2_flag(),
					 job->slot->buf, p->pool.slot_bytes, &job->info, job->tensor,
					 t->shard_off + off, &job->digest);
}

static int more(const prod_encoder *e)
{
	return !e->abort && e->next < e->end;
}

static void finish_job(prod_encoder *e, prod_job *job, int rc)
{
	if (rc && !e->err) {
		e->err = rc;
		snprintf(e->err_text, sizeof(e->err_text), "%s", dcast_last_error());
	}
	job->rc = rc;
	job->done = 1;
	pthread_cond_broadcast(&e->done_cv);
}

/* With a slot in hand: take the next range, if any, and encode it.  Called
 * with e->lock held; returns with it held; 0 when there was none. */
static int encode_next(dcast_producer *p, prod_encoder *e, prod_slot *slot)
{
	int mode = e->mode, rc;
	uint32_t j;
	prod_job *job;

	if (!more(e)) {
		if (slot)
			prod_pool_free_cb(slot->buf, slot);
		return 0;
	}
	j = e->next++;
	job = &e->jobs[j];
	job->slot = slot;
	job->run = e->run;
	pthread_mutex_unlock(&e->lock);
	rc = encode_job(p, mode, j, job);
	if (!rc && mode == PROD_ENC_DELTA && !job->info.changed) {
		prod_pool_free_cb(slot->buf, slot); /* nothing to send */
		job->slot = NULL;
	}
	pthread_mutex_lock(&e->lock);
	finish_job(e, job, rc);
	return 1;
}

/* A slot for the next range (a snapshot needs none: NULL); ETIMEDOUT when
 * none came back by deadline_ms.  e->mode is read without the lock: it only
 * changes between runs, and a run starts under the lock. */
static int take_slot(dcast_producer *p, const prod_encoder *e, uint64_t deadline_ms,
		     prod_slot **slot)
{
	*slot = NULL;
	return e->mode == PROD_ENC_SNAPSHOT ? 0 : prod_pool_get(&p->pool, deadline_ms, slot);
}

/* A worker's share of a run.  Called with e->lock held; returns with it held. */
static void work_run(dcast_producer *p, prod_encoder *e)
{
	while (more(e)) {
		prod_slot *slot;
		int got;

		pthread_mutex_unlock(&e->lock);
		got = !take_slot(p, e, dcast_now_ms() + ENC_SLOT_WAIT_MS, &slot);
		pthread_mutex_lock(&e->lock);
		if (got && !encode_next(p, e, slot))
			return;
	}
}

static void *worker(void *arg)
{
	dcast_producer *p = arg;
	prod_encoder *e = &p->enc;
	uint64_t seen = 0;

	pthread_mutex_lock(&e->lock);
	for (;;) {
		while (!e->stop && e->run == seen)
			pthread_cond_wait(&e->work_cv, &e->lock);
		if (e->stop)
			break;
		seen = e->run;
		e->busy++;
		work_run(p, e);
		e->busy--;
		pthread_cond_broadcast(&e->done_cv);
	}
	pthread_mutex_unlock(&e->lock);
	return NULL;
}

/* Encoders in all, the publishing thread included. */
static uint32_t encoders(const dcast_producer *p)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (p->opts.encode_threads)
		return p->opts.encode_threads;
	return n < 1 ? 1 : n > 8 ? 8 : (uint32_t)n;
}

static void job_tensors(dcast_producer *p)
{
	for (uint32_t i = 0; i < p->n_tensors; i++)
		for (uint32_t k = 0; k < p->tensors[i].n_chunks; k++)
			p->enc.jobs[p->tensors[i].first_chunk + k].tensor = i;
}

int prod_enc_setup(dcast_producer *p)
{
	prod_encoder *e = &p->enc;
	uint32_t n = encoders(p) - 1; /* worker threads */

	if (!(e->jobs = calloc(p->n_chunks + 1, sizeof(*e->jobs))) ||
	    !(e->threads = calloc(n + 1, sizeof(*e->threads))))
		return dcast_fail(DCAST_ENOMEM, "producer: out of memory for %u encode jobs",
				  p->n_chunks);
	job_tensors(p);
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->work_cv, NULL);
	pthread_cond_init(&e->done_cv, NULL);
	e->ready = 1;
	for (; e->n_threads < n; e->n_threads++)
		if (pthread_create(&e->threads[e->n_threads], NULL, worker, p))
			return dcast_fail(DCAST_ENOMEM, "producer: cannot start encoder thread %u of "
					  "%u", e->n_threads + 1, n);
	return 0;
}

void prod_enc_free(dcast_producer *p)
{
	prod_encoder *e = &p->enc;

	if (e->ready) {
		pthread_mutex_lock(&e->lock);
		e->stop = 1;
		pthread_cond_broadcast(&e->work_cv);
		pthread_mutex_unlock(&e->lock);
		for (uint32_t i = 0; i < e->n_threads; i++)
			pthread_join(e->threads[i], NULL);
		pthread_mutex_destroy(&e->lock);
		pthread_cond_destroy(&e->work_cv);
		pthread_cond_destroy(&e->done_cv);
	}
	free(e->threads);
	free(e->jobs);
	memset(e, 0, sizeof(*e));
}

void prod_enc_start(dcast_producer *p, prod_enc_mode mode, uint32_t from)
{
	prod_encoder *e = &p->enc;

	pthread_mutex_lock(&e->lock);
	for (uint32_t j = from; j < p->n_chunks; j++) {
		e->jobs[j].done = e->jobs[j].rc = e->jobs[j].no_old = 0;
		e->jobs[j].slot = NULL;
	}
	e->mode = (int)mode;
	e->next = from;
	e->end = p->n_chunks;
	e->abort = e->err = e->dev_moved = 0;
	e->run++;
	pthread_cond_broadcast(&e->work_cv);
	pthread_mutex_unlock(&e->lock);
}

static void deadline_in(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_nsec += (long)ms * 1000000L;
	ts->tv_sec += ts->tv_nsec / 1000000000L;
	ts->tv_nsec %= 1000000000L;
}

/* The publishing thread encodes a range itself when a slot is free at once.
 * With no worker threads (encode_threads 1) nobody else ever will, and a
 * slot that ZeroMQ's thread frees wakes the pool's waiters, not done_cv:
 * then it waits for a slot itself, up to the caller's timeout (waiting on
 * done_cv instead slept the whole timeout each time the pool ran dry: 2.7-8
 * s per delta of a model of 4721 small chunks).  Called with e->lock held;
 * returns with it held; 0 when it encoded nothing. */
static int help(dcast_producer *p, prod_encoder *e, int timeout_ms)
{
	prod_slot *slot;
	int rc;

	if (!more(e))
		return 0;
	if (take_slot(p, e, 0, &slot)) {
		if (e->n_threads)
			return 0;
		pthread_mutex_unlock(&e->lock);
		rc = take_slot(p, e, dcast_now_ms() + (uint64_t)timeout_ms, &slot);
		pthread_mutex_lock(&e->lock);
		if (rc)
			return 0;
	}
	return encode_next(p, e, slot);
}

int prod_enc_wait(dcast_producer *p, uint32_t j, int timeout_ms, prod_job **out)
{
	prod_encoder *e = &p->enc;
	struct timespec ts;
	int done;

	deadline_in(&ts, timeout_ms);
	pthread_mutex_lock(&e->lock);
	/* one range at most: the caller polls; with no workers, nobody signals done_cv */
	if (!e->jobs[j].done && !help(p, e, timeout_ms) && e->n_threads)
		while (!e->jobs[j].done && pthread_cond_timedwait(&e->done_cv, &e->lock, &ts) == 0)
			;
	done = e->jobs[j].done;
	pthread_mutex_unlock(&e->lock);
	*out = &e->jobs[j];
	if (!done)
		return DCAST_ETIMEDOUT;
	if ((*out)->rc)
		return dcast_fail((*out)->rc, "producer: encoding range %u: %s", j, e->err_text);
	return 0;
}

uint32_t prod_enc_stop(dcast_producer *p)
{
	prod_encoder *e = &p->enc;
	uint32_t claimed;

	pthread_mutex_lock(&e->lock);
	e->abort = 1;
	while (e->busy)
		pthread_cond_wait(&e->done_cv, &e->lock);
	claimed = e->next;
	pthread_mutex_unlock(&e->lock);
	return claimed;
}
