/* Run identity of a model's stream (docs/protocol.md, WELCOME.run): a
 * random non-zero u64 chosen when a producer creates the model, adopted
 * from the upstream broker by a relay, and kept in the data dir
 * (DATA_DIR/runs/<model name in hex>) so that a restarted broker serves the
 * same run (a restarted relay reads it back to tell whether its restored
 * log is of the run its upstream serves: relay.c).  A consumer holding
 * state of another run drops it and takes an anchor, so state from an
 * earlier run is never served as current. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include "broker.h"
#include "dcast_common.h"
#include "dcast_runfile.h"

uint64_t broker_run_new(void)
{
	uint64_t r = 0;

	while (!r)
		if (getrandom(&r, sizeof(r), 0) != sizeof(r))
			r = dcast_now_ns() ^ ((uint64_t)getpid() << 32); /* no entropy source: still unique enough */
	return r;
}

static void run_path(const struct broker *b, const char *model, char *out, size_t cap)
{
	int n = snprintf(out, cap, "%s/runs/", b->cfg.data_dir);

	for (const unsigned char *p = (const unsigned char *)model; *p && n + 3 < (int)cap; p++)
		n += snprintf(out + n, cap - (size_t)n, "%02x", *p);
}

void broker_run_save(const struct broker *b, const struct broker_model *m)
{
	char path[4096], dir[4096];

	if (!b->cfg.data_dir)
		return;
	snprintf(dir, sizeof(dir), "%s/runs", b->cfg.data_dir);
	run_path(b, m->name, path, sizeof(path));
	if (mkdir(dir, 0755) && errno != EEXIST)
		DCAST_LOG_W("model %s: run id not kept in %s: %s", m->name, dir, strerror(errno));
	else if (dcast_runfile_save(path, m->run))
		DCAST_LOG_W("model %s: run id not kept: %s", m->name, dcast_last_error());
}

int broker_run_load(const struct broker *b, const struct broker_model *m, uint64_t *run)
{
	char path[4096];
	int rc;

	*run = 0;
	if (!b->cfg.data_dir)
		return dcast_fail(DCAST_ENOTFOUND, "no --data-dir");
	run_path(b, m->name, path, sizeof(path));
	if ((rc = dcast_runfile_load(path, run)) == DCAST_ENOTFOUND)
		dcast_fail(rc, "no run id in %s (data dir from an older broker?)", path);
	return rc;
}

void broker_run_restore(const struct broker *b, struct broker_model *m)
{
	uint64_t run;
	int rc;

	if (!(rc = broker_run_load(b, m, &run))) {
		m->run = run;
		DCAST_LOG_I("model %s: restored from %s, run %016" PRIx64, m->name, b->cfg.data_dir, run);
		return;
	}
	if (rc == DCAST_ENOTFOUND)
		DCAST_LOG_W("model %s: %s: a new run %016" PRIx64 "; consumers holding this model's "
			    "state take an anchor", m->name, dcast_last_error(), m->run);
	else
		DCAST_LOG_E("model %s: run id lost (%s): a new run %016" PRIx64 "; consumers holding this "
			    "model's state take an anchor", m->name, dcast_last_error(), m->run);
	broker_run_save(b, m);
}

void broker_run_forget(const struct broker *b, const struct broker_model *m)
{
	char path[4096];

	if (!b->cfg.data_dir)
		return;
	run_path(b, m->name, path, sizeof(path));
	if (unlink(path) && errno != ENOENT)
		DCAST_LOG_W("model %s: run file %s not deleted: %s", m->name, path, strerror(errno));
}
