/* Hugging Face sharded layouts (cli/hf_layout.h): opening one from disk
 * for publish, the record that carries it to subscribers, and the checks
 * both sides make before anything is published or written. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "hf_layout.h"

static const char index_suffix[] = ".safetensors.index.json";
static const char record_magic[8] = {'D', 'C', 'H', 'F', 'L', 'A', 'Y', '1'};
static const char record_magic_files[8] = {'D', 'C', 'H', 'F', 'L', 'A', 'Y', '2'}; /* files follow */

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n > k && strcmp(s + n - k, suffix) == 0;
}

int hf_layout_wanted(const char *path)
{
	struct stat st;
	return ends_with(path, index_suffix) || (stat(path, &st) == 0 && S_ISDIR(st.st_mode));
}

/* ---- checks shared by both sides ---- */

typedef struct placed {
	const char *tensor;
	size_t shard;
} placed;

static int cmp_placed(const void *a, const void *b)
{
	return strcmp(((const placed *)a)->tensor, ((const placed *)b)->tensor);
}

static const hf_shard *shard_named(const hf_layout *l, const char *name)
{
	for (size_t i = 0; i < l->n_shards; i++)
		if (strcmp(l->shards[i].name, name) == 0)
			return &l->shards[i];
	return NULL;
}

/* Every shard tensor once, in the shard the index maps it to. */
static int check_shard_tensors(const hf_layout *l, placed *all)
{
	qsort(all, l->n_tensors, sizeof(*all), cmp_placed);
	for (size_t i = 0; i < l->n_tensors; i++) {
		const char *t = all[i].tensor, *where = l->shards[all[i].shard].name;
		const char *mapped = dcast_st_index_file_of(l->index, t);
		if (i > 0 && strcmp(all[i - 1].tensor, t) == 0)
			return cli_fail(DCAST_ECORRUPT, "%s: tensor \"%s\" is in two shards, %s and %s",
					l->label, t, l->shards[all[i - 1].shard].name, where);
		if (strcmp(t, HF_LAYOUT_TENSOR) == 0)
			return cli_fail(DCAST_EINVAL, "%s: shard %s holds a tensor named %s, a name "
					"deltacast reserves", l->label, where, HF_LAYOUT_TENSOR);
		if (!mapped)
			return cli_fail(DCAST_ECORRUPT, "%s: tensor \"%s\" of shard %s is not in the "
					"index's weight_map", l->label, t, where);
		if (strcmp(mapped, where) != 0)
			return cli_fail(DCAST_ECORRUPT, "%s: the index maps tensor \"%s\" to %s, but it is "
					"in %s", l->label, t, mapped, where);
	}
	return 0;
}

/* Every index entry names a tensor its shard holds. */
static int check_index_entries(const hf_layout *l)
{
	for (size_t i = 0; i < dcast_st_index_count(l->index); i++) {
		const char *t, *f;
		const hf_shard *s;
		dcast_st_index_at(l->index, i, &t, &f);
		s = shard_named(l, f);
		if (!s || !dcast_st_find(s->file, t))
			return cli_fail(DCAST_ECORRUPT, "%s: the index maps tensor \"%s\" to %s, which "
					"does not hold it", l->label, t, f);
	}
	return 0;
}

static int check_layout(hf_layout *l)
{
	placed *all;
	size_t k = 0;
	int err;

	l->n_tensors = 0;
	for (size_t i = 0; i < l->n_shards; i++)
		l->n_tensors += dcast_st_count(l->shards[i].file);
	if (!(all = malloc((l->n_tensors + 1) * sizeof(*all))))
		return cli_fail(DCAST_ENOMEM, "%s: out of memory", l->label);
	for (size_t i = 0; i < l->n_shards; i++)
		for (size_t j = 0; j < dcast_st_count(l->shards[i].file); j++)
			all[k++] = (placed){dcast_st_tensor_at(l->shards[i].file, j)->name, i};
	err = check_shard_tensors(l, all);
	free(all);
	return err ? err : check_index_entries(l);
}

/* ---- the files beside the shards ---- */

/* Shards, indexes, and weights in other formats: never carried. */
static const char *const weight_suffixes[] = {".safetensors", ".index.json", ".bin", ".pt", ".pth",
					      ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf"};

/* Why the file `name` does not travel in the record (NULL: it does). */
static const char *file_left_out(const hf_layout *l, const char *name)
{
	if (name[0] == '.')
		return "a hidden file";
	if (strchr(name, '/'))
		return "not a plain file name";
	if (strcmp(name, HF_VERSION_FILE) == 0)
		return "the version file subscribe writes";
	for (size_t i = 0; i < sizeof(weight_suffixes) / sizeof(weight_suffixes[0]); i++)
		if (ends_with(name, weight_suffixes[i]))
			return "a shard, an index or weights";
	return l->index_name && strcmp(name, l->index_name) == 0 ? "the index" : NULL;
}

/* Room in l for one more file `name` of len bytes (HF_FILES_MAX,
 * HF_FILES_MAX_BYTES). */
static int files_room(const hf_layout *l, const char *name, uint64_t len)
{
	if (l->n_files >= HF_FILES_MAX)
		return cli_fail(DCAST_ETOO_LARGE, "%s: more than %u files beside the shards (at %s); "
				"they travel in the layout tensor: move the ones that are not part of "
				"the model away", l->label, HF_FILES_MAX, name);
	if (len > HF_FILES_MAX_BYTES - l->files_bytes)
		return cli_fail(DCAST_ETOO_LARGE, "%s: the files beside the shards come to more than "
				"%u bytes, the limit, at %s (%llu bytes); they travel in the layout "
				"tensor: move large files that are not part of the model away",
				l->label, HF_FILES_MAX_BYTES, name, (unsigned long long)len);
	return 0;
}

/* Append file `name` (data: owned by l from here on, even on error). */
static int files_add(hf_layout *l, const char *name, unsigned char *data, size_t len)
{
	hf_file *f = realloc(l->files, (l->n_files + 1) * sizeof(*f));
	char *copy = strdup(name);

	if (f)
		l->files = f;
	if (!f || !copy) {
		free(data);
		free(copy);
		return cli_fail(DCAST_ENOMEM, "%s: out of memory", l->label);
	}
	l->files[l->n_files++] = (hf_file){copy, data, len};
	l->files_bytes += len;
	return 0;
}

/* ---- the record ---- */

typedef struct rec_writer {
	unsigned char *p;
	size_t len;
} rec_writer;

static void put_le(rec_writer *w, uint64_t v, unsigned bytes)
{
	for (unsigned i = 0; i < bytes; i++)
		w->p[w->len++] = (unsigned char)(v >> (8 * i));
}

static void put_bytes(rec_writer *w, const void *b, size_t n)
{
	memcpy(w->p + w->len, b, n);
	w->len += n;
}

static void put_files(rec_writer *w, const hf_layout *l)
{
	put_le(w, l->n_files, 4);
	for (size_t i = 0; i < l->n_files; i++) {
		put_le(w, strlen(l->files[i].name), 4);
		put_bytes(w, l->files[i].name, strlen(l->files[i].name));
		put_le(w, l->files[i].len, 8);
		put_bytes(w, l->files[i].data, l->files[i].len);
	}
}

static int build_record(hf_layout *l)
{
	size_t need = sizeof(record_magic) + 4 + 4 + strlen(l->index_name) + 8 + l->index_len, hlen;
	rec_writer w = {0};

	for (size_t i = 0; i < l->n_shards; i++) {
		dcast_st_header_bytes(l->shards[i].file, &hlen);
		need += 4 + strlen(l->shards[i].name) + 8 + (hlen - 8) + 8;
	}
	need += 4;
	for (size_t i = 0; i < l->n_files; i++)
		need += 4 + strlen(l->files[i].name) + 8 + l->files[i].len;
	if (!(w.p = malloc(need)))
		return cli_fail(DCAST_ENOMEM, "%s: out of memory", l->label);
	put_bytes(&w, l->n_files ? record_magic_files : record_magic, sizeof(record_magic));
	put_le(&w, l->n_shards, 4);
	put_le(&w, strlen(l->index_name), 4);
	put_bytes(&w, l->index_name, strlen(l->index_name));
	put_le(&w, l->index_len, 8);
	put_bytes(&w, l->index_json, l->index_len);
	for (size_t i = 0; i < l->n_shards; i++) {
		const unsigned char *h = dcast_st_header_bytes(l->shards[i].file, &hlen);
		put_le(&w, strlen(l->shards[i].name), 4);
		put_bytes(&w, l->shards[i].name, strlen(l->shards[i].name));
		put_le(&w, hlen - 8, 8);
		put_bytes(&w, h + 8, hlen - 8);
		put_le(&w, dcast_st_data_bytes(l->shards[i].file), 8);
	}
	if (l->n_files)
		put_files(&w, l);
	l->record = w.p;
	l->record_len = w.len;
	return 0;
}

typedef struct rec_reader {
	const unsigned char *p;
	size_t left;
	int bad;
} rec_reader;

static uint64_t get_le(rec_reader *r, unsigned bytes)
{
	uint64_t v = 0;
	if (r->bad || r->left < bytes) {
		r->bad = 1;
		return 0;
	}
	for (unsigned i = 0; i < bytes; i++)
		v |= (uint64_t)r->p[i] << (8 * i);
	r->p += bytes;
	r->left -= bytes;
	return v;
}

/* n bytes at the cursor, or NULL (r->bad) when fewer are left. */
static const unsigned char *get_bytes(rec_reader *r, uint64_t n)
{
	const unsigned char *at = r->p;
	if (r->bad || r->left < n) {
		r->bad = 1;
		return NULL;
	}
	r->p += n;
	r->left -= n;
	return at;
}

/* A length-prefixed name of 1..255 bytes, copied. */
static char *get_name(rec_reader *r)
{
	uint64_t n = get_le(r, 4);
	const unsigned char *b = n >= 1 && n <= 255 ? get_bytes(r, n) : NULL;
	char *s = b ? strndup((const char *)b, n) : NULL;
	if (!b || (s && strlen(s) != n)) {
		r->bad = 1;
		free(s);
		return NULL;
	}
	return s;
}

static int decode_shard(rec_reader *r, hf_shard *s)
{
	uint64_t hlen, data_bytes;
	const unsigned char *hdr;

	s->name = get_name(r);
	hlen = get_le(r, 8);
	hdr = get_bytes(r, hlen);
	data_bytes = get_le(r, 8);
	if (r->bad)
		return cli_fail(DCAST_ECORRUPT, "layout record: shard entry cut short");
	if (dcast_st_parse_header(hdr, hlen, data_bytes, s->name, &s->file))
		return cli_fail(DCAST_ECORRUPT, "layout record: %s", dcast_last_error());
	return 0;
}

/* The record's shards must be the index's files, in the same order. */
static int match_index_files(const hf_layout *l)
{
	if (dcast_st_index_file_count(l->index) != l->n_shards)
		return cli_fail(DCAST_ECORRUPT, "layout record: %zu shards, the index names %zu",
				l->n_shards, dcast_st_index_file_count(l->index));
	for (size_t i = 0; i < l->n_shards; i++)
		if (strcmp(dcast_st_index_file_at(l->index, i), l->shards[i].name) != 0)
			return cli_fail(DCAST_ECORRUPT, "layout record: shard %s is not the index's "
					"file %s", l->shards[i].name, dcast_st_index_file_at(l->index, i));
	return 0;
}

static int decode_file(hf_layout *l, rec_reader *r)
{
	char *name = get_name(r);
	uint64_t len = get_le(r, 8);
	const unsigned char *data = get_bytes(r, len);
	const char *why = name ? file_left_out(l, name) : NULL;
	unsigned char *copy;
	int err;

	if (r->bad)
		err = cli_fail(DCAST_ECORRUPT, "layout record: file entry cut short");
	else if (why)
		err = cli_fail(DCAST_ECORRUPT, "layout record: file \"%s\" is %s", name, why);
	else if (l->n_files && strcmp(l->files[l->n_files - 1].name, name) >= 0)
		err = cli_fail(DCAST_ECORRUPT, "layout record: file \"%s\" out of order or twice", name);
	else if ((err = files_room(l, name, len)))
		err = cli_fail(DCAST_ECORRUPT, "%s", dcast_last_error());
	else if (!(copy = malloc(len ? len : 1)))
		err = cli_fail(DCAST_ENOMEM, "layout record: out of memory");
	else
		err = files_add(l, name, memcpy(copy, data, len), len);
	free(name);
	return err;
}

static int decode_files(hf_layout *l, rec_reader *r)
{
	uint64_t n = get_le(r, 4);
	int err = 0;

	if (r->bad || n > HF_FILES_MAX)
		return cli_fail(DCAST_ECORRUPT, "layout record: bad file count (%llu, at most %u)",
				(unsigned long long)n, HF_FILES_MAX);
	for (uint64_t i = 0; i < n && !err; i++)
		err = decode_file(l, r);
	return err;
}

static int decode_body(hf_layout *l, rec_reader *r, int with_files)
{
	uint64_t n;
	const unsigned char *json;
	int err = 0;

	l->n_shards = get_le(r, 4);
	l->index_name = get_name(r);
	l->index_len = get_le(r, 8);
	json = get_bytes(r, l->index_len);
	if (r->bad || l->n_shards == 0 || l->n_shards > DCAST_MAX_TENSORS)
		return cli_fail(DCAST_ECORRUPT, "layout record: bad header (%zu shards)", l->n_shards);
	if (!ends_with(l->index_name, index_suffix) || l->index_name[0] == '.' ||
	    strchr(l->index_name, '/'))
		return cli_fail(DCAST_ECORRUPT, "layout record: index name \"%s\" is not a plain "
				"*%s file name", l->index_name, index_suffix);
	if (!(l->index_json = malloc(l->index_len + 1)) ||
	    !(l->shards = calloc(l->n_shards, sizeof(*l->shards))))
		return cli_fail(DCAST_ENOMEM, "layout record: out of memory");
	memcpy(l->index_json, json, l->index_len);
	if (dcast_st_index_parse(json, l->index_len, l->index_name, &l->index))
		return cli_fail(DCAST_ECORRUPT, "layout record: %s", dcast_last_error());
	for (n = 0; n < l->n_shards && !err; n++)
		err = decode_shard(r, &l->shards[n]);
	if (!err && with_files)
		err = decode_files(l, r);
	if (!err && r->left)
		err = cli_fail(DCAST_ECORRUPT, "layout record: %zu bytes after its end", r->left);
	return err ? err : match_index_files(l);
}

int hf_layout_decode(const void *rec, size_t len, hf_layout *l)
{
	rec_reader r = {rec, len, 0};
	const unsigned char *magic = get_bytes(&r, sizeof(record_magic));
	int err;

	memset(l, 0, sizeof(*l));
	if (!(l->label = strdup("layout record")))
		return cli_fail(DCAST_ENOMEM, "layout record: out of memory");
	int files = magic && memcmp(magic, record_magic_files, sizeof(record_magic)) == 0;

	if (!magic || (!files && memcmp(magic, record_magic, sizeof(record_magic)) != 0))
		err = cli_fail(DCAST_ECORRUPT, "layout record: no %.8s or %.8s magic", record_magic,
			       record_magic_files);
	else
		err = decode_body(l, &r, files);
	if (!err)
		err = check_layout(l);
	if (err)
		hf_layout_close(l);
	return err;
}

/* ---- opening a layout on disk ---- */

static int read_all(int fd, unsigned char *buf, size_t len, const char *path)
{
	while (len) {
		ssize_t n = read(fd, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return cli_fail(DCAST_EIO, "%s: read: %s", path, n ? strerror(errno) : "file shrank");
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

/* The whole regular file at path, of at most limit bytes, into a new
 * buffer *buf (one byte more than *len, for a terminator); *buf NULL on
 * error. */
static int read_whole(const char *path, uint64_t limit, unsigned char **buf, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), err = 0;
	struct stat st;

	*buf = NULL;
	*len = 0;
	if (fd < 0)
		return cli_fail(errno == ENOENT ? DCAST_ENOTFOUND : DCAST_EIO, "%s: %s", path,
				strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
		err = cli_fail(DCAST_EIO, "%s: not a regular file", path);
	else if ((uint64_t)st.st_size > limit)
		err = cli_fail(DCAST_ETOO_LARGE, "%s: %lld bytes, more than the limit of %llu", path,
			       (long long)st.st_size, (unsigned long long)limit);
	else if (!(*buf = malloc((size_t)st.st_size + 1)))
		err = cli_fail(DCAST_ENOMEM, "%s: out of memory", path);
	else
		err = read_all(fd, *buf, (size_t)st.st_size, path);
	close(fd);
	if (err) {
		free(*buf);
		*buf = NULL;
	} else {
		*len = (size_t)st.st_size;
	}
	return err;
}

static int read_index(hf_layout *l, const char *path)
{
	int err = read_whole(path, DCAST_ST_MAX_HEADER_BYTES, &l->index_json, &l->index_len);

	if (!err && dcast_st_index_parse(l->index_json, l->index_len, path, &l->index))
		err = cli_fail(DCAST_EMALFORMED, "%s", dcast_last_error());
	return err;
}

/* Call fn(ctx, dir, name) for each entry of dir whose name ends in
 * suffix, until it returns an error. */
static int scan_dir(const char *dir, const char *suffix,
		    int (*fn)(void *ctx, const char *dir, const char *name), void *ctx)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int err = 0;

	if (!d)
		return cli_fail(DCAST_EIO, "%s: %s", dir, strerror(errno));
	while (!err && (e = readdir(d)))
		if (ends_with(e->d_name, suffix))
			err = fn(ctx, dir, e->d_name);
	closedir(d);
	return err;
}

static int found_index(void *ctx, const char *dir, const char *name)
{
	char **out = ctx;

	if (*out)
		return cli_fail(DCAST_EINVAL, "%s holds two index files, %s and %s: give the one to "
				"publish", dir, strrchr(*out, '/') + 1, name);
	return (*out = cli_concat(dir, "/", name)) ? 0 : cli_fail(DCAST_ENOMEM, "out of memory");
}

/* The one *.safetensors.index.json in dir, as a new path. */
static int find_index(const char *dir, char **out)
{
	int err;

	*out = NULL;
	err = scan_dir(dir, index_suffix, found_index, out);
	if (!err && !*out)
		err = cli_fail(DCAST_ENOTFOUND, "%s holds no *%s (a sharded Hugging Face checkpoint "
			       "names its shards there)", dir, index_suffix);
	if (err) {
		free(*out);
		*out = NULL;
	}
	return err;
}

/* A tensor the index maps to `file`, to name in an error. */
static const char *a_tensor_of(const dcast_st_index *x, const char *file)
{
	for (size_t i = 0; i < dcast_st_index_count(x); i++) {
		const char *t, *f;
		dcast_st_index_at(x, i, &t, &f);
		if (strcmp(f, file) == 0)
			return t;
	}
	return "?";
}

static int open_shards(hf_layout *l, const char *dir)
{
	l->n_shards = dcast_st_index_file_count(l->index);
	if (!(l->shards = calloc(l->n_shards, sizeof(*l->shards))))
		return cli_fail(DCAST_ENOMEM, "out of memory");
	for (size_t i = 0; i < l->n_shards; i++) {
		const char *name = dcast_st_index_file_at(l->index, i);
		char *path = cli_concat(dir, "/", name);
		int err = path ? dcast_st_open(path, &l->shards[i].file) : DCAST_ENOMEM;
		free(path);
		if (!(l->shards[i].name = strdup(name)) && !err)
			err = DCAST_ENOMEM;
		if (err)
			return cli_fail(err, "%s: shard %s (holding tensor \"%s\"): %s", l->label, name,
					a_tensor_of(l->index, name), dcast_last_error());
	}
	return 0;
}

/* A *.safetensors file in the directory that the index does not name. */
static int found_shard(void *ctx, const char *dir, const char *name)
{
	const hf_layout *l = ctx;

	if (shard_named(l, name))
		return 0;
	return cli_fail(DCAST_ECORRUPT, "%s/%s is not in %s: a shard the index does not name "
			"(move it away, or list its tensors in the index)", dir, name, l->label);
}

/* A file beside the shards that travels in the record: read whole. */
static int found_file(void *ctx, const char *dir, const char *name)
{
	hf_layout *l = ctx;
	char *path;
	struct stat st;
	unsigned char *data;
	size_t len;
	int err;

	if (file_left_out(l, name))
		return 0;
	if (!(path = cli_concat(dir, "/", name)))
		return cli_fail(DCAST_ENOMEM, "out of memory");
	if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
		err = 0; /* a subdirectory, a dangling link: not the model's */
	else if (!(err = files_room(l, name, (uint64_t)st.st_size)) &&
		 !(err = read_whole(path, HF_FILES_MAX_BYTES - l->files_bytes, &data, &len)))
		err = files_add(l, name, data, len);
	free(path);
	return err;
}

static int cmp_file(const void *a, const void *b)
{
	return strcmp(((const hf_file *)a)->name, ((const hf_file *)b)->name);
}

static int read_files(hf_layout *l, const char *dir)
{
	int err = scan_dir(dir, "", found_file, l);

	if (!err && l->n_files)
		qsort(l->files, l->n_files, sizeof(*l->files), cmp_file);
	return err;
}

static int open_from_index(hf_layout *l, const char *index_path)
{
	const char *slash = strrchr(index_path, '/');
	char *dir = slash ? strndup(index_path, (size_t)(slash - index_path)) : strdup(".");
	int err;

	if (!dir || !(l->label = strdup(index_path)) ||
	    !(l->index_name = strdup(slash ? slash + 1 : index_path)))
		err = cli_fail(DCAST_ENOMEM, "out of memory");
	else if (!(err = read_index(l, index_path)) && !(err = open_shards(l, dir)) &&
		 !(err = scan_dir(dir, ".safetensors", found_shard, l)) && !(err = check_layout(l)) &&
		 !(err = read_files(l, dir)))
		err = build_record(l);
	free(dir);
	return err;
}

int hf_layout_open(const char *path, hf_layout *l)
{
	char *index_path = NULL;
	int err = 0;

	memset(l, 0, sizeof(*l));
	if (ends_with(path, index_suffix))
		index_path = strdup(path);
	else
		err = find_index(path, &index_path);
	if (!err && !index_path)
		err = cli_fail(DCAST_ENOMEM, "out of memory");
	if (!err)
		err = open_from_index(l, index_path);
	free(index_path);
	if (err)
		hf_layout_close(l);
	return err;
}

const dcast_st_tensor *hf_layout_tensor_at(const hf_layout *l, size_t i)
{
	for (size_t s = 0; s < l->n_shards; s++) {
		size_t n = dcast_st_count(l->shards[s].file);
		if (i < n)
			return dcast_st_tensor_at(l->shards[s].file, i);
		i -= n;
	}
	return NULL;
}

const dcast_st_tensor *hf_layout_find(const hf_layout *l, const char *name)
{
	const char *file = dcast_st_index_file_of(l->index, name);
	const hf_shard *s = file ? shard_named(l, file) : NULL;
	return s ? dcast_st_find(s->file, name) : NULL;
}

void hf_layout_close(hf_layout *l)
{
	for (size_t i = 0; l->shards && i < l->n_shards; i++) {
		free(l->shards[i].name);
		dcast_st_close(&l->shards[i].file);
	}
	free(l->shards);
	for (size_t i = 0; l->files && i < l->n_files; i++) {
		free(l->files[i].name);
		free(l->files[i].data);
	}
	free(l->files);
	dcast_st_index_close(&l->index);
	free(l->index_json);
	free(l->index_name);
	free(l->record);
	free(l->label);
	memset(l, 0, sizeof(*l));
}
