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
	pthread_cond_init(&s->fold_cv, NULL);
	s->sink = sink;
	s->anchor_file_version = DCAST_VERSION_NONE;
	s->new_version = DCAST_VERSION_NONE;
	s->anchor_path = join(c->dir, "model.safetensors");
	s->log_dir = join(c->dir, "model.dlog");
	if (!s->anchor_path || !s->log_dir)
		return dcast_fail(DCAST_ENOMEM, "paths");
	if (mkdir(s->log_dir, 0755) && errno != EEXIST)
		return dcast_fail(DCAST_EIO, "%s: mkdir: %s", s->log_dir, strerror(errno));
	if ((err = cs_syncer_open(&s->syncer)))
		return err;
	return cs_ckpt_wb_open(c);
}

void cs_store_close(dcast_consumer *c, int fold_owed)
{
	struct cs_store *s = c->store;

	if (!s)
		return;
	cs_ckpt_settle(c); /* chunk records written behind */
	if (cs_anchor_new_seal(c, NULL)) /* an anchor applied: durable */
		DCAST_LOG_W("consumer %s: anchor file at close: %s", c->model, dcast_last_error());
	if (fold_owed && cs_fold_wanted(c) && cs_store_fold_now(c))
		DCAST_LOG_W("consumer %s: fold at close: %s", c->model, dcast_last_error());
	cs_syncer_close(&s->syncer); /* what was committed is on the disk */
	cs_ckpt_wb_close(c);
	free(s->new_offs); /* an anchor in place still streaming in: its .new goes at the next open */
	free(s->anchor_path), free(s->log_dir);
	pthread_cond_destroy(&s->fold_cv);
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
	if (!v->direct)
		c->store->deltas_since_fold++; /* a record to fold (not an anchor in its own file) */
	return cs_anchor_new_applied(c, v);
}

void cs_store_stats(const cs_store *s, dcast_consumer_stats *st)
{
	st->log_write_bytes = s->log_write_bytes;
	st->log_write_ns = s->log_write_ns;
	st->folds = s->folds;
	st->folds_from_tensors = s->folds_live;
	st->folding = s->fold_running;
}

/* ---- the fold thread ---- */

/* A fold from the disk (fold.c): planned under `lock`, run without it (an
 * apply() meanwhile does not wait), finished under it. */
static int fold_from_disk(dcast_consumer *c, cs_fold_job *j)
{
	int err = cs_fold_plan(c, j);

	if (err || j->mode != CS_FOLD_DISK)
		return err;
	pthread_mutex_unlock(c->store->fold_lock);
	err = cs_fold_run(j, &c->store->stop);
	pthread_mutex_lock(c->store->fold_lock);
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
static int policy_fold(dcast_consumer *c, cs_fold_job *j)
{
	int err = cs_anchor_new_seal(c, c->store->fold_lock); /* an anchor written straight to its file, first */

	if (err || !cs_fold_wanted(c))
		return err;
	err = fold_from_disk(c, j);
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
	int err;

	pthread_mutex_lock(c->store->fold_lock);
	if ((err = policy_fold(c, &j)))
		c->store->sink->failed(c, err);
	cs_fold_job_free(&j);
	c->store->fold_running = 0;
	pthread_cond_broadcast(&c->store->fold_cv);
	pthread_mutex_unlock(c->store->fold_lock);
	return NULL;
}

int cs_store_folding(cs_store *s)
{
	if (s->fold_joinable && !s->fold_running) { /* done: it has let go of `lock` */
		pthread_join(s->fold_thread, NULL);
		s->fold_joinable = 0;
	}
	return s->fold_joinable;
}

int cs_store_fold_start(dcast_consumer *c, pthread_mutex_t *held)
{
	struct cs_store *s = c->store;

	if (cs_store_folding(s) || atomic_load(&s->stop))
		return 0;
	s->fold_running = 1;
	s->fold_lock = held;
	if (pthread_create(&s->fold_thread, NULL, fold_main, c) == 0) {
		s->fold_joinable = 1;
		return 0;
	}
	s->fold_running = 0;
	return cs_ckpt_fold(c);
}

void cs_store_fold_wait(cs_store *s, pthread_mutex_t *held)
{
	while (s->fold_running)
		pthread_cond_wait(&s->fold_cv, held);
}

void cs_store_fold_stop(cs_store *s)
{
	if (!s)
		return;
	atomic_store(&s->stop, 1);
	if (s->fold_joinable)
		pthread_join(s->fold_thread, NULL);
	s->fold_joinable = 0;
}
