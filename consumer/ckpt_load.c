/* Reading the local checkpoint back: load at open (anchor file, then every
 * whole record file in version order, cutting a torn or corrupt tail),
 * and restore after a failed apply that could not undo in memory.  Record
 * layout: consumer_impl.h; the anchor file: anchor.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"

static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	size_t got = 0;

	for (int guard = 0; got < len && guard < 1000000; guard++) {
		ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

/* Read a small body (manifest, digests) into a new buffer and check it. */
static int read_body(int fd, const rec_hdr *h, uint64_t off, void **out, const char *path)
{
	void *b = malloc(h->body_len ? h->body_len : 1);

	if (!b)
		return dcast_fail(DCAST_ENOMEM, "%s: record body of %" PRIu64 " bytes", path, h->body_len);
	if (pread_full(fd, b, h->body_len, off) || dcast_checksum(b, h->body_len) != h->body_checksum) {
		free(b);
		return dcast_fail(DCAST_ECORRUPT, "%s: record at %" PRIu64 ": body torn or corrupt", path, off);
	}
	*out = b;
	return 0;
}

static int on_manifest(dcast_consumer *c, int fd, const rec_hdr *h, uint64_t off, const char *path)
{
	void *b;
	dcast_msg m;
	int err = read_body(fd, h, off, &b, path);

	if (err)
		return err;
	err = dcast_msg_decode(b, h->body_len, &m);
	free(b);
	if (err) {
		char why[512];
		snprintf(why, sizeof(why), "%s", dcast_last_error());
		return dcast_fail(DCAST_ECORRUPT, "%s: manifest record: %s", path, why);
	}
	if (m.type != DCAST_MSG_MANIFEST)
		err = dcast_fail(DCAST_ECORRUPT, "%s: manifest record holds %s", path, dcast_msg_type_name((int)m.type));
	else
		err = cs_tensors_from_manifest(c, &m.u.manifest);
	dcast_msg_free(&m);
	return err;
}

static int on_chunk(dcast_consumer *c, cs_version *v, const rec_hdr *h, uint64_t off, const char *path)
{
	dcast_chunk k = {0};
	cs_chunk s = {0};

	k.version = h->version;
	k.base_version = h->base_version;
	k.anchor = h->anchor;
	k.part = h->part;
	k.seq = h->seq_or_chunks;
	k.tensor = h->tensor_or_ndigests;
	k.start = h->start_or_bytes;
	k.count = h->count;
	k.elem_size = h->elem_size;
	k.encoding = h->encoding;
	k.changed = h->changed;
	k.payload_bytes = h->body_len;
	if (h->version != v->version || h->anchor != (uint32_t)v->anchor ||
	    h->base_version != v->base_version)
		return dcast_fail(DCAST_ECORRUPT, "%s: chunk record at %" PRIu64 " is not of version %"
				  PRIu64, path, off, v->version);
	if (cs_check_chunk(c, &k)) {
		char why[512];
		snprintf(why, sizeof(why), "%s", dcast_last_error());
		return dcast_fail(DCAST_ECORRUPT, "%s: chunk record at %" PRIu64 ": %s", path, off, why);
	}
	if (cs_version_seen(v, k.part, k.seq))
		return 0;
	s.part = k.part, s.seq = k.seq, s.tensor = k.tensor, s.start = k.start;
	s.info = (dcast_chunk_info){k.encoding, k.elem_size, k.count, k.changed, k.payload_bytes};
	s.checksum = h->body_checksum;
	s.file_off = off;
	return cs_version_add(v, &s);
}

static int on_commit(cs_version *v, int fd, const rec_hdr *h, uint64_t off, const char *path)
{
	rec_digest *d;
	dcast_commit *m = &v->commit;
	int err;

	if (h->seq_or_chunks != v->n_chunks || h->start_or_bytes != v->bytes ||
	    h->body_len != (uint64_t)h->tensor_or_ndigests * sizeof(rec_digest))
		return dcast_fail(DCAST_ECORRUPT, "%s: commit record: %u chunks / %" PRIu64
				  " bytes, file holds %u / %" PRIu64, path, h->seq_or_chunks,
				  h->start_or_bytes, v->n_chunks, v->bytes);
	if ((err = read_body(fd, h, off, (void **)&d, path)))
		return err;
	m->digests = calloc(h->tensor_or_ndigests ? h->tensor_or_ndigests : 1, sizeof(*m->digests));
	if (!m->digests) {
		free(d);
		return dcast_fail(DCAST_ENOMEM, "%s: digests", path);
	}
	m->n_digests = h->tensor_or_ndigests;
	for (uint32_t i = 0; i < m->n_digests; i++)
		m->digests[i] = (dcast_range_digest){d[i].tensor, d[i].start, d[i].count, d[i].digest};
	free(d);
	m->version = v->version;
	m->base_version = v->base_version;
	m->anchor = (uint32_t)v->anchor;
	m->chunks = v->n_chunks;
	m->bytes = v->bytes;
	v->state = CS_V_READY;
	return 0;
}

static int parse_records(dcast_consumer *c, cs_version *v, const char *path, uint64_t size)
{
	uint64_t off = 0;
	int err = 0;

	for (uint32_t guard = 0; off < size && guard < DCAST_MAX_CHUNKS; guard++) {
		rec_hdr h;
		if (off + sizeof(h) > size || pread_full(v->fd, &h, sizeof(h), off) ||
		    h.magic != REC_MAGIC || dcast_checksum(&h, offsetof(rec_hdr, hdr_checksum)) != h.hdr_checksum ||
		    h.body_len > size - off - sizeof(h))
			return dcast_fail(DCAST_ECORRUPT, "%s: torn or corrupt record at offset %" PRIu64, path, off);
		if (v->state == CS_V_READY)
			return dcast_fail(DCAST_ECORRUPT, "%s: record after the commit record", path);
		if (off == 0) {
			v->anchor = (int)h.anchor;
			v->base_version = h.base_version;
		}
		off += sizeof(h);
		if (h.type == REC_MANIFEST && off == sizeof(h))
			err = c->n_tensors ? 0 : on_manifest(c, v->fd, &h, off, path);
		else if (h.type == REC_CHUNK)
			err = on_chunk(c, v, &h, off, path);
		else if (h.type == REC_COMMIT)
			err = on_commit(v, v->fd, &h, off, path);
		else
			err = dcast_fail(DCAST_ECORRUPT, "%s: unknown record type %u", path, h.type);
		if (err)
			return err;
		off += h.body_len;
	}
	if (v->state != CS_V_READY)
		return dcast_fail(DCAST_ETRUNCATED, "%s: no commit record (version incomplete)", path);
	return 0;
}

/* Open and index the record file of `version` into *v (READY on success). */
static int parse_file(dcast_consumer *c, uint64_t version, cs_version *v)
{
	char path[4096];
	struct stat st;

	cs_version_init(v, version);
	cs_ckpt_version_path(c, version, path, sizeof(path));
	v->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (v->fd < 0 || fstat(v->fd, &st) != 0)
		return dcast_fail(DCAST_EIO, "%s: open: %s", path, strerror(errno));
	v->file_bytes = (uint64_t)st.st_size;
	return parse_records(c, v, path, v->file_bytes);
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

/* Replay whole record files after `have` up to `until`; cut from the first
 * one that is not whole or does not follow. */
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
		int torn = 0;
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
		if (!err && (err = cs_apply_version(c, &v, c->opts.verify_digests, &torn)) && torn && cut)
			err = cs_ckpt_recover(c, vers[i], err); /* at load: back to `have`, then cut */
		if (!err) {
			have = vers[i];
			cs_set_applied(c, have);
			if (cut)
				c->deltas_since_fold = v.anchor ? 1000000 : c->deltas_since_fold + 1;
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
		cs_set_applied(c, have);
	return err;
}

int cs_ckpt_load(dcast_consumer *c)
{
	uint64_t have = DCAST_VERSION_NONE;
	int err;

	if (access(c->anchor_path, F_OK) == 0) {
		err = cs_anchor_load(c, &have);
		if (err)
			return err;
	}
	c->anchor_file_version = have;
	cs_set_applied(c, have);
	err = replay(c, have, DCAST_VERSION_NONE, 1);
	c->log_since_fold = log_bytes(c);
	if (!err && cs_fold_wanted(c))
		err = cs_ckpt_fold(c);
	return err;
}

int cs_ckpt_restore(dcast_consumer *c)
{
	uint64_t target = dcast_consumer_version(c), have = DCAST_VERSION_NONE;
	int err = 0;

	if (target == DCAST_VERSION_NONE)
		return 0;
	cs_set_applied(c, DCAST_VERSION_NONE); /* not valid while they are rebuilt */
	if (c->anchor_file_version != DCAST_VERSION_NONE && (err = cs_anchor_load(c, &have)))
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

	DCAST_LOG_W("consumer %s: local checkpoint in %s removed: it could not rebuild the tensors", c->model,
		    c->dir);
	unlink(c->anchor_path);
	c->anchor_file_version = DCAST_VERSION_NONE;
	c->deltas_since_fold = 0;
	if (vers && cs_ckpt_list(c, vers, CS_MAX_LOG_FILES, &n) == 0)
		for (uint32_t i = 0; i < n; i++)
			cs_ckpt_remove(c, vers[i]);
	free(vers);
}

void cs_forget_state(dcast_consumer *c)
{
	cs_set_applied(c, DCAST_VERSION_NONE);
	cs_dcache_clear(&c->dcache);
	c->fold_due = 0;
	cs_ckpt_discard(c);
}

int cs_ckpt_recover(dcast_consumer *c, uint64_t version, int err)
{
	uint64_t prev = dcast_consumer_version(c);
	char why[512];

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	DCAST_LOG_I("consumer %s: old values of version %" PRIu64 " not kept in memory; restoring version %"
		    PRIu64 " from the local checkpoint", c->model, version, prev);
	if (!cs_ckpt_restore(c))
		return dcast_fail(err, "%s (version %" PRIu64 " refused; tensors kept at the previous version)",
				  why, version);
	DCAST_LOG_E("consumer %s: restore from the local checkpoint failed: %s", c->model, dcast_last_error());
	cs_forget_state(c);
	DCAST_LOG_E("consumer %s: version %" PRIu64 " refused and version %" PRIu64 " could not be brought back; "
		    "tensors hold no valid version until an anchor arrives", c->model, version, prev);
	return dcast_fail(err, "%s (version %" PRIu64 " refused; version %" PRIu64 " could not be restored "
			  "either: the tensors hold no valid version (version() is NONE) until the broker's "
			  "anchor is applied)", why, version, prev);
}
