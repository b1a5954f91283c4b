/* The run identity of the state a consumer holds (docs/protocol.md,
 * WELCOME.run), kept in DIR/run.  A WELCOME naming another run means the
 * local state belongs to an earlier training run (a reused directory, a
 * broker restarted afresh, a model name used again): it is dropped, with a
 * log line saying why, and the consumer joins again for an anchor, so that
 * state from another run is never served as current. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"

static void run_path(const dcast_consumer *c, char *out, size_t cap)
{
	snprintf(out, cap, "%s/run", c->dir);
}

void cs_run_load(dcast_consumer *c)
{
	char path[4096];
	FILE *f;

	run_path(c, path, sizeof(path));
	c->run = 0;
	if (!(f = fopen(path, "r")))
		return;
	if (fscanf(f, "%16" SCNx64, &c->run) != 1)
		c->run = 0;
	fclose(f);
}

static void run_save(dcast_consumer *c, uint64_t run)
{
	char path[4096], tmp[4200];
	FILE *f;

	run_path(c, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	c->run = run;
	if (!(f = fopen(tmp, "w"))) {
		DCAST_LOG_W("consumer %s: %s: %s", c->model, tmp, strerror(errno));
		return;
	}
	fprintf(f, "%016" PRIx64 "\n", run);
	if (fflush(f) || fsync(fileno(f)) || fclose(f) || rename(tmp, path))
		DCAST_LOG_W("consumer %s: run id not kept in %s: %s", c->model, path, strerror(errno));
}

int cs_run_check(dcast_consumer *c, uint64_t run)
{
	int other = run && c->run && c->run != run && dcast_consumer_version(c) != DCAST_VERSION_NONE;

	if (!run)
		return 0; /* a broker that names no run: nothing to compare */
	if (other) {
		DCAST_LOG_W("consumer %s: the local state (version %" PRIu64 ") belongs to run %016" PRIx64
			    ", the broker serves run %016" PRIx64 ": dropped; joining again for an anchor",
			    c->model, dcast_consumer_version(c), c->run, run);
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
