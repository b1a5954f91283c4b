/* The run identity of the state a consumer holds (docs/protocol.md,
 * WELCOME.run), kept in DIR/run.  A WELCOME naming another run means the
 * local state belongs to an earlier training run (a reused directory, a
 * broker restarted afresh, a model name used again): it is dropped, with a
 * log line saying why, and the consumer joins again for an anchor, so that
 * state from another run is never served as current.  Staged, READY and
 * half-received versions are the held run's too: they go before anything
 * of the new run is taken, whether or not a version was applied. */
#include <inttypes.h>
#include <stdio.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "dcast_reclog.h" /* dcast_fsync_dir */
#include "dcast_runfile.h"

static void run_path(const dcast_consumer *c, char *out, size_t cap)
{
	snprintf(out, cap, "%s/run", c->dir);
}

void cs_run_load(dcast_consumer *c)
{
	char path[4096];
	int rc;

	run_path(c, path, sizeof(path));
	rc = dcast_runfile_load(path, &c->run);
	atomic_store(&c->run_unsynced, !rc); /* a crash may have come before its sync */
	if (rc && rc != DCAST_ENOTFOUND)
		DCAST_LOG_W("consumer %s: run id lost (%s): local state of an unknown run, dropped at the "
			    "broker's WELCOME", c->model, dcast_last_error());
}

static void run_save(dcast_consumer *c, uint64_t run)
{
	char path[4096];

	run_path(c, path, sizeof(path));
	c->run = run;
	pthread_mutex_lock(&c->run_mu);
	if (dcast_runfile_write(path, run))
		DCAST_LOG_W("consumer %s: run id not kept: %s", c->model, dcast_last_error());
	else
		atomic_store(&c->run_unsynced, 1);
	pthread_mutex_unlock(&c->run_mu);
}

int cs_run_durable(dcast_consumer *c)
{
	char path[4096];
	int err = 0;

	if (!atomic_load(&c->run_unsynced))
		return 0;
	run_path(c, path, sizeof(path));
	pthread_mutex_lock(&c->run_mu);
	if (atomic_load(&c->run_unsynced) && !(err = dcast_runfile_sync(path)) && !(err = dcast_fsync_dir(c->dir)))
		atomic_store(&c->run_unsynced, 0);
	pthread_mutex_unlock(&c->run_mu);
	return err;
}

static void run_name(uint64_t run, char *out, size_t cap)
{
	if (run)
		snprintf(out, cap, "run %016" PRIx64, run);
	else
		snprintf(out, cap, "no known run");
}

/* Staged, READY and half-received versions came from the stream of the run
 * held; none of them may be applied as the new run's (an engine that holds
 * a READY version for its pause point would apply the old weights). */
static int drop_staged(dcast_consumer *c, const char *was, uint64_t run)
{
	if (!c->n_staged)
		return 0;
	DCAST_LOG_W("consumer %s: versions %" PRIu64 "-%" PRIu64 " staged from %s, the broker serves run "
		    "%016" PRIx64 ": dropped before anything of it is taken", c->model, c->staged[0].version,
		    c->staged[c->n_staged - 1].version, was, run);
	cs_drop_all(c);
	return 1;
}

int cs_run_check(dcast_consumer *c, uint64_t run)
{
	/* State of no known run (its run file lost) counts as another run's. */
	int held = dcast_consumer_version(c) != DCAST_VERSION_NONE, dropped;
	char was[32];

	if (!run)
		return 0; /* a broker that names no run: nothing to compare */
	if (c->run == run) {
		atomic_store(&c->run_confirmed, run);
		return 0;
	}
	run_name(c->run, was, sizeof(was));
	dropped = drop_staged(c, was, run);
	if (held) {
		DCAST_LOG_W("consumer %s: the local state (version %" PRIu64 ") belongs to %s, the broker "
			    "serves run %016" PRIx64 ": dropped; joining again for an anchor", c->model,
			    dcast_consumer_version(c), was, run);
		cs_forget_state(c);
	}
	DCAST_ASSERT(c->n_staged == 0 && dcast_consumer_version(c) == DCAST_VERSION_NONE);
	run_save(c, run);
	if (held || dropped)
		return 1; /* our HELLO named a version of the other run: ask again */
	atomic_store(&c->run_confirmed, run);
	return 0;
}

uint64_t dcast_consumer_run(const dcast_consumer *c)
{
	return c ? atomic_load(&((dcast_consumer *)c)->run_confirmed) : 0;
}
