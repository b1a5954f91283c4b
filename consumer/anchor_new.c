/* An anchor received in place, written once: straight to
 * DIR/model.safetensors.new at the offsets model.safetensors will have,
 * instead of a record file that a fold later rewrites into that file
 * (the anchor's bytes written twice and read twice more).  Each chunk's
 * range of the tensor goes there behind, as its record would (ckpt.c,
 * write-behind queue).  Its COMMIT keeps the version's digests; the fold
 * thread seals the file off the stream's path and off `lock` (fold.c:
 * read back once, every COMMIT digest checked, the header with the file
 * digest written, fdatasync), then renames it over model.safetensors and
 * fsyncs the folder under `lock`, unless the checkpoint moved meanwhile
 * (c->ck.gen).  Until the rename the version is not durable: a restart
 * removes the file and fetches the anchor again.  Models with tiled
 * tensors (wire order in memory, natural order in the file) keep the
 * record file. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "deltacast/safetensors.h"

/* The file at its full size, each tensor's offset in c->ck.new_offs;
 * the header, with its file digest, is the seal's. */
int cs_anchor_new_create(dcast_consumer *c, cs_version *v)
{
	char path[4200], zero[32];
	dcast_st_layout lay;
	int err, h;

	cs_anchor_new_drop(c); /* one anchor in place at a time: any other is moot */
	snprintf(zero, sizeof(zero), "%016" PRIx64, (uint64_t)0);
	if ((err = cs_anchor_layout(c->model, c->tensors, c->n_tensors, v->version, zero, &lay)))
		return err;
	cs_anchor_new_path(c, path, sizeof(path));
	c->ck.new_offs = malloc(c->n_tensors * sizeof(*c->ck.new_offs));
	if (!c->ck.new_offs)
		err = dcast_fail(DCAST_ENOMEM, "%s: %u tensor offsets", path, c->n_tensors);
	else
		memcpy(c->ck.new_offs, lay.file_offsets, c->n_tensors * sizeof(*c->ck.new_offs));
	v->fd = err ? -1 : open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (!err && (v->fd < 0 || ftruncate(v->fd, (off_t)lay.file_bytes) != 0))
		err = dcast_fail(DCAST_EIO, "%s: create: %s", path, strerror(errno));
	dcast_st_layout_free(&lay);
	if (!err && (h = dcast_io_file_add(c->io, v->fd, path)) < 0)
		err = dcast_fail(-h, "%s: cannot add to the I/O engine", path);
	if (err) {
		cs_anchor_new_drop(c);
		return err;
	}
	v->io = c->io;
	v->io_file = h;
	v->file_bytes = 0;
	return 0;
}

/* Every chunk written (or the failure reported); the digests kept for the
 * seal, which the fold thread is woken for (fold_due). */
int cs_anchor_new_commit(dcast_consumer *c, cs_version *v)
{
	size_t n = v->commit.n_digests;
	int err = cs_ckpt_flush(c);

	if (err)
		return err;
	if (!(c->ck.new_dig = malloc((n ? n : 1) * sizeof(*c->ck.new_dig))))
		return dcast_fail(DCAST_ENOMEM, "anchor %" PRIu64 ": %zu digests", v->version, n);
	memcpy(c->ck.new_dig, v->commit.digests, n * sizeof(*c->ck.new_dig));
	c->ck.n_new_dig = (uint32_t)n;
	c->ck.new_version = v->version;
	free(c->ck.new_offs);
	c->ck.new_offs = NULL;
	c->ss.fold_due = 1;
	return 0;
}
