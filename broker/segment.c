/* Durable log segments (segment.h): append records through dcast_io, fsync
 * at commit, verify and cut torn tails at load.  Record prefixes live in a
 * fixed pool until their writes are reaped; headers and payloads are
 * written straight from the caller's frames. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "dcast_common.h"
#include "dcast_fit.h"
#include "dcast_io.h"
#include "dcast_reclog.h"
#include "deltacast/codec.h"
#include "deltacast/schema.h"
#include "segment.h"

#define SEG_IO_DEPTH 64u
#define SEG_PREFIX_POOL 4096u
#define SEG_MAX_FILES 1024u  /* segment files looked at per model folder */
#define SEG_ROOT_MAX 1024
#define SEG_DIR_MAX (SEG_ROOT_MAX + 300)
#define SEG_PATH_MAX (SEG_DIR_MAX + 40)

struct seg_file {
	int fd, handle;               /* handle: dcast_io file, -1 when closed */
	uint64_t anchor;              /* the version it starts with */
	uint64_t end, commit_end;     /* write offset, end of the last commit */
	char path[SEG_PATH_MAX];
};

struct seg_model {
	char name[DCAST_MAX_NAME + 1];
	char dir[SEG_DIR_MAX];
	struct seg_file cur, prev;    /* prev: open while a new anchor is uncommitted */
	int has_prev;
};

struct broker_seg_store {
	char root[SEG_ROOT_MAX];
	dcast_io *io;
	struct seg_model *models[BROKER_SEG_MAX_MODELS];
	unsigned n_models;
	uint8_t (*prefix)[DCAST_REC_PREFIX]; /* [SEG_PREFIX_POOL] */
	unsigned n_prefix;
	int write_err;                /* first failed write since the last commit */
	char write_detail[512];
	dcast_rec_reader rd;          /* load: reads one file at a time */
	uint64_t replay_off;          /* load: the record being visited */
	uint8_t *copy_buf;            /* copy_plain: broker_seg_put_chunk from a file
					 when copy_file_range cannot, quarantine */
};

/* ---- store and models ----------------------------------------------- */

/* fsync a folder; a failure is logged (the files in it are synced). */
static void dir_synced(const char *dir)
{
	if (dcast_fsync_dir(dir))
		DCAST_LOG_W("segment: %s", dcast_last_error());
}

int broker_seg_open(broker_seg_store **out, const char *data_dir)
{
	broker_seg_store *s;
	int rc;

	*out = NULL;
	if (!data_dir || !*data_dir || strlen(data_dir) >= SEG_ROOT_MAX)
		return dcast_fail(DCAST_EINVAL, "segment: --data-dir missing or too long");
	rc = dcast_mkdir(data_dir);
	if (rc)
		return rc;
	s = calloc(1, sizeof(*s));
	if (!s || !(s->prefix = calloc(SEG_PREFIX_POOL, DCAST_REC_PREFIX))) {
		free(s);
		return dcast_fail(DCAST_ENOMEM, "segment: store allocation");
	}
	snprintf(s->root, sizeof(s->root), "%s", data_dir);
	rc = dcast_io_open(&s->io, SEG_IO_DEPTH);
	if (rc) {
		free(s->prefix);
		free(s);
		return rc;
	}
	*out = s;
	return 0;
}

static void file_close(broker_seg_store *s, struct seg_file *f)
{
	if (f->handle >= 0)
		dcast_io_file_remove(s->io, f->handle);
	if (f->fd >= 0)
		close(f->fd);
	f->fd = f->handle = -1;
}

void broker_seg_close(broker_seg_store **sp)
{
	broker_seg_store *s = sp ? *sp : NULL;

	if (!s)
		return;
	dcast_io_drain(s->io);
	for (unsigned i = 0; i < s->n_models; i++) {
		file_close(s, &s->models[i]->cur);
		if (s->models[i]->has_prev)
			file_close(s, &s->models[i]->prev);
		free(s->models[i]);
	}
	dcast_io_close(&s->io);
	free(s->prefix);
	dcast_rec_reader_free(&s->rd);
	free(s->copy_buf);
	free(s);
	*sp = NULL;
}

int broker_seg_uses_uring(const broker_seg_store *s)
{
	return dcast_io_uses_uring(s->io);
}

/* Folder name of a model: its safe characters (at most 48), '-', and a
 * hash of the whole name, so any UTF-8 name maps to one short path. */
static void model_dirname(const char *name, char *out, size_t cap)
{
	char safe[49];
	size_t n = 0;

	for (const char *p = name; *p && n < sizeof(safe) - 1; p++)
		if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		    (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-')
			safe[n++] = *p;
	safe[n] = '\0';
	snprintf(out, cap, "%s-%016llx", safe,
		 (unsigned long long)dcast_checksum(name, strlen(name)));
}

static struct seg_model *model_find(broker_seg_store *s, const char *name)
{
	for (unsigned i = 0; i < s->n_models; i++)
		if (!strcmp(s->models[i]->name, name))
			return s->models[i];
	return NULL;
}

static struct seg_model *model_get(broker_seg_store *s, const char *name)
{
	struct seg_model *m = model_find(s, name);
	char dn[128];

	if (m)
		return m;
	if (s->n_models == BROKER_SEG_MAX_MODELS) {
		dcast_fail(DCAST_EBUSY, "segment: %u models already", BROKER_SEG_MAX_MODELS);
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		dcast_fail(DCAST_ENOMEM, "segment: model allocation");
		return NULL;
	}
	snprintf(m->name, sizeof(m->name), "%s", name);
	model_dirname(name, dn, sizeof(dn));
	snprintf(m->dir, sizeof(m->dir), "%s/%s", s->root, dn);
	m->cur.fd = m->cur.handle = m->prev.fd = m->prev.handle = -1;
	s->models[s->n_models++] = m;
	return m;
}

static void seg_path(const struct seg_model *m, uint64_t anchor, char *out, size_t cap)
{
	snprintf(out, cap, "%s/seg-%020llu.log", m->dir, (unsigned long long)anchor);
}

/* ---- queued writes -------------------------------------------------- */

static void note_write_errors(broker_seg_store *s, const dcast_io_done *d, int n)
{
	for (int i = 0; i < n; i++)
		if (d[i].err && !s->write_err) {
			s->write_err = d[i].err;
			snprintf(s->write_detail, sizeof(s->write_detail), "%s", dcast_last_error());
		}
}

/* Reap every outstanding write, keeping the first error. */
static void reap_all(broker_seg_store *s)
{
	int rc = dcast_io_drain(s->io);

	if (rc && !s->write_err) {
		s->write_err = rc;
		snprintf(s->write_detail, sizeof(s->write_detail), "%s", dcast_last_error());
	}
	s->n_prefix = 0;
}

static int queue_write(broker_seg_store *s, struct seg_file *f, const void *buf, size_t len)
{
	dcast_io_done done[16];
	int rc;

	if (len == 0)
		return 0;
	for (unsigned tries = 0; tries < SEG_IO_DEPTH + 1; tries++) {
		rc = dcast_io_write(s->io, f->handle, buf, len, f->end, DCAST_IO_NO_BUF, 0);
		if (rc != DCAST_EBUSY)
			break;
		int n = dcast_io_wait(s->io, 1, done, 16);

		if (n < 0)
			return -n;
		note_write_errors(s, done, n);
	}
	if (rc == 0)
		f->end += len;
	return rc;
}

/* Queue one record at the end of f; payload_sum is dcast_checksum() of its
 * payload (the caller's, computed when the chunk arrived).  A NULL payload
 * of payload_len bytes: the caller writes them next, at f->end. */
static int put_record(broker_seg_store *s, struct seg_file *f, int kind, uint64_t version,
		      const void *hdr, size_t hdr_len, const void *payload, size_t payload_len,
		      uint64_t payload_sum)
{
	uint8_t *p;
	int rc;

	if (hdr_len > DCAST_MAX_HEADER_BYTES || payload_len > DCAST_MAX_CHUNK_BYTES)
		return dcast_fail(DCAST_EINVAL, "segment: record of %zu+%zu bytes over limits",
				  hdr_len, payload_len);
	if (s->n_prefix == SEG_PREFIX_POOL)
		reap_all(s);
	p = s->prefix[s->n_prefix++];
	dcast_rec_encode(p, &(dcast_rec){(uint16_t)kind, (uint32_t)hdr_len, (uint32_t)payload_len,
					 version, payload_sum}, hdr);
	rc = queue_write(s, f, p, DCAST_REC_PREFIX);
	if (!rc)
		rc = queue_write(s, f, hdr, hdr_len);
	if (!rc && payload) /* NULL: the caller copies the bytes (copy_payload) */
		rc = queue_write(s, f, payload, payload_len);
	return rc;
}

/* A record without payload. */
static int put_header(broker_seg_store *s, struct seg_file *f, int kind, uint64_t version,
		      const void *hdr, size_t hdr_len)
{
	return put_record(s, f, kind, version, hdr, hdr_len, NULL, 0, dcast_checksum(NULL, 0));
}

/* ---- writing versions ----------------------------------------------- */

static int file_create(broker_seg_store *s, struct seg_model *m, uint64_t anchor)
{
	struct seg_file *f = &m->cur;
	int rc = dcast_mkdir(m->dir);

	if (rc)
		return rc;
	seg_path(m, anchor, f->path, sizeof(f->path));
	f->fd = open(f->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (f->fd < 0)
		return dcast_fail(DCAST_EIO, "segment: create '%s': %s", f->path, strerror(errno));
	f->handle = dcast_io_file_add(s->io, f->fd, f->path);
	if (f->handle < 0) {
		close(f->fd);
		f->fd = -1;
		return -f->handle;
	}
	f->anchor = anchor;
	f->end = f->commit_end = 0;
	dir_synced(m->dir);
	dir_synced(s->root);
	return 0;
}

int broker_seg_begin_anchor(broker_seg_store *s, const char *model, uint64_t version,
			    const void *manifest_hdr, size_t manifest_len)
{
	struct seg_model *m = model_get(s, model);
	int rc;

	if (!m)
		return dcast_fail(DCAST_EBUSY, "segment: %s", dcast_last_error());
	if (m->cur.fd >= 0 && m->cur.end != m->cur.commit_end)
		return dcast_fail(DCAST_ESTATE, "segment: model %s has an uncommitted version",
				  model);
	if (m->cur.fd >= 0 && m->cur.anchor == version)
		return dcast_fail(DCAST_ESTATE, "segment: model %s already has a segment at %llu",
				  model, (unsigned long long)version);
	if (m->has_prev)
		file_close(s, &m->prev);
	m->prev = m->cur;
	m->has_prev = m->cur.fd >= 0;
	rc = file_create(s, m, version);
	if (!rc)
		rc = put_header(s, &m->cur, BROKER_SEG_FILE, version, model, strlen(model));
	if (!rc)
		rc = put_header(s, &m->cur, BROKER_SEG_MANIFEST, version, manifest_hdr, manifest_len);
	if (!rc)
		rc = dcast_io_drain(s->io); /* the caller may free manifest_hdr on return */
	if (rc)
		broker_seg_abort(s, model);
	return rc;
}

int broker_seg_append_chunk(broker_seg_store *s, const char *model, uint64_t version,
			    const void *hdr, size_t hdr_len, const void *payload,
			    size_t payload_len, uint64_t payload_sum)
{
	struct broker_seg_payload p = {.mem = payload, .len = payload_len, .sum = payload_sum};
	uint64_t at;

	return broker_seg_put_chunk(s, model, version, hdr, hdr_len, &p, &at);
}

#define SEG_COPY_BYTES (1u << 20)

/* Copy len bytes at off of fd (named `from` in errors) to out at `at`
 * (named `to`) through the store's buffer: where copy_file_range is
 * refused (another file system, an old kernel), and for quarantine. */
static int copy_plain(broker_seg_store *s, int fd, uint64_t off, const char *from, int out,
		      uint64_t at, const char *to, uint64_t len)
{
	int rc = 0;

	if (!s->copy_buf && !(s->copy_buf = malloc(SEG_COPY_BYTES)))
		return dcast_fail(DCAST_ENOMEM, "segment: copy buffer");
	for (uint64_t done = 0, n; !rc && done < len; done += n) {
		n = len - done < SEG_COPY_BYTES ? len - done : SEG_COPY_BYTES;
		rc = dcast_pread_full(fd, s->copy_buf, (size_t)n, off + done, from);
		if (!rc)
			rc = dcast_pwrite_full(out, s->copy_buf, (size_t)n, at + done, to);
	}
	return rc;
}

/* Copy len bytes at off of fd to the end of f (in the kernel where it
 * can), outside dcast_io's queue: the seal's fsync covers them too. */
static int copy_payload(broker_seg_store *s, struct seg_file *f, int fd, uint64_t off,
			uint64_t len)
{
	loff_t in = (loff_t)off, out = (loff_t)f->end;
	uint64_t left = len;
	int rc = 0;

	while (left) {
		ssize_t n = copy_file_range(fd, &in, f->fd, &out, left, 0);

		if (n <= 0) {
			rc = copy_plain(s, fd, (uint64_t)in, "segment: a payload's file", f->fd,
					(uint64_t)out, f->path, left);
			break;
		}
		left -= (uint64_t)n;
	}
	if (!rc)
		f->end += len;
	return rc;
}

int broker_seg_put_chunk(broker_seg_store *s, const char *model, uint64_t version,
			 const void *hdr, size_t hdr_len, const struct broker_seg_payload *p,
			 uint64_t *at)
{
	struct seg_model *m = model_find(s, model);
	int rc;

	if (!m || m->cur.fd < 0)
		return dcast_fail(DCAST_ESTATE, "segment: model %s has no segment: the first "
				  "version must be an anchor", model);
	*at = m->cur.end + DCAST_REC_PREFIX + hdr_len;
	if (p->mem || !p->len)
		return put_record(s, &m->cur, BROKER_SEG_CHUNK, version, hdr, hdr_len, p->mem,
				  p->len, p->sum);
	rc = put_record(s, &m->cur, BROKER_SEG_CHUNK, version, hdr, hdr_len, NULL, p->len, p->sum);
	return rc ? rc : copy_payload(s, &m->cur, p->fd, p->off, p->len);
}

int broker_seg_reader(broker_seg_store *s, const char *model)
{
	struct seg_model *m = model_find(s, model);
	int fd;

	if (!m || m->cur.fd < 0)
		return -dcast_fail(DCAST_ESTATE, "segment: model %s has no segment", model);
	if ((fd = fcntl(m->cur.fd, F_DUPFD_CLOEXEC, 0)) < 0)
		return -dcast_fail(DCAST_EIO, "segment: read handle of '%s': %s", m->cur.path,
				   strerror(errno));
	return fd;
}

void broker_seg_replay_at(const broker_seg_store *s, int *fd, uint64_t *payload_off)
{
	*fd = s->rd.fd;
	*payload_off = s->replay_off;
}

/* Anchor committed: the previous segment is superseded. */
static void drop_prev(broker_seg_store *s, struct seg_model *m)
{
	if (!m->has_prev)
		return;
	file_close(s, &m->prev);
	if (unlink(m->prev.path))
		DCAST_LOG_W("segment: unlink '%s': %s", m->prev.path, strerror(errno));
	else
		DCAST_LOG_I("segment: '%s' superseded by anchor %llu: deleted", m->prev.path,
			    (unsigned long long)m->cur.anchor);
	m->has_prev = 0;
	dir_synced(m->dir);
}

/* Write the record that closes a unit (a COMMIT, a POISON mark), wait for
 * every queued write and fsync: on 0 the unit is durable; on error what
 * the unit wrote is cut off again. */
static int seal(broker_seg_store *s, struct seg_model *m, int kind, uint64_t version,
		const void *hdr, size_t hdr_len)
{
	int rc = put_header(s, &m->cur, kind, version, hdr, hdr_len);

	if (!rc)
		rc = dcast_io_sync(s->io, m->cur.handle, 1);
	s->n_prefix = 0;
	if (!rc && s->write_err) {
		rc = s->write_err;
		dcast_fail(rc, "%s", s->write_detail);
	}
	if (rc) {
		char why[512];

		snprintf(why, sizeof(why), "%s", dcast_last_error());
		broker_seg_abort(s, m->name);
		return dcast_fail(rc, "segment: %s of version %llu of %s not durable: %s",
				  kind == BROKER_SEG_POISON ? "poison mark" : "version",
				  (unsigned long long)version, m->name, why);
	}
	m->cur.commit_end = m->cur.end;
	return 0;
}

int broker_seg_commit(broker_seg_store *s, const char *model, uint64_t version,
		      const void *commit_hdr, size_t commit_len)
{
	struct seg_model *m = model_find(s, model);
	int rc;

	if (!m || m->cur.fd < 0)
		return dcast_fail(DCAST_ESTATE, "segment: model %s has no segment", model);
	if (!(rc = seal(s, m, BROKER_SEG_COMMIT, version, commit_hdr, commit_len)))
		drop_prev(s, m);
	return rc;
}

int broker_seg_poison(broker_seg_store *s, const char *model, uint64_t version, const void *hdr,
		      size_t hdr_len)
{
	struct seg_model *m = model_find(s, model);

	if (!m || m->cur.fd < 0 || m->cur.end != m->cur.commit_end)
		return dcast_fail(DCAST_ESTATE, "segment: model %s has %s", model,
				  m && m->cur.fd >= 0 ? "a version open" : "no segment");
	return seal(s, m, BROKER_SEG_POISON, version, hdr, hdr_len);
}

int broker_seg_abort(broker_seg_store *s, const char *model)
{
	struct seg_model *m = model_find(s, model);
	struct seg_file *f;

	if (!m || m->cur.fd < 0)
		return 0;
	reap_all(s);
	s->write_err = 0;
	f = &m->cur;
	if (f->commit_end == 0) {
		file_close(s, f);
		unlink(f->path);
		m->cur = m->prev;
		m->has_prev = 0;
		if (m->cur.fd < 0)
			m->cur.handle = -1;
		return 0;
	}
	if (ftruncate(f->fd, (off_t)f->commit_end))
		return dcast_fail(DCAST_EIO, "segment: truncate '%s' to %llu: %s", f->path,
				  (unsigned long long)f->commit_end, strerror(errno));
	f->end = f->commit_end;
	return 0;
}

static unsigned list_segments(const char *dir, uint64_t *out, unsigned cap);

/* Unlink every segment file of the folder, then the folder. */
static int dir_remove(const char *dir)
{
	uint64_t anchors[SEG_MAX_FILES];
	unsigned n = list_segments(dir, anchors, SEG_MAX_FILES);
	char path[SEG_PATH_MAX];
	int rc = 0;

	for (unsigned i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/seg-%020llu.log", dir, (unsigned long long)anchors[i]);
		if (unlink(path) && errno != ENOENT)
			rc = dcast_fail(DCAST_EIO, "segment: unlink '%s': %s", path, strerror(errno));
	}
	if (!rc && rmdir(dir) && errno != ENOENT)
		rc = dcast_fail(DCAST_EIO, "segment: rmdir '%s': %s", dir, strerror(errno));
	return rc;
}

int broker_seg_drop(broker_seg_store *s, const char *model)
{
	struct seg_model *m = model_find(s, model);
	char dn[128], dir[SEG_DIR_MAX];
	int rc;

	if (m) {
		reap_all(s);
		s->write_err = 0;
		file_close(s, &m->cur);
		if (m->has_prev)
			file_close(s, &m->prev);
		for (unsigned i = 0; i < s->n_models; i++)
			if (s->models[i] == m)
				s->models[i] = s->models[--s->n_models];
		free(m);
	}
	model_dirname(model, dn, sizeof(dn));
	snprintf(dir, sizeof(dir), "%s/%s", s->root, dn);
	rc = dir_remove(dir);
	dir_synced(s->root);
	return rc;
}

uint64_t broker_seg_bytes(const broker_seg_store *s, const char *model)
{
	for (unsigned i = 0; i < s->n_models; i++)
		if (!strcmp(s->models[i]->name, model))
			return s->models[i]->cur.fd >= 0 ? s->models[i]->cur.commit_end : 0;
	return 0;
}

/* ---- loading -------------------------------------------------------- */

/* What verifying a segment found. */
struct seg_scan {
	dcast_rec_scan_out out;
	uint64_t size, last_version;
	char model[DCAST_MAX_NAME + 1];
	/* from out.good_end on (set_aside): versions of readable records, and
	 * the newest whose COMMIT record verifies; DCAST_VERSION_NONE if none */
	uint64_t lost_lo, lost_hi, whole_lost;
	/* the version being read */
	uint64_t version, chunks, bytes;
	int kind_last;
	dcast_msg manifest; /* the segment's MANIFEST, once read (type 0 before) */
	uint64_t manifest_off, manifest_end;
	/* past the break (survey_tail): where reading resumed after the last
	 * record that did not verify, and [tail_off, tail_end) the whole
	 * versions from there to the end (tail_scan; tail_end 0: none), kept in
	 * the quarantine file q at offsets less out.good_end */
	uint64_t resume, tail_off, tail_end;
	char q[SEG_PATH_MAX + 64];
};

/* The message's version is the record's (dcast_rec_msg). */
static int chunk_fits(const dcast_rec *r, const dcast_msg *msg, const struct seg_scan *sc)
{
	return dcast_msg_check_payload(msg, r->payload_len) == 0 &&
	       (!sc->chunks || sc->version == r->version) &&
	       (!sc->out.units || r->version > sc->last_version) &&
	       dcast_chunk_verify_sum(&msg->u.chunk, r->payload_sum) == 0;
}

static int commit_fits(const dcast_rec *r, const dcast_msg *msg, const struct seg_scan *sc)
{
	const dcast_commit *c = &msg->u.commit;

	return (!sc->chunks || sc->version == r->version) &&
	       c->chunks == sc->chunks && c->bytes == sc->bytes && (sc->out.units || c->anchor) &&
	       (!sc->out.units || r->version > sc->last_version);
}

static int order_ok(int kind, int kind_last)
{
	if (kind == BROKER_SEG_FILE)
		return kind_last == 0;
	if (kind == BROKER_SEG_MANIFEST)
		return kind_last == BROKER_SEG_FILE;
	if (kind == BROKER_SEG_POISON)
		return kind_last == BROKER_SEG_COMMIT || kind_last == BROKER_SEG_POISON;
	return kind_last >= BROKER_SEG_MANIFEST;
}

/* A POISON mark: the broker's ERROR(DCAST_EPOISONED) naming a version this
 * segment committed before it.  1 (a unit of its own), or -1. */
static int poison_fits(const dcast_rec *r, const uint8_t *hdr, const struct seg_scan *sc)
{
	dcast_msg msg;
	int ok;

	if (r->payload_len || dcast_msg_decode(hdr, r->hdr_len, &msg))
		return -1;
	ok = msg.type == DCAST_MSG_ERROR && msg.u.error.code == DCAST_EPOISONED &&
	     msg.u.error.version == r->version && r->version <= sc->last_version;
	dcast_msg_free(&msg);
	return ok ? 1 : -1;
}

/* Check a record that reads back intact against its kind and its place in
 * the sequence FILE MANIFEST (CHUNK* COMMIT)* (dcast_rec_fn).  Returns 1
 * when it closes a version, 0 when fine, -1 (why set) when it does not
 * belong. */
static int check_record(void *ctx, uint64_t off, const dcast_rec *r, const uint8_t *hdr,
			const uint8_t *payload, char *why, size_t why_cap)
{
	struct seg_scan *sc = ctx;
	dcast_msg msg;
	int rc = 0;

	(void)payload; /* checked against r->payload_sum by the scan */
	if (!order_ok(r->kind, sc->kind_last))
		return snprintf(why, why_cap, "record kind %u out of order", r->kind), -1;
	sc->kind_last = r->kind;
	if (r->kind == BROKER_SEG_FILE)
		return dcast_rec_file_name(r, hdr, sc->model) ? (snprintf(why, why_cap, "bad FILE record"), -1) : 0;
	if (r->kind == BROKER_SEG_POISON && poison_fits(r, hdr, sc) < 0)
		return snprintf(why, why_cap, "POISON record of version %llu does not fit",
				(unsigned long long)r->version), -1;
	if (r->kind == BROKER_SEG_POISON)
		return 1;
	if (dcast_rec_msg(r, hdr, &msg))
		return snprintf(why, why_cap, "header: %s", dcast_last_error()), -1;
	if (r->kind == BROKER_SEG_MANIFEST) {
		dcast_msg_free(&sc->manifest);
		sc->manifest = msg; /* the chunks after it are checked against it */
		sc->manifest_off = off;
		sc->manifest_end = off + dcast_rec_bytes(r);
		return 0;
	}
	if (r->kind == BROKER_SEG_CHUNK &&
	    dcast_chunk_fits(&msg.u.chunk, dcast_manifest_descs(&sc->manifest.u.manifest))) {
		snprintf(why, why_cap, "CHUNK record of version %llu outside the segment's MANIFEST (%s)",
			 (unsigned long long)r->version, dcast_last_error());
		dcast_msg_free(&msg);
		return -1;
	}
	if (r->kind == BROKER_SEG_CHUNK)
		rc = chunk_fits(r, &msg, sc) ? 0 : -1;
	else if (r->kind == BROKER_SEG_COMMIT)
		rc = commit_fits(r, &msg, sc) ? 1 : -1;
	if (rc < 0)
		snprintf(why, why_cap, "%s record of version %llu does not fit its version",
			 dcast_msg_type_name((int)msg.type), (unsigned long long)r->version);
	dcast_msg_free(&msg);
	if (rc == 0 && r->kind == BROKER_SEG_CHUNK) {
		sc->version = r->version;
		sc->chunks++;
		sc->bytes += r->payload_len;
	}
	if (rc == 1) {
		sc->last_version = r->version;
		sc->chunks = sc->bytes = 0;
	}
	return rc;
}

/* Verify a whole segment file: sc->out.good_end is the end of the last
 * whole committed version. */
static int scan_file(broker_seg_store *s, int fd, struct seg_scan *sc)
{
	s->rd.fd = fd;
	s->rd.size = sc->size;
	s->rd.max_kind = BROKER_SEG_POISON;
	return dcast_rec_scan(&s->rd, 1, check_record, sc, &sc->out);
}

/* Replay records [off, end) of a verified file through fn. */
static int replay_file(broker_seg_store *s, int fd, const char *model, uint64_t off, uint64_t end,
		       broker_seg_visit_fn fn, void *ctx)
{
	dcast_rec r;
	char why[256];
	int rc;

	s->rd.fd = fd;
	s->rd.size = end;
	while (off < end) {
		rc = dcast_rec_read(&s->rd, off, 1, &r, why, sizeof(why));
		if (rc)
			return dcast_fail(rc, "segment: replay of %s at offset %llu: %s", model,
					  (unsigned long long)off, why);
		if (r.kind != BROKER_SEG_FILE) {
			s->replay_off = off + DCAST_REC_PREFIX + r.hdr_len;
			rc = fn(ctx, model, &r, s->rd.buf, s->rd.buf + r.hdr_len);
			if (rc)
				return rc;
		}
		off += dcast_rec_bytes(&r);
	}
	return 0;
}

/* ---- quarantine: what cannot be read is kept, never deleted ---------- */

/* Versions in the records from good_end on: readable records only (a
 * damaged record's own fields are not trusted).  A COMMIT record that
 * verifies there was whole on disk, so fsynced and maybe ACKed. */
static void note_lost(struct seg_scan *sc, const dcast_rec *r)
{
	if (r->kind == BROKER_SEG_FILE || (sc->out.units && r->version <= sc->last_version))
		return;
	if (sc->lost_lo == DCAST_VERSION_NONE || r->version < sc->lost_lo)
		sc->lost_lo = r->version;
	if (sc->lost_hi == DCAST_VERSION_NONE || r->version > sc->lost_hi)
		sc->lost_hi = r->version;
	if (r->kind == BROKER_SEG_COMMIT &&
	    (sc->whole_lost == DCAST_VERSION_NONE || r->version > sc->whole_lost))
		sc->whole_lost = r->version;
}

/* Read past the break to name what is lost: every record that verifies,
 * re-synchronising on the next magic after one that does not.  The record
 * that stopped the scan and every one that does not read are damage:
 * sc->resume is where reading resumed after the last of them. */
static void survey_tail(broker_seg_store *s, int fd, struct seg_scan *sc)
{
	uint64_t off = sc->out.good_end;
	dcast_rec r;
	char why[256];

	s->rd.fd = fd;
	s->rd.size = sc->size;
	sc->resume = sc->size;
	while (off < sc->size) {
		int rc = dcast_rec_read(&s->rd, off, 1, &r, why, sizeof(why));

		if (rc == DCAST_ENOMEM || rc == DCAST_EIO)
			return;
		if (rc == 0) {
			note_lost(sc, &r);
			off += dcast_rec_bytes(&r);
		} else {
			off = dcast_rec_next_magic(fd, off + 1, sc->size);
		}
		if (rc || off - dcast_rec_bytes(&r) == sc->out.bad_off)
			sc->resume = off;
	}
}

/* A record past the damage, checked as the scan checks it; a POISON mark
 * ends the tail (the versions it names are not replayed past it). */
static int tail_record(struct seg_scan *t, uint64_t off, const dcast_rec *r, const uint8_t *buf,
		       char *why, size_t why_cap)
{
	if (r->kind == BROKER_SEG_POISON)
		return -1; /* the tail ends there */
	return check_record(t, off, r, buf, buf + r->hdr_len, why, why_cap);
}

/* The whole versions past the damage: from sc->resume, records checked as
 * the scan checks them (check_record: deltas that fit the MANIFEST and
 * their version, above the last whole one), a partial version at the start
 * skipped, up to the first that does not fit.  They are served to
 * consumers that hold what they build on (durable.c) until an anchor
 * comes; sets sc->tail_off, tail_end. */
static void tail_scan(broker_seg_store *s, int fd, struct seg_scan *sc)
{
	struct seg_scan t = {.manifest = sc->manifest, .kind_last = BROKER_SEG_COMMIT,
			     .last_version = sc->out.units ? sc->last_version : 0};
	uint64_t off = sc->resume, start = off;
	dcast_rec r;
	char why[256];

	t.out.units = 1; /* a delta may come first; versions above last_version */
	s->rd.fd = fd;
	s->rd.size = sc->size;
	while (sc->manifest.type == DCAST_MSG_MANIFEST && off < sc->size &&
	       dcast_rec_read(&s->rd, off, 1, &r, why, sizeof(why)) == 0) {
		uint64_t had = t.chunks;
		int rc = tail_record(&t, off, &r, s->rd.buf, why, sizeof(why));

		if (rc < 0 && sc->tail_end)
			return;
		if (rc < 0 && had) { /* the rest of a damaged version: this record may
					begin the next one */
			t.chunks = t.bytes = 0;
			t.kind_last = BROKER_SEG_COMMIT;
			continue;
		}
		start = rc >= 0 && !had ? off : start;
		off += dcast_rec_bytes(&r);
		if (rc == 1 && !sc->tail_end)
			sc->tail_off = start;
		if (rc == 1)
			sc->tail_end = off;
	}
}

/* A free name in DATA_DIR/quarantine/ for bytes from `from` on of the
 * segment at path: <model folder>.<file>.from-<offset>.<UTC time>[.N]. */
static int quarantine_name(const broker_seg_store *s, const char *path, uint64_t from,
			   char *out, size_t cap)
{
	const char *file = strrchr(path, '/') + 1, *dir = file - 1;
	char stamp[32], qdir[SEG_ROOT_MAX + 16];
	struct tm tm;
	time_t now = time(NULL);
	int rc;

	while (dir > path && dir[-1] != '/')
		dir--;
	snprintf(qdir, sizeof(qdir), "%s/" BROKER_SEG_QUARANTINE, s->root);
	if ((rc = dcast_mkdir(qdir)))
		return rc;
	strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", gmtime_r(&now, &tm));
	for (unsigned i = 0; i < 1000; i++) {
		int n = snprintf(out, cap, "%s/" BROKER_SEG_QUARANTINE "/%.*s.%s.from-%llu.%s",
				 s->root, (int)(file - 1 - dir), dir, file,
				 (unsigned long long)from, stamp);

		if (i)
			snprintf(out + n, cap - (size_t)n, ".%u", i);
		if (access(out, F_OK) && errno == ENOENT)
			return 0;
	}
	return dcast_fail(DCAST_EIO, "segment: no free quarantine name for '%s'", path);
}

static void fsync_quarantine(const broker_seg_store *s)
{
	char q[SEG_ROOT_MAX + 16];

	snprintf(q, sizeof(q), "%s/" BROKER_SEG_QUARANTINE, s->root);
	dir_synced(q);
}

/* Copy bytes [from, size) of fd (the segment `path`) into the new file
 * q, fsynced. */
static int copy_tail(broker_seg_store *s, int fd, const char *path, uint64_t from, uint64_t size,
		     const char *q)
{
	int out = open(q, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	int rc;

	if (out < 0)
		return dcast_fail(DCAST_EIO, "segment: create '%s': %s", q, strerror(errno));
	rc = copy_plain(s, fd, from, path, out, 0, q, size - from);
	if (!rc && fsync(out))
		rc = dcast_fail(DCAST_EIO, "segment: fsync '%s': %s", q, strerror(errno));
	close(out);
	return rc;
}

/* Move what cannot be replayed to quarantine/: the whole file when
 * nothing in it is whole, else its tail from the end of the last whole
 * version (copied, fsynced, then the file cut back).  q: where it went. */
static int quarantine(broker_seg_store *s, const char *path, int fd, const struct seg_scan *sc,
		      char *q, size_t cap)
{
	int rc = quarantine_name(s, path, sc->out.good_end, q, cap);

	if (!rc && sc->out.good_end == 0 && rename(path, q))
		rc = dcast_fail(DCAST_EIO, "segment: move '%s' to '%s': %s", path, q, strerror(errno));
	if (!rc && sc->out.good_end)
		rc = copy_tail(s, fd, path, sc->out.good_end, sc->size, q);
	if (rc)
		return rc;
	fsync_quarantine(s);
	if (sc->out.good_end == 0) {
		if (dcast_fsync_parent(path))
			DCAST_LOG_W("segment: %s", dcast_last_error());
		return 0;
	}
	if (ftruncate(fd, (off_t)sc->out.good_end) || fsync(fd))
		return dcast_fail(DCAST_EIO, "segment: truncate '%s': %s", path, strerror(errno));
	return 0;
}

/* "versions 4..7", "version 7", or "no readable version". */
static void lost_text(const struct seg_scan *sc, char *out, size_t cap)
{
	if (sc->lost_lo == DCAST_VERSION_NONE)
		snprintf(out, cap, "no readable version");
	else if (sc->lost_lo == sc->lost_hi)
		snprintf(out, cap, "version %llu", (unsigned long long)sc->lost_lo);
	else
		snprintf(out, cap, "versions %llu..%llu", (unsigned long long)sc->lost_lo,
			 (unsigned long long)sc->lost_hi);
}

/* The one line that says what was lost, from which file, kept where. */
static void log_lost(const char *path, const struct seg_scan *sc, const char *q)
{
	char lost[64], whole[64] = "";

	lost_text(sc, lost, sizeof(lost));
	if (sc->whole_lost != DCAST_VERSION_NONE)
		snprintf(whole, sizeof(whole), "; whole on disk up to version %llu",
			 (unsigned long long)sc->whole_lost);
	if (sc->out.good_end == 0)
		DCAST_LOG_E("segment: model %s: %s lost (%s at offset %llu of '%s'%s): no whole "
			    "version before it; the file is kept in '%s'", sc->model[0] ? sc->model : "?",
			    lost, sc->out.why[0] ? sc->out.why : "empty", (unsigned long long)sc->out.bad_off, path,
			    whole, q);
	else
		DCAST_LOG_E("segment: model %s: %s lost (%s at offset %llu of '%s'%s): cut back to "
			    "offset %llu (last whole version %llu); bytes %llu..%llu kept in '%s'",
			    sc->model, lost, sc->out.why, (unsigned long long)sc->out.bad_off, path, whole,
			    (unsigned long long)sc->out.good_end, (unsigned long long)sc->last_version,
			    (unsigned long long)sc->out.good_end, (unsigned long long)sc->size, q);
}

/* Set aside what cannot be replayed.  Returns 1 when the file is gone
 * (moved whole), 0 when it stays (maybe cut back), -1 on DCAST_EIO. */
static int set_aside(broker_seg_store *s, const char *path, int fd, struct seg_scan *sc)
{
	char q[sizeof(sc->q)];

	if (sc->out.good_end == sc->size && sc->size)
		return 0;
	if (sc->size == 0) {
		DCAST_LOG_W("segment: '%s' is empty (a new segment cut short): removed", path);
		unlink(path);
		return 1;
	}
	survey_tail(s, fd, sc);
	tail_scan(s, fd, sc);
	if (quarantine(s, path, fd, sc, q, sizeof(q)))
		return -1;
	snprintf(sc->q, sizeof(sc->q), "%s", q);
	log_lost(path, sc, q);
	return sc->out.good_end == 0;
}

static int cmp_u64_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

/* Anchor versions of the seg-*.log files in dir, newest first. */
static unsigned list_segments(const char *dir, uint64_t *out, unsigned cap)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	unsigned n = 0;

	while (d && (e = readdir(d)) != NULL && n < cap) {
		unsigned long long v;
		char tail[8];

		if (sscanf(e->d_name, "seg-%20llu%7s", &v, tail) == 2 && !strcmp(tail, ".log") &&
		    strlen(e->d_name) == 28)
			out[n++] = v;
	}
	if (d)
		closedir(d);
	qsort(out, n, sizeof(*out), cmp_u64_desc);
	return n;
}

/* Open and verify one segment file; what cannot be replayed goes to
 * quarantine/ (set_aside).  On success (whole versions in it) the file
 * stays open in *f and *sc describes it.  Returns 1 if usable, 0 when
 * nothing in it was whole (the file is gone), minus an error code else: a
 * file of another segment format gives -DCAST_EPROTO_VERSION and is left
 * as it is. */
static int open_verified(broker_seg_store *s, const char *path, struct seg_file *f,
			 struct seg_scan *sc)
{
	struct stat st;
	int rc, gone;

	memset(sc, 0, sizeof(*sc));
	sc->lost_lo = sc->lost_hi = sc->whole_lost = DCAST_VERSION_NONE;
	f->fd = open(path, O_RDWR | O_CLOEXEC);
	if (f->fd < 0 || fstat(f->fd, &st))
		return dcast_fail(DCAST_EIO, "segment: open '%s': %s", path, strerror(errno)),
		       -DCAST_EIO;
	f->handle = dcast_io_file_add(s->io, f->fd, path);
	sc->size = (uint64_t)st.st_size;
	rc = f->handle < 0 ? -f->handle : scan_file(s, f->fd, sc);
	if (rc == DCAST_EPROTO_VERSION)
		dcast_fail(rc, "segment '%s': %s; left as it is (use another --data-dir, or move "
			   "the file away to drop it)", path, sc->out.why);
	gone = rc ? 0 : set_aside(s, path, f->fd, sc); /* 1: moved, -1: DCAST_EIO */
	dcast_msg_free(&sc->manifest);
	if (rc || gone) {
		file_close(s, f);
		return rc ? -rc : gone < 0 ? -DCAST_EIO : 0;
	}
	snprintf(f->path, sizeof(f->path), "%s", path);
	f->end = f->commit_end = sc->out.good_end;
	return 1;
}

/* What a model folder's segments lost, over all of them. */
struct seg_losses {
	int any;
	uint64_t whole;                   /* newest version whole on disk and lost */
	char model[DCAST_MAX_NAME + 1];   /* from a FILE record that verified */
};

static void losses_add(struct seg_losses *l, const struct seg_scan *sc)
{
	if (sc->out.good_end == sc->size)
		return;
	l->any = 1;
	if (sc->whole_lost != DCAST_VERSION_NONE &&
	    (l->whole == DCAST_VERSION_NONE || sc->whole_lost > l->whole))
		l->whole = sc->whole_lost;
	if (!l->model[0])
		snprintf(l->model, sizeof(l->model), "%s", sc->model);
}

/* After a model's replay: tell the caller what was lost (BROKER_SEG_LOST),
 * so that the model exists and refuses those version numbers again. */
static int report_losses(const struct seg_losses *l, const char *dir, int found,
			 broker_seg_visit_fn fn, void *ctx)
{
	if (!l->any)
		return 0;
	if (!l->model[0]) {
		DCAST_LOG_E("segment: '%s': no readable model name and no intact anchor; "
			    "nothing restored from it", dir);
		return 0;
	}
	if (!found)
		DCAST_LOG_E("segment: model %s: no intact anchor left: the model starts empty and "
			    "asks its producers for an anchor", l->model);
	return fn(ctx, l->model, &(dcast_rec){.kind = BROKER_SEG_LOST, .version = l->whole}, NULL, NULL);
}

/* Whole versions past the damage in the newest segment, in its quarantine
 * file q: [from, to), and the MANIFEST record when the file went there
 * whole (no intact anchor: the model needs its manifest for them). */
struct seg_tail {
	char q[SEG_PATH_MAX + 64];
	uint64_t from, to, mf_from, mf_to;
};

static void tail_keep(struct seg_tail *t, const struct seg_scan *sc)
{
	if (!sc->tail_end)
		return;
	snprintf(t->q, sizeof(t->q), "%s", sc->q);
	t->from = sc->tail_off - sc->out.good_end;
	t->to = sc->tail_end - sc->out.good_end;
	if (sc->out.good_end == 0 && sc->manifest_end) {
		t->mf_from = sc->manifest_off;
		t->mf_to = sc->manifest_end;
	}
}

/* Replay the tail from its quarantine file: a BROKER_SEG_TAIL marker,
 * the MANIFEST when kept, then the versions (each record's checksums are
 * checked again as it is read). */
static int replay_tail(broker_seg_store *s, const struct seg_tail *t, const char *model,
		       broker_seg_visit_fn fn, void *ctx)
{
	int fd = open(t->q, O_RDONLY | O_CLOEXEC), rc;

	if (fd < 0)
		return dcast_fail(DCAST_EIO, "segment: open '%s': %s", t->q, strerror(errno));
	rc = fn(ctx, model, &(dcast_rec){.kind = BROKER_SEG_TAIL}, NULL, NULL);
	if (!rc && t->mf_to)
		rc = replay_file(s, fd, model, t->mf_from, t->mf_to, fn, ctx);
	if (!rc)
		rc = replay_file(s, fd, model, t->from, t->to, fn, ctx);
	close(fd);
	return rc;
}

/* Load one model folder, newest segment first: the first one with an
 * intact anchor is replayed (up to any break) and kept, every older one is
 * superseded and deleted; a newer one without an intact anchor has gone to
 * quarantine/ on the way. */
static int load_model_dir(broker_seg_store *s, const char *dir, broker_seg_visit_fn fn,
			  void *ctx)
{
	uint64_t anchors[SEG_MAX_FILES];
	unsigned n = list_segments(dir, anchors, SEG_MAX_FILES);
	struct seg_file f = {.fd = -1, .handle = -1};
	struct seg_losses lost = {.whole = DCAST_VERSION_NONE};
	struct seg_tail tail = {0};
	struct seg_scan sc;
	struct seg_model *m = NULL;
	char path[SEG_PATH_MAX];
	uint64_t found_anchor = 0;
	int found = 0, rc = 0;

	for (unsigned i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/seg-%020llu.log", dir,
			 (unsigned long long)anchors[i]);
		if (found) {
			DCAST_LOG_I("segment: '%s' superseded by a newer anchor: deleted", path);
			unlink(path);
			continue;
		}
		rc = open_verified(s, path, &f, &sc);
		if (rc < 0)
			return -rc;
		if (i == 0)
			tail_keep(&tail, &sc);
		losses_add(&lost, &sc);
		found = rc;
		found_anchor = anchors[i];
	}
	if (!found && tail.to && lost.model[0])
		rc = replay_tail(s, &tail, lost.model, fn, ctx);
	if (!found)
		return rc ? rc : report_losses(&lost, dir, 0, fn, ctx);
	m = model_get(s, sc.model);
	if (!m || m->cur.fd >= 0) {
		file_close(s, &f);
		return m ? dcast_fail(DCAST_ECORRUPT, "segment: two folders for model %s", sc.model)
			 : DCAST_EBUSY;
	}
	f.anchor = found_anchor;
	m->cur = f;
	DCAST_LOG_I("segment: model %s: %llu version(s) up to %llu from '%s'", sc.model,
		    (unsigned long long)sc.out.units, (unsigned long long)sc.last_version, f.path);
	snprintf(lost.model, sizeof(lost.model), "%s", sc.model);
	rc = replay_file(s, f.fd, sc.model, 0, sc.out.good_end, fn, ctx);
	if (!rc && found_anchor == anchors[0] && tail.to)
		rc = replay_tail(s, &tail, sc.model, fn, ctx);
	return rc ? rc : report_losses(&lost, dir, 1, fn, ctx);
}

int broker_seg_load(broker_seg_store *s, broker_seg_visit_fn fn, void *ctx)
{
	DIR *d = opendir(s->root);
	struct dirent *e;
	char dir[SEG_DIR_MAX];
	int rc = 0;

	if (!d)
		return dcast_fail(DCAST_EIO, "segment: open '%s': %s", s->root, strerror(errno));
	while (!rc && (e = readdir(d)) != NULL) {
		struct stat st;

		if (e->d_name[0] == '.')
			continue;
		if (!strcmp(e->d_name, BROKER_SEG_QUARANTINE))
			continue;
		snprintf(dir, sizeof(dir), "%s/%s", s->root, e->d_name);
		if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
			rc = load_model_dir(s, dir, fn, ctx);
	}
	closedir(d);
	return rc;
}
