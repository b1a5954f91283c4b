/* Writes schema/vectors/: one good header per message type (NAME.msgpack +
 * NAME.json, the value a msgpack decoder yields) and bad headers
 * (bad_NAME.msgpack + bad_NAME.json: {"error": code name, "detail":
 * substring of the message}); and in codec/, compact v2 payloads
 * (NAME.bin) with their range and decode (NAME.json: the chunk info, the
 * base values, the positions and codes, the values after apply).  `make vectors` runs it; the committed files
 * are the contract, and tests/test_schema_vectors checks them. */
#include <msgpack.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "dcast_batch.h"
#include "deltacast/codec.h"
#include "deltacast/schema.h"

static const char *dir;

static void write_file(const char *name, const char *ext, const void *p, size_t n)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.%s", dir, name, ext);
	if (!(f = fopen(path, "wb")) || fwrite(p, 1, n, f) != n || fclose(f)) {
		perror(path);
		exit(1);
	}
}

static void good(const char *name, dcast_msg *m)
{
	void *buf;
	size_t len;
	char *json;

	if (dcast_msg_encode(m, &buf, &len) || dcast_msg_to_json(m, &json)) {
		fprintf(stderr, "%s: %s\n", name, dcast_last_error());
		exit(1);
	}
	write_file(name, "msgpack", buf, len);
	write_file(name, "json", json, strlen(json));
	free(buf);
	free(json);
}

static void bad_raw(const char *name, const void *p, size_t n, const char *err,
		    const char *detail)
{
	char bad[64], json[512];

	snprintf(bad, sizeof(bad), "bad_%s", name);
	snprintf(json, sizeof(json), "{\"error\": \"%s\", \"detail\": \"%s\"}\n", err, detail);
	write_file(bad, "msgpack", p, n);
	write_file(bad, "json", json, strlen(json));
}

/* ---- good messages ---- */

static dcast_tensor_desc tensors[2];
static dcast_range_digest digests[2];

static void make_hello(dcast_msg *m)
{
	m->u.hello.role = DCAST_ROLE_PRODUCER;
	strcpy(m->u.hello.model, "llama-8b");
	m->u.hello.part = 1, m->u.hello.parts = 2, m->u.hello.have_version = 41;
	strcpy(m->u.hello.client, "trainer-rank1");
}

static void make_manifest(dcast_msg *m)
{
	strcpy(m->u.manifest.model, "llama-8b");
	strcpy(tensors[0].name, "model.embed_tokens.weight");
	tensors[0].dtype = DCAST_DTYPE_BF16, tensors[0].ndim = 2;
	tensors[0].shape[0] = 128256, tensors[0].shape[1] = 4096;
	strcpy(tensors[1].name, "model.norm.weight");
	tensors[1].dtype = DCAST_DTYPE_F32, tensors[1].ndim = 1, tensors[1].shape[0] = 4096;
	m->u.manifest.n_tensors = 2, m->u.manifest.tensors = tensors;
}

static void make_chunk(dcast_msg *m)
{
	strcpy(m->u.chunk.model, "llama-8b");
	m->u.chunk.version = 42, m->u.chunk.base_version = 41;
	m->u.chunk.part = 1, m->u.chunk.seq = 7, m->u.chunk.tensor = 0;
	m->u.chunk.start = 1048576, m->u.chunk.count = 1048576, m->u.chunk.elem_size = 2;
	m->u.chunk.encoding = DCAST_ENC_COMPACT, m->u.chunk.changed = 10486;
	m->u.chunk.payload_bytes = 13020, m->u.chunk.checksum = 0x9e3779b97f4a7c15ull;
}

static void make_commit(dcast_msg *m)
{
	strcpy(m->u.commit.model, "llama-8b");
	m->u.commit.version = 42, m->u.commit.base_version = 41;
	m->u.commit.part = 1, m->u.commit.parts = 2, m->u.commit.chunks = 501;
	m->u.commit.bytes = 6512345;
	digests[0] = (dcast_range_digest){0, 0, 525336576, 0xfedcba9876543210ull};
	digests[1] = (dcast_range_digest){1, 0, 4096, 12345};
	m->u.commit.n_digests = 2, m->u.commit.digests = digests;
}

static void make_small(dcast_msg *m)
{
	switch (m->type) {
	case DCAST_MSG_WELCOME:
		strcpy(m->u.welcome.model, "llama-8b");
		m->u.welcome.version = 41, m->u.welcome.anchor_version = 30;
		m->u.welcome.heartbeat_ms = 1000;
		break;
	case DCAST_MSG_ACK:
		strcpy(m->u.ack.model, "llama-8b");
		m->u.ack.version = 42, m->u.ack.part = 1;
		break;
	case DCAST_MSG_CREDIT:
		m->u.credit.bytes = 64u << 20;
		break;
	case DCAST_MSG_ERROR:
		m->u.error.code = DCAST_EVERSION;
		strcpy(m->u.error.text, "COMMIT.version: 40 is not above the newest committed 41");
		strcpy(m->u.error.model, "llama-8b");
		m->u.error.version = 40;
		break;
	case DCAST_MSG_HEARTBEAT:
		m->u.heartbeat.time_ms = 123456789, m->u.heartbeat.version = 42;
		break;
	case DCAST_MSG_BYE:
		strcpy(m->u.bye.reason, "shutting down");
		break;
	case DCAST_MSG_BULK:
		strcpy(m->u.bulk.model, "llama-8b");
		m->u.bulk.version = 42, m->u.bulk.port = 5570, m->u.bulk.token = 0x5eed5eed5eedull;
		m->u.bulk.chunks = 30, m->u.bulk.bytes = 16060104;
		break;
	}
}

static void make_good(dcast_msg *m, int type)
{
	dcast_msg_init(m, type);
	if (type == DCAST_MSG_HELLO)
		make_hello(m);
	else if (type == DCAST_MSG_MANIFEST)
		make_manifest(m);
	else if (type == DCAST_MSG_CHUNK)
		make_chunk(m);
	else if (type == DCAST_MSG_COMMIT)
		make_commit(m);
	else
		make_small(m);
}

static void lower(char *dst, const char *s)
{
	while ((*dst++ = (char)(*s >= 'A' && *s <= 'Z' ? *s + 32 : *s)))
		s++;
}

static void write_good(void)
{
	char name[32];
	dcast_msg m;

	for (int t = 1; t < DCAST_MSG_TYPE_COUNT; t++) {
		make_good(&m, t);
		lower(name, dcast_msg_type_name(t));
		good(name, &m);
	}
	make_good(&m, DCAST_MSG_CHUNK); /* an anchor chunk: nil base, dense */
	m.u.chunk.anchor = 1, m.u.chunk.base_version = DCAST_VERSION_NONE;
	m.u.chunk.encoding = DCAST_ENC_DENSE, m.u.chunk.payload_bytes = 2097152;
	m.u.chunk.changed = 1048576;
	good("chunk_anchor", &m);
	make_good(&m, DCAST_MSG_HELLO); /* a consumer with nothing yet */
	m.u.hello.role = DCAST_ROLE_CONSUMER, m.u.hello.part = 0, m.u.hello.parts = 1;
	m.u.hello.have_version = DCAST_VERSION_NONE, m.u.hello.window_bytes = 256u << 20;
	good("hello_consumer", &m);
	make_good(&m, DCAST_MSG_CREDIT); /* with its optional model */
	strcpy(m.u.credit.model, "llama-8b");
	good("credit_model", &m);
	make_good(&m, DCAST_MSG_WELCOME); /* to a producer: the consumer endpoint */
	strcpy(m.u.welcome.consumers, "tcp://0.0.0.0:5556");
	good("welcome_consumers", &m);
}

/* ---- bad messages: a good header re-packed with one change ---- */

typedef void (*pack_fn)(msgpack_packer *pk);

struct mutation {
	const char *drop;  /* key to leave out */
	const char *key;   /* key to set or add */
	pack_fn value;     /* its value */
	int dup;           /* repeat `key` */
};

static void pack_s(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str(pk, strlen(s));
	msgpack_pack_str_body(pk, s, strlen(s));
}

static int key_is(const msgpack_object *k, const char *s)
{
	return s && k->via.str.size == strlen(s) && memcmp(k->via.str.ptr, s, k->via.str.size) == 0;
}

static void pack_tail(msgpack_packer *pk, const struct mutation *mu, int found)
{
	for (int i = 0; i < (mu->key && !found) + mu->dup; i++) {
		pack_s(pk, mu->key);
		mu->value(pk);
	}
}

static void repack(const dcast_msg *m, const struct mutation *mu, msgpack_sbuffer *sb)
{
	void *buf;
	size_t len, off = 0;
	msgpack_unpacked up;
	msgpack_packer pk;
	int found = 0;

	if (dcast_msg_encode(m, &buf, &len))
		exit(1);
	msgpack_unpacked_init(&up);
	msgpack_unpack_next(&up, buf, len, &off);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	const msgpack_object_map *map = &up.data.via.map;
	for (uint32_t i = 0; i < map->size; i++)
		found |= key_is(&map->ptr[i].key, mu->key);
	msgpack_pack_map(&pk, map->size - (mu->drop ? 1 : 0) + (mu->key && !found) + mu->dup);
	for (uint32_t i = 0; i < map->size; i++) {
		const msgpack_object_kv *kv = &map->ptr[i];
		if (key_is(&kv->key, mu->drop))
			continue;
		msgpack_pack_object(&pk, kv->key);
		if (key_is(&kv->key, mu->key))
			mu->value(&pk);
		else
			msgpack_pack_object(&pk, kv->val);
	}
	pack_tail(&pk, mu, found);
	msgpack_unpacked_destroy(&up);
	free(buf);
}

static void bad(const char *name, int type, struct mutation mu, const char *err,
		const char *detail)
{
	msgpack_sbuffer sb;
	dcast_msg m;

	make_good(&m, type);
	msgpack_sbuffer_init(&sb);
	repack(&m, &mu, &sb);
	bad_raw(name, sb.data, sb.size, err, detail);
	msgpack_sbuffer_destroy(&sb);
}

static void v_proto1(msgpack_packer *pk) { msgpack_pack_uint32(pk, 1); } /* a peer of protocol 1 */
static void v_type_foo(msgpack_packer *pk) { pack_s(pk, "FOO"); }
static void v_str1(msgpack_packer *pk) { pack_s(pk, "1"); }
static void v_neg(msgpack_packer *pk) { msgpack_pack_int64(pk, -1); }
static void v_big_count(msgpack_packer *pk) { msgpack_pack_uint64(pk, 1ull << 27); }
static void v_one(msgpack_packer *pk) { msgpack_pack_uint32(pk, 1); }
static void v_zero(msgpack_packer *pk) { msgpack_pack_uint32(pk, 0); }
static void v_true(msgpack_packer *pk) { msgpack_pack_true(pk); }
static void v_nil(msgpack_packer *pk) { msgpack_pack_nil(pk); }
static void v_three(msgpack_packer *pk) { msgpack_pack_uint32(pk, 3); }
static void v_float(msgpack_packer *pk) { msgpack_pack_double(pk, 42.0); }
static void v_observer(msgpack_packer *pk) { pack_s(pk, "observer"); }
static void v_dense(msgpack_packer *pk) { msgpack_pack_uint32(pk, DCAST_ENC_DENSE); }

static void pack_repeat(msgpack_packer *pk, char c, size_t n)
{
	char s[2048];

	memset(s, c, n);
	s[n] = 0;
	pack_s(pk, s);
}

static void v_long_name(msgpack_packer *pk) { pack_repeat(pk, 'm', 300); }
static void v_model_flip(msgpack_packer *pk) { pack_s(pk, "llama-8c"); } /* one bit off "llama-8b" */
static void v_long_text(msgpack_packer *pk) { pack_repeat(pk, 't', 2000); }
static void v_long_endpoint(msgpack_packer *pk) { pack_repeat(pk, 'e', 300); }
static void v_tab_endpoint(msgpack_packer *pk) { pack_s(pk, "tcp://host\t:5556"); }

static void v_deep(msgpack_packer *pk)
{
	for (int i = 0; i < 10; i++)
		msgpack_pack_array(pk, 1);
	msgpack_pack_uint32(pk, 1);
}

static void tensor(msgpack_packer *pk, const char *name, const char *dtype, int ndim)
{
	msgpack_pack_map(pk, 3);
	pack_s(pk, "name");
	pack_s(pk, name);
	pack_s(pk, "dtype");
	pack_s(pk, dtype);
	pack_s(pk, "shape");
	msgpack_pack_array(pk, ndim);
	for (int i = 0; i < ndim; i++)
		msgpack_pack_uint32(pk, 2);
}

static void v_c64(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 1);
	tensor(pk, "w", "C64", 2);
}

static void v_nine_dims(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 1);
	tensor(pk, "w", "BF16", 9);
}

static void v_dup_tensor(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 2);
	tensor(pk, "w", "BF16", 2);
	tensor(pk, "w", "F32", 1);
}

static void write_bad_raw(void)
{
	static const uint8_t not_msgpack[] = {0xc1};
	static const uint8_t not_map[] = {0x92, 0x01, 0x02};
	static const uint8_t huge_array[] = {0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x00};
	dcast_msg m;
	void *buf;
	size_t len;

	bad_raw("not_msgpack", not_msgpack, sizeof(not_msgpack), "DCAST_EMALFORMED", "0xc1");
	bad_raw("not_map", not_map, sizeof(not_map), "DCAST_EMALFORMED", "expected a map");
	bad_raw("huge_array", huge_array, sizeof(huge_array), "DCAST_ETRUNCATED",
		"claims 4294967295 entries");
	make_good(&m, DCAST_MSG_CHUNK);
	if (dcast_msg_encode(&m, &buf, &len))
		exit(1);
	bad_raw("truncated", buf, len - 3, "DCAST_ETRUNCATED", "truncated");
	buf = realloc(buf, len + 1);
	((uint8_t *)buf)[len] = 0;
	bad_raw("trailing", buf, len + 1, "DCAST_EMALFORMED", "trailing");
	free(buf);
}

#define MUT_SET(k, v) ((struct mutation){.key = k, .value = v})
#define MUT_DROP(k) ((struct mutation){.drop = k})

static void write_bad_fields(void)
{
	bad("proto_1", DCAST_MSG_CHUNK, MUT_SET("proto", v_proto1), "DCAST_EPROTO_VERSION",
	    "header.proto: version 1");
	bad("proto_missing", DCAST_MSG_ACK, MUT_DROP("proto"), "DCAST_EFIELD_MISSING", "header.proto");
	bad("type_unknown", DCAST_MSG_ACK, MUT_SET("type", v_type_foo), "DCAST_EMSG_TYPE",
	    "\\\"FOO\\\"");
	bad("chunk_no_version", DCAST_MSG_CHUNK, MUT_DROP("version"), "DCAST_EFIELD_MISSING",
	    "CHUNK.version");
	bad("chunk_version_str", DCAST_MSG_CHUNK, MUT_SET("version", v_str1), "DCAST_EFIELD_TYPE",
	    "CHUNK.version: expected uint, got str");
	bad("chunk_version_float", DCAST_MSG_CHUNK, MUT_SET("version", v_float),
	    "DCAST_EFIELD_TYPE", "CHUNK.version: expected uint, got float");
	bad("chunk_start_negative", DCAST_MSG_CHUNK, MUT_SET("start", v_neg), "DCAST_EFIELD_RANGE",
	    "CHUNK.start: -1 is negative");
	bad("chunk_count_range", DCAST_MSG_CHUNK, MUT_SET("count", v_big_count),
	    "DCAST_EFIELD_RANGE", "CHUNK.count: 134217728 outside [1, 67108864]");
	bad("chunk_unknown_field", DCAST_MSG_CHUNK, MUT_SET("color", v_one), "DCAST_EFIELD_UNKNOWN",
	    "CHUNK: unknown field \\\"color\\\"");
	bad("chunk_duplicate_key", DCAST_MSG_CHUNK,
	    ((struct mutation){.key = "seq", .value = v_one, .dup = 1}), "DCAST_EMALFORMED",
	    "duplicate key \\\"seq\\\"");
	bad("chunk_anchor_with_base", DCAST_MSG_CHUNK, MUT_SET("anchor", v_true),
	    "DCAST_EFIELD_RANGE", "CHUNK.base_version: an anchor has no base");
	bad("chunk_delta_no_base", DCAST_MSG_CHUNK, MUT_SET("base_version", v_nil),
	    "DCAST_EFIELD_MISSING", "CHUNK.base_version: required for a delta");
	bad("chunk_elem_size_3", DCAST_MSG_CHUNK, MUT_SET("elem_size", v_three),
	    "DCAST_EFIELD_RANGE", "CHUNK.elem_size");
	bad("chunk_dense_size", DCAST_MSG_CHUNK, MUT_SET("encoding", v_dense), "DCAST_EFIELD_RANGE",
	    "CHUNK.payload_bytes");
}

static void write_bad_other(void)
{
	bad("model_too_long", DCAST_MSG_ACK, MUT_SET("model", v_long_name), "DCAST_ETOO_LARGE",
	    "ACK.model: 300 bytes exceeds limit 255");
	bad("hello_part_range", DCAST_MSG_HELLO, MUT_SET("part", v_three), "DCAST_EFIELD_RANGE",
	    "HELLO.part: 3 not below parts (2)");
	bad("hello_role", DCAST_MSG_HELLO, MUT_SET("role", v_observer), "DCAST_EFIELD_RANGE",
	    "HELLO.role: unknown value");
	bad("manifest_dtype", DCAST_MSG_MANIFEST, MUT_SET("tensors", v_c64), "DCAST_EDTYPE",
	    "MANIFEST.tensors[0].dtype: unknown dtype \\\"C64\\\"");
	bad("manifest_dims", DCAST_MSG_MANIFEST, MUT_SET("tensors", v_nine_dims),
	    "DCAST_ETOO_LARGE", "MANIFEST.tensors[0].shape: 9 dims");
	bad("manifest_duplicate", DCAST_MSG_MANIFEST, MUT_SET("tensors", v_dup_tensor),
	    "DCAST_EFIELD_RANGE", "duplicate name \\\"w\\\"");
	bad("manifest_no_sum", DCAST_MSG_MANIFEST, MUT_DROP("sum"), "DCAST_EFIELD_MISSING",
	    "MANIFEST.sum: required field missing");
	bad("manifest_sum", DCAST_MSG_MANIFEST, MUT_SET("model", v_model_flip), "DCAST_ECHECKSUM",
	    "MANIFEST of llama-8c (2 tensors): content sums to");
	bad("credit_zero", DCAST_MSG_CREDIT, MUT_SET("bytes", v_zero), "DCAST_EFIELD_RANGE",
	    "CREDIT.bytes: 0 outside");
	bad("error_text_long", DCAST_MSG_ERROR, MUT_SET("text", v_long_text), "DCAST_ETOO_LARGE",
	    "ERROR.text: 2000 bytes exceeds limit 1024");
	bad("nested_too_deep", DCAST_MSG_HEARTBEAT, MUT_SET("x-deep", v_deep), "DCAST_ETOO_LARGE",
	    "nesting deeper");
	bad("welcome_no_need_anchor", DCAST_MSG_WELCOME, MUT_DROP("need_anchor"),
	    "DCAST_EFIELD_MISSING", "WELCOME.need_anchor");
	bad("welcome_consumers_long", DCAST_MSG_WELCOME, MUT_SET("x-consumers", v_long_endpoint),
	    "DCAST_ETOO_LARGE", "WELCOME.x-consumers: 300 bytes exceeds limit 255");
	bad("welcome_consumers_tab", DCAST_MSG_WELCOME, MUT_SET("x-consumers", v_tab_endpoint),
	    "DCAST_EFIELD_RANGE", "WELCOME.x-consumers: byte 0x09 at offset 10 is not printable");
}

/* ---- codec payloads ---- */

static uint64_t lcg_state = 20261128;

static uint32_t lcg(void)
{
	lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(lcg_state >> 33);
}

static void json_array(FILE *f, const char *key, const uint8_t *p, uint64_t n, unsigned es, const char *sep)
{
	fprintf(f, "  \"%s\": [", key);
	for (uint64_t i = 0; i < n; i++) {
		uint32_t v = 0;
		memcpy(&v, p + i * es, es);
		fprintf(f, "%s%u", i ? ", " : "", v);
	}
	fprintf(f, "]%s\n", sep);
}

/* The decode of info/pl and the range after apply, as JSON. */
static void codec_json(FILE *f, const dcast_chunk_info *info, const uint8_t *pl, const uint8_t *base,
		       const uint8_t *after)
{
	uint32_t *pos = calloc(info->changed + 1, 4), *code = calloc(info->changed + 1, 4);
	unsigned mode;

	if (!pos || !code || dcast_batch_decode(info, pl, pos, code, &mode)) {
		fprintf(stderr, "gen_vectors: decode: %s\n", dcast_last_error());
		exit(1);
	}
	fprintf(f, "{\n  \"encoding\": %u, \"elem_size\": %u, \"count\": %llu, \"changed\": %llu, "
		   "\"payload_bytes\": %llu, \"value_mode\": %u,\n", info->encoding, info->elem_size,
		(unsigned long long)info->count, (unsigned long long)info->changed,
		(unsigned long long)info->payload_bytes, mode == DCAST_BATCH_ULP ? 1u : 0u);
	json_array(f, "base", base, info->count, info->elem_size, ",");
	json_array(f, "positions", (const uint8_t *)pos, info->changed, 4, ",");
	json_array(f, "codes", (const uint8_t *)code, info->changed, 4, ",");
	json_array(f, "after", after, info->count, info->elem_size, "");
	fprintf(f, "}\n");
	free(pos), free(code);
}

/* A compact v2 payload of count es-byte elements, about permille in 1000
 * changed: low bits flipped (small ulp differences), and with wild the
 * other bytes random (raw values). */
static void codec_vector(const char *name, uint64_t count, unsigned es, unsigned permille, int wild)
{
	uint8_t *base = malloc(count * es), *cur = malloc(count * es), *pl = malloc(dcast_codec_bound(count, es));
	dcast_chunk_info info;
	char path[512];
	FILE *f;

	for (uint64_t i = 0; i < count * es; i++)
		base[i] = cur[i] = (uint8_t)lcg();
	for (uint64_t i = 0; i < count; i++) {
		if (lcg() % 1000 >= permille)
			continue;
		cur[i * es] ^= (uint8_t)(1 + lcg() % 3);
		for (unsigned b = 1; wild && b < es; b++)
			cur[i * es + b] = (uint8_t)lcg();
	}
	if (dcast_codec_encode(cur, base, count, es, DCAST_ENC_COMPACT2, 0, pl, dcast_codec_bound(count, es), &info)) {
		fprintf(stderr, "gen_vectors: encode: %s\n", dcast_last_error());
		exit(1);
	}
	snprintf(path, sizeof(path), "codec/%s", name);
	write_file(path, "bin", pl, info.payload_bytes);
	snprintf(path, sizeof(path), "%s/codec/%s.json", dir, name);
	if (!(f = fopen(path, "w"))) {
		perror(path);
		exit(1);
	}
	codec_json(f, &info, pl, base, cur);
	fclose(f);
	free(base), free(cur), free(pl);
}

static void write_codec(void)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/codec", dir);
	mkdir(path, 0777);
	codec_vector("compact2_small", 300, 2, 200, 0);
	codec_vector("compact2_blocks", 8600, 1, 500, 0);
	codec_vector("compact2_raw", 600, 4, 100, 1);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen_vectors DIR\n");
		return 2;
	}
	dir = argv[1];
	write_good();
	write_bad_raw();
	write_bad_fields();
	write_bad_other();
	write_codec();
	return 0;
}
