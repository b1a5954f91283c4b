/* The run identity of the state a consumer holds (docs/protocol.md,
 * WELCOME.run), kept in DIR/run.  A WELCOME naming another run means the
 * local state belongs to an earlier training run (a reused directory, a
 * broker restarted afresh, a model name used again): it is dropped, with a
 * log line saying why, and the consumer joins again for an anchor, so that
 * state from another run is never served as current. */
#include <inttypes.h>
#include <stdio.h>
#include "consumer_impl.h"
#include "dcast_common.h"
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
	if ((rc = dcast_runfile_load(path, &c->run)) && rc != DCAST_ENOTFOUND)
		DCAST_LOG_W("consumer %s: run id lost (%s): local state of an unknown run, dropped at the "
			    "broker's WELCOME", c->model, dcast_last_error());
}

static void run_save(dcast_consumer *c, uint64_t run)
{
	char path[4096];

	run_path(c, path, sizeof(path));
	c->run = run;
	if (dcast_runfile_save(path, run))
		DCAST_LOG_W("consumer %s: run id not kept: %s", c->model, dcast_last_error());
}

int cs_run_check(dcast_consumer *c, uint64_t run)
{
	/* State of no known run (its run file lost) counts as another run's. */
	int other = run && c->run != run && dcast_consumer_version(c) != DCAST_VERSION_NONE;

	if (!run)
		return 0; /* a broker that names no run: nothing to compare */
	if (other) {
		char was[32] = "no known run";

		if (c->run)
			snprintf(was, sizeof(was), "run %016" PRIx64, c->run);
		DCAST_LOG_W("consumer %s: the local state (version %" PRIu64 ") belongs to %s, the broker "
			    "serves run %016" PRIx64 ": dropped; joining again for an anchor", c->model,
			    dcast_consumer_version(c), was, run);
		cs_forget_state(c);
		cs_drop_all(c);
	}
	if (c->run != run)
		run_save(c, run);
	if (!other)
		atomic_store(&c->run_confirmed, run);
	return other;
}

uint64_t dcast_consumer_run(const dcast_consumer *c)
{
	return c ? atomic_load(&((dcast_consumer *)c)->run_confirmed) : 0;
}
