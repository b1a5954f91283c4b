/* The anchor file DIR/model.safetensors: loaded at open and on restore by
 * reading its data area through dcast_io into the pool's scratch region and
 * copying each piece to the live tensor (host or device); folded from the
 * live tensors the same way in reverse, into a temporary file that is
 * fsynced and renamed over the old one (then the directory is fsynced).
 * Tiled tensors are kept in wire order in memory and in natural order in
 * the file (an ordinary safetensors file), with their grid in metadata
 * "deltacast.grid.NAME" ("2x4"); pieces are reordered through scratch.
 * An anchor received in place is written straight to its own file,
 * model.safetensors.new, made here with the layout of model.safetensors
 * and given its header here at the COMMIT (its seal: anchor_new.c). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "store_impl.h"
#include "dcast_reclog.h"
#include "dcast_bytes.h"
#include "dcast_common.h"
#include "deltacast/codec.h"
#include "deltacast/safetensors.h"

#define GRID_KEY "deltacast.grid."

/* The grid of tensor d from metadata "2x4" (none: untiled). */
static int grid_from_file(const dcast_st_file *f, dcast_tensor_desc *d, const char *path)
{
	char key[sizeof(GRID_KEY) + DCAST_MAX_NAME];
	const char *s;
	char *end;

	snprintf(key, sizeof(key), GRID_KEY "%s", d->name);
	if (!(s = dcast_st_metadata_get(f, key)))
		return 0;
	for (uint32_t i = 0; i < d->ndim; i++, s = end + 1) {
		unsigned long long g = strtoull(s, &end, 10);
		if (end == s || !g || g > UINT32_MAX || d->shape[i] % g || *end != (i + 1 < d->ndim ? 'x' : '\0'))
			return dcast_fail(DCAST_ECORRUPT, "%s: metadata %s is not a grid of %u dims that "
					  "divides the shape", path, key, d->ndim);
		d->grid[i] = (uint32_t)g;
	}
	return 0;
}

/* Tensor table from the file's header when no manifest is known yet. */
static int tensors_from_file(dcast_consumer *c, const dcast_st_file *f)
{
	dcast_manifest m = {0};
	size_t n = dcast_st_count(f);
	int err;

	snprintf(m.model, sizeof(m.model), "%s", c->model);
	m.tensors = calloc(n ? n : 1, sizeof(*m.tensors));
	if (!m.tensors)
		return dcast_fail(DCAST_ENOMEM, "%s: %zu tensors", c->store->anchor_path, n);
	m.n_tensors = (uint32_t)n;
	for (size_t i = 0; i < n; i++) {
		const dcast_st_tensor *s = dcast_st_tensor_at(f, i);
		snprintf(m.tensors[i].name, sizeof(m.tensors[i].name), "%s", s->name);
		int dt = dcast_dtype_from_name(dcast_st_dtype_name(s->dtype));
		if (dt < 0) {
			free(m.tensors);
			return dcast_fail(DCAST_EDTYPE, "%s: tensor %s has dtype %s, not one deltacast carries",
					  c->store->anchor_path, s->name, dcast_st_dtype_name(s->dtype));
		}
		m.tensors[i].dtype = (uint32_t)dt;
		m.tensors[i].ndim = s->ndim;
		memcpy(m.tensors[i].shape, s->shape, sizeof(s->shape));
		if ((err = grid_from_file(f, &m.tensors[i], c->store->anchor_path))) {
			free(m.tensors);
			return err;
		}
	}
	err = cs_tensors_from_manifest(c, &m);
	free(m.tensors);
	return err;
}

/* Read one tensor's bytes at file offset `off` piece by piece via the pool. */
static int read_tensor(dcast_consumer *c, int file, cs_tensor *t, uint64_t off)
{
	unsigned char *scratch = cs_pool_scratch(&c->pool);
	uint64_t piece = c->pool.region_bytes;
	int err = 0;

	for (uint64_t done = 0; !err && done < t->bytes; done += piece) {
		uint64_t n = t->bytes - done < piece ? t->bytes - done : piece;
		err = cs_io_read(c, file, scratch, n, off + done, c->store->anchor_path);
		if (!err)
			err = cs_tensor_write_natural(t, done / t->elem_size, n / t->elem_size, scratch);
	}
	return err;
}

static int read_tensors(dcast_consumer *c, const dcast_st_file *f, int file)
{
	size_t hdr = 0;
	int err = 0;

	dcast_st_header_bytes(f, &hdr);
	for (uint32_t i = 0; !err && i < c->n_tensors; i++) {
		cs_tensor *t = &c->tensors[i];
		const dcast_st_tensor *s = dcast_st_find(f, t->desc.name);
		if (!s || s->nbytes != t->bytes ||
		    dcast_dtype_from_name(dcast_st_dtype_name(s->dtype)) != (int)t->desc.dtype)
			return dcast_fail(DCAST_ESHAPE, "%s: tensor %s missing or of another dtype/size",
					  c->store->anchor_path, t->desc.name);
		err = read_tensor(c, file, t, hdr + s->data_offset);
	}
	return err;
}

/* XXH3-64 of a tensor's name, dtype and shape (and grid, when tiled). */
static uint64_t desc_hash(const dcast_tensor_desc *t)
{
	uint64_t v[3 + 2 * DCAST_MAX_DIMS] = {dcast_checksum(t->name, strlen(t->name)), t->dtype, t->ndim};
	uint32_t n = 3 + t->ndim;

	memcpy(&v[3], t->shape, t->ndim * sizeof(t->shape[0]));
	for (uint32_t i = 0; dcast_tensor_tiled(t) && i < t->ndim; i++)
		v[n++] = t->grid[i];
	return dcast_checksum(v, n * sizeof(v[0]));
}

uint64_t cs_descs_sum(const cs_tensor *t, uint32_t n)
{
	uint64_t seed[2] = {n, CS_FILE_ALIGN}; /* the layout's too: a fold begun with another is not resumed */
	uint64_t sum = dcast_checksum(seed, sizeof(seed));

	for (uint32_t i = 0; i < n; i++) {
		uint64_t pair[2] = {sum, desc_hash(&t[i].desc)};
		sum = dcast_checksum(pair, sizeof(pair));
	}
	return sum;
}

/* The file digest of model.safetensors: XXH3-64 (dcast_checksum) of the
 * little-endian u64s version and, per tensor in manifest order, desc_hash
 * and dcast_digest of its data (td[i]).  Kept in the file's metadata so a
 * load refuses a flipped bit on disk: in the data, a tensor's name, dtype
 * or shape, or the version. */
int cs_file_digest(const cs_tensor *t, uint32_t n, uint64_t version, const uint64_t *td, uint64_t *out)
{
	uint64_t *d = malloc((2 * (size_t)n + 1) * sizeof(*d));

	if (!d)
		return dcast_fail(DCAST_ENOMEM, "checkpoint digest: %u tensors", n);
	d[0] = version;
	for (uint32_t i = 0; i < n; i++) {
		d[1 + 2 * i] = desc_hash(&t[i].desc);
		d[2 + 2 * i] = td[i];
	}
	*out = dcast_checksum(d, (2 * (size_t)n + 1) * sizeof(*d));
	free(d);
	return 0;
}

typedef struct digest_job {
	const dcast_consumer *c;
	uint64_t *td;
	cs_landed *landed; /* the anchor in place's COMMIT: its blocks hashed as they landed */
} digest_job;

/* Host tensor i's digest from the block hashes taken as its chunks landed
 * (ckpt.c), hashing the blocks no chunk held whole. */
static uint64_t landed_digest(const cs_tensor *t, cs_landed *l, uint32_t i)
{
	uint64_t first = l->block[i], n = l->block[i + 1] - first;
	const uint64_t B = DCAST_DIGEST_BLOCK_BYTES;

	for (uint64_t k = 0; k < n; k++)
		if (!l->have[first + k])
			l->hash[first + k] = dcast_checksum(t->ptr + k * B, t->bytes - k * B < B ? t->bytes - k * B : B);
	uint64_t d = dcast_digest_join(l->hash + first, n);

	DCAST_DEBUG_ASSERT(d == dcast_digest(t->ptr, t->bytes));
	return d;
}

static void host_digest(void *arg, unsigned i)
{
	digest_job *j = arg;
	const cs_tensor *t = &j->c->tensors[i];

	if (t->mem == DCAST_MEM_HOST && j->landed)
		j->td[i] = landed_digest(t, j->landed, i);
	else if (t->mem == DCAST_MEM_HOST)
		cs_tensor_digest(t, 0, t->bytes, &j->td[i]); /* cannot fail in host memory */
}

static uint64_t host_bytes(const dcast_consumer *c)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < c->n_tensors; i++)
		n += c->tensors[i].mem == DCAST_MEM_HOST ? c->tensors[i].bytes : 0;
	return n;
}

/* The file digest of the live tensors as version `version`: O(model), the
 * host tensors' digests on several threads (cs_par_for), then the device
 * tensors' on this one.  landed (NULL: none): the anchor in place's
 * COMMIT, whose chunks hashed the blocks they held whole as they landed. */
static int model_digest(dcast_consumer *c, uint64_t version, cs_landed *landed, uint64_t *out)
{
	uint64_t *td = calloc(c->n_tensors ? c->n_tensors : 1, sizeof(*td));
	int err = td ? 0 : dcast_fail(DCAST_ENOMEM, "checkpoint digest: %u tensors", c->n_tensors);

	if (!err)
		cs_par_for(c->n_tensors, host_bytes(c), host_digest,
			   &(digest_job){c, td, landed && landed->hash ? landed : NULL});
	for (uint32_t i = 0; !err && i < c->n_tensors; i++)
		if (c->tensors[i].mem != DCAST_MEM_HOST)
			err = cs_tensor_digest(&c->tensors[i], 0, c->tensors[i].bytes, &td[i]);
	if (!err)
		err = cs_file_digest(c->tensors, c->n_tensors, version, td, out);
	free(td);
	return err;
}

static int check_model_digest(dcast_consumer *c, const dcast_st_file *f, uint64_t version)
{
	const char *want = dcast_st_metadata_get(f, "deltacast.model_digest");
	uint64_t got = 0;
	int err;

	if (!want || !*want)
		return dcast_fail(DCAST_ECORRUPT, "%s: no deltacast.model_digest metadata (damaged, or "
				  "written before names and version were covered)", c->store->anchor_path);
	if ((err = model_digest(c, version, NULL, &got)))
		return err;
	if (strtoull(want, NULL, 16) != got)
		return dcast_fail(DCAST_ECORRUPT,
				  "%s: model digest %016" PRIx64 " (tensor names, shapes, data, version), "
				  "metadata says %s: the file is corrupt", c->store->anchor_path, got, want);
	return 0;
}

int cs_ckpt_foreign(const dcast_consumer *c, const char *what, const char *name)
{
	return dcast_fail(DCAST_ESTATE, "%s holds model %s's checkpoint (%s), not %s's: left as it is; "
			  "give each model its own directory, or remove it", c->dir, name, what, c->model);
}

/* The file is this model's (metadata deltacast.model), before its tensors
 * are read: another model's is left as it is (cs_ckpt_foreign). */
static int owner_check(const dcast_consumer *c, const dcast_st_file *f)
{
	const char *m = dcast_st_metadata_get(f, "deltacast.model");

	return m && strcmp(m, c->model) ? cs_ckpt_foreign(c, "model.safetensors, metadata deltacast.model", m) : 0;
}

/* The open file's owner, version and (when none is known) tensor table. */
static int header_take(dcast_consumer *c, const dcast_st_file *f, uint64_t *version)
{
	const char *vs = dcast_st_metadata_get(f, "deltacast.version");
	int err = owner_check(c, f);

	if (!err && (!vs || !*vs))
		err = dcast_fail(DCAST_ECORRUPT, "%s: no deltacast.version metadata", c->store->anchor_path);
	if (!err)
		*version = strtoull(vs, NULL, 10);
	if (!err && !c->n_tensors)
		err = tensors_from_file(c, f);
	return err;
}

int cs_anchor_header_read(dcast_consumer *c, uint64_t *version)
{
	dcast_st_file *f = NULL;
	int err = dcast_st_open(c->store->anchor_path, &f);

	if (!err)
		err = header_take(c, f, version);
	dcast_st_close(&f);
	return err;
}

int cs_anchor_load(dcast_consumer *c, uint64_t *version)
{
	dcast_st_file *f = NULL;
	int fd = -1, file = -1, err;

	cs_ckpt_settle(c); /* chunk records written behind use the engine too */
	if ((err = dcast_st_open(c->store->anchor_path, &f))) /* header checks */
		return err;
	err = header_take(c, f, version);
	if (!err && (fd = open(c->store->anchor_path, O_RDONLY | O_CLOEXEC)) < 0)
		err = dcast_fail(DCAST_EIO, "%s: open: %s", c->store->anchor_path, strerror(errno));
	if (!err && (file = dcast_io_file_add(c->io, fd, c->store->anchor_path)) < 0)
		err = dcast_fail(-file, "%s: cannot add to the I/O engine", c->store->anchor_path);
	cs_dcache_clear(&c->dcache); /* the tensors are overwritten */
	if (!err)
		err = read_tensors(c, f, file);
	if (!err)
		err = cs_views_refresh(c);
	if (!err)
		err = check_model_digest(c, f, *version);
	if (file >= 0)
		dcast_io_file_remove(c->io, file);
	if (fd >= 0)
		close(fd);
	dcast_st_close(&f);
	return err;
}

/* Write tensor t at off: host tensors straight from their memory, device
 * and tiled tensors through the scratch region (fixed-buffer writes). */
static int write_tensor(dcast_consumer *c, int file, const cs_tensor *t, uint64_t off)
{
	int direct = t->mem == DCAST_MEM_HOST && !t->map.tiled;
	unsigned char *scratch = direct ? NULL : cs_pool_scratch(&c->pool); /* pins the pool */
	uint64_t piece = c->pool.region_bytes;
	int err = 0;

	for (uint64_t done = 0; !err && done < t->bytes; done += piece) {
		uint64_t n = t->bytes - done < piece ? t->bytes - done : piece;
		if (direct) {
			err = dcast_io_write(c->io, file, t->ptr + done, n, off + done, DCAST_IO_NO_BUF, 4);
		} else if (!(err = dcast_io_drain(c->io)) &&
			   !(err = cs_tensor_read_natural(t, done / t->elem_size, n / t->elem_size, scratch))) {
			err = dcast_io_write(c->io, file, scratch, n, off + done,
					     dcast_io_buffers_fixed(c->io) ? 0 : DCAST_IO_NO_BUF, 4);
		}
		if (err == DCAST_EBUSY && !(err = dcast_io_drain(c->io)))
			done -= piece; /* queue was full: submit this piece again */
	}
	return err;
}

/* One metadata entry per tiled tensor: its grid ("2x4"), key and value
 * in one string of store. */
#define GRID_ENTRY (sizeof(GRID_KEY) + DCAST_MAX_NAME + 12 * DCAST_MAX_DIMS)

static size_t grid_meta(const cs_tensor *t, uint32_t nt, dcast_st_meta *meta, char *store)
{
	size_t n = 0;

	for (uint32_t i = 0; i < nt; i++) {
		const dcast_tensor_desc *d = &t[i].desc;
		char *e = store + n * GRID_ENTRY, *v;
		if (!dcast_tensor_tiled(d))
			continue;
		v = e + snprintf(e, GRID_ENTRY, GRID_KEY "%s", d->name) + 1;
		for (uint32_t k = 0, at = 0; k < d->ndim; k++)
			at += (uint32_t)snprintf(v + at, 12, k ? "x%u" : "%u", d->grid[k]);
		meta[n++] = (dcast_st_meta){e, v};
	}
	return n;
}

/* The header padded with spaces (JSON allows them after the object; the
 * 8-byte length counts them) so that the data section starts at a
 * multiple of CS_FILE_ALIGN: an anchor received in place writes its
 * tensors' whole pages there with O_DIRECT (ckpt.c). */
static int pad_header(dcast_st_layout *lay)
{
	size_t to = (lay->header_bytes + CS_FILE_ALIGN - 1) / CS_FILE_ALIGN * CS_FILE_ALIGN;
	size_t more = to - lay->header_bytes;
	unsigned char *h = realloc(lay->header, to);

	if (!h)
		return dcast_fail(DCAST_ENOMEM, "safetensors header of %zu bytes", to);
	memset(h + lay->header_bytes, ' ', more);
	dcast_put_le64(h, (uint64_t)(to - 8));
	lay->header = h;
	lay->header_bytes = to;
	for (size_t i = 0; i < lay->count; i++)
		lay->file_offsets[i] += more;
	lay->file_bytes += more;
	return 0;
}

int cs_anchor_layout(const char *model, const cs_tensor *t, uint32_t nt, uint64_t version, const char *digest,
		     dcast_st_layout *lay)
{
	size_t n = nt ? nt : 1;
	dcast_st_meta *meta = calloc(n + 3, sizeof(*meta));
	dcast_st_spec *specs = calloc(n, sizeof(*specs));
	char *store = calloc(n, GRID_ENTRY), vbuf[32];
	size_t n_grid = 0;
	int err = 0;

	if (!specs || !meta || !store)
		err = dcast_fail(DCAST_ENOMEM, "fold: %u tensors", nt);
	else
		n_grid = grid_meta(t, nt, meta + 3, store); /* the tiled tensors' grids, after 3 entries */
	for (uint32_t i = 0; !err && i < nt; i++) {
		const char *dn = dcast_dtype_name((int)t[i].desc.dtype);
		specs[i].name = t[i].desc.name;
		specs[i].dtype = dcast_st_dtype_from_name(dn, strlen(dn));
		specs[i].ndim = t[i].desc.ndim;
		memcpy(specs[i].shape, t[i].desc.shape, sizeof(specs[i].shape));
	}
	if (!err) {
		snprintf(vbuf, sizeof(vbuf), "%" PRIu64, version);
		meta[0] = (dcast_st_meta){"deltacast.model", model};
		meta[1] = (dcast_st_meta){"deltacast.version", vbuf};
		meta[2] = (dcast_st_meta){"deltacast.model_digest", digest};
		err = dcast_st_layout_compute(specs, nt, meta, 3 + n_grid, lay);
	}
	if (!err && (err = pad_header(lay)))
		dcast_st_layout_free(lay);
	free(specs), free(meta), free(store);
	return err;
}

static int write_file(dcast_consumer *c, int file, const dcast_st_layout *lay)
{
	int err = dcast_io_write(c->io, file, lay->header, lay->header_bytes, 0, DCAST_IO_NO_BUF, 4);

	for (uint32_t i = 0; !err && i < c->n_tensors; i++)
		err = write_tensor(c, file, &c->tensors[i], lay->file_offsets[i]);
	int derr = dcast_io_sync(c->io, file, 0);
	return err ? err : derr;
}

/* Temporary file, fsync, rename over the anchor, fsync the directory. */
static int write_anchor(dcast_consumer *c, const dcast_st_layout *lay)
{
	char tmp[4200];
	int fd, file, err;

	if ((err = c->store->sink->durable(c)))
		return err;
	snprintf(tmp, sizeof(tmp), "%s.tmp", c->store->anchor_path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return dcast_fail(DCAST_EIO, "%s: create: %s", tmp, strerror(errno));
	file = dcast_io_file_add(c->io, fd, tmp);
	err = file < 0 ? dcast_fail(-file, "%s: cannot add to the I/O engine", tmp) : write_file(c, file, lay);
	if (file >= 0) {
		int rerr = dcast_io_file_remove(c->io, file);
		err = err ? err : rerr;
	}
	close(fd);
	if (!err && rename(tmp, c->store->anchor_path) != 0)
		err = dcast_fail(DCAST_EIO, "%s: rename to %s: %s", tmp, c->store->anchor_path, strerror(errno));
	if (err)
		unlink(tmp);
	return err ? err : dcast_fsync_dir(c->dir);
}

/* The layout of model.safetensors for the live tensors as version v
 * (landed: as model_digest). */
static int live_layout(dcast_consumer *c, uint64_t v, cs_landed *landed, dcast_st_layout *lay)
{
	uint64_t digest = 0;
	char dbuf[32];
	int err = model_digest(c, v, landed, &digest);

	if (err)
		return err;
	snprintf(dbuf, sizeof(dbuf), "%016" PRIx64, digest);
	return cs_anchor_layout(c->model, c->tensors, c->n_tensors, v, dbuf, lay);
}

/* The header of model.safetensors as v, the anchor in place, at its
 * COMMIT (its file digest from the live tensors and the blocks hashed as
 * they landed: `landed`, taken from the store), written behind at offset
 * 0 of its file, as its chunks' ranges are: the session thread does not
 * wait for the disk, nor, where the I/O engine runs syscalls on threads,
 * behind their writes for the file's lock.  The store keeps the header
 * until the file's writes are done (new_header).  Errors: DCAST_EIO,
 * DCAST_ENOMEM, DCAST_ENODEVICE. */
static int new_header_submit(dcast_consumer *c, const cs_version *v, cs_landed *landed)
{
	dcast_st_layout lay;
	unsigned char *header;
	int err = live_layout(c, v->version, landed, &lay);

	if (err)
		return err;
	header = lay.header;
	lay.header = NULL; /* the store's from here */
	cs_store_lock(c->store);
	DCAST_ASSERT(!c->store->new_header); /* one anchor in place at a time */
	c->store->new_header = header;
	cs_store_unlock(c->store);
	err = cs_ckpt_direct_bytes(c, v, header, 0, lay.header_bytes);
	dcast_st_layout_free(&lay);
	return err;
}

static void new_header_free(dcast_consumer *c)
{
	cs_ckpt_settle(c); /* none of its writes reads it now */
	cs_store_lock(c->store);
	free(c->store->new_header);
	c->store->new_header = NULL;
	cs_store_unlock(c->store);
}

/* ---- an anchor received in place: its file ----
 * model.safetensors.new, made at the anchor's first chunk at the offsets
 * of its layout, each chunk's range written there behind (ckpt.c), its
 * header written at the COMMIT; what follows its apply (the rename to
 * .applied, the seal, the adoption at open) is anchor_new.c's. */

void cs_anchor_new_path(const dcast_consumer *c, int applied, char *out, size_t cap)
{
	snprintf(out, cap, "%s.%s", c->store->anchor_path, applied ? "applied" : "new");
}

static void landed_free(cs_landed *l)
{
	free(l->hash), free(l->block), free(l->have);
	*l = (cs_landed){0};
}

void cs_anchor_new_release(dcast_consumer *c)
{
	int fd, file;

	cs_ckpt_settle(c); /* every write: removing a file from the engine drains it */
	cs_store_lock(c->store);
	fd = c->store->new_fd;
	file = c->store->new_file;
	c->store->new_fd = c->store->new_file = -1;
	if (file >= 0)
		dcast_io_file_remove(c->io, file);
	free(c->store->new_header); /* its write was one of them */
	c->store->new_header = NULL;
	cs_store_unlock(c->store);
	if (fd >= 0)
		close(fd);
}

void cs_anchor_new_drop(dcast_consumer *c)
{
	char path[4200];

	cs_ckpt_forget_direct(c); /* its writes still waiting are moot */
	cs_anchor_new_release(c); /* its writes done: none reads the tensors or writes the file */
	cs_store_lock(c->store);
	if (c->store->new_version != DCAST_VERSION_NONE)
		c->store->gen++; /* armed: a seal of it running is not renamed over model.safetensors */
	cs_anchor_new_path(c, 0, path, sizeof(path));
	unlink(path);
	cs_anchor_new_path(c, 1, path, sizeof(path));
	unlink(path);
	cs_anchor_new_forget(c->store);
	c->store->new_version = DCAST_VERSION_NONE;
	cs_store_unlock(c->store);
}

void cs_anchor_new_forget(struct cs_store *s)
{
	DCAST_DEBUG_ASSERT(cs_store_held(s));
	free(s->new_offs);
	s->new_offs = NULL;
	landed_free(&s->new_landed);
}

/* The block hashes' tables for the tensors, or none (hash NULL): they
 * only spare the COMMIT a pass. */
static cs_landed landed_alloc(const dcast_consumer *c)
{
	cs_landed l = {0};
	uint64_t n = 0;

	if (!(l.block = malloc((c->n_tensors + 1) * sizeof(*l.block))))
		return l;
	for (uint32_t i = 0; i < c->n_tensors; i++) {
		l.block[i] = n;
		n += (c->tensors[i].bytes + DCAST_DIGEST_BLOCK_BYTES - 1) / DCAST_DIGEST_BLOCK_BYTES;
	}
	l.block[c->n_tensors] = n;
	l.hash = malloc((n ? n : 1) * sizeof(*l.hash));
	l.have = calloc(n ? n : 1, 1);
	if (!l.hash || !l.have)
		landed_free(&l);
	return l;
}

/* Each tensor whose offset in the file suits its elements lies in the
 * arena at an address congruent to it (state.c): its whole pages go from
 * there with O_DIRECT (ckpt.c).  Tensors received in place are the
 * arena's (intake.c, in_place_ok). */
static void arena_congruent(const dcast_consumer *c, const uint64_t *offs)
{
	for (uint32_t i = 0; i < c->n_tensors; i++) {
		const cs_tensor *t = &c->tensors[i];
		DCAST_ASSERT(t->ptr == t->host);
		DCAST_ASSERT(offs[i] % t->elem_size || ((uintptr_t)t->ptr - offs[i]) % CS_FILE_ALIGN == 0);
	}
}

/* The file's blocks, all of them, now: its writes run behind the COMMIT
 * (READY does not wait for them), so a disk too full to hold the anchor
 * must refuse it here, before anything is READY, not in a write after.
 * A file system without fallocate gets the size alone (a full disk then
 * fails a write: before the COMMIT the version goes, after it the seal
 * does).  Errors: DCAST_EIO (ENOSPC included). */
static int new_reserve(int fd, uint64_t bytes, const char *path)
{
	if (fallocate(fd, 0, 0, (off_t)bytes) == 0)
		return 0;
	if (errno != EOPNOTSUPP && errno != ENOSYS)
		return dcast_fail(DCAST_EIO, "%s: reserving the anchor's %" PRIu64 " bytes: %s", path, bytes,
				  strerror(errno));
	if (ftruncate(fd, (off_t)bytes) != 0)
		return dcast_fail(DCAST_EIO, "%s: truncate to %" PRIu64 " bytes: %s", path, bytes, strerror(errno));
	return 0;
}

/* The file at its full size, each tensor's offset in c->store->new_offs
 * (and the file opened a second time with O_DIRECT, where it may be); the
 * header is written at the COMMIT. */
static int new_create(dcast_consumer *c, cs_version *v)
{
	char path[4200], zero[32];
	dcast_st_layout lay;
	uint64_t *offs;
	int err;

	cs_anchor_new_drop(c); /* one anchor in place at a time: any other is moot */
	cs_store_lock(c->store);
	c->store->new_write_lost = 0;
	c->store->new_write_why[0] = '\0';
	cs_store_unlock(c->store);
	snprintf(zero, sizeof(zero), "%016" PRIx64, (uint64_t)0);
	if ((err = cs_anchor_layout(c->model, c->tensors, c->n_tensors, v->version, zero, &lay)))
		return err;
	cs_anchor_new_path(c, 0, path, sizeof(path));
	offs = malloc(c->n_tensors * sizeof(*offs));
	if (!offs)
		err = dcast_fail(DCAST_ENOMEM, "%s: %u tensor offsets", path, c->n_tensors);
	else
		memcpy(offs, lay.file_offsets, c->n_tensors * sizeof(*offs));
	cs_store_lock(c->store);
	c->store->new_offs = offs; /* freed by the drop below on a failure */
	if (offs)
		c->store->new_landed = landed_alloc(c);
	cs_store_unlock(c->store);
	v->fd = err ? -1 : open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (!err && v->fd < 0)
		err = dcast_fail(DCAST_EIO, "%s: create: %s", path, strerror(errno));
	if (!err)
		err = new_reserve(v->fd, lay.file_bytes, path);
	dcast_st_layout_free(&lay);
	v->file_bytes = 0;
	if (!err && !(err = cs_ckpt_io_attach(c, v, path))) {
		if (dcast_io_file_direct(c->io, v->io_file, path))
			arena_congruent(c, offs);
		return 0;
	}
	cs_anchor_new_drop(c);
	return err;
}

/* The header, now: its file digest comes from the blocks' hashes, not
 * from the file.  The chunks' writes go on behind (ckpt.c): the version is
 * READY once received and checked, not once the disk has it; the file's
 * descriptor and handle become the store's, as the version goes at its
 * apply; its seal waits for those writes (anchor_new.c). */
static int new_commit(dcast_consumer *c, cs_version *v)
{
	cs_landed landed;
	int err;

	cs_store_lock(c->store);
	landed = c->store->new_landed; /* the COMMIT's: no chunk lands after it */
	c->store->new_landed = (cs_landed){0};
	cs_anchor_new_forget(c->store);
	cs_store_unlock(c->store);
	err = new_header_submit(c, v, &landed);
	landed_free(&landed);
	if (err) {
		new_header_free(c);
		return err;
	}
	cs_store_lock(c->store);
	DCAST_ASSERT(c->store->new_fd < 0 && c->store->new_file < 0); /* one anchor in place at a time */
	c->store->new_fd = v->fd;
	c->store->new_file = v->io_file;
	v->fd = v->io_file = -1;
	cs_store_unlock(c->store);
	return 0;
}

/* ---- a staged version's file: the anchor file in place, or a record file ---- */

int cs_store_version_create(dcast_consumer *c, cs_version *v)
{
	return v->direct ? new_create(c, v) : cs_ckpt_version_create(c, v);
}

int cs_store_version_commit(dcast_consumer *c, cs_version *v)
{
	return v->direct ? new_commit(c, v) : cs_ckpt_commit_write(c, v);
}

void cs_store_version_drop(dcast_consumer *c, const cs_version *v, int unlink_file)
{
	if (!v->direct) /* records: an anchor's file's writes behind go on (the disk's time) */
		cs_ckpt_settle_log(c);
	else if (v->io_file >= 0 && !unlink_file) /* its own file, before its COMMIT (the store's after) */
		cs_ckpt_settle(c);
	if (unlink_file && v->direct) /* its waiting writes forgotten, the rest waited for */
		cs_anchor_new_drop(c);
	else if (unlink_file)
		cs_ckpt_remove(c, v->version);
}

void cs_fold_tmp_path(const dcast_consumer *c, char *out, size_t cap)
{
	snprintf(out, cap, "%s.fold", c->store->anchor_path);
}

void cs_fold_state_path(const dcast_consumer *c, char *out, size_t cap)
{
	snprintf(out, cap, "%s.fold.state", c->store->anchor_path);
}

void cs_fold_leftovers_drop(const dcast_consumer *c)
{
	char p[4200];

	cs_fold_state_path(c, p, sizeof(p));
	unlink(p); /* first: a progress record without its fold's file is stale (cs_fold_resume) */
	cs_fold_tmp_path(c, p, sizeof(p));
	unlink(p);
}

/* The anchor file's version. */
static uint64_t file_version(cs_store *s)
{
	uint64_t v;

	cs_store_lock(s);
	v = s->anchor_file_version;
	cs_store_unlock(s);
	return v;
}

/* model.safetensors renamed as version v, written from the tensors: the
 * counts since the last fold start again.  1 when the anchor received in
 * place not sealed yet is moot (this file holds it or newer). */
static int folded_live(cs_store *s, uint64_t v)
{
	int moot;

	cs_store_lock(s);
	s->anchor_file_version = v;
	s->deltas_since_fold = 0;
	s->log_since_fold = 0;
	s->gen++; /* a fold running from the disk is not renamed over this */
	s->folds++;
	s->folds_live++;
	moot = s->new_version != DCAST_VERSION_NONE && s->new_version <= v;
	cs_store_unlock(s);
	return moot;
}

int cs_ckpt_fold(dcast_consumer *c)
{
	uint64_t v = dcast_consumer_version(c), *vers;
	dcast_st_layout lay;
	uint32_t n = 0;
	int err;

	if (v == DCAST_VERSION_NONE || v == file_version(c->store))
		return 0; /* nothing to fold */
	cs_ckpt_settle(c); /* chunk records written behind use the engine too */
	if ((err = live_layout(c, v, NULL, &lay)))
		return err;
	err = write_anchor(c, &lay);
	dcast_st_layout_free(&lay);
	if (err)
		return err;
	cs_fold_leftovers_drop(c); /* a fold from the disk stopped halfway: this file replaces it */
	if (folded_live(c->store, v))
		cs_anchor_new_drop(c); /* the anchor not sealed yet: this file holds it or newer */
	vers = malloc(CS_MAX_LOG_FILES * sizeof(*vers));
	if (vers && cs_ckpt_list(c, vers, CS_MAX_LOG_FILES, &n) == 0)
		for (uint32_t i = 0; i < n && vers[i] <= v; i++)
			cs_ckpt_remove(c, vers[i]);
	free(vers);
	return 0;
}

static uint64_t model_bytes(const dcast_consumer *c)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < c->n_tensors; i++)
		n += c->tensors[i].bytes;
	return n;
}

int cs_fold_wanted(const dcast_consumer *c)
{
	uint64_t deltas, logged;

	cs_store_lock(c->store);
	deltas = c->store->deltas_since_fold;
	logged = c->store->log_since_fold;
	cs_store_unlock(c->store);
	if (c->opts.fold_every && deltas >= c->opts.fold_every)
		return 1;
	return c->opts.fold_fraction > 0 && (double)logged > c->opts.fold_fraction * (double)model_bytes(c);
}
