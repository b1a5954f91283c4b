/* The store's life (open, close), its fold thread, and what the consumer
 * tells it or asks of it outside a load, a record write or a fold: a
 * version applied, its counters, a failed sync, the generation of its
 * files. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "store_impl.h"
#include "dcast_common.h"

static char *join(const char *a, const char *b)
{
	size_t n = strlen(a) + strlen(b) + 2;
	char *s = malloc(n);

	if (s)
		snprintf(s, n, "%s/%s", a, b);
	return s;
}

int cs_store_open(dcast_consumer *c, const cs_store_sink *sink)
{
	struct cs_store *s = calloc(1, sizeof(*s));
	int err;

	if (!(c->store = s))
		return dcast_fail(DCAST_ENOMEM, "consumer: its store");
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->fold_cv, NULL);
	pthread_cond_init(&s->direct_cv, NULL);
	s->sink = sink;
	cs_store_lock(s);
	s->anchor_file_version = DCAST_VERSION_NONE;
	s->new_version = DCAST_VERSION_NONE;
	s->new_fd = s->new_file = -1;
	cs_store_unlock(s);
	s->anchor_path = join(c->dir, "model.safetensors");
	s->log_dir = join(c->dir, "model.dlog");
	if (!s->anchor_path || !s->log_dir)
		return dcast_fail(DCAST_ENOMEM, "paths");
	if (mkdir(s->log_dir, 0755) && errno != EEXIST)
		return dcast_fail(DCAST_EIO, "%s: mkdir: %s", s->log_dir, strerror(errno));
	if ((err = cs_syncer_open(&s->syncer, c)))
		return err;
	return cs_ckpt_wb_open(c);
}

void cs_store_close(dcast_consumer *c, int fold_owed)
{
	struct cs_store *s = c->store;
	int armed;

	if (!s)
		return;
	cs_store_lock(s);
	armed = s->new_version != DCAST_VERSION_NONE;
	cs_store_unlock(s);
	if (!armed) /* an anchor in place READY and not applied: the next open drops its .new file */
		cs_ckpt_forget_direct(c);
	cs_ckpt_settle(c); /* chunk records written behind */
	if (cs_anchor_new_seal(c, NULL)) /* an anchor applied: durable */
		DCAST_LOG_W("consumer %s: anchor file at close: %s", c->model, dcast_last_error());
	cs_anchor_new_release(c); /* one READY and not applied keeps its .new file (a restart drops it) */
	if (fold_owed && cs_fold_wanted(c) && cs_store_fold_now(c))
		DCAST_LOG_W("consumer %s: fold at close: %s", c->model, dcast_last_error());
	cs_syncer_close(&s->syncer); /* what was committed is on the disk */
	cs_ckpt_wb_close(c);
	cs_store_lock(s);
	cs_anchor_new_forget(s); /* an anchor in place still streaming in: its .new goes at the next open */
	cs_store_unlock(s);
	free(s->anchor_path), free(s->log_dir);
	pthread_cond_destroy(&s->fold_cv);
	pthread_cond_destroy(&s->direct_cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
	c->store = NULL;
}

int cs_store_error(cs_store *s)
{
	return cs_syncer_error(&s->syncer);
}

uint64_t cs_store_gen(const cs_store *s)
{
	return atomic_load(&((cs_store *)s)->gen);
}

int cs_store_applied(dcast_consumer *c, const cs_version *v)
{
	cs_store_lock(c->store);
	c->store->deltas_since_fold += !v->direct; /* a record to fold (not an anchor in its own file) */
	cs_store_unlock(c->store);
	return cs_anchor_new_applied(c, v);
}

void cs_store_stats(cs_store *s, dcast_consumer_stats *st)
{
	cs_store_lock(s);
	st->log_write_bytes = s->log_write_bytes;
	st->log_write_ns = s->log_write_ns;
	st->direct_write_bytes = s->direct_write_bytes;
	st->folds = s->folds;
	st->folds_from_tensors = s->folds_live;
	st->folding = s->fold_running;
	cs_store_unlock(s);
}

/* ---- the fold thread ---- */

/* A fold from the disk (fold.c): planned under `held` (the consumer's
 * `lock`), run without it (an apply() meanwhile does not wait), finished
 * under it. */
static int fold_from_disk(dcast_consumer *c, cs_fold_job *j, pthread_mutex_t *held)
{
	int err = cs_fold_plan(c, j);

	if (err || j->mode != CS_FOLD_DISK)
		return err;
	pthread_mutex_unlock(held);
	err = cs_fold_run(j, &c->store->stop);
	cs_store_handed_lock(held);
	return err ? err : cs_fold_finish(c, j);
}

int cs_store_fold_now(dcast_consumer *c)
{
	cs_fold_job j = {0};
	int err = cs_fold_resume(c); /* a fold stopped halfway (at close: by the stop) finished first */

	if (!err)
		err = cs_fold_plan(c, &j);
	j.here = 1;
	if (!err && j.mode == CS_FOLD_DISK && !(err = cs_fold_run(&j, NULL)))
		err = cs_fold_finish(c, &j);
	if (err)
		DCAST_LOG_W("consumer %s: fold from the disk: %s; folding from the tensors instead", c->model,
			    dcast_last_error());
	if (err || j.mode == CS_FOLD_LIVE)
		err = cs_ckpt_fold(c);
	cs_fold_job_free(&j);
	return err;
}

/* The seal of an anchor written straight to its file (anchor_new.c), then
 * the fold the policy asked for, if it still wants one.  A fold from the
 * disk that failed while the files stayed as planned is done again from
 * the live tensors, which hold the applied version, checked. */
static int policy_fold(dcast_consumer *c, cs_fold_job *j, pthread_mutex_t *held)
{
	int err = cs_anchor_new_seal(c, held); /* an anchor written straight to its file, first */

	if (err || !cs_fold_wanted(c))
		return err;
	err = fold_from_disk(c, j, held);
	if (j->gen != cs_store_gen(c->store) || atomic_load(&c->store->stop))
		return 0; /* done (its rename moved the generation), or moot: the files moved on, or closing */
	if (!err && j->mode != CS_FOLD_LIVE)
		return 0; /* nothing to fold */
	if (err)
		DCAST_LOG_W("consumer %s: fold from the disk: %s; folding from the tensors instead", c->model,
			    dcast_last_error());
	return cs_ckpt_fold(c);
}

static void *fold_main(void *arg)
{
	dcast_consumer *c = arg;
	cs_fold_job j = {0};
	pthread_mutex_t *held;
	int err;

	cs_store_lock(c->store);
	held = c->store->fold_lock;
	cs_store_unlock(c->store);
	cs_store_handed_lock(held);
	if ((err = policy_fold(c, &j, held)))
		c->store->sink->failed(c, err);
	cs_fold_job_free(&j);
	cs_store_lock(c->store);
	c->store->fold_running = 0;
	pthread_cond_broadcast(&c->store->fold_cv);
	cs_store_unlock(c->store);
	pthread_mutex_unlock(held);
	return NULL;
}

/* Join the fold thread once it is done; 1 while it runs.  `mu` held. */
static int folding(cs_store *s)
{
	DCAST_DEBUG_ASSERT(cs_store_held(s));
	if (s->fold_joinable && !s->fold_running) { /* done: it needs no lock to end */
		pthread_join(s->fold_thread, NULL);
		s->fold_joinable = 0;
	}
	return s->fold_joinable;
}

int cs_store_folding(cs_store *s)
{
	int running;

	cs_store_lock(s);
	running = folding(s);
	cs_store_unlock(s);
	return running;
}

int cs_store_fold_start(dcast_consumer *c, pthread_mutex_t *held)
{
	struct cs_store *s = c->store;
	int started = 0;

	cs_store_lock(s);
	if (folding(s) || atomic_load(&s->stop)) {
		cs_store_unlock(s);
		return 0;
	}
	s->fold_lock = held;
	started = pthread_create(&s->fold_thread, NULL, fold_main, c) == 0;
	if (started)
		pthread_setname_np(s->fold_thread, "dcast-fold");
	s->fold_running = s->fold_joinable = started;
	cs_store_unlock(s);
	return started ? 0 : cs_ckpt_fold(c);
}

void cs_store_fold_wait(cs_store *s, pthread_mutex_t *held)
{
	while (cs_store_folding(s)) { /* one done is joined: it has let go of `held` */
		pthread_mutex_unlock(held); /* the fold thread's until it ends */
		cs_store_lock(s);
		while (s->fold_running)
			cs_store_wait(s, &s->fold_cv);
		cs_store_unlock(s);
		cs_store_handed_lock(held);
	}
}

void cs_store_fold_stop(cs_store *s)
{
	int joinable;

	if (!s)
		return;
	atomic_store(&s->stop, 1);
	cs_store_lock(s);
	cs_ckpt_direct_wake(s); /* a fold thread in cs_ckpt_await_direct sees the stop */
	joinable = s->fold_joinable;
	s->fold_joinable = 0;
	cs_store_unlock(s);
	if (joinable) /* it takes `mu` to end: joined without it */
		pthread_join(s->fold_thread, NULL);
}
