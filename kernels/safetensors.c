/* Strict safetensors reader and atomic writer (include/deltacast/safetensors.h).
 * The reader parses the JSON header with its own strict parser, checks every
 * tensor entry, then checks that the tensors tile the data area exactly:
 * sorted by offset, the first starts at 0, each starts where the previous
 * ended, and the last ends at the end of the file. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcast_common.h"
#include "deltacast/safetensors.h"
#include "safetensors_json.h"
#include "dcast_bytes.h"

struct dcast_st_file {
	char *label;               /* path or caller's label, for errors */
	dcast_json root;           /* the parsed header; names point into it */
	dcast_st_tensor *tensors;  /* sorted by data offset */
	size_t count;
	const dcast_st_tensor **by_name; /* sorted by name */
	const dcast_json **meta;   /* __metadata__ members */
	size_t meta_count;
	const unsigned char *header; /* 8-byte prefix + JSON */
	size_t header_len;
	unsigned char *header_copy;  /* owned header, for dcast_st_parse_header */
	uint64_t data_bytes;
	void *map;                 /* owned mapping (dcast_st_open) */
	size_t map_len;
};

/* The names and sizes are the wire's dtype table (schema/tables.c). */
const char *dcast_st_dtype_name(int dtype)
{
	return dcast_dtype_name(dtype);
}

unsigned dcast_st_dtype_size(int dtype)
{
	return dcast_dtype_size(dtype) * dcast_dtype_lanes(dtype);
}

int dcast_st_dtype_from_name(const char *name, size_t len)
{
	char z[16]; /* longer than any dtype name */

	if (len >= sizeof(z) || memchr(name, '\0', len))
		return -1;
	memcpy(z, name, len);
	z[len] = '\0';
	return dcast_dtype_from_name(z);
}

/* ---- reading ---- */

/* Element count and byte size of a shape, refusing overflow. */
static int shape_size(const char *label, const char *name, dcast_st_tensor *t)
{
	uint64_t count = 1;
	for (unsigned d = 0; d < t->ndim; d++) {
		if (t->shape[d] && count > UINT64_MAX / t->shape[d])
			return dcast_fail(DCAST_ESHAPE, "%s: tensor \"%s\": shape overflows 64 bits",
					  label, name);
		count *= t->shape[d];
	}
	if (count > UINT64_MAX / t->elem_size)
		return dcast_fail(DCAST_ESHAPE, "%s: tensor \"%s\": byte size overflows 64 bits",
				  label, name);
	t->count = count;
	t->nbytes = count * t->elem_size;
	return 0;
}

/* An array of non-negative integers, at most `max` of them. */
static int uint_array(const char *label, const char *name, const char *field,
		      const dcast_json *v, uint64_t *out, size_t max, size_t *n)
{
	if (!v || v->type != DCAST_JSON_ARRAY)
		return dcast_fail(DCAST_EMALFORMED, "%s: tensor \"%s\": \"%s\" %s", label, name,
				  field, v ? "is not an array" : "is missing");
	if (v->nkids > max)
		return dcast_fail(strcmp(field, "shape") ? DCAST_EMALFORMED : DCAST_ESHAPE,
				  "%s: tensor \"%s\": \"%s\" has %zu entries, at most %zu", label,
				  name, field, v->nkids, max);
	for (size_t i = 0; i < v->nkids; i++) {
		if (v->kids[i].type != DCAST_JSON_INT || v->kids[i].negative)
			return dcast_fail(DCAST_EMALFORMED,
					  "%s: tensor \"%s\": \"%s\"[%zu] is not a non-negative integer",
					  label, name, field, i);
		out[i] = v->kids[i].num;
	}
	*n = v->nkids;
	return 0;
}

static int tensor_dtype(const char *label, const dcast_json *e, dcast_st_tensor *t)
{
	const dcast_json *v = dcast_json_get(e, "dtype");
	if (!v || v->type != DCAST_JSON_STRING)
		return dcast_fail(DCAST_EMALFORMED, "%s: tensor \"%s\": \"dtype\" %s", label, t->name,
				  v ? "is not a string" : "is missing");
	t->dtype = dcast_st_dtype_from_name(v->str, v->str_len);
	if (t->dtype < 0)
		return dcast_fail(DCAST_EDTYPE, "%s: tensor \"%s\": unknown dtype \"%.40s\"", label,
				  t->name, v->str);
	t->elem_size = dcast_st_dtype_size(t->dtype);
	return 0;
}

static int tensor_fields_known(const char *label, const dcast_json *e)
{
	for (size_t i = 0; i < e->nkids; i++) {
		const char *k = e->kids[i].key;
		if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
			return dcast_fail(DCAST_EMALFORMED, "%s: tensor \"%s\": unknown field \"%.80s\"",
					  label, e->key, k);
	}
	return 0;
}

static int tensor_offsets(const char *label, const dcast_json *e, dcast_st_tensor *t)
{
	uint64_t off[2];
	size_t n = 0;
	int err = uint_array(label, t->name, "data_offsets", dcast_json_get(e, "data_offsets"),
			     off, 2, &n);
	if (err)
		return err;
	if (n != 2)
		return dcast_fail(DCAST_EMALFORMED, "%s: tensor \"%s\": \"data_offsets\" needs 2 entries",
				  label, t->name);
	if (off[1] < off[0] || off[1] - off[0] != t->nbytes)
		return dcast_fail(DCAST_ECORRUPT,
				  "%s: tensor \"%s\": data_offsets [%llu, %llu] span %s, shape and dtype "
				  "need %llu bytes",
				  label, t->name, (unsigned long long)off[0], (unsigned long long)off[1],
				  off[1] < off[0] ? "a negative size" : "the wrong size",
				  (unsigned long long)t->nbytes);
	t->data_offset = off[0];
	return 0;
}

static int parse_tensor(const char *label, const dcast_json *e, dcast_st_tensor *t)
{
	t->name = e->key;
	if (e->type != DCAST_JSON_OBJECT)
		return dcast_fail(DCAST_EMALFORMED, "%s: tensor \"%s\" is not an object", label, e->key);
	if (e->key_len == 0 || e->key_len > DCAST_ST_MAX_NAME_BYTES)
		return dcast_fail(DCAST_EMALFORMED, "%s: tensor name of %zu bytes (1..%u allowed)",
				  label, e->key_len, DCAST_ST_MAX_NAME_BYTES);
	int err = tensor_fields_known(label, e);
	if (!err)
		err = tensor_dtype(label, e, t);
	size_t ndim = 0;
	if (!err)
		err = uint_array(label, t->name, "shape", dcast_json_get(e, "shape"), t->shape,
				 DCAST_ST_MAX_DIMS, &ndim);
	t->ndim = (unsigned)ndim;
	if (!err)
		err = shape_size(label, t->name, t);
	if (!err)
		err = tensor_offsets(label, e, t);
	return err;
}

static int parse_metadata(dcast_st_file *f, const dcast_json *m)
{
	if (m->type != DCAST_JSON_OBJECT)
		return dcast_fail(DCAST_EMALFORMED, "%s: \"__metadata__\" is not an object", f->label);
	f->meta = calloc(m->nkids + 1, sizeof(*f->meta));
	if (!f->meta)
		return dcast_fail(DCAST_ENOMEM, "%s: out of memory", f->label);
	for (size_t i = 0; i < m->nkids; i++) {
		if (m->kids[i].type != DCAST_JSON_STRING)
			return dcast_fail(DCAST_EMALFORMED,
					  "%s: \"__metadata__\" value of \"%.80s\" is not a string",
					  f->label, m->kids[i].key);
		f->meta[f->meta_count++] = &m->kids[i];
	}
	return 0;
}

static int cmp_offset(const void *a, const void *b)
{
	const dcast_st_tensor *x = a, *y = b;
	if (x->data_offset != y->data_offset)
		return x->data_offset < y->data_offset ? -1 : 1;
	return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp((*(const dcast_st_tensor *const *)a)->name,
		      (*(const dcast_st_tensor *const *)b)->name);
}

/* Sorted by offset, the tensors must tile [0, data_bytes) exactly. */
static int check_tiling(dcast_st_file *f)
{
	uint64_t pos = 0;
	qsort(f->tensors, f->count, sizeof(*f->tensors), cmp_offset);
	for (size_t i = 0; i < f->count; i++) {
		const dcast_st_tensor *t = &f->tensors[i];
		if (t->data_offset != pos)
			return dcast_fail(DCAST_ECORRUPT,
					  "%s: tensor \"%s\" starts at data byte %llu, but the tensors "
					  "before it end at %llu (%s)",
					  f->label, t->name, (unsigned long long)t->data_offset,
					  (unsigned long long)pos,
					  t->data_offset < pos ? "overlap" : "gap");
		pos += t->nbytes;
	}
	if (pos > f->data_bytes)
		return dcast_fail(DCAST_ETRUNCATED,
				  "%s: tensors need %llu data bytes but the data area holds %llu "
				  "(file truncated?)",
				  f->label, (unsigned long long)pos, (unsigned long long)f->data_bytes);
	if (pos < f->data_bytes)
		return dcast_fail(DCAST_ECORRUPT, "%s: %llu bytes after the last tensor's data",
				  f->label, (unsigned long long)(f->data_bytes - pos));
	return 0;
}

static int index_names(dcast_st_file *f)
{
	f->by_name = malloc((f->count + 1) * sizeof(*f->by_name));
	if (!f->by_name)
		return dcast_fail(DCAST_ENOMEM, "%s: out of memory", f->label);
	for (size_t i = 0; i < f->count; i++)
		f->by_name[i] = &f->tensors[i];
	qsort(f->by_name, f->count, sizeof(*f->by_name), cmp_name);
	return 0;
}

static int parse_entries(dcast_st_file *f)
{
	const dcast_json *root = &f->root;
	if (root->type != DCAST_JSON_OBJECT)
		return dcast_fail(DCAST_EMALFORMED, "%s: header is not a JSON object", f->label);
	f->tensors = calloc(root->nkids + 1, sizeof(*f->tensors));
	if (!f->tensors)
		return dcast_fail(DCAST_ENOMEM, "%s: out of memory", f->label);
	for (size_t i = 0; i < root->nkids; i++) {
		const dcast_json *e = &root->kids[i];
		int err = strcmp(e->key, "__metadata__") == 0
				  ? parse_metadata(f, e)
				  : parse_tensor(f->label, e, &f->tensors[f->count++]);
		if (err)
			return err;
	}
	int err = check_tiling(f);
	return err ? err : index_names(f);
}

static dcast_st_file *file_new(const char *label)
{
	dcast_st_file *f = calloc(1, sizeof(*f));
	if (f)
		f->label = strdup(label ? label : "safetensors");
	if (f && !f->label) {
		free(f);
		f = NULL;
	}
	if (!f)
		dcast_fail(DCAST_ENOMEM, "%s: out of memory", label ? label : "safetensors");
	return f;
}

/* Parse the JSON at f->header + 8 and check it against f->data_bytes. */
static int parse_header_json(dcast_st_file *f)
{
	const char *json = (const char *)f->header + 8;
	int err = dcast_json_parse(json, f->header_len - 8, f->label, &f->root);
	return err ? err : parse_entries(f);
}

/* Header length prefix against limits and the bytes available. */
static int check_header_len(const char *label, uint64_t hlen, uint64_t avail)
{
	if (hlen < 2)
		return dcast_fail(DCAST_EMALFORMED, "%s: header length %llu is too small for a JSON object",
				  label, (unsigned long long)hlen);
	if (hlen > DCAST_ST_MAX_HEADER_BYTES)
		return dcast_fail(DCAST_ETOO_LARGE, "%s: header length %llu exceeds the limit of %u bytes",
				  label, (unsigned long long)hlen, DCAST_ST_MAX_HEADER_BYTES);
	if (hlen > avail)
		return dcast_fail(DCAST_ETRUNCATED,
				  "%s: header length %llu exceeds the %llu bytes after the length field",
				  label, (unsigned long long)hlen, (unsigned long long)avail);
	return 0;
}

/* Parse buf (borrowed) into f. */
static int parse_image(dcast_st_file *f, const unsigned char *buf, size_t len)
{
	if (len < 8)
		return dcast_fail(DCAST_ETRUNCATED, "%s: file is %zu bytes, shorter than the 8-byte header length",
				  f->label, len);
	uint64_t hlen = dcast_get_le64(buf);
	int err = check_header_len(f->label, hlen, len - 8);
	if (err)
		return err;
	f->header = buf;
	f->header_len = 8 + (size_t)hlen;
	f->data_bytes = len - f->header_len;
	if ((err = parse_header_json(f)))
		return err;
	for (size_t i = 0; i < f->count; i++)
		f->tensors[i].data = buf + f->header_len + f->tensors[i].data_offset;
	return 0;
}

int dcast_st_parse(const void *buf, size_t len, const char *label, dcast_st_file **out)
{
	*out = NULL;
	dcast_st_file *f = file_new(label);
	if (!f)
		return DCAST_ENOMEM;
	int err = parse_image(f, buf, len);
	if (err)
		dcast_st_close(&f);
	*out = f;
	return err;
}

int dcast_st_parse_header(const void *hdr, size_t hdr_len, uint64_t data_bytes, const char *label,
			  dcast_st_file **out)
{
	*out = NULL;
	dcast_st_file *f = file_new(label);
	if (!f)
		return DCAST_ENOMEM;
	int err = check_header_len(f->label, hdr_len, hdr_len);
	if (!err && !(f->header_copy = malloc(hdr_len + 8)))
		err = dcast_fail(DCAST_ENOMEM, "%s: out of memory", f->label);
	if (!err) {
		dcast_put_le64(f->header_copy, hdr_len);
		memcpy(f->header_copy + 8, hdr, hdr_len);
		f->header = f->header_copy;
		f->header_len = hdr_len + 8;
		f->data_bytes = data_bytes;
		err = parse_header_json(f);
	}
	if (err)
		dcast_st_close(&f);
	*out = f;
	return err;
}

static int map_file(dcast_st_file *f, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return dcast_fail(errno == ENOENT ? DCAST_ENOTFOUND : DCAST_EIO, "%s: open: %s", path,
				  strerror(errno));
	struct stat st;
	int err = 0;
	if (fstat(fd, &st) != 0)
		err = dcast_fail(DCAST_EIO, "%s: stat: %s", path, strerror(errno));
	else if (!S_ISREG(st.st_mode))
		err = dcast_fail(DCAST_EIO, "%s: not a regular file", path);
	else if (st.st_size < 8)
		err = dcast_fail(DCAST_ETRUNCATED,
				 "%s: file is %lld bytes, shorter than the 8-byte header length", path,
				 (long long)st.st_size);
	if (!err) {
		f->map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
		if (f->map == MAP_FAILED) {
			f->map = NULL;
			err = dcast_fail(DCAST_EIO, "%s: mmap: %s", path, strerror(errno));
		} else {
			f->map_len = (size_t)st.st_size;
		}
	}
	close(fd);
	return err;
}

int dcast_st_open(const char *path, dcast_st_file **out)
{
	*out = NULL;
	dcast_st_file *f = file_new(path);
	if (!f)
		return DCAST_ENOMEM;
	int err = map_file(f, path);
	if (!err)
		err = parse_image(f, f->map, f->map_len);
	if (err)
		dcast_st_close(&f);
	*out = f;
	return err;
}

void dcast_st_close(dcast_st_file **fp)
{
	if (!fp || !*fp)
		return;
	dcast_st_file *f = *fp;
	if (f->map)
		munmap(f->map, f->map_len);
	dcast_json_free(&f->root);
	free(f->tensors);
	free(f->by_name);
	free(f->meta);
	free(f->header_copy);
	free(f->label);
	free(f);
	*fp = NULL;
}

size_t dcast_st_count(const dcast_st_file *f)
{
	return f->count;
}

const dcast_st_tensor *dcast_st_tensor_at(const dcast_st_file *f, size_t i)
{
	return i < f->count ? &f->tensors[i] : NULL;
}

/* bsearch: the name `key` against a by_name entry. */
static int name_vs_entry(const void *key, const void *entry)
{
	return strcmp(key, (*(const dcast_st_tensor *const *)entry)->name);
}

const dcast_st_tensor *dcast_st_find(const dcast_st_file *f, const char *name)
{
	const dcast_st_tensor *const *hit =
		f->count ? bsearch(name, f->by_name, f->count, sizeof(*f->by_name), name_vs_entry) : NULL;

	return hit ? *hit : NULL;
}

size_t dcast_st_metadata_count(const dcast_st_file *f)
{
	return f->meta_count;
}

int dcast_st_metadata_at(const dcast_st_file *f, size_t i, const char **key, const char **value)
{
	if (i >= f->meta_count)
		return dcast_fail(DCAST_EINVAL, "%s: metadata index %zu out of range (%zu entries)",
				  f->label, i, f->meta_count);
	*key = f->meta[i]->key;
	*value = f->meta[i]->str;
	return 0;
}

const char *dcast_st_metadata_get(const dcast_st_file *f, const char *key)
{
	for (size_t i = 0; i < f->meta_count; i++)
		if (strcmp(f->meta[i]->key, key) == 0)
			return f->meta[i]->str;
	return NULL;
}

const void *dcast_st_header_bytes(const dcast_st_file *f, size_t *len)
{
	*len = f->header_len;
	return f->header;
}

uint64_t dcast_st_data_bytes(const dcast_st_file *f)
{
	return f->data_bytes;
}
