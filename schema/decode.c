/* Strict header decoding: msgpack bytes -> dcast_msg, driven by the field
 * tables.  Every rejection names the message, the field and the rule. */
#include <msgpack.h>
#include <stdint.h>
#include <string.h>
#include "dcast_common.h"
#include "schema_impl.h"

#define MAX_MAP_KEYS 64

static const char *kind_name(msgpack_object_type t)
{
	switch (t) {
	case MSGPACK_OBJECT_NIL: return "nil";
	case MSGPACK_OBJECT_BOOLEAN: return "bool";
	case MSGPACK_OBJECT_POSITIVE_INTEGER: return "uint";
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "negative int";
	case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64: return "float";
	case MSGPACK_OBJECT_STR: return "str";
	case MSGPACK_OBJECT_ARRAY: return "array";
	case MSGPACK_OBJECT_MAP: return "map";
	case MSGPACK_OBJECT_BIN: return "bin";
	default: return "ext";
	}
}

static int want(const msgpack_object *o, msgpack_object_type t, const char *path,
		const char *key, const char *what)
{
	if (o->type == t)
		return 0;
	if (t == MSGPACK_OBJECT_POSITIVE_INTEGER && o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.%s: %lld is negative",
				  path, key, (long long)o->via.i64);
	return dcast_fail(DCAST_EFIELD_TYPE, "%s.%s: expected %s, got %s", path, key, what,
			  kind_name(o->type));
}

static int get_uint(const msgpack_object *o, const char *path, const char *key, uint64_t *v)
{
	int rc = want(o, MSGPACK_OBJECT_POSITIVE_INTEGER, path, key, "uint");

	if (!rc)
		*v = o->via.u64;
	return rc;
}

/* At most SHOWN bytes of a peer's string, escaped (dcast_printable), for an
 * error detail: the detail goes back in an ERROR and into logs, and those
 * stay printable whatever the peer sent. */
#define SHOWN 64
typedef struct shown_str {
	char text[DCAST_PRINTABLE_CAP(SHOWN)];
} shown_str;

static shown_str shown(const msgpack_object *o)
{
	shown_str s;

	dcast_printable(s.text, sizeof(s.text), o->via.str.ptr,
			o->via.str.size > SHOWN ? SHOWN : o->via.str.size);
	return s;
}

/* Copy a string into dst[max + 1]; the length limit is checked here since
 * it bounds the copy, the lower bound later by validation.  Strings are
 * UTF-8 (msgpack str): anything else is refused, so names never reach logs,
 * WELCOMEs or /metrics as raw bytes. */
static int get_str(const msgpack_object *o, const char *path, const struct field *f,
		   char *dst)
{
	int rc = want(o, MSGPACK_OBJECT_STR, path, f->key, "str");

	if (rc)
		return rc;
	if (o->via.str.size > f->max)
		return dcast_fail(DCAST_ETOO_LARGE, "%s.%s: %u bytes exceeds limit %llu", path,
				  f->key, o->via.str.size, (unsigned long long)f->max);
	if (memchr(o->via.str.ptr, 0, o->via.str.size))
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.%s: contains a NUL byte", path, f->key);
	size_t bad = schema_utf8_bad_at(o->via.str.ptr, o->via.str.size);
	if (bad < o->via.str.size)
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.%s: not UTF-8 (byte 0x%02x at offset %zu)", path,
				  f->key, (unsigned char)o->via.str.ptr[bad], bad);
	memcpy(dst, o->via.str.ptr, o->via.str.size);
	dst[o->via.str.size] = '\0';
	return 0;
}

/* The first byte first: most keys differ there, and strlen is the cost of
 * a header's decode otherwise (each key against each field). */
static int is_key(const msgpack_object *k, const char *s)
{
	return k->type == MSGPACK_OBJECT_STR &&
	       (k->via.str.size ? k->via.str.ptr[0] == s[0] : !s[0]) &&
	       k->via.str.size == strlen(s) && memcmp(k->via.str.ptr, s, k->via.str.size) == 0;
}

/* Role or dtype name -> enum value, compared in place (no copy). */
static int enum_value(const msgpack_object *o, int kind)
{
	int n = kind == F_ROLE ? 2 : DCAST_DTYPE_COUNT;

	for (int i = 0; i < n; i++)
		if (is_key(o, kind == F_ROLE ? schema_role_name(i) : dcast_dtype_name(i)))
			return i;
	return -1;
}

static int get_enum_str(const msgpack_object *o, const char *path, const struct field *f,
			uint32_t *dst)
{
	int rc = want(o, MSGPACK_OBJECT_STR, path, f->key, "str");

	if (rc)
		return rc;
	int v = enum_value(o, f->kind);
	if (v < 0 && f->kind == F_DTYPE)
		return dcast_fail(DCAST_EDTYPE, "%s.%s: unknown dtype \"%s\"", path, f->key,
				  shown(o).text);
	if (v < 0)
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.%s: unknown value \"%s\"", path,
				  f->key, shown(o).text);
	*dst = (uint32_t)v;
	return 0;
}

static int get_shape(const msgpack_object *o, const char *path, const struct field *f,
		     dcast_tensor_desc *t)
{
	int rc = want(o, MSGPACK_OBJECT_ARRAY, path, f->key, "array");

	if (rc)
		return rc;
	if (o->via.array.size > DCAST_MAX_DIMS)
		return dcast_fail(DCAST_ETOO_LARGE, "%s.shape: %u dims exceeds DCAST_MAX_DIMS (%d)",
				  path, o->via.array.size, DCAST_MAX_DIMS);
	t->ndim = o->via.array.size;
	for (uint32_t i = 0; i < t->ndim && !rc; i++)
		rc = get_uint(&o->via.array.ptr[i], path, "shape[]", &t->shape[i]);
	return rc;
}

/* Tiles per dimension: 1..2^32-1 each; the count is checked against the
 * shape by validation (the keys may come in any order). */
static int get_grid(const msgpack_object *o, const char *path, const struct field *f,
		    dcast_tensor_desc *t)
{
	int rc = want(o, MSGPACK_OBJECT_ARRAY, path, f->key, "array");
	uint64_t v = 0;

	if (rc)
		return rc;
	if (o->via.array.size > DCAST_MAX_DIMS)
		return dcast_fail(DCAST_ETOO_LARGE, "%s.grid: %u dims exceeds DCAST_MAX_DIMS (%d)",
				  path, o->via.array.size, DCAST_MAX_DIMS);
	memset(t->grid, 0, sizeof(t->grid));
	for (uint32_t i = 0; i < o->via.array.size && !rc; i++) {
		if ((rc = get_uint(&o->via.array.ptr[i], path, "grid[]", &v)))
			break;
		if (v < f->min || v > f->max)
			return dcast_fail(DCAST_EFIELD_RANGE, "%s.grid[%u]: %llu outside [1, 2^32)", path,
					  i, (unsigned long long)v);
		t->grid[i] = (uint32_t)v;
	}
	return rc;
}

static int decode_map(const msgpack_object *o, const struct msg_table *t, void *base,
		      const char *path);

/* Decode an array of nested maps (tensors, digests) into a calloc'd array. */
static int get_array(const msgpack_object *o, const char *path, const struct field *f,
		     void *base)
{
	struct schema_array a = schema_array_of(f, base);
	char sub_path[96];
	int rc = want(o, MSGPACK_OBJECT_ARRAY, path, f->key, "array");

	if (rc)
		return rc;
	if (o->via.array.size > f->max)
		return dcast_fail(DCAST_ETOO_LARGE, "%s.%s: %u entries exceeds limit %llu", path,
				  f->key, o->via.array.size, (unsigned long long)f->max);
	*a.count = o->via.array.size;
	*a.entries = calloc(o->via.array.size ? o->via.array.size : 1, a.entry_size);
	if (!*a.entries)
		return dcast_fail(DCAST_ENOMEM, "%s.%s: out of memory", path, f->key);
	for (uint32_t i = 0; i < o->via.array.size && !rc; i++) {
		void *entry = (char *)*a.entries + i * a.entry_size;
		/* the entry's path only for its error (a COMMIT of many chunks has
		 * as many entries): decoded again under it, nothing allocated */
		if (!decode_map(&o->via.array.ptr[i], a.table, entry, path))
			continue;
		snprintf(sub_path, sizeof(sub_path), "%s.%s[%u]", path, f->key, i);
		rc = decode_map(&o->via.array.ptr[i], a.table, entry, sub_path);
	}
	return rc;
}

static int decode_field(const msgpack_object *o, const struct field *f, void *base,
			const char *path)
{
	void *slot = (char *)base + f->off;
	uint64_t v = 0;
	int rc;

	switch (f->kind) {
	case F_VER:
		if (o->type == MSGPACK_OBJECT_NIL) {
			*(uint64_t *)slot = DCAST_VERSION_NONE;
			return 0;
		}
		/* fall through */
	case F_U64:
	case F_U32:
	case F_SUM:
		if ((rc = get_uint(o, path, f->key, &v)))
			return rc;
		if (v < f->min || v > f->max)
			return dcast_fail(DCAST_EFIELD_RANGE, "%s.%s: %llu outside [%llu, %llu]",
					  path, f->key, (unsigned long long)v,
					  (unsigned long long)f->min, (unsigned long long)f->max);
		if (f->kind == F_U32)
			*(uint32_t *)slot = (uint32_t)v;
		else
			*(uint64_t *)slot = v;
		return 0;
	case F_BOOL:
		if ((rc = want(o, MSGPACK_OBJECT_BOOLEAN, path, f->key, "bool")))
			return rc;
		*(uint32_t *)slot = o->via.boolean;
		return 0;
	case F_STR:
		return get_str(o, path, f, slot);
	case F_ROLE:
	case F_DTYPE:
		return get_enum_str(o, path, f, slot);
	case F_SHAPE:
		return get_shape(o, path, f, base);
	case F_GRID:
		return get_grid(o, path, f, base);
	default:
		return get_array(o, path, f, base);
	}
}


/* From *from on, round: our encoder writes the fields in table order, so
 * the next key is usually the field after the last one found. */
static int find_field(const struct msg_table *t, const msgpack_object *k, unsigned *from)
{
	for (unsigned n = 0, i = *from; n < t->n_fields; n++, i = i + 1 < t->n_fields ? i + 1 : 0)
		if (is_key(k, t->fields[i].key))
			return *from = i + 1 < t->n_fields ? i + 1 : 0, (int)i;
	return -1;
}

static int is_header_key(const msgpack_object *k)
{
	return is_key(k, "proto") || is_key(k, "type");
}

static int check_key(const msgpack_object *k, const char *path)
{
	if (k->type != MSGPACK_OBJECT_STR)
		return dcast_fail(DCAST_EMALFORMED, "%s: map key is %s, not str", path,
				  kind_name(k->type));
	return 0;
}

static int unknown_key(const msgpack_object *k, const char *path)
{
	if (k->via.str.size >= 2 && memcmp(k->via.str.ptr, "x-", 2) == 0)
		return 0;
	return dcast_fail(DCAST_EFIELD_UNKNOWN, "%s: unknown field \"%s\"", path, shown(k).text);
}

/* stored: a header read back from a record file, whose MANIFEST may
 * predate its `sum` (dcast_msg_decode_stored). */
static int check_missing(const struct msg_table *t, uint64_t seen, const char *path, int stored)
{
	for (unsigned i = 0; i < t->n_fields; i++)
		if (t->fields[i].required && !(seen >> i & 1) && !(stored && t->fields[i].kind == F_SUM))
			return dcast_fail(DCAST_EFIELD_MISSING, "%s.%s: required field missing",
					  path, t->fields[i].key);
	return 0;
}

/* Duplicate keys make a header ambiguous; maps are small (bounded above),
 * so a quadratic check is cheap. */
static int check_duplicates(const msgpack_object_map *m, const char *path)
{
	for (uint32_t i = 0; i < m->size; i++)
		for (uint32_t j = i + 1; j < m->size; j++)
			if (m->ptr[j].key.type == MSGPACK_OBJECT_STR &&
			    m->ptr[i].key.type == MSGPACK_OBJECT_STR &&
			    m->ptr[i].key.via.str.size == m->ptr[j].key.via.str.size &&
			    (!m->ptr[i].key.via.str.size ||
			     m->ptr[i].key.via.str.ptr[0] == m->ptr[j].key.via.str.ptr[0]) &&
			    memcmp(m->ptr[i].key.via.str.ptr, m->ptr[j].key.via.str.ptr,
				   m->ptr[i].key.via.str.size) == 0)
				return dcast_fail(DCAST_EMALFORMED, "%s: duplicate key \"%s\"",
						  path, shown(&m->ptr[i].key).text);
	return 0;
}

/* Decode the keys of map o into base; *seen gets a bit per field found. */
static int decode_keys(const msgpack_object *o, const struct msg_table *t, void *base,
		       const char *path, int skip_header, uint64_t *seen)
{
	unsigned from = 0;
	int rc;

	if (o->type != MSGPACK_OBJECT_MAP)
		return dcast_fail(DCAST_EFIELD_TYPE, "%s: expected map, got %s", path,
				  kind_name(o->type));
	if (o->via.map.size > MAX_MAP_KEYS)
		return dcast_fail(DCAST_ETOO_LARGE, "%s: %u keys exceeds %d", path,
				  o->via.map.size, MAX_MAP_KEYS);
	if ((rc = check_duplicates(&o->via.map, path)))
		return rc;
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object_kv *kv = &o->via.map.ptr[i];
		if ((rc = check_key(&kv->key, path)))
			return rc;
		if (skip_header && is_header_key(&kv->key))
			continue;
		int fi = find_field(t, &kv->key, &from);
		if (fi < 0 && (rc = unknown_key(&kv->key, path)))
			return rc;
		if (fi < 0)
			continue;
		*seen |= 1ull << fi;
		if ((rc = decode_field(&kv->val, &t->fields[fi], base, path)))
			return rc;
	}
	return 0;
}

/* A nested map (a tensor, a digest): its keys, then the required ones. */
static int decode_map(const msgpack_object *o, const struct msg_table *t, void *base,
		      const char *path)
{
	uint64_t seen = 0;
	int rc = decode_keys(o, t, base, path, 0, &seen);

	return rc ? rc : check_missing(t, seen, path, 0);
}

static const msgpack_object *lookup(const msgpack_object_map *m, const char *key)
{
	for (uint32_t i = 0; i < m->size; i++)
		if (is_key(&m->ptr[i].key, key))
			return &m->ptr[i].val;
	return NULL;
}

/* "proto" first (a peer speaking another version may change everything
 * else), then "type". */
static int decode_type(const msgpack_object *root, int *type)
{
	const msgpack_object *proto, *t;

	if (root->type != MSGPACK_OBJECT_MAP)
		return dcast_fail(DCAST_EMALFORMED, "header: expected a map, got %s",
				  kind_name(root->type));
	if (!(proto = lookup(&root->via.map, "proto")))
		return dcast_fail(DCAST_EFIELD_MISSING, "header.proto: required field missing");
	if (proto->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return dcast_fail(DCAST_EFIELD_TYPE, "header.proto: expected uint, got %s",
				  kind_name(proto->type));
	if (proto->via.u64 != DCAST_PROTO_VERSION)
		return dcast_fail(DCAST_EPROTO_VERSION,
				  "header.proto: version %llu not spoken (this build speaks %d)",
				  (unsigned long long)proto->via.u64, DCAST_PROTO_VERSION);
	if (!(t = lookup(&root->via.map, "type")))
		return dcast_fail(DCAST_EFIELD_MISSING, "header.type: required field missing");
	if (t->type != MSGPACK_OBJECT_STR)
		return dcast_fail(DCAST_EFIELD_TYPE, "header.type: expected str, got %s",
				  kind_name(t->type));
	for (int i = 1; i < DCAST_MSG_TYPE_COUNT; i++) /* the name formatted only for an error */
		if (t->via.str.size == strlen(schema_table(i)->name) &&
		    memcmp(schema_table(i)->name, t->via.str.ptr, t->via.str.size) == 0)
			return *type = i, 0;
	return dcast_fail(DCAST_EMSG_TYPE, "header.type: unknown message type \"%s\"", shown(t).text);
}

/* The last check of a MANIFEST: its content against the sum it carries,
 * which the keys' own checks leave as the only one a flipped bit of a
 * name, dtype or shape can still break. */
static int check_sum(const dcast_manifest *m)
{
	uint64_t sum = dcast_manifest_sum(m);
	char model[DCAST_PRINTABLE_CAP(SHOWN)];

	if (sum == m->sum)
		return 0;
	dcast_printable(model, sizeof(model), m->model, strnlen(m->model, SHOWN));
	return dcast_fail(DCAST_ECHECKSUM,
			  "MANIFEST of %s (%u tensors): content sums to %016llx, MANIFEST.sum says %016llx",
			  model, m->n_tensors, (unsigned long long)sum, (unsigned long long)m->sum);
}

/* The field bit of MANIFEST.sum in a decode_keys() seen mask. */
static uint64_t sum_bit(const struct msg_table *t)
{
	uint64_t bit = 0;

	for (unsigned i = 0; i < t->n_fields; i++)
		bit |= (uint64_t)(t->fields[i].kind == F_SUM) << i;
	return bit;
}

static int decode_root(const msgpack_object *root, dcast_msg *m, int stored)
{
	uint64_t seen = 0;
	int type = 0, rc;

	if ((rc = decode_type(root, &type)))
		return rc;
	dcast_msg_init(m, type);
	const struct msg_table *t = schema_table(type);
	if ((rc = decode_keys(root, t, &m->u, t->name, 1, &seen)) ||
	    (rc = check_missing(t, seen, t->name, stored)) || (rc = dcast_msg_validate(m)))
		return rc;
	if (type != DCAST_MSG_MANIFEST || !(seen & sum_bit(t)))
		return 0; /* no sum: a stored MANIFEST of an older build */
	return check_sum(&m->u.manifest);
}

static int decode(const void *data, size_t len, dcast_msg *m, int stored)
{
	msgpack_unpacked up;
	size_t off = 0;
	int rc;

	memset(m, 0, sizeof(*m));
	if (!data && len)
		return dcast_fail(DCAST_EINVAL, "header: NULL data");
	if (len > DCAST_MAX_HEADER_BYTES)
		return dcast_fail(DCAST_ETOO_LARGE, "header: %zu bytes exceeds DCAST_MAX_HEADER_BYTES (%u)",
				  len, DCAST_MAX_HEADER_BYTES);
	if (len == 0)
		return dcast_fail(DCAST_ETRUNCATED, "header: empty frame");
	if ((rc = schema_prescan(data, len)))
		return rc;
	msgpack_unpacked_init(&up);
	if (msgpack_unpack_next(&up, data, len, &off) != MSGPACK_UNPACK_SUCCESS)
		rc = dcast_fail(DCAST_EMALFORMED, "header: msgpack-c could not unpack it");
	else
		rc = decode_root(&up.data, m, stored);
	msgpack_unpacked_destroy(&up);
	if (rc)
		dcast_msg_free(m);
	return rc;
}

int dcast_msg_decode(const void *data, size_t len, dcast_msg *m)
{
	return decode(data, len, m, 0);
}

int dcast_msg_decode_stored(const void *data, size_t len, dcast_msg *m)
{
	return decode(data, len, m, 1);
}
