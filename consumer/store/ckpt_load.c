/* Reading the local checkpoint back: load at open (anchor file, then every
 * whole record file in version order, cutting a torn or corrupt tail),
 * and restore after a failed apply that could not undo in memory.  Each
 * record file is replayed into the sink the consumer gave at open
 * (store.h): its messages take the same steps as the wire's, and the
 * consumer applies the version.  Records: common/dcast_reclog.h and
 * ckpt.c; the anchor file: anchor.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "store_impl.h"
#include "dcast_common.h"
#include "dcast_reclog.h"

/* Replaying one version's record file. */
struct replay_file {
	dcast_consumer *c;
	const cs_store_sink *sink;
	cs_version *v;
	uint32_t records;
	int manifest;
};

#define WHY(...) (snprintf(why, why_cap, __VA_ARGS__), -1)

/* A CHUNK or COMMIT of an anchor's file follows its MANIFEST record; a
 * delta's has none. */
static int manifest_first(const struct replay_file *f, uint32_t anchor)
{
	return (int)anchor == f->manifest ? 0 : dcast_fail(DCAST_ECORRUPT, "%s without a MANIFEST "
		"record first", anchor ? "an anchor" : "a delta");
}

static int replay_chunk(struct replay_file *f, uint64_t off, const dcast_rec *r, const dcast_chunk *h)
{
	int err = manifest_first(f, h->anchor);

	return err ? err : f->sink->chunk(f->c, f->v, h, r->payload_sum, off + DCAST_REC_PREFIX + r->hdr_len);
}

static int replay_commit(struct replay_file *f, dcast_commit *m)
{
	int err = manifest_first(f, m->anchor);

	if (!err && !(err = f->sink->commit(f->c, f->v, m)))
		DCAST_ASSERT(f->v->state == CS_V_READY);
	return err;
}

/* One record's message (of the record's kind and version: dcast_rec_msg),
 * through the version's steps; 1 when it closes the version (COMMIT). */
static int replay_msg(struct replay_file *f, uint64_t off, const dcast_rec *r, dcast_msg *m)
{
	if (r->kind == DCAST_REC_MANIFEST) {
		if (f->records != 2)
			return dcast_fail(DCAST_ECORRUPT, "MANIFEST record not second");
		f->manifest = 1;
		return f->sink->manifest(f->c, &m->u.manifest);
	}
	if (r->version != f->v->version)
		return dcast_fail(DCAST_ECORRUPT, "a record of version %" PRIu64, r->version);
	if (r->kind == DCAST_REC_CHUNK)
		return replay_chunk(f, off, r, &m->u.chunk);
	return replay_commit(f, &m->u.commit) ? -1 : 1;
}

/* A record of a version's file (dcast_rec_fn): FILE (the model's name,
 * compared at open: check_owner), MANIFEST for an anchor, CHUNKs, one
 * COMMIT. */
static int on_record(void *ctx, uint64_t off, const dcast_rec *r, const uint8_t *hdr,
		     const uint8_t *payload, char *why, size_t why_cap)
{
	struct replay_file *f = ctx;
	dcast_msg m;
	int rc;

	(void)payload; /* read when applied, checked against r->payload_sum then */
	if (++f->records == 1)
		return r->kind == DCAST_REC_FILE ? 0 : WHY("no FILE record first");
	if (r->kind == DCAST_REC_FILE || f->v->state == CS_V_READY)
		return WHY("record of kind %u at offset %" PRIu64 " out of place", r->kind, off);
	if (dcast_rec_msg(r, hdr, &m))
		return WHY("record at offset %" PRIu64 ": %s", off, dcast_last_error());
	rc = replay_msg(f, off, r, &m);
	dcast_msg_free(&m);
	return rc < 0 ? WHY("record at offset %" PRIu64 ": %s", off, dcast_last_error()) : rc;
}

/* Open and index the record file of `version` into *v (READY on success):
 * the whole file must be one version, closed by its COMMIT. */
static int parse_file(dcast_consumer *c, uint64_t version, cs_version *v)
{
	struct replay_file f = {c, c->store->sink, v, 0, 0};
	dcast_rec_reader rd = {.max_kind = DCAST_REC_COMMIT};
	dcast_rec_scan_out out;
	char path[4096];
	struct stat st;
	int err;

	cs_version_init(v, version);
	cs_ckpt_version_path(c, version, path, sizeof(path));
	v->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (v->fd < 0 || fstat(v->fd, &st) != 0)
		return dcast_fail(DCAST_EIO, "%s: open: %s", path, strerror(errno));
	v->file_bytes = rd.size = (uint64_t)st.st_size;
	rd.fd = v->fd;
	err = dcast_rec_scan(&rd, 0, on_record, &f, &out);
	dcast_rec_reader_free(&rd);
	if (err)
		return dcast_fail(err, "%s: %s", path, out.why);
	if (out.bad_off != rd.size)
		return dcast_fail(DCAST_ECORRUPT, "%s: %s", path, out.why);
	if (v->state != CS_V_READY || out.good_end != rd.size)
		return dcast_fail(DCAST_ETRUNCATED, "%s: no commit record (version incomplete)", path);
	return 0;
}

/* Bytes of the record files left in the log: what a fold would take in. */
static uint64_t log_bytes(dcast_consumer *c)
{
	uint64_t *vers = malloc(CS_MAX_LOG_FILES * sizeof(*vers)), total = 0;
	uint32_t n = 0;
	char path[4096];
	struct stat st;

	if (vers && cs_ckpt_list(c, vers, CS_MAX_LOG_FILES, &n) == 0)
		for (uint32_t i = 0; i < n; i++) {
			cs_ckpt_version_path(c, vers[i], path, sizeof(path));
			total += stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
		}
	free(vers);
	return total;
}

/* A record file replayed at load: one more to fold (an anchor's: a fold
 * due at once). */
static void replayed(cs_store *s, int anchor)
{
	cs_store_lock(s);
	s->deltas_since_fold = anchor ? 1000000 : s->deltas_since_fold + 1;
	cs_store_unlock(s);
}

/* Apply the record files after `have` up to `until` (NONE: all).  With
 * cut (at load), a version that fails is cut off with all after it, the
 * tensors first brought back to `have` if it tore them; without (a
 * restore), any failure fails the replay. */
static int replay(dcast_consumer *c, uint64_t have, uint64_t until, int cut)
{
	uint64_t *vers = malloc(CS_MAX_LOG_FILES * sizeof(*vers));
	uint32_t n = 0;
	int err = vers ? cs_ckpt_list(c, vers, CS_MAX_LOG_FILES, &n) : dcast_fail(DCAST_ENOMEM, "log list");

	for (uint32_t i = 0; !err && i < n; i++) {
		cs_version v;
		if (vers[i] <= have && have != DCAST_VERSION_NONE) {
			if (cut)
				cs_ckpt_remove(c, vers[i]);
			continue;
		}
		if (vers[i] > until && until != DCAST_VERSION_NONE)
			break;
		err = parse_file(c, vers[i], &v);
		if (!err && !v.anchor && v.base_version != have)
			err = dcast_fail(DCAST_EGAP, "record file of version %" PRIu64 ": base %" PRIu64
					 " but checkpoint is at %" PRIu64, vers[i], v.base_version, have);
		if (!err)
			err = c->store->sink->apply(c, &v, cut); /* at load, torn: back to `have`, then cut */
		if (!err) {
			have = vers[i];
			if (cut)
				replayed(c->store, v.anchor);
		}
		cs_version_free(&v);
		if (err && cut && dcast_consumer_version(c) != have) { /* recovery forgot it all */
			have = DCAST_VERSION_NONE;
			err = 0;
			break;
		}
		if (err && cut) {
			DCAST_LOG_W("consumer %s: checkpoint cut back to version %" PRIu64 ": %s",
				    c->model, have, dcast_last_error());
			for (uint32_t j = i; j < n; j++)
				cs_ckpt_remove(c, vers[j]);
			err = 0;
			break;
		}
	}
	free(vers);
	if (!err)
		c->store->sink->holds(c, have);
	return err;
}

/* The model a record file's FILE record names, into name (empty when its
 * first record is not an intact FILE record: the replay cuts it). */
static void rec_file_model(const dcast_consumer *c, uint64_t version, char *name)
{
	dcast_rec_reader rd = {.max_kind = DCAST_REC_COMMIT};
	char path[4096], why[128];
	struct stat st;
	dcast_rec r;

	name[0] = '\0';
	cs_ckpt_version_path(c, version, path, sizeof(path));
	if ((rd.fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return;
	if (fstat(rd.fd, &st) == 0 && (rd.size = (uint64_t)st.st_size) &&
	    dcast_rec_read(&rd, 0, 0, &r, why, sizeof(why)) == 0)
		(void)dcast_rec_file_name(&r, rd.buf, name);
	close(rd.fd);
	dcast_rec_reader_free(&rd);
}

/* Every record file's FILE record names c->model (the anchor file's
 * metadata is checked by cs_anchor_load): a directory reused for another
 * model (same tensors or not) is neither served nor deleted, the open
 * fails.  Damage is left to the replay. */
static int check_owner(dcast_consumer *c)
{
	uint64_t *vers = malloc(CS_MAX_LOG_FILES * sizeof(*vers));
	char name[DCAST_MAX_NAME + 1];
	uint32_t n = 0;
	int err = vers ? 0 : dcast_fail(DCAST_ENOMEM, "log list");

	if (!err && cs_ckpt_list(c, vers, CS_MAX_LOG_FILES, &n) == 0)
		for (uint32_t i = 0; !err && i < n; i++) {
			rec_file_model(c, vers[i], name);
			if (name[0] && strcmp(name, c->model))
				err = cs_ckpt_foreign(c, "model.dlog, its record files' FILE record", name);
		}
	free(vers);
	return err;
}

/* What a fold leaves when the process dies in it (fold.c, anchor.c), once
 * the anchor file is whole (a fold from the disk stopped halfway was
 * finished first: cs_fold_resume). */
static void drop_fold_leftovers(const dcast_consumer *c)
{
	char p[4200];

	cs_fold_leftovers_drop(c);
	snprintf(p, sizeof(p), "%s.tmp", c->store->anchor_path);
	unlink(p);
	cs_anchor_new_path(c, 0, p, sizeof(p)); /* an anchor not applied: fetched again */
	unlink(p);
}

static int is_dir(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* DIR/model.dlog that is not a directory (a plain file in its place) is
 * damage like any: the checkpoint is dropped, and the drop makes the log
 * a directory again (cs_ckpt_discard).  Checked after the anchor files,
 * so that another model's are refused before anything is removed. */
static int log_dir_check(const dcast_consumer *c)
{
	return is_dir(c->store->log_dir) ? 0 : dcast_fail(DCAST_ECORRUPT, "%s is not a directory", c->store->log_dir);
}

/* The record log an empty directory again, in place of what is there. */
static void log_dir_make(const dcast_consumer *c)
{
	if (is_dir(c->store->log_dir))
		return;
	if ((unlink(c->store->log_dir) && errno != ENOENT) || mkdir(c->store->log_dir, 0755))
		DCAST_LOG_E("consumer %s: %s is not a directory and cannot be made one (%s): no version "
			    "can be written", c->model, c->store->log_dir, strerror(errno));
	else
		DCAST_LOG_W("consumer %s: %s was not a directory: removed, made again", c->model, c->store->log_dir);
}

static int load(dcast_consumer *c)
{
	uint64_t have = DCAST_VERSION_NONE, logged;
	int err;

	if ((err = cs_anchor_new_adopt(c)) || (err = cs_fold_resume(c)))
		return err;
	if (access(c->store->anchor_path, F_OK) == 0 && (err = cs_anchor_load(c, &have)))
		return err;
	if ((err = log_dir_check(c)) || (err = check_owner(c)))
		return err;
	drop_fold_leftovers(c);
	cs_store_lock(c->store);
	c->store->anchor_file_version = have;
	cs_store_unlock(c->store);
	c->store->sink->holds(c, have);
	err = replay(c, have, DCAST_VERSION_NONE, 1);
	logged = log_bytes(c);
	cs_store_lock(c->store);
	c->store->log_since_fold = logged;
	cs_store_unlock(c->store);
	if (!err && cs_fold_wanted(c))
		err = cs_store_fold_now(c);
	return err;
}

/* A tensor table read from files that gave no version (a dropped anchor
 * file: one renamed tensor in its header) would make every MANIFEST of the
 * model differ from it: it goes, and the broker's MANIFEST sets it. */
int cs_ckpt_load(dcast_consumer *c)
{
	int err = load(c);

	if (err || dcast_consumer_version(c) == DCAST_VERSION_NONE)
		cs_tensors_free(c);
	return err;
}

int cs_ckpt_restore(dcast_consumer *c)
{
	uint64_t target = dcast_consumer_version(c), have = DCAST_VERSION_NONE;
	int err = 0;

	if (target == DCAST_VERSION_NONE)
		return 0;
	if ((err = cs_anchor_new_seal(c, NULL))) /* an anchor applied and not sealed: sealed first */
		return err;
	if ((err = cs_fold_resume(c))) /* a fold stopped halfway: the anchor file whole first */
		return err;
	c->store->sink->holds(c, DCAST_VERSION_NONE); /* not valid while they are rebuilt */
	cs_store_lock(c->store);
	have = c->store->anchor_file_version;
	cs_store_unlock(c->store);
	if (have != DCAST_VERSION_NONE && (err = cs_anchor_load(c, &have)))
		return err;
	err = replay(c, have, target, 0);
	if (!err && dcast_consumer_version(c) != target)
		err = dcast_fail(DCAST_ECORRUPT, "restore reached version %" PRIu64 ", not %" PRIu64,
				 dcast_consumer_version(c), target);
	return err;
}

void cs_ckpt_discard(dcast_consumer *c)
{
	uint64_t *vers = malloc(CS_MAX_LOG_FILES * sizeof(*vers));
	uint32_t n = 0;

	DCAST_LOG_W("consumer %s: local checkpoint in %s removed with the state it held", c->model,
		    c->dir);
	unlink(c->store->anchor_path);
	cs_anchor_new_drop(c);
	drop_fold_leftovers(c);
	cs_store_lock(c->store);
	c->store->anchor_file_version = DCAST_VERSION_NONE;
	c->store->deltas_since_fold = 0;
	c->store->gen++; /* a fold running from the disk is not renamed over this */
	cs_store_unlock(c->store);
	log_dir_make(c);
	if (vers && cs_ckpt_list(c, vers, CS_MAX_LOG_FILES, &n) == 0)
		for (uint32_t i = 0; i < n; i++)
			cs_ckpt_remove(c, vers[i]);
	free(vers);
}
