/* The field tables of wire schema v1: one row per header field, in
 * encoding order.  docs/protocol.md describes the same fields in prose. */
#include <string.h>
#include "deltacast/codec.h"
#include "dcast_common.h"
#include "schema_impl.h"

#define U64MAX UINT64_MAX
#define VERMAX (UINT64_MAX - 1)
#define OFF(s, f) ((uint16_t)offsetof(s, f))
#define NAME(s, f, req) {#f, F_STR, req, OFF(s, f), 1, DCAST_MAX_NAME}

static const struct field hello_fields[] = {
	{"role", F_ROLE, 1, OFF(dcast_hello, role), 0, 1},
	NAME(dcast_hello, model, 1),
	{"part", F_U32, 0, OFF(dcast_hello, part), 0, DCAST_MAX_PARTS - 1},
	{"parts", F_U32, 0, OFF(dcast_hello, parts), 1, DCAST_MAX_PARTS},
	{"have_version", F_VER, 0, OFF(dcast_hello, have_version), 0, VERMAX},
	{"window_bytes", F_U64, 0, OFF(dcast_hello, window_bytes), 0, DCAST_MAX_CREDIT_BYTES},
	{"client", F_STR, 0, OFF(dcast_hello, client), 0, DCAST_MAX_CLIENT},
	{"x-bulk", F_BOOL, 0, OFF(dcast_hello, bulk), 0, 1},
};

static const struct field welcome_fields[] = {
	NAME(dcast_welcome, model, 1),
	{"version", F_VER, 1, OFF(dcast_welcome, version), 0, VERMAX},
	{"anchor_version", F_VER, 1, OFF(dcast_welcome, anchor_version), 0, VERMAX},
	{"need_anchor", F_BOOL, 1, OFF(dcast_welcome, need_anchor), 0, 1},
	{"heartbeat_ms", F_U32, 0, OFF(dcast_welcome, heartbeat_ms), 0, 3600000},
	{"run", F_U64, 0, OFF(dcast_welcome, run), 0, UINT64_MAX},
	{"x-consumers", F_STR, 0, OFF(dcast_welcome, consumers), 0, DCAST_MAX_ENDPOINT},
};

static const struct field manifest_fields[] = {
	NAME(dcast_manifest, model, 1),
	{"tensors", F_TENSORS, 1, OFF(dcast_manifest, n_tensors), 0, DCAST_MAX_TENSORS},
	{"sum", F_SUM, 1, OFF(dcast_manifest, sum), 0, U64MAX},
};

static const struct field chunk_fields[] = {
	NAME(dcast_chunk, model, 1),
	{"version", F_U64, 1, OFF(dcast_chunk, version), 0, VERMAX},
	{"base_version", F_VER, 0, OFF(dcast_chunk, base_version), 0, VERMAX},
	{"anchor", F_BOOL, 1, OFF(dcast_chunk, anchor), 0, 1},
	{"part", F_U32, 0, OFF(dcast_chunk, part), 0, DCAST_MAX_PARTS - 1},
	{"seq", F_U32, 1, OFF(dcast_chunk, seq), 0, DCAST_MAX_CHUNKS - 1},
	{"tensor", F_U32, 1, OFF(dcast_chunk, tensor), 0, DCAST_MAX_TENSORS - 1},
	{"start", F_U64, 1, OFF(dcast_chunk, start), 0, DCAST_MAX_TENSOR_ELEMS - 1},
	{"count", F_U64, 1, OFF(dcast_chunk, count), 1, DCAST_MAX_RANGE_ELEMS},
	{"elem_size", F_U32, 1, OFF(dcast_chunk, elem_size), 1, 4},
	{"encoding", F_U32, 1, OFF(dcast_chunk, encoding), 0, DCAST_ENC_COUNT - 1},
	{"changed", F_U64, 1, OFF(dcast_chunk, changed), 0, DCAST_MAX_RANGE_ELEMS},
	{"payload_bytes", F_U64, 1, OFF(dcast_chunk, payload_bytes), 0, DCAST_MAX_CHUNK_BYTES},
	{"checksum", F_U64, 1, OFF(dcast_chunk, checksum), 0, U64MAX},
};

static const struct field commit_fields[] = {
	NAME(dcast_commit, model, 1),
	{"version", F_U64, 1, OFF(dcast_commit, version), 0, VERMAX},
	{"base_version", F_VER, 0, OFF(dcast_commit, base_version), 0, VERMAX},
	{"anchor", F_BOOL, 1, OFF(dcast_commit, anchor), 0, 1},
	{"part", F_U32, 0, OFF(dcast_commit, part), 0, DCAST_MAX_PARTS - 1},
	{"parts", F_U32, 0, OFF(dcast_commit, parts), 1, DCAST_MAX_PARTS},
	{"chunks", F_U32, 1, OFF(dcast_commit, chunks), 0, DCAST_MAX_CHUNKS},
	{"bytes", F_U64, 1, OFF(dcast_commit, bytes), 0, 1ull << 62},
	{"digests", F_DIGESTS, 1, OFF(dcast_commit, n_digests), 0, DCAST_MAX_DIGESTS},
};

static const struct field ack_fields[] = {
	NAME(dcast_ack, model, 1),
	{"version", F_U64, 1, OFF(dcast_ack, version), 0, VERMAX},
	{"part", F_U32, 0, OFF(dcast_ack, part), 0, DCAST_MAX_PARTS - 1},
};

static const struct field credit_fields[] = {
	{"bytes", F_U64, 1, OFF(dcast_credit, bytes), 1, DCAST_MAX_CREDIT_BYTES},
	{"model", F_STR, 0, OFF(dcast_credit, model), 0, DCAST_MAX_NAME},
};

static const struct field error_fields[] = {
	{"code", F_U32, 1, OFF(dcast_error_msg, code), 1, DCAST_MAX_CODE},
	{"text", F_STR, 1, OFF(dcast_error_msg, text), 0, DCAST_MAX_TEXT},
	{"model", F_STR, 0, OFF(dcast_error_msg, model), 0, DCAST_MAX_NAME},
	{"version", F_VER, 0, OFF(dcast_error_msg, version), 0, VERMAX},
};

static const struct field heartbeat_fields[] = {
	{"time_ms", F_U64, 0, OFF(dcast_heartbeat, time_ms), 0, U64MAX},
	{"version", F_VER, 0, OFF(dcast_heartbeat, version), 0, VERMAX},
};

static const struct field bye_fields[] = {
	{"reason", F_STR, 0, OFF(dcast_bye, reason), 0, DCAST_MAX_TEXT},
};

static const struct field bulk_fields[] = {
	NAME(dcast_bulk, model, 1),
	{"version", F_U64, 1, OFF(dcast_bulk, version), 0, VERMAX},
	{"port", F_U32, 1, OFF(dcast_bulk, port), 1, 65535},
	{"token", F_U64, 1, OFF(dcast_bulk, token), 0, U64MAX},
	{"chunks", F_U32, 1, OFF(dcast_bulk, chunks), 0, DCAST_MAX_CHUNKS},
	{"bytes", F_U64, 1, OFF(dcast_bulk, bytes), 0, 1ull << 62},
};

static const struct field tensor_fields[] = {
	NAME(dcast_tensor_desc, name, 1),
	{"dtype", F_DTYPE, 1, OFF(dcast_tensor_desc, dtype), 0, DCAST_DTYPE_COUNT - 1},
	{"shape", F_SHAPE, 1, OFF(dcast_tensor_desc, ndim), 0, DCAST_MAX_DIMS},
	{"grid", F_GRID, 0, OFF(dcast_tensor_desc, grid), 1, UINT32_MAX},
};

static const struct field digest_fields[] = {
	{"tensor", F_U32, 1, OFF(dcast_range_digest, tensor), 0, DCAST_MAX_TENSORS - 1},
	{"start", F_U64, 1, OFF(dcast_range_digest, start), 0, DCAST_MAX_TENSOR_ELEMS - 1},
	{"count", F_U64, 1, OFF(dcast_range_digest, count), 0, DCAST_MAX_TENSOR_ELEMS},
	{"digest", F_U64, 1, OFF(dcast_range_digest, digest), 0, U64MAX},
};

#define TABLE(n, f) {n, f, DCAST_ARRAY_LEN(f)}

static const struct msg_table tables[DCAST_MSG_TYPE_COUNT] = {
	[DCAST_MSG_HELLO] = TABLE("HELLO", hello_fields),
	[DCAST_MSG_WELCOME] = TABLE("WELCOME", welcome_fields),
	[DCAST_MSG_MANIFEST] = TABLE("MANIFEST", manifest_fields),
	[DCAST_MSG_CHUNK] = TABLE("CHUNK", chunk_fields),
	[DCAST_MSG_COMMIT] = TABLE("COMMIT", commit_fields),
	[DCAST_MSG_ACK] = TABLE("ACK", ack_fields),
	[DCAST_MSG_CREDIT] = TABLE("CREDIT", credit_fields),
	[DCAST_MSG_ERROR] = TABLE("ERROR", error_fields),
	[DCAST_MSG_HEARTBEAT] = TABLE("HEARTBEAT", heartbeat_fields),
	[DCAST_MSG_BYE] = TABLE("BYE", bye_fields),
	[DCAST_MSG_BULK] = TABLE("BULK", bulk_fields),
};

const struct msg_table schema_tensor_table = TABLE("tensor", tensor_fields);
const struct msg_table schema_digest_table = TABLE("digest", digest_fields);

const struct msg_table *schema_table(int type)
{
	if (type <= 0 || type >= DCAST_MSG_TYPE_COUNT)
		return NULL;
	return &tables[type];
}

struct schema_array schema_array_of(const struct field *f, const void *base)
{
	char *b = (char *)(uintptr_t)base; /* callers that only read keep it const */
	struct schema_array a = {.count = (uint32_t *)(b + f->off)};

	if (f->kind == F_TENSORS) {
		a.entries = (void **)&((dcast_manifest *)b)->tensors;
		a.entry_size = sizeof(dcast_tensor_desc);
		a.table = &schema_tensor_table;
	} else {
		a.entries = (void **)&((dcast_commit *)b)->digests;
		a.entry_size = sizeof(dcast_range_digest);
		a.table = &schema_digest_table;
	}
	return a;
}

const char *schema_role_name(uint32_t role)
{
	return role == DCAST_ROLE_PRODUCER ? "producer" : "consumer";
}

const char *dcast_msg_type_name(int type)
{
	const struct msg_table *t = schema_table(type);

	return t ? t->name : "?";
}

uint64_t dcast_tensor_elems(const dcast_tensor_desc *t)
{
	uint64_t n = dcast_dtype_lanes((int)t->dtype);

	for (uint32_t i = 0; i < t->ndim && i < DCAST_MAX_DIMS; i++)
		n *= t->shape[i];
	return n;
}

int dcast_tensor_tiled(const dcast_tensor_desc *t)
{
	for (uint32_t i = 0; i < t->ndim && i < DCAST_MAX_DIMS; i++)
		if (t->grid[i] > 1)
			return 1;
	return 0;
}

int schema_field_present(const struct field *f, const void *base)
{
	/* CREDIT.model, WELCOME.x-consumers and HELLO.x-bulk are optional;
	 * CREDIT.model was refused by older decoders: only a caller that sets
	 * them puts them on the wire. */
	if (f == &credit_fields[1] || f == &welcome_fields[6])
		return *((const char *)base + f->off) != '\0';
	if (f == &hello_fields[7])
		return *(const uint32_t *)((const char *)base + f->off) != 0;
	return f->kind != F_GRID || dcast_tensor_tiled(base);
}
