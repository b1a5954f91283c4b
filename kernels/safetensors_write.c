/* safetensors writer: layout computation (header JSON + offsets, no data
 * touched) and an atomic whole-file writer (temp file, fsync, rename, fsync
 * of the directory).  The JSON is compact, with __metadata__ first and the
 * tensors in the caller's order; the header is padded with spaces to a
 * multiple of 8 bytes, as the reference implementation does. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcast_common.h"
#include "deltacast/safetensors.h"
#include "deltacast/schema.h"
#include "dcast_bytes.h"
#include "dcast_io.h"

typedef struct text_buf {
	char *data;
	size_t len;
	size_t cap;
	int failed;
} text_buf;

static void tb_put(text_buf *b, const char *s, size_t n)
{
	if (b->failed)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *d = realloc(b->data, cap);
		if (!d) {
			b->failed = 1;
			return;
		}
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, s, n);
	b->len += n;
}

static void tb_str(text_buf *b, const char *s)
{
	tb_put(b, s, strlen(s));
}

static void tb_u64(text_buf *b, uint64_t v)
{
	char num[24];
	int n = snprintf(num, sizeof(num), "%" PRIu64, v);
	tb_put(b, num, (size_t)n);
}

/* A JSON string literal: quotes, backslashes and control bytes escaped. */
static void tb_quoted(text_buf *b, const char *s)
{
	tb_put(b, "\"", 1);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[8];
		if (c == '"' || c == '\\') {
			esc[0] = '\\', esc[1] = (char)c;
			tb_put(b, esc, 2);
		} else if (c < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			tb_put(b, esc, 6);
		} else {
			tb_put(b, s, 1);
		}
	}
	tb_put(b, "\"", 1);
}

static void tb_metadata(text_buf *b, const dcast_st_meta *meta, size_t n_meta)
{
	tb_str(b, "\"__metadata__\":{");
	for (size_t i = 0; i < n_meta; i++) {
		if (i)
			tb_str(b, ",");
		tb_quoted(b, meta[i].key);
		tb_str(b, ":");
		tb_quoted(b, meta[i].value);
	}
	tb_str(b, "}");
}

static void tb_tensor(text_buf *b, const dcast_st_spec *s, uint64_t begin, uint64_t end)
{
	tb_quoted(b, s->name);
	tb_str(b, ":{\"dtype\":\"");
	tb_str(b, dcast_st_dtype_name(s->dtype));
	tb_str(b, "\",\"shape\":[");
	for (unsigned d = 0; d < s->ndim; d++) {
		if (d)
			tb_str(b, ",");
		tb_u64(b, s->shape[d]);
	}
	tb_str(b, "],\"data_offsets\":[");
	tb_u64(b, begin);
	tb_str(b, ",");
	tb_u64(b, end);
	tb_str(b, "]}");
}

static int spec_bytes(const dcast_st_spec *s, uint64_t *nbytes)
{
	if (dcast_tensor_name_check(s->name, "safetensors writer"))
		return dcast_fail(DCAST_EINVAL, "%s", dcast_last_error());
	unsigned es = dcast_st_dtype_size(s->dtype);
	if (!es)
		return dcast_fail(DCAST_EDTYPE, "safetensors writer: tensor \"%s\": unknown dtype %d",
				  s->name, s->dtype);
	if (s->ndim > DCAST_ST_MAX_DIMS)
		return dcast_fail(DCAST_ESHAPE, "safetensors writer: tensor \"%s\": %u dims, at most %d",
				  s->name, s->ndim, DCAST_ST_MAX_DIMS);
	uint64_t n = es;
	for (unsigned d = 0; d < s->ndim; d++) {
		if (s->shape[d] && n > UINT64_MAX / 2 / s->shape[d])
			return dcast_fail(DCAST_ESHAPE, "safetensors writer: tensor \"%s\": size overflows",
					  s->name);
		n *= s->shape[d];
	}
	*nbytes = n;
	return 0;
}

static int cmp_spec_name(const void *a, const void *b)
{
	return strcmp((*(const dcast_st_spec *const *)a)->name, (*(const dcast_st_spec *const *)b)->name);
}

static int check_unique(const dcast_st_spec *specs, size_t n)
{
	const dcast_st_spec **idx = malloc((n + 1) * sizeof(*idx));
	if (!idx)
		return dcast_fail(DCAST_ENOMEM, "safetensors writer: out of memory");
	for (size_t i = 0; i < n; i++)
		idx[i] = &specs[i];
	qsort(idx, n, sizeof(*idx), cmp_spec_name);
	int err = 0;
	for (size_t i = 1; i < n && !err; i++)
		if (strcmp(idx[i - 1]->name, idx[i]->name) == 0)
			err = dcast_fail(DCAST_EINVAL, "safetensors writer: duplicate tensor name \"%.80s\"",
					 idx[i]->name);
	free(idx);
	return err;
}

/* Fill the JSON into b and sizes/offsets (relative) into the layout. */
static int build_json(text_buf *b, const dcast_st_spec *specs, size_t n,
		      const dcast_st_meta *meta, size_t n_meta, dcast_st_layout *out)
{
	uint64_t pos = 0;
	tb_str(b, "{");
	if (n_meta)
		tb_metadata(b, meta, n_meta);
	for (size_t i = 0; i < n; i++) {
		int err = spec_bytes(&specs[i], &out->nbytes[i]);
		if (err)
			return err;
		if (i || n_meta)
			tb_str(b, ",");
		tb_tensor(b, &specs[i], pos, pos + out->nbytes[i]);
		out->file_offsets[i] = pos;
		pos += out->nbytes[i];
	}
	tb_str(b, "}");
	while (b->len % 8)
		tb_str(b, " ");
	if (b->failed)
		return dcast_fail(DCAST_ENOMEM, "safetensors writer: out of memory");
	return 0;
}

static int layout_fill(const dcast_st_spec *specs, size_t n, const dcast_st_meta *meta,
		       size_t n_meta, dcast_st_layout *out)
{
	text_buf b = {0};
	tb_str(&b, "01234567"); /* room for the length prefix */
	int err = build_json(&b, specs, n, meta, n_meta, out);
	if (err) {
		free(b.data);
		return err;
	}
	dcast_put_le64(b.data, (uint64_t)(b.len - 8));
	out->header = (unsigned char *)b.data;
	out->header_bytes = b.len;
	for (size_t i = 0; i < n; i++)
		out->file_offsets[i] += b.len;
	out->file_bytes = n ? out->file_offsets[n - 1] + out->nbytes[n - 1] : b.len;
	return 0;
}

int dcast_st_layout_compute(const dcast_st_spec *specs, size_t n, const dcast_st_meta *meta,
			    size_t n_meta, dcast_st_layout *out)
{
	memset(out, 0, sizeof(*out));
	int err = check_unique(specs, n);
	if (err)
		return err;
	out->count = n;
	out->file_offsets = calloc(n + 1, sizeof(uint64_t));
	out->nbytes = calloc(n + 1, sizeof(uint64_t));
	err = out->file_offsets && out->nbytes
		      ? layout_fill(specs, n, meta, n_meta, out)
		      : dcast_fail(DCAST_ENOMEM, "safetensors writer: out of memory");
	if (err)
		dcast_st_layout_free(out);
	return err;
}

void dcast_st_layout_free(dcast_st_layout *layout)
{
	free(layout->header);
	free(layout->file_offsets);
	free(layout->nbytes);
	memset(layout, 0, sizeof(*layout));
}

static int write_data(int fd, const char *tmp, const dcast_st_spec *specs,
		      const dcast_st_layout *lay)
{
	int err = dcast_pwrite_full(fd, lay->header, lay->header_bytes, 0, tmp);
	for (size_t i = 0; i < lay->count && !err; i++) {
		if (!specs[i].data && lay->nbytes[i])
			return dcast_fail(DCAST_EINVAL, "safetensors writer: tensor \"%s\" has no data",
					  specs[i].name);
		err = dcast_pwrite_full(fd, specs[i].data, lay->nbytes[i], lay->file_offsets[i], tmp);
	}
	if (!err && fsync(fd) != 0)
		err = dcast_fail(DCAST_EIO, "%s: fsync: %s", tmp, strerror(errno));
	return err;
}

static void fsync_parent(const char *path)
{
	char *dir = strdup(path);
	if (!dir)
		return;
	char *slash = strrchr(dir, '/');
	const char *d = slash ? (slash == dir ? "/" : (*slash = '\0', dir)) : ".";
	int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	free(dir);
}

static int write_tmp_and_rename(const char *path, const char *tmp, const dcast_st_spec *specs,
				const dcast_st_layout *lay)
{
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return dcast_fail(DCAST_EIO, "%s: create: %s", tmp, strerror(errno));
	int err = write_data(fd, tmp, specs, lay);
	if (close(fd) != 0 && !err)
		err = dcast_fail(DCAST_EIO, "%s: close: %s", tmp, strerror(errno));
	if (!err && rename(tmp, path) != 0)
		err = dcast_fail(DCAST_EIO, "%s: rename to %s: %s", tmp, path, strerror(errno));
	if (err)
		unlink(tmp);
	else
		fsync_parent(path);
	return err;
}

int dcast_st_write(const char *path, const dcast_st_spec *specs, size_t n,
		   const dcast_st_meta *meta, size_t n_meta)
{
	dcast_st_layout lay;
	int err = dcast_st_layout_compute(specs, n, meta, n_meta, &lay);
	if (err)
		return err;
	size_t tlen = strlen(path) + 32;
	char *tmp = malloc(tlen);
	if (!tmp) {
		dcast_st_layout_free(&lay);
		return dcast_fail(DCAST_ENOMEM, "%s: out of memory", path);
	}
	snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
	err = write_tmp_and_rename(path, tmp, specs, &lay);
	free(tmp);
	dcast_st_layout_free(&lay);
	return err;
}
