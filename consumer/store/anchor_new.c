/* An anchor received in place, written once: straight to
 * DIR/model.safetensors.new at the offsets model.safetensors will have,
 * instead of a record file that a fold later rewrote into that file (the
 * anchor's bytes written twice and read twice more).  The file is made,
 * each chunk's range of the tensor written there behind (as its record
 * would be: ckpt.c, the write-behind queue) and its header written at the
 * COMMIT, with the file digest of the tensors (they hold the anchor whole
 * then; O(model) hashing, as an anchor's digest check is), beside the
 * anchor file's other writers (anchor.c).  Here, what follows: once
 * apply() has checked the anchor (every element covered, the COMMIT
 * digests), it is renamed to .applied and the fold thread seals it off
 * the stream's path: fdatasync without `lock`, then, unless the
 * checkpoint changed meanwhile (c->store->gen), the rename over
 * model.safetensors and the folder's fsync; the chunks' writes, which run
 * behind the COMMIT, are waited for first.  Until the rename the version
 * is not durable: a restart removes the file and fetches the anchor
 * again.  The file is never read back: the load checks its file digest,
 * as for any model.safetensors, and drops a damaged one.  Models with
 * tiled tensors (wire order in memory, natural order in the file) keep
 * the record file. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "store_impl.h"
#include "dcast_common.h"
#include "dcast_reclog.h" /* dcast_fsync_dir */
#include "deltacast/safetensors.h"

/* Checked: renamed to .applied (what a restart may adopt), its seal due. */
int cs_anchor_new_applied(dcast_consumer *c, const cs_version *v)
{
	char from[4200], to[4200];

	if (!v->direct)
		return 0;
	cs_anchor_new_path(c, 0, from, sizeof(from));
	cs_anchor_new_path(c, 1, to, sizeof(to));
	if (rename(from, to) != 0) { /* not durable: the policy's next fold takes the tensors */
		DCAST_LOG_W("consumer %s: anchor %" PRIu64 ": rename %s: %s", c->model, v->version, from,
			    strerror(errno));
		cs_anchor_new_drop(c);
		return 0;
	}
	cs_store_lock(c->store);
	c->store->new_version = v->version;
	cs_store_unlock(c->store);
	return 1; /* the seal, on the fold thread */
}

/* fdatasync the file, the run file first; with `release`, without it,
 * in the background. */
static int sync_file(dcast_consumer *c, const char *path, pthread_mutex_t *release)
{
	int fd = open(path, O_RDWR | O_CLOEXEC), err = 0, saved = 0;

	if (fd < 0)
		return dcast_fail(DCAST_EIO, "%s: open: %s", path, strerror(errno));
	if (release) {
		pthread_mutex_unlock(release);
		cs_fold_priority(1, &saved);
	}
	cs_fault_fold(c); /* the test seam: the seal held here */
	err = c->store->sink->durable(c);
	if (!err && fdatasync(fd) != 0)
		err = dcast_fail(DCAST_EIO, "%s: fdatasync: %s", path, strerror(errno));
	if (release) {
		cs_fold_priority(0, &saved);
		cs_store_handed_lock(release);
	}
	close(fd);
	return err;
}

/* Every write of anchor v's file done (they run behind its COMMIT:
 * ckpt.c), and none failed; with `release` (the fold thread), waited for
 * without it, so that the session and apply() go on meanwhile (those
 * writes take as long as the disk does).  -1: moot, as the files moved
 * on since gen meanwhile, or closing first (the seal at close waits
 * itself).  Errors: DCAST_EIO. */
static int written(dcast_consumer *c, uint64_t v, uint64_t gen, pthread_mutex_t *release)
{
	char why[sizeof(c->store->new_write_why)];
	int failed, stop = 0;

	if (release) {
		pthread_mutex_unlock(release);
		stop = cs_ckpt_await_direct(c);
		cs_store_handed_lock(release);
	}
	if (stop || gen != atomic_load(&c->store->gen))
		return -1; /* another anchor's file may be the store's by now */
	cs_anchor_new_release(c);
	cs_store_lock(c->store);
	failed = c->store->new_write_lost;
	memcpy(why, c->store->new_write_why, sizeof(why));
	cs_store_unlock(c->store);
	return failed ? dcast_fail(DCAST_EIO, "anchor %" PRIu64 ": a write of its file failed: %s", v,
				   why[0] ? why : "(before its COMMIT)") : 0;
}

/* The synced file at `path`, of version v, renamed over model.safetensors
 * unless the files moved on since gen (then -1: moot).  Errors: DCAST_EIO. */
static int seal_rename(dcast_consumer *c, const char *path, uint64_t v, uint64_t gen)
{
	int err = 0;

	cs_store_lock(c->store);
	if (gen != atomic_load(&c->store->gen)) {
		cs_store_unlock(c->store);
		return -1; /* whatever changed the files dropped this one */
	}
	DCAST_ASSERT(c->store->new_version == v);
	if (rename(path, c->store->anchor_path) != 0)
		err = dcast_fail(DCAST_EIO, "%s: rename: %s", path, strerror(errno));
	if (!err)
		c->store->new_version = DCAST_VERSION_NONE; /* renamed: nothing left to drop */
	if (!err && dcast_consumer_version(c) == v)
		c->store->deltas_since_fold = 0; /* the file holds the applied version */
	cs_store_unlock(c->store);
	return err;
}

int cs_anchor_new_seal(dcast_consumer *c, pthread_mutex_t *release)
{
	uint64_t v, gen;
	char path[4200];
	int err;

	cs_store_lock(c->store);
	v = c->store->new_version;
	gen = atomic_load(&c->store->gen);
	cs_store_unlock(c->store);
	if (v == DCAST_VERSION_NONE)
		return 0;
	cs_anchor_new_path(c, 1, path, sizeof(path));
	if ((err = written(c, v, gen, release)) < 0)
		return 0; /* moot, or closing: the seal at close does it */
	if (!err)
		err = sync_file(c, path, release);
	if (!err && (err = seal_rename(c, path, v, gen)) < 0)
		return 0; /* moot */
	if (!err)
		return cs_fold_renamed(c, v);
	if (gen != atomic_load(&c->store->gen))
		return 0; /* moot: whatever changed the files dropped this one */
	DCAST_LOG_W("consumer %s: sealing anchor %" PRIu64 " in %s: %s; folding from the tensors instead",
		    c->model, v, c->dir, dcast_last_error());
	cs_anchor_new_drop(c);
	return cs_ckpt_fold(c); /* they hold the anchor (applied) or newer */
}

/* The model named in the file's metadata, into name ("" when it names
 * none); -1 when the header does not parse. */
static int file_model(const char *path, char *name, size_t cap)
{
	dcast_st_file *f = NULL;
	const char *m;

	if (dcast_st_open(path, &f) != 0)
		return -1;
	m = dcast_st_metadata_get(f, "deltacast.model");
	snprintf(name, cap, "%s", m ? m : "");
	dcast_st_close(&f);
	return 0;
}

int cs_anchor_new_adopt(dcast_consumer *c)
{
	char path[4200], name[DCAST_MAX_NAME + 1];
	int err;

	cs_anchor_new_path(c, 1, path, sizeof(path));
	if (access(path, F_OK) != 0)
		return 0;
	if (file_model(path, name, sizeof(name)) < 0) { /* torn before its header was whole */
		unlink(path);
		return 0;
	}
	if (strcmp(name, c->model)) /* neither served nor deleted */
		return cs_ckpt_foreign(c, "model.safetensors.applied, metadata deltacast.model",
				       name[0] ? name : "(none)");
	if ((err = sync_file(c, path, NULL)) || rename(path, c->store->anchor_path) != 0)
		return err ? err : dcast_fail(DCAST_EIO, "%s: rename: %s", path, strerror(errno));
	DCAST_LOG_I("consumer %s: anchor applied before the last exit, not sealed then: %s is now "
		    "model.safetensors (its digest is checked as it loads)", c->model, path);
	return dcast_fsync_dir(c->dir);
}
