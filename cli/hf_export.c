/* Writing a Hugging Face layout back from a consumer's live tensors
 * (hf_layout_export, cli/hf_layout.h): every file into a temporary
 * directory beside the target, each fsynced, then the directory swapped in
 * whole, so that a reader of the target never finds a half-written layout
 * or shards of two versions side by side. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "hf_layout.h"

#define TMP_SUFFIX ".deltacast-tmp"
#define OLD_SUFFIX ".deltacast-old"

/* A tiled tensor's bytes in natural order, in a buffer *copy of the caller's. */
static int natural_copy(dcast_consumer *c, const dcast_st_tensor *t, const void **data, void **copy)
{
	if (!(*copy = malloc(t->nbytes ? t->nbytes : 1)))
		return cli_fail(DCAST_ENOMEM, "tensor \"%s\": %llu bytes", t->name, (unsigned long long)t->nbytes);
	int err = dcast_consumer_read_slice(c, t->name, 0, NULL, NULL, *copy, t->nbytes);
	if (err)
		return cli_fail(err, "tensor \"%s\": %s", t->name, dcast_last_error());
	*data = *copy;
	return 0;
}

/* The live host bytes of tensor t of `shard`, after checking that the
 * model publishes it with the header's dtype and shape (a tiled tensor's
 * through *copy, which the caller frees). */
static int live_bytes(dcast_consumer *c, const char *shard, const dcast_st_tensor *t,
		      const void **data, void **copy)
{
	void *ptr = NULL;
	dcast_tensor_desc d;
	dcast_mem mem;

	if (dcast_consumer_tensor(c, t->name, &ptr, &d, &mem))
		return cli_fail(DCAST_ENOTFOUND, "layout shard %s: tensor \"%s\" is not in the model's "
				"manifest", shard, t->name);
	if (strcmp(dcast_dtype_name((int)d.dtype), dcast_st_dtype_name(t->dtype)) != 0 ||
	    d.ndim != t->ndim || memcmp(d.shape, t->shape, t->ndim * sizeof(t->shape[0])) != 0)
		return cli_fail(DCAST_ESHAPE, "layout shard %s: tensor \"%s\" is %s with %u dims in its "
				"header, the model publishes %s with %u dims (or another shape)", shard,
				t->name, dcast_st_dtype_name(t->dtype), t->ndim,
				dcast_dtype_name((int)d.dtype), d.ndim);
	if (mem != DCAST_MEM_HOST)
		return cli_fail(DCAST_EINVAL, "tensor \"%s\" lives on a CUDA device", t->name);
	if (dcast_tensor_tiled(&d))
		return natural_copy(c, t, data, copy);
	*data = ptr;
	return 0;
}

static int open_new(int dirfd, const char *dir, const char *name, int *fd)
{
	*fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	return *fd < 0 ? cli_fail(DCAST_EIO, "%s/%s: create: %s", dir, name, strerror(errno)) : 0;
}

static int close_synced(int fd, const char *dir, const char *name, int err)
{
	if (!err && fsync(fd) != 0)
		err = cli_fail(DCAST_EIO, "%s/%s: fsync: %s", dir, name, strerror(errno));
	if (close(fd) != 0 && !err)
		err = cli_fail(DCAST_EIO, "%s/%s: close: %s", dir, name, strerror(errno));
	return err;
}

static int write_small(int dirfd, const char *dir, const char *name, const void *buf, size_t len)
{
	int fd, err = open_new(dirfd, dir, name, &fd);
	if (err)
		return err;
	err = cli_pwrite_all(fd, buf, len, 0, name);
	return close_synced(fd, dir, name, err);
}

/* One shard: its header as published, then every tensor at its offset. */
static int write_shard(dcast_consumer *c, int dirfd, const char *dir, const hf_shard *s)
{
	size_t hlen;
	const void *hdr = dcast_st_header_bytes(s->file, &hlen), *data = NULL;
	int fd, err = open_new(dirfd, dir, s->name, &fd);

	if (err)
		return err;
	err = cli_pwrite_all(fd, hdr, hlen, 0, s->name);
	for (size_t i = 0; !err && i < dcast_st_count(s->file); i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(s->file, i);
		void *copy = NULL;
		if (!(err = live_bytes(c, s->name, t, &data, &copy)))
			err = cli_pwrite_all(fd, data, t->nbytes, hlen + t->data_offset, s->name);
		free(copy);
	}
	return close_synced(fd, dir, s->name, err);
}

static int sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;

	if (fd < 0 || fsync(fd) != 0)
		err = cli_fail(DCAST_EIO, "%s: fsync: %s", dir, strerror(errno));
	if (fd >= 0)
		close(fd);
	return err;
}

static int write_all(dcast_consumer *c, const hf_layout *l, const char *tmp, uint64_t version)
{
	int dirfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;
	char line[32];

	if (dirfd < 0)
		return cli_fail(DCAST_EIO, "%s: %s", tmp, strerror(errno));
	for (size_t i = 0; !err && i < l->n_shards; i++)
		err = write_shard(c, dirfd, tmp, &l->shards[i]);
	if (!err)
		err = write_small(dirfd, tmp, l->index_name, l->index_json, l->index_len);
	for (size_t i = 0; !err && i < l->n_files; i++)
		err = write_small(dirfd, tmp, l->files[i].name, l->files[i].data, l->files[i].len);
	snprintf(line, sizeof(line), "%" PRIu64 "\n", version);
	if (!err)
		err = write_small(dirfd, tmp, HF_VERSION_FILE, line, strlen(line));
	if (!err && fsync(dirfd) != 0)
		err = cli_fail(DCAST_EIO, "%s: fsync: %s", tmp, strerror(errno));
	close(dirfd);
	return err;
}

/* Remove a directory of plain files (ours); absent is fine.  `report`: 0
 * on a clean-up path, so that the error being reported keeps its detail. */
static int remove_flat(const char *dir, int report)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	const char *what = NULL, *name = "";
	int e_no = 0;

	if (!d && errno != ENOENT)
		what = "opendir", e_no = errno;
	while (d && !what && (e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
		    unlinkat(dirfd(d), e->d_name, 0) != 0)
			what = "unlink", name = e->d_name, e_no = errno;
	if (d)
		closedir(d);
	if (d && !what && rmdir(dir) != 0)
		what = "rmdir", e_no = errno;
	if (!what)
		return 0;
	return report ? cli_fail(DCAST_EIO, "%s/%s: %s: %s", dir, name, what, strerror(e_no))
		      : DCAST_EIO;
}

/* 1 when out exists, 0 when absent; an error when it is not a directory
 * subscribe may replace (empty, or holding HF_VERSION_FILE). */
static int existing_target(const char *out, int *exists)
{
	struct stat st;
	DIR *d;
	struct dirent *e;
	int entries = 0, ours = 0;

	*exists = lstat(out, &st) == 0;
	if (!*exists)
		return errno == ENOENT ? 0 : cli_fail(DCAST_EIO, "%s: %s", out, strerror(errno));
	if (!S_ISDIR(st.st_mode) || !(d = opendir(out)))
		return cli_fail(DCAST_EIO, "%s: not a directory subscribe can write a layout in", out);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
			entries++;
			ours |= strcmp(e->d_name, HF_VERSION_FILE) == 0;
		}
	closedir(d);
	if (entries && !ours)
		return cli_fail(DCAST_EINVAL, "%s holds files but no %s: not a layout subscribe "
				"wrote, refusing to replace it (give an empty or new --layout-dir)",
				out, HF_VERSION_FILE);
	return 0;
}

/* After the exchange tmp holds the layout just replaced.  A loader that
 * opened the directory before the swap reads through that handle: deleting
 * its files now would let a listing see part of a version.  It stays whole
 * as `old` until the next swap; the one before it goes now. */
static int keep_replaced(const char *tmp, const char *old)
{
	int err = remove_flat(old, 1);

	if (!err && rename(tmp, old) != 0)
		err = cli_fail(DCAST_EIO, "rename %s to %s: %s", tmp, old, strerror(errno));
	return err;
}

/* Put the complete directory tmp in place of out. */
static int swap_in(const char *tmp, const char *out, const char *old)
{
	static int said;
	int exists, err = existing_target(out, &exists);

	if (err)
		return err;
	if (!exists)
		return rename(tmp, out) == 0 ? 0 : cli_fail(DCAST_EIO, "rename %s to %s: %s", tmp, out,
							    strerror(errno));
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_EXCHANGE) == 0)
		return keep_replaced(tmp, old);
	if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
		return cli_fail(DCAST_EIO, "exchange %s and %s: %s", tmp, out, strerror(errno));
	if (!said++)
		fprintf(stderr, "deltacast subscribe: %s: this filesystem cannot exchange directories "
			"(%s): the layout is moved away and the new one in, absent for a moment\n",
			out, strerror(errno));
	if ((err = remove_flat(old, 1)))
		return err;
	if (rename(out, old) != 0 || rename(tmp, out) != 0)
		return cli_fail(DCAST_EIO, "replacing %s with %s: %s", out, tmp, strerror(errno));
	return remove_flat(old, 1);
}

static char *parent_of(const char *path)
{
	const char *slash = strrchr(path, '/');
	return slash == path ? strdup("/") : slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
}

/* The layout record the model carries, decoded. */
static int layout_of(dcast_consumer *c, hf_layout *l)
{
	void *rec = NULL;
	dcast_tensor_desc d;
	dcast_mem mem;

	if (dcast_consumer_tensor(c, HF_LAYOUT_TENSOR, &rec, &d, &mem))
		return cli_fail(DCAST_ENOTFOUND, "the model carries no Hugging Face layout (no tensor "
				"%s): it was not published from a directory or a "
				"*.safetensors.index.json", HF_LAYOUT_TENSOR);
	if (d.dtype != DCAST_DTYPE_U8 || d.ndim != 1 || mem != DCAST_MEM_HOST)
		return cli_fail(DCAST_ECORRUPT, "tensor %s is not a U8 vector in host memory",
				HF_LAYOUT_TENSOR);
	if (hf_layout_decode(rec, d.shape[0], l))
		return DCAST_ECORRUPT;
	if (dcast_consumer_tensor_count(c) != l->n_tensors + 1) {
		hf_layout_close(l);
		return cli_fail(DCAST_ESHAPE, "the model has %u tensors, its layout names %zu (and %s)",
				dcast_consumer_tensor_count(c), l->n_tensors, HF_LAYOUT_TENSOR);
	}
	return 0;
}

static int export_paths(dcast_consumer *c, const hf_layout *l, const char *out, char *tmp,
			char *old, char *parent)
{
	int err = remove_flat(tmp, 1); /* left by a run that died while writing */

	if (!err && mkdir(tmp, 0755) != 0)
		err = cli_fail(DCAST_EIO, "%s: mkdir: %s", tmp, strerror(errno));
	if (!err && !(err = write_all(c, l, tmp, dcast_consumer_version(c))) &&
	    !(err = swap_in(tmp, out, old)))
		return sync_dir(parent);
	remove_flat(tmp, 0);
	return err;
}

int hf_layout_export(dcast_consumer *c, const char *out)
{
	hf_layout l;
	char *tmp = cli_concat(out, TMP_SUFFIX, ""), *old = cli_concat(out, OLD_SUFFIX, "");
	char *parent = parent_of(out);
	int err = tmp && old && parent ? 0 : cli_fail(DCAST_ENOMEM, "out of memory");

	if (!err && dcast_consumer_version(c) == DCAST_VERSION_NONE)
		err = cli_fail(DCAST_ESTATE, "no version applied yet: nothing to write to %s", out);
	if (!err && !(err = layout_of(c, &l))) {
		err = export_paths(c, &l, out, tmp, old, parent);
		hf_layout_close(&l);
	}
	free(tmp);
	free(old);
	free(parent);
	return err;
}

void hf_layout_export_end(const char *out)
{
	char *old = cli_concat(out, OLD_SUFFIX, "");

	if (old)
		remove_flat(old, 0);
	free(old);
}
