/* Background folds: DIR/model.safetensors rebuilt from the disk alone, on
 * the fold thread (session.c), without `lock` and without reading the live
 * tensors, so that an apply() that comes meanwhile does not wait for it.
 *
 * cs_fold_plan (under `lock`) takes what the fold needs: the target (the
 * applied version), the version in the anchor file, the record files up to
 * the target, the tensors' geometry, the applied version's COMMIT digests
 * (c->dcache) and the checkpoint's generation.  cs_fold_run (no lock, at
 * nice 19 and the lowest best-effort I/O level) writes
 * DIR/model.safetensors.fold: every record file after the anchor file up
 * to the target scanned and its CHUNK records indexed (headers only; each
 * delta's base the version before it); then, piece by piece in file order
 * (an eighth of the model, see "pieces" below), the old anchor file's
 * bytes copied (copy_file_range) and the indexed chunks applied group by
 * group, each group (ranges that overlap,
 * across versions) read once, patched in memory in version order and
 * written once, so that folding K versions reads and writes each byte of
 * the model once, not K times (an anchor's record covers every element;
 * a group over FOLD_WINDOW bytes goes chunk by chunk, each one's range
 * read, patched, written); the fold adds at most FOLD_WINDOW bytes (or
 * one chunk's range, when a producer's are larger) and the index (80 bytes
 * a CHUNK record) to the process's memory, and holds at most FOLD_FDS
 * record files open; each piece made durable and then punched out of the
 * old anchor file, so that the directory holds about 1.125 models, not 2;
 * then the file read back once through one bounded
 * buffer (FOLD_PIECE), every cached COMMIT digest checked against it (the
 * output is exactly the applied version, or it is not used) and its file
 * digest put in the header; fdatasync.  cs_fold_finish (under `lock`)
 * renames it over the old file unless the checkpoint changed meanwhile (a
 * discard, a fold from the tensors: c->store->gen moved), fsyncs the folder,
 * then drops the record files it covers.  A fold whose files moved on, or
 * whose consumer closes, stops at its next record file, group or piece;
 * one stopped (or killed) after its first punch is finished by
 * cs_fold_resume at the next open, or replaced by a fold from the tensors.
 *
 * Tiled tensors are in wire order in the records, the COMMIT digests and
 * the file digest, and in natural order in the file: every range goes
 * between memory (wire order) and the file through tensor_io, one pread or
 * pwrite per run (dcast_tiles), so their models fold from the disk too. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>
#include "store_impl.h"
#include "dcast_common.h"
#include "codec_shared.h" /* DCAST_DIGEST_BLOCK */
#include "dcast_reclog.h"
#include "deltacast/codec.h"
#include "deltacast/safetensors.h"

void cs_fold_job_free(cs_fold_job *j)
{
	free(j->t);
	cs_dcache_clear(&j->dig);
	free(j->vers);
	memset(j, 0, sizeof(*j));
}

/* The record files after the anchor file's version up to the target. */
static int plan_files(dcast_consumer *c, cs_fold_job *j)
{
	uint32_t n = 0;
	int err;

	if (!(j->vers = malloc(CS_MAX_LOG_FILES * sizeof(*j->vers))))
		return dcast_fail(DCAST_ENOMEM, "fold: record file list");
	if ((err = cs_ckpt_list(c, j->vers, CS_MAX_LOG_FILES, &n)))
		return err;
	for (uint32_t i = 0; i < n; i++)
		if ((j->have == DCAST_VERSION_NONE || j->vers[i] > j->have) && j->vers[i] <= j->version)
			j->vers[j->n_vers++] = j->vers[i];
	return 0;
}

/* The tensors' geometry and the applied version's digests into j. */
static int plan_tensors(dcast_consumer *c, cs_fold_job *j)
{
	j->n = c->n_tensors;
	j->t = malloc(j->n * sizeof(*j->t));
	j->dig.e = malloc((c->dcache.n ? c->dcache.n : 1) * sizeof(*j->dig.e));
	if (!j->t || !j->dig.e)
		return dcast_fail(DCAST_ENOMEM, "fold: %u tensors", j->n);
	for (uint32_t i = 0; i < j->n; i++) {
		j->t[i] = c->tensors[i]; /* geometry only: nothing here reads their memory */
		j->t[i].ptr = NULL, j->t[i].views = NULL, j->t[i].n_views = 0;
	}
	if (c->dcache.n) /* none cached: verification off, or nothing applied since open */
		memcpy(j->dig.e, c->dcache.e, c->dcache.n * sizeof(*j->dig.e));
	j->dig.n = c->dcache.n;
	j->descs = cs_descs_sum(j->t, j->n);
	return 0;
}

int cs_fold_plan(dcast_consumer *c, cs_fold_job *j)
{
	char path[4200];
	struct stat st;
	int err;

	memset(j, 0, sizeof(*j));
	j->version = dcast_consumer_version(c);
	cs_store_lock(c->store);
	j->have = c->store->anchor_file_version;
	j->gen = atomic_load(&c->store->gen);
	cs_store_unlock(c->store);
	j->c = c;
	if (j->version == DCAST_VERSION_NONE || j->version == j->have)
		return 0; /* mode NONE: nothing to fold */
	cs_fold_state_path(c, path, sizeof(path)); /* a fold stopped halfway: the anchor file is punched */
	j->mode = !c->n_tensors || access(path, F_OK) == 0 ? CS_FOLD_LIVE : CS_FOLD_DISK;
	if (j->mode == CS_FOLD_LIVE)
		return 0;
	if ((err = plan_tensors(c, j)) || (err = plan_files(c, j)))
		return err;
	if (j->have != DCAST_VERSION_NONE && stat(c->store->anchor_path, &st) == 0)
		j->anchor_ino = (uint64_t)st.st_ino;
	if (!j->n_vers && j->have == DCAST_VERSION_NONE)
		return dcast_fail(DCAST_ECORRUPT, "fold: version %" PRIu64 " applied, but neither an anchor "
				  "file nor a record file holds it", j->version);
	return 0;
}

/* ---- the new file, built from the disk ---- */

#define FOLD_PIECE (4u * DCAST_DIGEST_BLOCK) /* bytes read back at once */
#define FOLD_WINDOW (16u << 20) /* a group of chunk ranges patched in memory at most */
#define FOLD_FDS 64             /* record files open at once */

/* A CHUNK record of the files to fold: its range in the new file, where
 * its payload lies, and its place in the order of application. */
typedef struct fold_chunk {
	uint64_t off, len;     /* its range: the tensor's offset in the new file plus
				  the range's start in wire order, in bytes (a tiled
				  tensor's file bytes are in natural order: tensor_io
				  maps); its bytes */
	uint64_t at, sum;      /* its payload's offset in its record file, dcast_checksum */
	uint64_t seq;          /* records in version order, then file order */
	uint32_t file;         /* index into j->vers */
	uint32_t tensor;       /* the tensor it belongs to */
	dcast_chunk_info info;
} fold_chunk;

typedef struct fold_out {
	cs_fold_job *j;
	dcast_st_layout lay;
	int fd;
	unsigned char *buf;    /* FOLD_PIECE bytes */
	char path[4200];
	int old_fd;            /* the anchor file folded from, or -1 (none) */
	uint64_t old_ino;      /* its inode */
	uint64_t *old_offs;    /* each tensor's offset in it */
	int punch;             /* its pieces are punched out once done (1 until that fails) */
	uint64_t piece_bytes;  /* a piece's bytes at least (fold_piece) */
	int state_fd;          /* the progress record (fold_state), or -1 */
	uint64_t state_seq;
	char state_path[4200];
	fold_chunk *ch;        /* every CHUNK record to fold (index_file) */
	size_t n_ch, cap_ch;
	int *fds;              /* per record file: open (record_fd), or -1 */
	uint32_t open[FOLD_FDS]; /* the files open, by slot; opens so far: */
	uint64_t next_open;
	unsigned char *win, *pl; /* a group's bytes, one payload */
	size_t win_cap, pl_cap;
} fold_out;

/* Copy n bytes through buf (FOLD_PIECE bytes), where the kernel cannot. */
static int copy_through(int from, uint64_t a, int to, uint64_t b, uint64_t n, unsigned char *buf, const char *what)
{
	int err = 0;

	while (!err && n) {
		size_t k = n < FOLD_PIECE ? (size_t)n : FOLD_PIECE;
		if (!(err = dcast_pread_full(from, buf, k, a, what)))
			err = dcast_pwrite_full(to, buf, k, b, what);
		a += k, b += k, n -= k;
	}
	return err;
}

/* Copy n bytes in the kernel (page cache to page cache, or shared extents),
 * through buf where the file system cannot. */
static int copy_range(int from, uint64_t from_off, int to, uint64_t to_off, uint64_t n, unsigned char *buf,
		      const char *what)
{
	loff_t a = (loff_t)from_off, b = (loff_t)to_off;

	while (n) {
		ssize_t got = copy_file_range(from, &a, to, &b, n, 0);
		if (got < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
			return copy_through(from, (uint64_t)a, to, (uint64_t)b, n, buf, what);
		if (got <= 0)
			return dcast_fail(got ? DCAST_EIO : DCAST_ETRUNCATED, "fold: copying %s: %s", what,
					  got ? strerror(errno) : "ends early");
		n -= (uint64_t)got;
	}
	return 0;
}

/* The anchor file folded from, open, and each tensor's offset in it; it
 * must still be the one planned (its inode), or the fold is moot. */
static int open_old(fold_out *o)
{
	const char *path = o->j->c->store->anchor_path;
	dcast_st_file *f = NULL;
	struct stat st;
	size_t hdr = 0;
	int err = dcast_st_open(path, &f);

	if (!err && !(o->old_offs = calloc(o->j->n ? o->j->n : 1, sizeof(*o->old_offs))))
		err = dcast_fail(DCAST_ENOMEM, "fold: %u tensors", o->j->n);
	if (!err && ((o->old_fd = open(path, O_RDWR | O_CLOEXEC)) < 0 || fstat(o->old_fd, &st) != 0))
		err = dcast_fail(DCAST_EIO, "fold: %s: open: %s", path, strerror(errno));
	if (!err)
		o->old_ino = (uint64_t)st.st_ino;
	if (!err && o->j->anchor_ino && (uint64_t)st.st_ino != o->j->anchor_ino)
		err = dcast_fail(DCAST_ESTATE, "fold to version %" PRIu64 " abandoned: %s was replaced",
				 o->j->version, path);
	if (!err)
		dcast_st_header_bytes(f, &hdr);
	for (uint32_t i = 0; !err && i < o->j->n; i++) {
		const cs_tensor *t = &o->j->t[i];
		const dcast_st_tensor *s = dcast_st_find(f, t->desc.name);
		if (!s || s->nbytes != t->bytes)
			err = dcast_fail(DCAST_ESHAPE, "fold: %s: tensor %s missing or of another size", path,
					 t->desc.name);
		else
			o->old_offs[i] = hdr + s->data_offset;
	}
	dcast_st_close(&f);
	return err;
}

/* Is the anchor file (still) inode ino? */
static int anchor_is(const dcast_consumer *c, uint64_t ino)
{
	struct stat st;

	return ino && stat(c->store->anchor_path, &st) == 0 && (uint64_t)st.st_ino == ino;
}

/* DCAST_ESTATE once the fold is moot: the files moved on (c->store->gen),
 * but for an anchor file still the one it punches (an anchor received in
 * place dropped: cs_fold_finish decides), or the consumer is closing
 * (*j->stop); checked between record files, groups and pieces. */
static int abandoned(const fold_out *o)
{
	const cs_fold_job *j = o->j;

	if (!(j->stop && atomic_load(j->stop)) &&
	    (atomic_load(&j->c->store->gen) == j->gen || anchor_is(j->c, o->old_ino)))
		return 0;
	return dcast_fail(DCAST_ESTATE, "fold to version %" PRIu64 " abandoned: the checkpoint moved on, "
			  "or the consumer is closing", j->version);
}

/* ---- first pass: every record file scanned (headers only), its CHUNK
 * records indexed; nothing written yet ---- */

typedef struct fold_file {
	fold_out *o;
	uint32_t file;         /* index into j->vers */
	uint32_t records;
	int anchor;
} fold_file;

/* p with room for need items of size bytes (cap: its room, doubled as
 * needed); NULL (p still the caller's, the error set) when it cannot. */
static void *grown(void *p, size_t *cap, size_t need, size_t size)
{
	size_t n = *cap ? *cap : 64;
	void *q;

	while (n < need)
		n *= 2;
	if (n == *cap)
		return p;
	if (!(q = realloc(p, n * size))) {
		dcast_fail(DCAST_ENOMEM, "fold: %zu bytes", n * size);
		return NULL;
	}
	*cap = n;
	return q;
}

/* The fold's tensors as a manifest (dcast_fit.h). */
static dcast_desc_array job_descs(const cs_fold_job *j)
{
	return (dcast_desc_array){j->n ? &j->t[0].desc : NULL, sizeof(cs_tensor), j->n};
}

/* CHUNK record r (header h, at offset off of its file) into the index. */
static int index_chunk(fold_file *f, const dcast_chunk *h, const dcast_rec *r, uint64_t off)
{
	fold_out *o = f->o;
	fold_chunk *ch;
	int err;

	if (h->payload_bytes != r->payload_len)
		return dcast_fail(DCAST_EPAYLOAD_SIZE, "CHUNK record: header says %" PRIu64 " payload bytes, "
				  "the record holds %u", h->payload_bytes, r->payload_len);
	if ((err = dcast_chunk_sound(h, job_descs(o->j), r->payload_sum))) /* the decoder checked the rest */
		return dcast_fail(err, "CHUNK record: %s", dcast_last_error());
	if (!h->count)
		return 0;
	if (!(ch = grown(o->ch, &o->cap_ch, o->n_ch + 1, sizeof(*ch))))
		return DCAST_ENOMEM;
	o->ch = ch;
	o->ch[o->n_ch] = (fold_chunk){
		.off = o->lay.file_offsets[h->tensor] + h->start * h->elem_size,
		.len = h->count * h->elem_size,
		.at = off + DCAST_REC_PREFIX + r->hdr_len,
		.sum = r->payload_sum,
		.seq = o->n_ch,
		.file = f->file,
		.tensor = h->tensor,
		.info = {h->encoding, h->elem_size, h->count, h->changed, h->payload_bytes},
	};
	o->n_ch++;
	return 0;
}

#define WHY(...) (snprintf(why, why_cap, __VA_ARGS__), -1)

/* A delta's record file follows the one before it (or the anchor file):
 * a version missing from the log is never folded over. */
static int chain_ok(const fold_file *f, const dcast_commit *m)
{
	const cs_fold_job *j = f->o->j;

	return m->anchor || m->base_version == (f->file ? j->vers[f->file - 1] : j->have);
}

static int by_range(const void *a, const void *b)
{
	const dcast_range_digest *x = &((const cs_dentry *)a)->d, *y = &((const cs_dentry *)b)->d;

	if (x->tensor != y->tensor)
		return (x->tensor > y->tensor) - (x->tensor < y->tensor);
	return (x->start > y->start) - (x->start < y->start);
}

/* With no digests cached (verification off, or a fold resumed at open),
 * the target's own COMMIT record's, from its record file (the last): they
 * cover every element, so the result is checked all the same. */
static int take_digests(fold_file *f, const dcast_commit *m)
{
	cs_fold_job *j = f->o->j;
	cs_dentry *e;
	int err;

	if (j->dig.n || f->file + 1 != j->n_vers || !m->n_digests)
		return 0;
	for (uint32_t i = 0; i < m->n_digests; i++)
		if ((err = dcast_digest_fits(&m->digests[i], i, job_descs(j))))
			return dcast_fail(err, "COMMIT record: %s", dcast_last_error());
	if (!(e = calloc(m->n_digests, sizeof(*e))))
		return dcast_fail(DCAST_ENOMEM, "fold: %u digests", m->n_digests);
	for (uint32_t i = 0; i < m->n_digests; i++)
		e[i].d = m->digests[i];
	qsort(e, m->n_digests, sizeof(*e), by_range);
	free(j->dig.e);
	j->dig.e = e, j->dig.n = m->n_digests;
	return 0;
}

static int on_record(void *ctx, uint64_t off, const dcast_rec *r, const uint8_t *hdr, const uint8_t *payload,
		     char *why, size_t why_cap)
{
	fold_file *f = ctx;
	uint64_t version = f->o->j->vers[f->file];
	dcast_msg m;
	int rc = 0;

	(void)payload;
	if (++f->records == 1)
		return r->kind == DCAST_REC_FILE ? 0 : WHY("no FILE record first");
	if (r->kind == DCAST_REC_FILE || r->version != version)
		return WHY("record at offset %" PRIu64 " out of place", off);
	if (r->kind == DCAST_REC_MANIFEST) {
		f->anchor = 1;
		return 0;
	}
	if (dcast_rec_msg(r, hdr, &m))
		return WHY("record at offset %" PRIu64 ": %s", off, dcast_last_error());
	if (r->kind == DCAST_REC_CHUNK && (rc = index_chunk(f, &m.u.chunk, r, off)))
		rc = WHY("record at offset %" PRIu64 ": %s", off, dcast_last_error());
	else if (r->kind == DCAST_REC_COMMIT && !chain_ok(f, &m.u.commit))
		rc = WHY("a delta on version %" PRIu64 ", but the version before it here is %" PRIu64,
			 m.u.commit.base_version, f->file ? f->o->j->vers[f->file - 1] : f->o->j->have);
	else if (r->kind == DCAST_REC_COMMIT)
		rc = take_digests(f, &m.u.commit) ? WHY("%s", dcast_last_error()) : 1;
	dcast_msg_free(&m);
	return rc;
}

/* Index the record file j->vers[file]; its bytes are added to *bytes. */
static int index_file(fold_out *o, uint32_t file, uint64_t *bytes)
{
	fold_file f = {o, file, 0, 0};
	dcast_rec_reader rd = {.max_kind = DCAST_REC_COMMIT};
	dcast_rec_scan_out out;
	char path[4096];
	struct stat st;
	int err;

	cs_ckpt_version_path(o->j->c, o->j->vers[file], path, sizeof(path));
	if ((rd.fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(rd.fd, &st) != 0) {
		err = dcast_fail(DCAST_EIO, "fold: %s: open: %s", path, strerror(errno));
		goto out;
	}
	rd.size = (uint64_t)st.st_size;
	*bytes += rd.size;
	err = dcast_rec_scan(&rd, 0, on_record, &f, &out);
	if (!err && (out.units != 1 || out.good_end != rd.size))
		err = dcast_fail(DCAST_ECORRUPT, "fold: %s: %s", path, out.why[0] ? out.why : "not one whole version");
	if (!err && file + 1 == o->j->n_vers && o->j->vers[file] != o->j->version)
		err = dcast_fail(DCAST_ECORRUPT, "fold: no record file of version %" PRIu64 " (the newest is "
				 "%s)", o->j->version, path);
out:
	if (rd.fd >= 0)
		close(rd.fd);
	dcast_rec_reader_free(&rd);
	return err;
}

/* ---- second pass: the new file patched group by group, in file order.
 * A group is a run of chunk ranges that overlap one another (across
 * versions; within a version ranges never overlap): read once, every
 * chunk of it applied in version order, written once.  Each byte of the
 * model is read and written once however many versions are folded, where
 * replaying version after version touched every page of a 1% delta's
 * ranges once per version.  Groups are in the space of fold_chunk.off:
 * a tensor's offset in the file plus the range's in wire order. ---- */

/* The record file of index entry k, open.  At most FOLD_FDS stay open
 * (the descriptors the process has are its ZeroMQ sockets' and its
 * record log's too): past that, the one opened longest ago is closed. */
static int record_fd(fold_out *o, const fold_chunk *k, char *path, size_t cap)
{
	uint32_t *slot = &o->open[o->next_open % FOLD_FDS];
	int fd;

	cs_ckpt_version_path(o->j->c, o->j->vers[k->file], path, cap);
	if (o->fds[k->file] >= 0)
		return o->fds[k->file];
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return -dcast_fail(DCAST_EIO, "fold: %s: open: %s", path, strerror(errno));
	if (o->next_open >= FOLD_FDS) { /* the slot's file, opened FOLD_FDS opens ago, still open */
		DCAST_ASSERT(o->fds[*slot] >= 0);
		close(o->fds[*slot]), o->fds[*slot] = -1;
	}
	*slot = k->file;
	o->next_open++;
	return o->fds[k->file] = fd;
}

/* Chunk k's payload into o->pl, checked against its record's sum (the
 * scan read headers only). */
static int load_payload(fold_out *o, const fold_chunk *k)
{
	char path[4096];
	size_t n = (size_t)k->info.payload_bytes;
	int fd = record_fd(o, k, path, sizeof(path));
	unsigned char *pl;

	if (fd < 0)
		return -fd;
	if (!(pl = grown(o->pl, &o->pl_cap, n ? n : 1, 1)))
		return DCAST_ENOMEM;
	o->pl = pl;
	if (dcast_pread_full(fd, o->pl, n, k->at, path))
		return dcast_fail(DCAST_EIO, "fold: payload at %" PRIu64 ": %s", k->at, dcast_last_error());
	if (dcast_checksum(o->pl, n) != k->sum)
		return dcast_fail(DCAST_ECHECKSUM, "fold: %s: the payload at %" PRIu64 " does not match its "
				  "record's checksum: the file is damaged", path, k->at);
	return 0;
}

/* Chunk k applied to dst, its range's bytes in wire order. */
static int apply_chunk(fold_out *o, const fold_chunk *k, unsigned char *dst)
{
	int err = load_payload(o, k);

	if (!err && (err = dcast_codec_apply(&k->info, o->pl, dst, NULL)))
		err = dcast_fail(err, "fold: record file of version %" PRIu64 ", payload at %" PRIu64 ": %s",
				 o->j->vers[k->file], k->at, dcast_last_error());
	return err;
}

/* Moving wire elements of one tensor between a buffer and the new file. */
typedef struct tensor_io_ctx {
	const fold_out *o;
	uint64_t base, w0;     /* the tensor's offset in the file; buf's first element */
	unsigned es;
	unsigned char *buf;
	int write;
} tensor_io_ctx;

static int io_run(void *ctx, uint64_t ni, uint64_t wi, uint64_t n)
{
	const tensor_io_ctx *x = ctx;
	size_t len = (size_t)(n * x->es);
	unsigned char *p = x->buf + (wi - x->w0) * x->es;
	uint64_t at = x->base + ni * x->es;

	return x->write ? dcast_pwrite_full(x->o->fd, p, len, at, x->o->path)
			: dcast_pread_full(x->o->fd, p, len, at, x->o->path);
}

/* Wire elements [w0, w0 + n) of tensor t between buf and the new file
 * (write: to the file): one pread or pwrite for an untiled tensor, one per
 * run for a tiled one (its file bytes are in natural order). */
static int tensor_io(const fold_out *o, uint32_t t, uint64_t w0, uint64_t n, unsigned char *buf, int write)
{
	const cs_tensor *ts = &o->j->t[t];
	tensor_io_ctx x = {o, o->lay.file_offsets[t], w0, ts->elem_size, buf, write};
	dcast_box whole;
	int err;

	if (!dcast_tensor_tiled(&ts->desc))
		return io_run(&x, w0, w0, n);
	if ((err = dcast_box_init(&whole, &ts->desc, 0, NULL, NULL, "fold")))
		return err;
	return dcast_tiles_range_runs(&ts->map, &whole, w0, n, io_run, &x);
}

/* Bytes [from, from + len) of group g's tensor (fold_chunk.off's space)
 * between o->win and the file. */
static int window_io(fold_out *o, const fold_chunk *g, uint64_t from, uint64_t len, int write)
{
	uint32_t t = g->tensor;
	unsigned es = o->j->t[t].elem_size;

	return tensor_io(o, t, (from - o->lay.file_offsets[t]) / es, len / es, o->win, write);
}

static int by_offset(const void *a, const void *b)
{
	const fold_chunk *x = a, *y = b;

	return x->off != y->off ? (x->off > y->off) - (x->off < y->off) : (x->seq > y->seq) - (x->seq < y->seq);
}

static int by_seq(const void *a, const void *b)
{
	const fold_chunk *x = a, *y = b;

	return (x->seq > y->seq) - (x->seq < y->seq);
}

/* The n chunks g[] that cover [g[0].off, end), all of one tensor: read,
 * applied in version order, written.  A group over FOLD_WINDOW bytes
 * goes chunk by chunk, each one's range read (unless dense), patched and
 * written. */
static int fold_group(fold_out *o, fold_chunk *g, size_t n, uint64_t end)
{
	uint64_t from = g[0].off, len = end - from, most = len > FOLD_WINDOW ? 0 : len;
	unsigned char *win;
	int err = 0;

	qsort(g, n, sizeof(*g), by_seq);
	for (size_t i = 0; !most && i < n; i++)
		most = g[i].len > most ? g[i].len : most;
	if (!(win = grown(o->win, &o->win_cap, (size_t)most, 1)))
		return DCAST_ENOMEM;
	o->win = win;
	if (len <= FOLD_WINDOW) {
		err = window_io(o, g, from, len, 0);
		for (size_t i = 0; !err && i < n; i++)
			err = apply_chunk(o, &g[i], o->win + (g[i].off - from));
		return err ? err : window_io(o, g, from, len, 1);
	}
	for (size_t i = 0; !err && i < n; i++) {
		if (g[i].info.encoding != DCAST_ENC_DENSE)
			err = window_io(o, &g[i], g[i].off, g[i].len, 0);
		if (!err && !(err = apply_chunk(o, &g[i], o->win)))
			err = window_io(o, &g[i], g[i].off, g[i].len, 1);
	}
	return err;
}

/* ---- pieces: the new file is written a piece at a time, in file
 * order; once a piece is durable there (fdatasync), the progress record
 * says so (fold_state) and its range is punched out of the anchor file, so
 * that the two files together hold about one model, not two.  A piece is
 * whole groups and whole tiled tensors (their chunks' ranges are in wire
 * order), so that a fold resumed at the progress record's offset
 * (cs_fold_resume) never applies a record to bytes it already holds: a
 * compact payload's value differences are not idempotent. ---- */

/* The progress record, DIR/model.safetensors.fold.state: two slots, the
 * one written last (higher seq) with a good sum counts, so that a torn
 * write leaves the one before.  done: every byte of the new file below it
 * is durable there, and the anchor file's bytes of those ranges may be
 * punched. */
#define FOLD_STATE_MAGIC 0x32736c6f66646364ull /* "dcdfols2" */
#define FOLD_STATE_SLOT 512u
typedef struct fold_state {
	uint64_t magic, seq, have, target, done, descs, sum; /* descs: the job's (cs_descs_sum) */
} fold_state;

static uint64_t state_sum(const fold_state *s)
{
	return dcast_checksum(s, offsetof(fold_state, sum));
}

static int state_write(fold_out *o, uint64_t done)
{
	fold_state s = {FOLD_STATE_MAGIC, ++o->state_seq, o->j->have, o->j->version, done, o->j->descs, 0};
	int err;

	s.sum = state_sum(&s);
	if ((err = dcast_pwrite_full(o->state_fd, &s, sizeof(s), (s.seq % 2) * FOLD_STATE_SLOT, o->state_path)))
		return err;
	return fdatasync(o->state_fd) ? dcast_fail(DCAST_EIO, "fold: %s: fdatasync: %s", o->state_path,
						   strerror(errno)) : 0;
}

/* The newest good slot of the progress record at path into *s; -1: none. */
static int state_read(const char *path, fold_state *s)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), found = -1;

	for (uint64_t k = 0; fd >= 0 && k < 2; k++) {
		fold_state x;
		if (pread(fd, &x, sizeof(x), (off_t)(k * FOLD_STATE_SLOT)) == (ssize_t)sizeof(x) &&
		    x.magic == FOLD_STATE_MAGIC && x.sum == state_sum(&x) && (found < 0 || x.seq > s->seq))
			*s = x, found = 0;
	}
	if (fd >= 0)
		close(fd);
	return found;
}

/* The progress record made (or, resumed, opened), durable with the new
 * file's name before anything is punched. */
static int state_open(fold_out *o)
{
	cs_fold_job *j = o->j;
	int err;

	cs_fold_state_path(j->c, o->state_path, sizeof(o->state_path));
	o->state_fd = open(o->state_path, O_RDWR | O_CREAT | (j->resume_from ? 0 : O_TRUNC) | O_CLOEXEC, 0644);
	if (o->state_fd < 0)
		return dcast_fail(DCAST_EIO, "fold: %s: create: %s", o->state_path, strerror(errno));
	o->state_seq = j->resume_seq;
	if (j->resume_from)
		return 0;
	if ((err = state_write(o, o->lay.header_bytes)))
		return err;
	return dcast_fsync_dir(j->c->dir);
}

/* The range [a, b) of the new file, tensor by tensor: each tensor's part
 * of it, at [at, at + n) in the new file and from `old` in the anchor file. */
typedef int (*piece_fn)(fold_out *o, uint64_t at, uint64_t old, uint64_t n);

static int piece_each(fold_out *o, uint64_t a, uint64_t b, piece_fn fn)
{
	int err = 0;

	for (uint32_t i = 0; !err && i < o->j->n; i++) {
		uint64_t t0 = o->lay.file_offsets[i], t1 = t0 + o->j->t[i].bytes;
		uint64_t lo = a > t0 ? a : t0, hi = b < t1 ? b : t1;
		if (lo < hi)
			err = fn(o, lo, o->old_offs[i] + (lo - t0), hi - lo);
	}
	return err;
}

static int copy_old(fold_out *o, uint64_t at, uint64_t old, uint64_t n)
{
	return copy_range(o->old_fd, old, o->fd, at, n, o->buf, o->j->c->store->anchor_path);
}

/* The anchor file's whole blocks in [old, old + n) punched out; where the
 * file system cannot, it is said once and the fold goes on unpunched
 * (the directory then peaks at two models, as before). */
static int punch_old(fold_out *o, uint64_t at, uint64_t old, uint64_t n)
{
	uint64_t lo = (old + 4095) & ~4095ull, hi = (old + n) & ~4095ull;

	(void)at;
	if (!o->punch || lo >= hi ||
	    !fallocate(o->old_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)lo, (off_t)(hi - lo)))
		return 0;
	DCAST_LOG_W("consumer %s: fold: %s: punching the folded ranges out: %s; the directory holds two "
		    "models until the fold's rename", o->j->c->model, o->j->c->store->anchor_path, strerror(errno));
	o->punch = 0;
	return 0;
}

/* The end of the piece that starts at a, chunk i the first at or past a:
 * a + piece_bytes, moved on past every group and tiled tensor that would
 * straddle it. */
static uint64_t piece_end(const fold_out *o, size_t i, uint64_t a)
{
	uint64_t end = o->lay.file_bytes, b = end - a > o->piece_bytes ? a + o->piece_bytes : end, was = 0;

	while (b != was) {
		was = b;
		for (; i < o->n_ch && o->ch[i].off < b; i++)
			b = o->ch[i].off + o->ch[i].len > b ? o->ch[i].off + o->ch[i].len : b;
		for (uint32_t t = 0; t < o->j->n; t++) {
			uint64_t t0 = o->lay.file_offsets[t], t1 = t0 + o->j->t[t].bytes;
			if (dcast_tensor_tiled(&o->j->t[t].desc) && t0 < b && b < t1)
				b = t1;
		}
	}
	return b;
}

/* The groups of chunks from *i that start before b, each folded; *i moves past them. */
static int fold_groups(fold_out *o, size_t *i, uint64_t b)
{
	int err = 0;

	while (!err && *i < o->n_ch && o->ch[*i].off < b) {
		size_t k;
		uint64_t end = o->ch[*i].off + o->ch[*i].len;
		for (k = *i + 1; k < o->n_ch && o->ch[k].off < end; k++)
			end = o->ch[k].off + o->ch[k].len > end ? o->ch[k].off + o->ch[k].len : end;
		if (!(err = abandoned(o)))
			err = fold_group(o, &o->ch[*i], k - *i, end);
		*i = k;
	}
	return err;
}

/* Piece [a, b): the anchor file's bytes copied, its groups folded; then,
 * folding from an anchor file, durable, recorded, and punched out of it. */
static int fold_piece(fold_out *o, size_t *i, uint64_t a, uint64_t b)
{
	int err = o->old_fd >= 0 ? piece_each(o, a, b, copy_old) : 0;

	if (!err)
		err = fold_groups(o, i, b);
	if (err || o->old_fd < 0)
		return err;
	if (fdatasync(o->fd) != 0)
		return dcast_fail(DCAST_EIO, "fold: %s: fdatasync: %s", o->path, strerror(errno));
	if ((err = state_write(o, b)))
		return err;
	cs_fault_fold_piece(o->j->c);
	return piece_each(o, a, b, punch_old);
}

/* Every indexed chunk into the new file, piece by piece in file order
 * (from the progress record's offset when resumed). */
static int fold_chunks(fold_out *o)
{
	size_t i = 0;
	int err = 0;

	if (!(o->fds = malloc((o->j->n_vers ? o->j->n_vers : 1) * sizeof(*o->fds))))
		return dcast_fail(DCAST_ENOMEM, "fold: %u record files", o->j->n_vers);
	for (uint32_t k = 0; k < o->j->n_vers; k++)
		o->fds[k] = -1;
	qsort(o->ch, o->n_ch, sizeof(*o->ch), by_offset);
	uint64_t a = o->j->resume_from ? o->j->resume_from : o->lay.header_bytes;
	while (i < o->n_ch && o->ch[i].off < a) /* resumed: folded before */
		i++;
	for (uint64_t b; !err && a < o->lay.file_bytes; a = b)
		err = fold_piece(o, &i, a, b = piece_end(o, i, a));
	return err;
}

/* Add each cached COMMIT digest range's share of elements [e0, e0 + n) of
 * tensor t, which o->buf holds, to range[] (the digest is additive: a
 * range's is the sum of its pieces'); the ranges are sorted, so only
 * those that meet the piece are visited. */
static void piece_ranges(const fold_out *o, uint32_t t, uint64_t e0, uint64_t n, uint64_t *range)
{
	const cs_fold_job *j = o->j;
	unsigned es = j->t[t].elem_size;

	for (uint32_t k = cs_dcache_first(&j->dig, t, e0); k < j->dig.n && j->dig.e[k].d.tensor == t &&
	     j->dig.e[k].d.start < e0 + n; k++) {
		const dcast_range_digest *d = &j->dig.e[k].d;
		uint64_t lo = d->start > e0 ? d->start : e0, part = 0;
		uint64_t hi = d->start + d->count < e0 + n ? d->start + d->count : e0 + n;
		if (lo < hi && !dcast_ldigest(t, lo, o->buf + (lo - e0) * es, hi - lo, es, &part))
			range[k] += part;
	}
}

/* One pass over tensor i in the new file: its dcast_digest (XXH3 of its
 * 1 MiB blocks' XXH3s, docs/protocol.md, "Checksum and digest") into *td,
 * and its share of every cached COMMIT digest range into range[]. */
static int scan_tensor(const fold_out *o, uint32_t i, uint64_t *td, uint64_t *range)
{
	const cs_tensor *t = &o->j->t[i];
	uint64_t bytes = t->bytes, nb = (bytes + DCAST_DIGEST_BLOCK - 1) / DCAST_DIGEST_BLOCK;
	uint64_t *h = malloc((nb ? nb : 1) * sizeof(*h));
	int err = h ? 0 : dcast_fail(DCAST_ENOMEM, "fold: %" PRIu64 " block hashes", nb);

	for (uint64_t off = 0; !err && off < bytes; off += FOLD_PIECE) {
		uint64_t n = bytes - off < FOLD_PIECE ? bytes - off : FOLD_PIECE;
		err = abandoned(o) ? DCAST_ESTATE : tensor_io(o, i, off / t->elem_size, n / t->elem_size, o->buf, 0);
		for (uint64_t b = 0; !err && b < n; b += DCAST_DIGEST_BLOCK)
			h[(off + b) / DCAST_DIGEST_BLOCK] =
				dcast_checksum(o->buf + b, n - b < DCAST_DIGEST_BLOCK ? n - b : DCAST_DIGEST_BLOCK);
		if (!err)
			piece_ranges(o, i, off / t->elem_size, n / t->elem_size, range);
	}
	if (!err)
		*td = dcast_checksum(h, nb * sizeof(*h));
	free(h);
	return err;
}

/* Every cached COMMIT digest of the target against the file's (range[]). */
static int check_ranges(const fold_out *o, const uint64_t *range)
{
	const cs_fold_job *j = o->j;

	for (uint32_t k = 0; k < j->dig.n; k++) {
		const dcast_range_digest *d = &j->dig.e[k].d;
		if (range[k] != d->digest)
			return dcast_fail(DCAST_EDIGEST, "fold: tensor %s elements [%" PRIu64 ", %" PRIu64
					  ") do not match version %" PRIu64 "'s digest: the record log and the "
					  "anchor file do not rebuild it", j->t[d->tensor].desc.name, d->start,
					  d->start + d->count, j->version);
	}
	return 0;
}

/* The header, with the file digest (anchor.c) of the tensors' td[]. */
static int seal(fold_out *o, const uint64_t *td)
{
	cs_fold_job *j = o->j;
	uint64_t digest;
	char dbuf[32];
	dcast_st_layout lay;
	int err = cs_file_digest(j->t, j->n, j->version, td, &digest);

	if (err)
		return err;
	snprintf(dbuf, sizeof(dbuf), "%016" PRIx64, digest);
	if ((err = cs_anchor_layout(j->c->model, j->t, j->n, j->version, dbuf, &lay)))
		return err;
	DCAST_ASSERT(lay.header_bytes == o->lay.header_bytes); /* fixed-width digest */
	err = dcast_pwrite_full(o->fd, lay.header, lay.header_bytes, 0, o->path);
	dcast_st_layout_free(&lay);
	return err;
}

/* Read the new file back once: checked against the target's digests, then
 * sealed with its file digest. */
static int check_and_seal(fold_out *o)
{
	cs_fold_job *j = o->j;
	uint64_t *td = malloc(j->n * sizeof(*td)), *range = calloc(j->dig.n ? j->dig.n : 1, sizeof(*range));
	int err = td && range ? 0 : dcast_fail(DCAST_ENOMEM, "fold: %u tensors", j->n);

	for (uint32_t i = 0; !err && i < j->n; i++)
		err = scan_tensor(o, i, &td[i], range);
	if (!err)
		err = check_ranges(o, range);
	if (!err)
		err = seal(o, td);
	free(td), free(range);
	return err;
}

/* A piece: an eighth of the model (at least FOLD_PIECE_MIN), so that
 * the anchor file and the new one together hold at most 1.125 models
 * (more only where one group of overlapping chunk ranges, or a tiled
 * tensor, is larger); the whole file at once when there is no anchor file
 * to punch. */
#define FOLD_PIECE_MIN (1u << 20)

static uint64_t piece_bytes(const cs_fold_job *j)
{
	uint64_t n = 0;

	if (j->have == DCAST_VERSION_NONE)
		return UINT64_MAX;
	for (uint32_t i = 0; i < j->n; i++)
		n += j->t[i].bytes;
	return n / 8 > FOLD_PIECE_MIN ? n / 8 : FOLD_PIECE_MIN;
}

/* The anchor file open and the record files indexed (damage found before
 * anything is punched), then the pieces, the check, the header. */
static int build(fold_out *o)
{
	cs_fold_job *j = o->j;
	int err = 0;

	if (!j->resume_from && ftruncate(o->fd, (off_t)o->lay.file_bytes) != 0)
		return dcast_fail(DCAST_EIO, "fold: %s: %s", o->path, strerror(errno));
	if (j->have != DCAST_VERSION_NONE && (err = open_old(o)))
		return err;
	for (uint32_t i = 0; !err && i < j->n_vers; i++)
		if (!(err = abandoned(o)))
			err = index_file(o, i, &j->folded_bytes);
	if (!err && o->old_fd >= 0)
		err = state_open(o);
	if (!err)
		err = fold_chunks(o);
	if (!err)
		err = check_and_seal(o);
	if (!err && fdatasync(o->fd) != 0)
		err = dcast_fail(DCAST_EIO, "fold: %s: fdatasync: %s", o->path, strerror(errno));
	return err;
}

/* A fold that failed: its file goes, unless the anchor file, punched
 * already (a progress record made), is still the checkpoint's: then both
 * stay, for a fold from the tensors to replace or the next open to finish
 * (cs_fold_resume). */
static void fold_failed(const fold_out *o)
{
	const cs_fold_job *j = o->j;

	if (o->state_fd < 0)
		unlink(o->path);
	else if (!anchor_is(j->c, o->old_ino))
		cs_fold_leftovers_drop(j->c);
	else
		DCAST_LOG_W("consumer %s: fold to version %" PRIu64 " stopped halfway: %s and its progress "
			    "record kept until the anchor file is whole again", j->c->model, j->version, o->path);
}

static int fold_open(fold_out *o)
{
	char zero[32];
	int err;

	snprintf(zero, sizeof(zero), "%016" PRIx64, (uint64_t)0);
	cs_fold_tmp_path(o->j->c, o->path, sizeof(o->path));
	if ((err = cs_anchor_layout(o->j->c->model, o->j->t, o->j->n, o->j->version, zero, &o->lay)))
		return err;
	o->fd = open(o->path, O_RDWR | (o->j->resume_from ? 0 : O_CREAT | O_TRUNC) | O_CLOEXEC, 0644);
	if (o->fd < 0)
		return dcast_fail(DCAST_EIO, "fold: %s: %s: %s", o->path, o->j->resume_from ? "open" : "create",
				  strerror(errno));
	if (!(o->buf = malloc(FOLD_PIECE)))
		return dcast_fail(DCAST_ENOMEM, "fold: read-back buffer");
	return build(o);
}

static int fold_run(cs_fold_job *j)
{
	fold_out o = {.j = j, .fd = -1, .old_fd = -1, .state_fd = -1, .punch = 1, .piece_bytes = piece_bytes(j)};
	int err;

	cs_fault_fold(j->c);
	err = fold_open(&o);
	for (uint32_t i = 0; o.fds && i < j->n_vers; i++)
		if (o.fds[i] >= 0)
			close(o.fds[i]);
	free(o.fds), free(o.ch), free(o.win), free(o.pl), free(o.old_offs);
	free(o.buf);
	if (err)
		fold_failed(&o);
	if (o.fd >= 0)
		close(o.fd);
	if (o.old_fd >= 0)
		close(o.old_fd);
	if (o.state_fd >= 0)
		close(o.state_fd);
	dcast_st_layout_free(&o.lay);
	return err;
}

/* The calling thread's CPU and I/O priority: a fold is background work,
 * so it runs at nice 19 and the lowest best-effort I/O level, taking what
 * the session thread and the caller's apply() leave (on a busy host it
 * takes longer, and nobody waits for it).  Then back to what it was,
 * where the system lets a thread raise its priority again. */
void cs_fold_priority(int background, int *saved)
{
	pid_t tid = (pid_t)syscall(SYS_gettid);

	if (background) {
		errno = 0;
		*saved = getpriority(PRIO_PROCESS, (id_t)tid);
		if (errno)
			*saved = 0;
	}
	(void)setpriority(PRIO_PROCESS, (id_t)tid, background ? 19 : *saved);
	(void)syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, tid,
		      background ? (2 << 13) | 7 : 0); /* best effort, level 7; 0: from the nice value */
}

int cs_fold_run(cs_fold_job *j, const _Atomic int *stop)
{
	uint64_t t0 = dcast_now_ns(), cpu0 = dcast_thread_cpu_ns();
	int saved = 0, err;

	j->stop = stop;
	if (!j->here)
		cs_fold_priority(1, &saved);
	if (!(err = j->c->store->sink->durable(j->c))) /* its pieces and progress record are durable state */
		err = fold_run(j);
	if (!j->here)
		cs_fold_priority(0, &saved);
	DCAST_LOG_D("consumer %s: fold from the disk to version %" PRIu64 ": %u record files, %" PRIu64
		    " bytes of them, %.1f ms, %.1f ms of CPU%s%s", j->c->model, j->version, j->n_vers,
		    j->folded_bytes, (double)(dcast_now_ns() - t0) / 1e6, (double)(dcast_thread_cpu_ns() - cpu0) / 1e6,
		    err ? ", failed: " : "", err ? dcast_last_error() : "");
	return err;
}

/* The store's fields after a rename over model.safetensors holding
 * `version`, of which j (NULL: none) folded the records.  `mu` held. */
static void renamed(cs_store *s, uint64_t version, const cs_fold_job *j)
{
	DCAST_DEBUG_ASSERT(cs_store_held(s));
	s->gen++;
	s->anchor_file_version = version;
	s->folds++;
	if (!j)
		return;
	s->log_since_fold -= j->folded_bytes < s->log_since_fold ? j->folded_bytes : s->log_since_fold;
	s->deltas_since_fold -= j->n_vers < s->deltas_since_fold ? j->n_vers : s->deltas_since_fold;
}

/* After a rename over model.safetensors: a fold's progress record goes
 * (the anchor file is whole), the folder is fsynced. */
static int rename_durable(dcast_consumer *c)
{
	cs_fold_leftovers_drop(c);
	return dcast_fsync_dir(c->dir); /* the rename durable before the files it covers go */
}

int cs_fold_renamed(dcast_consumer *c, uint64_t version)
{
	cs_store_lock(c->store);
	renamed(c->store, version, NULL);
	cs_store_unlock(c->store);
	return rename_durable(c);
}

/* Are the files as j planned them (1), or is its file moot (0)?  `mu`
 * held. */
static int as_planned(dcast_consumer *c, const cs_fold_job *j)
{
	DCAST_DEBUG_ASSERT(cs_store_held(c->store));
	if (j->gen != atomic_load(&c->store->gen) && /* the files moved on: this is not their anchor, */
	    !(anchor_is(c, j->anchor_ino) && c->store->anchor_file_version == j->have)) /* unless it is */
		return 0;
	/* the files are as planned: the same anchor file, the target newer */
	DCAST_ASSERT(c->store->anchor_file_version == j->have &&
		     (j->have == DCAST_VERSION_NONE || j->version > j->have));
	return 1;
}

int cs_fold_finish(dcast_consumer *c, cs_fold_job *j)
{
	char tmp[4200];
	int err = 0;

	cs_fold_tmp_path(c, tmp, sizeof(tmp));
	cs_store_lock(c->store);
	if (!as_planned(c, j)) {
		cs_store_unlock(c->store);
		cs_fold_leftovers_drop(c);
		return 0;
	}
	if (rename(tmp, c->store->anchor_path) != 0) /* kept: the anchor file may be punched */
		err = dcast_fail(DCAST_EIO, "fold: rename %s: %s", tmp, strerror(errno));
	else
		renamed(c->store, j->version, j);
	cs_store_unlock(c->store);
	if (!err)
		err = rename_durable(c);
	for (uint32_t i = 0; !err && i < j->n_vers; i++)
		cs_ckpt_remove(c, j->vers[i]);
	return err;
}

/* ---- a fold from the disk that a dead process left halfway ---- */

/* The job its progress record s describes: the record files up to its
 * target, which must still be there, and the target's digests from its
 * COMMIT record (those cached are the applied version's: take_digests). */
static int resume_job(dcast_consumer *c, const fold_state *s, cs_fold_job *j)
{
	int err;

	memset(j, 0, sizeof(*j));
	j->c = c, j->mode = CS_FOLD_DISK, j->gen = atomic_load(&c->store->gen);
	j->version = s->target, j->have = s->have;
	j->resume_from = s->done, j->resume_seq = s->seq;
	if ((err = plan_tensors(c, j)) || (err = plan_files(c, j)))
		return err;
	j->dig.n = 0;
	j->here = 1;
	return j->n_vers ? 0 : dcast_fail(DCAST_ECORRUPT, "fold to version %" PRIu64 " stopped halfway, and "
					  "no record file is left to finish it", j->version);
}

int cs_fold_resume(dcast_consumer *c)
{
	char sp[4200], fp[4200];
	uint64_t have = DCAST_VERSION_NONE;
	fold_state s = {0};
	cs_fold_job j = {0};
	int err;

	cs_fold_state_path(c, sp, sizeof(sp));
	cs_fold_tmp_path(c, fp, sizeof(fp));
	if (state_read(sp, &s) || access(fp, F_OK) || access(c->store->anchor_path, F_OK))
		return unlink(sp), 0; /* none; made, but nothing punched; or renamed */
	if ((err = cs_anchor_header_read(c, &have)))
		return err;
	if (have != s.have)
		return unlink(sp), 0; /* the anchor file replaced since */
	DCAST_LOG_W("consumer %s: a fold to version %" PRIu64 " stopped halfway (%s punched below offset %"
		    PRIu64 "): finishing it", c->model, s.target, c->store->anchor_path, s.done);
	cs_store_lock(c->store);
	c->store->anchor_file_version = have;
	cs_store_unlock(c->store);
	if (!(err = resume_job(c, &s, &j)) && j.descs != s.descs)
		err = dcast_fail(DCAST_ECORRUPT, "%s: the tensor table in its header is not the one the fold "
				 "to version %" PRIu64 " began with", c->store->anchor_path, s.target);
	if (!err && !(err = cs_fold_run(&j, NULL)))
		err = cs_fold_finish(c, &j);
	cs_fold_job_free(&j);
	if (err && err != DCAST_ENOMEM && err != DCAST_EIO && err != DCAST_ECORRUPT)
		err = dcast_fail(DCAST_ECORRUPT, "%s: %s", c->store->anchor_path, dcast_last_error());
	return err; /* ECORRUPT: the checkpoint is dropped, and an anchor fetched */
}
