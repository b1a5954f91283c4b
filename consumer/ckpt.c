/* The local checkpoint: DIR/model.safetensors (the newest folded anchor,
 * metadata "deltacast.version") and DIR/model.dlog/<version>.rec, one record
 * file per version staged after it.  A record file holds, in order: for an
 * anchor a MANIFEST record, then one CHUNK record per distinct chunk, then
 * one COMMIT record.  A file without its COMMIT record, with a torn or
 * corrupt record, or whose version does not follow the one before, is cut:
 * it and every later file are removed, so the checkpoint always ends at the
 * last whole version.  Records are written through dcast_io (io_uring),
 * their writeback started at once, and fdatasynced after the COMMIT record
 * by the sync thread (syncer.c): READY does not wait for the disk. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "deltacast/safetensors.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "record files are little-endian; add byte swapping for this target"
#endif

void cs_ckpt_version_path(const dcast_consumer *c, uint64_t version, char *out, size_t cap)
{
	snprintf(out, cap, "%s/%020" PRIu64 ".rec", c->log_dir, version);
}

static int pool_index(const dcast_consumer *c, const void *p, uint64_t len)
{
	const unsigned char *b = p;

	return b >= c->pool.base && b + len <= c->pool.base + c->pool.bytes &&
	       dcast_io_buffers_fixed(c->io) ? 0 : DCAST_IO_NO_BUF;
}

/* Bind a version's record file to the I/O engine. */
static int io_attach(dcast_consumer *c, cs_version *v, const char *path)
{
	int h = dcast_io_file_add(c->io, v->fd, path);

	if (h < 0)
		return dcast_fail(-h, "%s: cannot add to the I/O engine", path);
	v->io = c->io;
	v->io_file = h;
	return 0;
}

static void hdr_seal(rec_hdr *h)
{
	h->magic = REC_MAGIC;
	h->hdr_checksum = dcast_checksum(h, offsetof(rec_hdr, hdr_checksum));
}

/* Start the disk writing the record now (best effort: the fdatasync at
 * COMMIT is what makes it durable), so that the disk works while the next
 * chunks arrive and that fdatasync waits for the last few only. */
static void start_writeback(const cs_version *v, uint64_t off, uint64_t len)
{
	(void)sync_file_range(v->fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE);
}

static int append(dcast_consumer *c, cs_version *v, rec_hdr *h, const void *body,
		  uint64_t *body_off)
{
	uint64_t t0 = dcast_now_ns();
	int err;

	hdr_seal(h);
	err = dcast_io_write(c->io, v->io_file, h, sizeof(*h), v->file_bytes, DCAST_IO_NO_BUF, 1);
	if (!err && h->body_len)
		err = dcast_io_write(c->io, v->io_file, body, h->body_len, v->file_bytes + sizeof(*h),
				     pool_index(c, body, h->body_len), 2);
	int derr = dcast_io_drain(c->io); /* h lives on the caller's stack */
	c->log_write_ns += dcast_now_ns() - t0;
	if (err || (err = derr))
		return err;
	c->log_write_bytes += sizeof(*h) + h->body_len;
	c->log_since_fold += sizeof(*h) + h->body_len;
	start_writeback(v, v->file_bytes, sizeof(*h) + h->body_len);
	if (body_off)
		*body_off = v->file_bytes + sizeof(*h);
	v->file_bytes += sizeof(*h) + h->body_len;
	return 0;
}

static int write_manifest(dcast_consumer *c, cs_version *v)
{
	dcast_msg m;
	void *buf = NULL;
	size_t len = 0;
	rec_hdr h = {0};
	int err;

	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	snprintf(m.u.manifest.model, sizeof(m.u.manifest.model), "%s", c->model);
	m.u.manifest.n_tensors = c->n_tensors;
	m.u.manifest.tensors = calloc(c->n_tensors ? c->n_tensors : 1, sizeof(dcast_tensor_desc));
	if (!m.u.manifest.tensors)
		return dcast_fail(DCAST_ENOMEM, "manifest record");
	for (uint32_t i = 0; i < c->n_tensors; i++)
		m.u.manifest.tensors[i] = c->tensors[i].desc;
	err = dcast_msg_encode(&m, &buf, &len);
	free(m.u.manifest.tensors);
	if (err)
		return err;
	h.type = REC_MANIFEST;
	h.version = v->version;
	h.base_version = v->base_version;
	h.anchor = (uint32_t)v->anchor;
	h.body_len = len;
	h.body_checksum = dcast_checksum(buf, len);
	err = append(c, v, &h, buf, NULL);
	free(buf);
	return err;
}

int cs_ckpt_version_create(dcast_consumer *c, cs_version *v)
{
	char path[4096];

	cs_ckpt_version_path(c, v->version, path, sizeof(path));
	v->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (v->fd < 0)
		return dcast_fail(DCAST_EIO, "%s: create: %s", path, strerror(errno));
	v->file_bytes = 0;
	int err = io_attach(c, v, path);
	if (err)
		return err;
	return v->anchor ? write_manifest(c, v) : 0;
}

int cs_ckpt_chunk_write(dcast_consumer *c, cs_version *v, const dcast_chunk *k,
			const void *payload, uint64_t payload_sum, uint64_t *payload_off)
{
	rec_hdr h = {0};

	h.type = REC_CHUNK;
	h.version = k->version;
	h.base_version = k->base_version;
	h.anchor = k->anchor;
	h.part = k->part;
	h.seq_or_chunks = k->seq;
	h.tensor_or_ndigests = k->tensor;
	h.start_or_bytes = k->start;
	h.count = k->count;
	h.elem_size = k->elem_size;
	h.encoding = k->encoding;
	h.changed = k->changed;
	h.body_len = k->payload_bytes;
	h.body_checksum = payload_sum;
	return append(c, v, &h, payload, payload_off);
}

int cs_ckpt_commit_write(dcast_consumer *c, cs_version *v)
{
	const dcast_commit *m = &v->commit;
	uint64_t n = m->n_digests;
	rec_digest *d = calloc(n ? n : 1, sizeof(*d));
	rec_hdr h = {0};
	int err;

	if (!d)
		return dcast_fail(DCAST_ENOMEM, "commit record of version %" PRIu64, v->version);
	for (uint64_t i = 0; i < n; i++)
		d[i] = (rec_digest){m->digests[i].tensor, 0, m->digests[i].start,
				    m->digests[i].count, m->digests[i].digest};
	h.type = REC_COMMIT;
	h.version = v->version;
	h.base_version = v->base_version;
	h.anchor = (uint32_t)v->anchor;
	h.seq_or_chunks = v->n_chunks;
	h.tensor_or_ndigests = (uint32_t)n;
	h.start_or_bytes = v->bytes;
	h.body_len = n * sizeof(*d);
	h.body_checksum = dcast_checksum(d, h.body_len);
	err = append(c, v, &h, d, NULL);
	free(d);
	return err ? err : cs_syncer_push(&c->syncer, v->fd, v->version); /* durable later */
}

int cs_io_read(dcast_consumer *c, int file, void *dst, uint64_t len, uint64_t off, const char *what)
{
	dcast_io_done d;
	int n, err = dcast_io_read(c->io, file, dst, len, off, pool_index(c, dst, len), 3);

	if (err)
		return err;
	n = dcast_io_wait(c->io, 1, &d, 1);
	if (n < 0)
		return -n;
	if (n == 1 && !d.err && d.bytes == len)
		return 0;
	return n == 1 && d.err ? d.err : dcast_fail(DCAST_ETRUNCATED, "%s: %" PRIu64 " bytes at %"
						      PRIu64 " run past its end", what, len, off);
}

int cs_ckpt_read_payload(dcast_consumer *c, const cs_version *v, const cs_chunk *k, void *dst)
{
	char path[4096];
	int err;

	cs_ckpt_version_path(c, v->version, path, sizeof(path));
	if (v->io_file < 0 && (err = io_attach(c, (cs_version *)v, path)))
		return err;
	return cs_io_read(c, v->io_file, dst, k->info.payload_bytes, k->file_off, path);
}
