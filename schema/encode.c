/* Header encoding (dcast_msg -> msgpack, via msgpack-c's packer) and the
 * JSON rendering used by test vectors, both driven by the field tables. */
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>
#include "dcast_common.h"
#include "schema_impl.h"

/* ---- msgpack ---- */

static void pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

static void pack_map(msgpack_packer *pk, const struct msg_table *t, const void *base);

static void pack_array(msgpack_packer *pk, const struct field *f, const void *base)
{
	struct schema_array a = schema_array_of(f, base);

	msgpack_pack_array(pk, *a.count);
	for (uint32_t i = 0; i < *a.count; i++)
		pack_map(pk, a.table, (const char *)*a.entries + i * a.entry_size);
}

static void pack_field(msgpack_packer *pk, const struct field *f, const void *base)
{
	const void *slot = (const char *)base + f->off;
	const dcast_tensor_desc *t = base;

	pack_str(pk, f->key);
	switch (f->kind) {
	case F_U32: msgpack_pack_uint32(pk, *(const uint32_t *)slot); break;
	case F_U64: msgpack_pack_uint64(pk, *(const uint64_t *)slot); break;
	case F_SUM: msgpack_pack_uint64(pk, dcast_manifest_sum(base)); break;
	case F_BOOL:
		(*(const uint32_t *)slot ? msgpack_pack_true : msgpack_pack_false)(pk);
		break;
	case F_VER:
		if (*(const uint64_t *)slot == DCAST_VERSION_NONE)
			msgpack_pack_nil(pk);
		else
			msgpack_pack_uint64(pk, *(const uint64_t *)slot);
		break;
	case F_STR: pack_str(pk, slot); break;
	case F_ROLE: pack_str(pk, schema_role_name(*(const uint32_t *)slot)); break;
	case F_DTYPE: pack_str(pk, dcast_dtype_name(*(const uint32_t *)slot)); break;
	case F_SHAPE:
		msgpack_pack_array(pk, t->ndim);
		for (uint32_t i = 0; i < t->ndim; i++)
			msgpack_pack_uint64(pk, t->shape[i]);
		break;
	case F_GRID:
		msgpack_pack_array(pk, t->ndim);
		for (uint32_t i = 0; i < t->ndim; i++)
			msgpack_pack_uint32(pk, t->grid[i] ? t->grid[i] : 1);
		break;
	default: pack_array(pk, f, base); break;
	}
}

static unsigned n_present(const struct msg_table *t, const void *base)
{
	unsigned n = 0;

	for (unsigned i = 0; i < t->n_fields; i++)
		n += (unsigned)schema_field_present(&t->fields[i], base);
	return n;
}

static void pack_fields(msgpack_packer *pk, const struct msg_table *t, const void *base)
{
	for (unsigned i = 0; i < t->n_fields; i++)
		if (schema_field_present(&t->fields[i], base))
			pack_field(pk, &t->fields[i], base);
}

static void pack_map(msgpack_packer *pk, const struct msg_table *t, const void *base)
{
	msgpack_pack_map(pk, n_present(t, base));
	pack_fields(pk, t, base);
}

/* The encoder's output: a heap buffer from HDR_FIRST bytes, doubled as it
 * fills (msgpack's sbuffer starts at 8 KiB: a malloc that size for every
 * ~150-byte CHUNK header, held until ZeroMQ sent it). */
#define HDR_FIRST 256u

typedef struct hdr_buf {
	char *data;
	size_t size, cap;
	int oom;
} hdr_buf;

static int hdr_write(void *arg, const char *p, size_t n)
{
	hdr_buf *b = arg;

	if (b->oom)
		return -1;
	if (b->size + n > b->cap) {
		size_t cap = b->cap ? b->cap : HDR_FIRST;
		char *d;

		while (cap < b->size + n)
			cap *= 2;
		if (!(d = realloc(b->data, cap))) {
			b->oom = 1;
			return -1;
		}
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->size, p, n);
	b->size += n;
	return 0;
}

int dcast_msg_encode(const dcast_msg *m, void **out, size_t *out_len)
{
	hdr_buf b = {0};
	msgpack_packer pk;
	int rc;

	*out = NULL;
	*out_len = 0;
	if ((rc = dcast_msg_validate(m)))
		return rc;
	const struct msg_table *t = schema_table(m->type);
	msgpack_packer_init(&pk, &b, hdr_write);
	msgpack_pack_map(&pk, 2 + n_present(t, &m->u));
	pack_str(&pk, "proto");
	msgpack_pack_uint32(&pk, DCAST_PROTO_VERSION);
	pack_str(&pk, "type");
	pack_str(&pk, t->name);
	pack_fields(&pk, t, &m->u);
	if (b.oom || !b.data) {
		free(b.data);
		return dcast_fail(DCAST_ENOMEM, "%s: out of memory encoding header", t->name);
	}
	if (b.size > DCAST_MAX_HEADER_BYTES) { /* every receiver would refuse it */
		free(b.data);
		return dcast_fail(DCAST_ETOO_LARGE, "%s: header of %zu bytes exceeds DCAST_MAX_HEADER_BYTES (%u)",
				  t->name, b.size, DCAST_MAX_HEADER_BYTES);
	}
	*out_len = b.size;
	*out = b.data;
	return 0;
}

/* ---- JSON ---- */

struct jbuf {
	char *p;
	size_t len, cap;
	int oom;
};

static void jput(struct jbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->cap + n + 1) * 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = 1;
			return;
		}
		b->p = p, b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void jputs(struct jbuf *b, const char *s)
{
	jput(b, s, strlen(s));
}

static void jstr(struct jbuf *b, const char *s)
{
	char esc[8];

	jputs(b, "\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\' || c < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			jputs(b, esc);
		} else {
			jput(b, s, 1);
		}
	}
	jputs(b, "\"");
}

static void juint(struct jbuf *b, uint64_t v)
{
	char num[24];

	snprintf(num, sizeof(num), "%llu", (unsigned long long)v);
	jputs(b, num);
}

static void json_map(struct jbuf *b, const struct msg_table *t, const void *base);

static void json_array(struct jbuf *b, const struct field *f, const void *base)
{
	struct schema_array a = schema_array_of(f, base);

	jputs(b, "[");
	for (uint32_t i = 0; i < *a.count; i++) {
		jputs(b, i ? ", " : "");
		json_map(b, a.table, (const char *)*a.entries + i * a.entry_size);
	}
	jputs(b, "]");
}

static void json_value(struct jbuf *b, const struct field *f, const void *base)
{
	const void *slot = (const char *)base + f->off;
	const dcast_tensor_desc *t = base;

	switch (f->kind) {
	case F_U32: juint(b, *(const uint32_t *)slot); break;
	case F_U64: juint(b, *(const uint64_t *)slot); break;
	case F_SUM: juint(b, dcast_manifest_sum(base)); break;
	case F_BOOL: jputs(b, *(const uint32_t *)slot ? "true" : "false"); break;
	case F_VER:
		if (*(const uint64_t *)slot == DCAST_VERSION_NONE)
			jputs(b, "null");
		else
			juint(b, *(const uint64_t *)slot);
		break;
	case F_STR: jstr(b, slot); break;
	case F_ROLE: jstr(b, schema_role_name(*(const uint32_t *)slot)); break;
	case F_DTYPE: jstr(b, dcast_dtype_name(*(const uint32_t *)slot)); break;
	case F_SHAPE:
	case F_GRID:
		jputs(b, "[");
		for (uint32_t i = 0; i < t->ndim; i++) {
			jputs(b, i ? ", " : "");
			juint(b, f->kind == F_SHAPE ? t->shape[i] : t->grid[i] ? t->grid[i] : 1);
		}
		jputs(b, "]");
		break;
	default: json_array(b, f, base); break;
	}
}

static void json_fields(struct jbuf *b, const struct msg_table *t, const void *base, int first)
{
	for (unsigned i = 0; i < t->n_fields; i++) {
		if (!schema_field_present(&t->fields[i], base))
			continue;
		jputs(b, first ? "\"" : ", \"");
		first = 0;
		jputs(b, t->fields[i].key);
		jputs(b, "\": ");
		json_value(b, &t->fields[i], base);
	}
}

static void json_map(struct jbuf *b, const struct msg_table *t, const void *base)
{
	jputs(b, "{");
	json_fields(b, t, base, 1);
	jputs(b, "}");
}

int dcast_msg_to_json(const dcast_msg *m, char **out)
{
	const struct msg_table *t = schema_table(m->type);
	struct jbuf b = {0};

	*out = NULL;
	if (!t)
		return dcast_fail(DCAST_EMSG_TYPE, "message type %u unknown", m->type);
	jputs(&b, "{\"proto\": ");
	juint(&b, DCAST_PROTO_VERSION);
	jputs(&b, ", \"type\": ");
	jstr(&b, t->name);
	json_fields(&b, t, &m->u, 0);
	jputs(&b, "}\n");
	if (b.oom) {
		free(b.p);
		return dcast_fail(DCAST_ENOMEM, "%s: out of memory rendering JSON", t->name);
	}
	*out = b.p;
	return 0;
}
