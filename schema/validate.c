/* Message construction and the checks shared by encode and decode: field
 * ranges from the tables, then the cross-field rules of docs/protocol.md. */
#include <string.h>
#include "deltacast/codec.h"
#include "dcast_common.h"
#include "schema_impl.h"

void dcast_msg_init(dcast_msg *m, dcast_msg_type type)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	switch (type) {
	case DCAST_MSG_HELLO:
		m->u.hello.parts = 1;
		m->u.hello.have_version = DCAST_VERSION_NONE;
		break;
	case DCAST_MSG_WELCOME:
		m->u.welcome.version = m->u.welcome.anchor_version = DCAST_VERSION_NONE;
		break;
	case DCAST_MSG_CHUNK:
		m->u.chunk.base_version = DCAST_VERSION_NONE;
		break;
	case DCAST_MSG_COMMIT:
		m->u.commit.base_version = DCAST_VERSION_NONE;
		m->u.commit.parts = 1;
		break;
	case DCAST_MSG_ERROR:
		m->u.error.version = DCAST_VERSION_NONE;
		break;
	case DCAST_MSG_HEARTBEAT:
		m->u.heartbeat.version = DCAST_VERSION_NONE;
		break;
	default:
		break;
	}
}

void dcast_msg_free(dcast_msg *m)
{
	if (!m)
		return;
	if (m->type == DCAST_MSG_MANIFEST) {
		free(m->u.manifest.tensors);
		m->u.manifest.tensors = NULL;
		m->u.manifest.n_tensors = 0;
	} else if (m->type == DCAST_MSG_COMMIT) {
		free(m->u.commit.digests);
		m->u.commit.digests = NULL;
		m->u.commit.n_digests = 0;
	}
}

static int check_range(const struct field *f, uint64_t v, const char *path)
{
	if (v >= f->min && v <= f->max)
		return 0;
	return dcast_fail(DCAST_EFIELD_RANGE, "%s.%s: %llu outside [%llu, %llu]", path, f->key,
			  (unsigned long long)v, (unsigned long long)f->min,
			  (unsigned long long)f->max);
}

static int check_str(const struct field *f, const char *s, const char *path)
{
	size_t n = strnlen(s, f->max + 1);

	if (n > f->max)
		return dcast_fail(DCAST_ETOO_LARGE, "%s.%s: longer than limit %llu", path, f->key,
				  (unsigned long long)f->max);
	if (n < f->min)
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.%s: must not be empty", path, f->key);
	return 0;
}

static int check_shape(const dcast_tensor_desc *t, const char *path)
{
	uint64_t n = dcast_dtype_lanes((int)t->dtype) ? dcast_dtype_lanes((int)t->dtype) : 1;

	if (t->ndim > DCAST_MAX_DIMS)
		return dcast_fail(DCAST_ETOO_LARGE, "%s.shape: %u dims exceeds DCAST_MAX_DIMS (%d)",
				  path, t->ndim, DCAST_MAX_DIMS);
	for (uint32_t i = 0; i < t->ndim; i++) {
		if (t->shape[i] > DCAST_MAX_TENSOR_ELEMS ||
		    (t->shape[i] && n > DCAST_MAX_TENSOR_ELEMS / t->shape[i]))
			return dcast_fail(DCAST_EFIELD_RANGE,
					  "%s.shape: more than DCAST_MAX_TENSOR_ELEMS (2^48) elements",
					  path);
		n *= t->shape[i];
	}
	return 0;
}

/* A grid names every dimension (no more), and its tiles divide the shape. */
static int check_grid(const dcast_tensor_desc *t, const char *path)
{
	uint32_t n = 0;

	while (n < DCAST_MAX_DIMS && t->grid[n])
		n++;
	if (!n)
		return 0;
	for (uint32_t i = n; i < DCAST_MAX_DIMS; i++)
		if (t->grid[i])
			return dcast_fail(DCAST_EFIELD_RANGE, "%s.grid[%u]: 0 tiles", path, n);
	if (n != t->ndim)
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.grid: %u entries for a shape of %u dims",
				  path, n, t->ndim);
	for (uint32_t i = 0; i < n; i++)
		if (t->shape[i] % t->grid[i])
			return dcast_fail(DCAST_EFIELD_RANGE, "%s.grid[%u]: %u tiles do not divide "
					  "shape[%u] = %llu", path, i, t->grid[i], i,
					  (unsigned long long)t->shape[i]);
	return 0;
}

static int check_array(const struct field *f, const void *base, const char *path);

static int check_field(const struct field *f, const void *base, const char *path)
{
	const void *slot = (const char *)base + f->off;

	switch (f->kind) {
	case F_U32:
	case F_BOOL:
	case F_ROLE:
	case F_DTYPE:
		return check_range(f, *(const uint32_t *)slot, path);
	case F_U64:
	case F_SUM: /* any value; the decoder checks it against the content */
		return check_range(f, *(const uint64_t *)slot, path);
	case F_VER:
		if (*(const uint64_t *)slot == DCAST_VERSION_NONE)
			return 0;
		return check_range(f, *(const uint64_t *)slot, path);
	case F_STR:
		return check_str(f, slot, path);
	case F_SHAPE:
		return check_shape(base, path);
	case F_GRID:
		return check_grid(base, path);
	default:
		return check_array(f, base, path);
	}
}

int schema_validate_fields(const struct msg_table *t, const void *base, const char *path)
{
	int rc = 0;

	for (unsigned i = 0; i < t->n_fields && !rc; i++)
		rc = check_field(&t->fields[i], base, path);
	return rc;
}

static int check_array(const struct field *f, const void *base, const char *path)
{
	struct schema_array a = schema_array_of(f, base);
	uint32_t n = *a.count;
	char sub_path[96];
	int rc = 0;

	if (n > f->max)
		return dcast_fail(DCAST_ETOO_LARGE, "%s.%s: %u entries exceeds limit %llu", path,
				  f->key, n, (unsigned long long)f->max);
	if (n && !*a.entries)
		return dcast_fail(DCAST_EINVAL, "%s.%s: %u entries but no array", path, f->key, n);
	for (uint32_t i = 0; i < n && !rc; i++) {
		const char *entry = (const char *)*a.entries + i * a.entry_size;
		if (!schema_validate_fields(a.table, entry, path))
			continue; /* the entry's path only for its error, checked again */
		snprintf(sub_path, sizeof(sub_path), "%s.%s[%u]", path, f->key, i);
		rc = schema_validate_fields(a.table, entry, sub_path);
	}
	return rc;
}

/* anchor <=> no base; a delta's base precedes its version. */
static int check_base(const char *path, uint32_t anchor, uint64_t version, uint64_t base)
{
	if (anchor && base != DCAST_VERSION_NONE)
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.base_version: an anchor has no base", path);
	if (!anchor && base == DCAST_VERSION_NONE)
		return dcast_fail(DCAST_EFIELD_MISSING, "%s.base_version: required for a delta", path);
	if (!anchor && base >= version)
		return dcast_fail(DCAST_EFIELD_RANGE,
				  "%s.base_version: %llu not below version %llu", path,
				  (unsigned long long)base, (unsigned long long)version);
	return 0;
}

static int check_part(const char *path, uint32_t part, uint32_t parts)
{
	if (part >= parts)
		return dcast_fail(DCAST_EFIELD_RANGE, "%s.part: %u not below parts (%u)", path,
				  part, parts);
	return 0;
}

static int check_chunk(const dcast_chunk *c)
{
	int rc = check_base("CHUNK", c->anchor, c->version, c->base_version);

	if (rc)
		return rc;
	if (c->elem_size == 3)
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK.elem_size: 3 is not 1, 2 or 4");
	if (c->changed > c->count)
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK.changed: %llu exceeds count %llu",
				  (unsigned long long)c->changed, (unsigned long long)c->count);
	if (c->start + c->count > DCAST_MAX_TENSOR_ELEMS)
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK.start: range ends past 2^48 elements");
	if (c->anchor && c->encoding != DCAST_ENC_DENSE)
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK.encoding: an anchor must be dense (0)");
	if (c->encoding == DCAST_ENC_DENSE && c->payload_bytes != c->count * c->elem_size)
		return dcast_fail(DCAST_EFIELD_RANGE,
				  "CHUNK.payload_bytes: %llu, dense needs count*elem_size = %llu",
				  (unsigned long long)c->payload_bytes,
				  (unsigned long long)(c->count * c->elem_size));
	return 0;
}

/* Length of the well-formed UTF-8 sequence at p (n bytes left), or 0:
 * shortest forms only, no surrogates, nothing above U+10FFFF (RFC 3629). */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
	unsigned c = p[0], len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
				 : (c & 0xf8) == 0xf0 ? 4 : 0;
	uint32_t cp;

	if (!len || len > n)
		return 0;
	cp = len == 1 ? c : c & (0x7fu >> len);
	for (unsigned i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
	    cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

size_t schema_utf8_bad_at(const char *s, size_t n)
{
	size_t i = 0, k;

	while (i < n && (k = utf8_seq((const unsigned char *)s + i, n - i)))
		i += k;
	return i;
}

/* The key a safetensors header keeps for its metadata: a tensor of that
 * name cannot be written to a consumer's anchor file. */
#define RESERVED_NAME "__metadata__"

/* Refuse a tensor name: its first 64 bytes escaped, and the rule. */
static int name_fail(int err, const char *what, const char *name, size_t n, const char *rule)
{
	char shown[DCAST_PRINTABLE_CAP(64)];

	dcast_printable(shown, sizeof(shown), name, n < 64 ? n : 64);
	return dcast_fail(err, "%s: tensor name \"%s%s\" %s", what, shown, n > 64 ? "..." : "", rule);
}

int dcast_tensor_name_check(const char *name, const char *what)
{
	size_t n = name ? strnlen(name, DCAST_MAX_NAME + 1) : 0, bad;
	char rule[64];

	if (!n)
		return dcast_fail(DCAST_EFIELD_RANGE, "%s: tensor name must not be empty", what);
	if (n > DCAST_MAX_NAME)
		return name_fail(DCAST_ETOO_LARGE, what, name, n, "is longer than 255 bytes");
	if ((bad = schema_utf8_bad_at(name, n)) < n) {
		snprintf(rule, sizeof(rule), "is not UTF-8 (byte 0x%02x at offset %zu)",
			 (unsigned char)name[bad], bad);
		return name_fail(DCAST_EFIELD_RANGE, what, name, n, rule);
	}
	if (strcmp(name, RESERVED_NAME) == 0)
		return name_fail(DCAST_EFIELD_RANGE, what, name, n,
				 "is reserved (safetensors keeps it for metadata)");
	return 0;
}

static int name_cmp(const void *a, const void *b)
{
	const dcast_tensor_desc *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

static int check_names(const dcast_manifest *m)
{
	char what[48];
	int rc = 0;

	for (uint32_t i = 0; i < m->n_tensors && !rc; i++) {
		if (!dcast_tensor_name_check(m->tensors[i].name, "MANIFEST.tensors"))
			continue; /* the entry's path only for its error */
		snprintf(what, sizeof(what), "MANIFEST.tensors[%u].name", i);
		rc = dcast_tensor_name_check(m->tensors[i].name, what);
	}
	return rc;
}

static int check_manifest(const dcast_manifest *m)
{
	const dcast_tensor_desc **idx;
	char shown[DCAST_PRINTABLE_CAP(64)];
	int rc = check_names(m);

	if (rc || m->n_tensors < 2)
		return rc;
	if (!(idx = malloc(m->n_tensors * sizeof(*idx))))
		return dcast_fail(DCAST_ENOMEM, "MANIFEST.tensors: out of memory");
	for (uint32_t i = 0; i < m->n_tensors; i++)
		idx[i] = &m->tensors[i];
	qsort(idx, m->n_tensors, sizeof(*idx), name_cmp);
	for (uint32_t i = 1; i < m->n_tensors && !rc; i++)
		if (strcmp(idx[i - 1]->name, idx[i]->name) == 0)
			rc = dcast_fail(DCAST_EFIELD_RANGE, "MANIFEST.tensors: duplicate name \"%s\"",
					dcast_printable(shown, sizeof(shown), idx[i]->name,
							strnlen(idx[i]->name, 64)));
	free(idx);
	return rc;
}

static int check_digests(const dcast_commit *c)
{
	for (uint32_t i = 0; i < c->n_digests; i++)
		if (c->digests[i].start + c->digests[i].count > DCAST_MAX_TENSOR_ELEMS)
			return dcast_fail(DCAST_EFIELD_RANGE,
					  "COMMIT.digests[%u]: range ends past 2^48 elements", i);
	return 0;
}

/* Printable ASCII without spaces: an endpoint reaches logs and
 * zmq_connect() as it is. */
int dcast_endpoint_check(const char *ep, const char *what)
{
	size_t n = ep ? strnlen(ep, DCAST_MAX_ENDPOINT + 1) : 0;

	if (n > DCAST_MAX_ENDPOINT)
		return dcast_fail(DCAST_ETOO_LARGE, "%s: longer than %d bytes", what,
				  DCAST_MAX_ENDPOINT);
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)ep[i] <= ' ' || (unsigned char)ep[i] > '~')
			return dcast_fail(DCAST_EFIELD_RANGE, "%s: byte 0x%02x at offset %zu is not "
					  "printable ASCII", what, (unsigned char)ep[i], i);
	return 0;
}

static int check_welcome(const dcast_welcome *w)
{
	if (w->anchor_version != DCAST_VERSION_NONE &&
	    (w->version == DCAST_VERSION_NONE || w->anchor_version > w->version))
		return dcast_fail(DCAST_EFIELD_RANGE, "WELCOME.anchor_version: after version");
	return dcast_endpoint_check(w->consumers, "WELCOME.x-consumers");
}

static int check_cross(const dcast_msg *m)
{
	const dcast_commit *c = &m->u.commit;
	int rc;

	switch (m->type) {
	case DCAST_MSG_HELLO:
		return check_part("HELLO", m->u.hello.part, m->u.hello.parts);
	case DCAST_MSG_CHUNK:
		return check_chunk(&m->u.chunk);
	case DCAST_MSG_COMMIT:
		if ((rc = check_base("COMMIT", c->anchor, c->version, c->base_version)) ||
		    (rc = check_part("COMMIT", c->part, c->parts)))
			return rc;
		return check_digests(c);
	case DCAST_MSG_MANIFEST:
		return check_manifest(&m->u.manifest);
	case DCAST_MSG_WELCOME:
		return check_welcome(&m->u.welcome);
	default:
		return 0;
	}
}

int dcast_msg_validate(const dcast_msg *m)
{
	const struct msg_table *t = schema_table(m ? (int)m->type : 0);
	int rc;

	if (!t)
		return dcast_fail(DCAST_EMSG_TYPE, "message type %d unknown", m ? (int)m->type : -1);
	if ((rc = schema_validate_fields(t, &m->u, t->name)))
		return rc;
	return check_cross(m);
}

int dcast_msg_check_payload(const dcast_msg *m, size_t payload_len)
{
	uint64_t want = m->type == DCAST_MSG_CHUNK ? m->u.chunk.payload_bytes : 0;

	if (payload_len == want)
		return 0;
	return dcast_fail(DCAST_EPAYLOAD_SIZE, "%s: payload frame of %zu bytes, header says %llu",
			  dcast_msg_type_name(m->type), payload_len, (unsigned long long)want);
}

