/* Reader of a Hugging Face sharded-checkpoint index
 * (model.safetensors.index.json; include/deltacast/safetensors.h): the
 * "weight_map" from tensor name to shard file, checked strictly with the
 * same JSON parser as safetensors headers.  Shard names must be plain file
 * names ending in ".safetensors", so that a layout written back from an
 * index never leaves its directory. */
#include <stdlib.h>
#include <string.h>

#include "dcast_common.h"
#include "deltacast/safetensors.h"
#include "safetensors_json.h"

struct dcast_st_index {
	char *label;
	dcast_json root;
	const dcast_json *map;       /* the weight_map object; entries point into root */
	const dcast_json **by_name;  /* weight_map entries sorted by tensor name */
	const char **files;          /* distinct shard names, sorted */
	size_t n_files;
};

static int cmp_entry(const void *a, const void *b)
{
	return strcmp((*(const dcast_json *const *)a)->key, (*(const dcast_json *const *)b)->key);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name the layout can be written back under: a plain file name. */
static int check_file_name(const dcast_st_index *x, const dcast_json *e)
{
	static const char suffix[] = ".safetensors";
	const char *f = e->str;
	size_t n = e->str_len, s = sizeof(suffix) - 1;

	if (e->type != DCAST_JSON_STRING)
		return dcast_fail(DCAST_EMALFORMED, "%s: weight_map[\"%.200s\"] is not a string",
				  x->label, e->key);
	if (e->key_len == 0 || e->key_len > DCAST_ST_MAX_NAME_BYTES)
		return dcast_fail(DCAST_EMALFORMED, "%s: weight_map has a tensor name of %zu bytes "
				  "(1..%u allowed)", x->label, e->key_len, DCAST_ST_MAX_NAME_BYTES);
	if (n <= s || n > 255 || memcmp(f + n - s, suffix, s) != 0 || f[0] == '.' ||
	    strchr(f, '/') || strlen(f) != n)
		return dcast_fail(DCAST_EMALFORMED, "%s: tensor \"%.200s\" maps to \"%.200s\", not a "
				  "plain file name ending in .safetensors (at most 255 bytes, no '/', "
				  "not starting with '.')", x->label, e->key, f);
	return 0;
}

static int parse_map(dcast_st_index *x)
{
	const dcast_json *meta = dcast_json_get(&x->root, "metadata");

	if (x->root.type != DCAST_JSON_OBJECT)
		return dcast_fail(DCAST_EMALFORMED, "%s: the index is not a JSON object", x->label);
	if (meta && meta->type != DCAST_JSON_OBJECT)
		return dcast_fail(DCAST_EMALFORMED, "%s: \"metadata\" is not an object", x->label);
	x->map = dcast_json_get(&x->root, "weight_map");
	if (!x->map || x->map->type != DCAST_JSON_OBJECT || x->map->nkids == 0)
		return dcast_fail(DCAST_EMALFORMED, "%s: \"weight_map\" %s", x->label,
				  !x->map ? "is missing" : x->map->type != DCAST_JSON_OBJECT
				  ? "is not an object" : "is empty");
	for (size_t i = 0; i < x->map->nkids; i++) {
		int err = check_file_name(x, &x->map->kids[i]);
		if (err)
			return err;
	}
	return 0;
}

/* by_name and the distinct file names. */
static int build_lookups(dcast_st_index *x)
{
	size_t n = x->map->nkids;

	x->by_name = malloc(n * sizeof(*x->by_name));
	x->files = malloc(n * sizeof(*x->files));
	if (!x->by_name || !x->files)
		return dcast_fail(DCAST_ENOMEM, "%s: out of memory", x->label);
	for (size_t i = 0; i < n; i++) {
		x->by_name[i] = &x->map->kids[i];
		x->files[i] = x->map->kids[i].str;
	}
	qsort(x->by_name, n, sizeof(*x->by_name), cmp_entry);
	qsort(x->files, n, sizeof(*x->files), cmp_str);
	for (size_t i = 0; i < n; i++)
		if (x->n_files == 0 || strcmp(x->files[x->n_files - 1], x->files[i]) != 0)
			x->files[x->n_files++] = x->files[i];
	return 0;
}

int dcast_st_index_parse(const void *json, size_t len, const char *label, dcast_st_index **out)
{
	dcast_st_index *x = calloc(1, sizeof(*x));
	int err;

	*out = NULL;
	if (!x || !(x->label = strdup(label ? label : "index"))) {
		free(x);
		return dcast_fail(DCAST_ENOMEM, "%s: out of memory", label ? label : "index");
	}
	if (len > DCAST_ST_MAX_HEADER_BYTES)
		err = dcast_fail(DCAST_ETOO_LARGE, "%s: %zu bytes, more than the limit of %u", x->label,
				 len, DCAST_ST_MAX_HEADER_BYTES);
	else if (!(err = dcast_json_parse(json, len, x->label, &x->root)) && !(err = parse_map(x)))
		err = build_lookups(x);
	if (err)
		dcast_st_index_close(&x);
	*out = x;
	return err;
}

void dcast_st_index_close(dcast_st_index **xp)
{
	if (!xp || !*xp)
		return;
	dcast_json_free(&(*xp)->root);
	free((*xp)->by_name);
	free((*xp)->files);
	free((*xp)->label);
	free(*xp);
	*xp = NULL;
}

size_t dcast_st_index_count(const dcast_st_index *x)
{
	return x->map->nkids;
}

int dcast_st_index_at(const dcast_st_index *x, size_t i, const char **tensor, const char **file)
{
	if (i >= x->map->nkids)
		return dcast_fail(DCAST_EINVAL, "%s: weight_map entry %zu out of range (%zu entries)",
				  x->label, i, x->map->nkids);
	*tensor = x->map->kids[i].key;
	*file = x->map->kids[i].str;
	return 0;
}

/* bsearch: the tensor name `key` against a by_name entry. */
static int name_vs_entry(const void *key, const void *entry)
{
	return strcmp(key, (*(const dcast_json *const *)entry)->key);
}

const char *dcast_st_index_file_of(const dcast_st_index *x, const char *tensor)
{
	const dcast_json *const *hit =
		bsearch(tensor, x->by_name, x->map->nkids, sizeof(*x->by_name), name_vs_entry);

	return hit ? (*hit)->str : NULL;
}

size_t dcast_st_index_file_count(const dcast_st_index *x)
{
	return x->n_files;
}

const char *dcast_st_index_file_at(const dcast_st_index *x, size_t i)
{
	return i < x->n_files ? x->files[i] : NULL;
}
