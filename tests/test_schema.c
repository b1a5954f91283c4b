/* Wire schema v1: round trips at the limits, every truncation and random
 * corruption of a valid header rejected without a crash, payload size and
 * checksum checks, and an invalid struct never encoded. */
#include <msgpack.h>
#include "check.h"
#include "chunk_fit_cases.h"
#include "dcast_fit.h"
#include "deltacast/codec.h"
#include "deltacast/schema.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return rng;
}

static void roundtrip(const dcast_msg *m)
{
	void *buf, *buf2;
	size_t len, len2;
	dcast_msg back;

	REQUIRE(dcast_msg_encode(m, &buf, &len) == DCAST_OK);
	CHECK_ERR(dcast_msg_decode(buf, len, &back), DCAST_OK);
	CHECK_ERR(dcast_msg_encode(&back, &buf2, &len2), DCAST_OK);
	CHECK(len == len2 && memcmp(buf, buf2, len) == 0);
	CHECK(back.type == m->type);
	free(buf), free(buf2);
	dcast_msg_free(&back);
}

static void test_limits(void)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HELLO);
	m.u.hello.role = DCAST_ROLE_CONSUMER;
	memset(m.u.hello.model, 'a', DCAST_MAX_NAME); /* exactly at the limit */
	m.u.hello.window_bytes = DCAST_MAX_CREDIT_BYTES;
	m.u.hello.have_version = UINT64_MAX - 1;
	roundtrip(&m);
	dcast_msg_init(&m, DCAST_MSG_CHUNK);
	strcpy(m.u.chunk.model, "m");
	m.u.chunk.version = 5, m.u.chunk.base_version = 0;
	m.u.chunk.count = DCAST_MAX_RANGE_ELEMS, m.u.chunk.elem_size = 4;
	m.u.chunk.encoding = DCAST_ENC_IDX32, m.u.chunk.changed = 1;
	m.u.chunk.start = DCAST_MAX_TENSOR_ELEMS - DCAST_MAX_RANGE_ELEMS;
	m.u.chunk.payload_bytes = DCAST_MAX_CHUNK_BYTES, m.u.chunk.checksum = UINT64_MAX;
	roundtrip(&m);
	m.u.chunk.start++; /* range now ends past 2^48 */
	void *buf;
	size_t len;
	CHECK_ERR(dcast_msg_encode(&m, &buf, &len), DCAST_EFIELD_RANGE);
	CHECK(buf == NULL && len == 0);
}

static void test_big_manifest(void)
{
	dcast_msg m;
	uint32_t n = 5000;

	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	strcpy(m.u.manifest.model, "big");
	m.u.manifest.n_tensors = n;
	REQUIRE((m.u.manifest.tensors = calloc(n, sizeof(dcast_tensor_desc))));
	for (uint32_t i = 0; i < n; i++) {
		snprintf(m.u.manifest.tensors[i].name, DCAST_MAX_NAME, "layers.%u.weight", i);
		m.u.manifest.tensors[i].dtype = i % DCAST_DTYPE_COUNT;
		m.u.manifest.tensors[i].ndim = 1 + i % DCAST_MAX_DIMS;
		for (uint32_t d = 0; d < m.u.manifest.tensors[i].ndim; d++)
			m.u.manifest.tensors[i].shape[d] = 1 + d;
	}
	roundtrip(&m);
	strcpy(m.u.manifest.tensors[4999].name, m.u.manifest.tensors[17].name);
	CHECK_ERR(dcast_msg_validate(&m), DCAST_EFIELD_RANGE);
	CHECK(strstr(dcast_last_error(), "duplicate name") != NULL);
	dcast_msg_free(&m);
	CHECK(m.u.manifest.tensors == NULL);
}

static void make_commit(dcast_msg *m, dcast_range_digest *d, uint32_t n)
{
	dcast_msg_init(m, DCAST_MSG_COMMIT);
	strcpy(m->u.commit.model, "model");
	m->u.commit.version = 3, m->u.commit.base_version = 2, m->u.commit.chunks = n;
	m->u.commit.n_digests = n, m->u.commit.digests = d;
	for (uint32_t i = 0; i < n; i++)
		d[i] = (dcast_range_digest){i, i * 10, 10, next_rand()};
}

/* Every prefix of a valid header is rejected, none crashes. */
static void test_truncations(void)
{
	dcast_range_digest d[8];
	dcast_msg m, out;
	void *buf;
	size_t len;

	make_commit(&m, d, 8);
	REQUIRE(dcast_msg_encode(&m, &buf, &len) == DCAST_OK);
	for (size_t n = 0; n < len; n++) {
		int rc = dcast_msg_decode(buf, n, &out);
		CHECK(rc == DCAST_ETRUNCATED);
	}
	free(buf);
}

/* Random byte corruption: either a clean decode or a named error. */
static void test_corruption(void)
{
	dcast_range_digest d[4];
	dcast_msg m, out;
	void *buf;
	size_t len;
	int ok = 0, rejected = 0;

	make_commit(&m, d, 4);
	REQUIRE(dcast_msg_encode(&m, &buf, &len) == DCAST_OK);
	uint8_t *copy = malloc(len);
	for (int trial = 0; trial < 20000; trial++) {
		memcpy(copy, buf, len);
		for (int k = 0; k < 1 + (int)(next_rand() % 3); k++)
			copy[next_rand() % len] = (uint8_t)next_rand();
		int rc = dcast_msg_decode(copy, len, &out);
		if (rc == 0) {
			ok++;
			dcast_msg_free(&out);
			continue;
		}
		rejected++;
		CHECK(dcast_last_error()[0] != '\0');
	}
	CHECK(rejected > 0);
	printf("corruption: %d decoded, %d rejected\n", ok, rejected);
	free(copy), free(buf);
}

/* Every single-bit change of a placement field fails the checksum, as a
 * damaged payload does; part and seq (renumbered by the broker) do not.
 * (A receiver has checked payload_bytes against the frame first, so the
 * payload's own sum is used here.) */
static void header_flips(const dcast_chunk *good, const uint8_t *payload)
{
	uint64_t sum = dcast_checksum(payload, good->payload_bytes);
	static const size_t off[] = { offsetof(dcast_chunk, version), offsetof(dcast_chunk, base_version),
				      offsetof(dcast_chunk, tensor), offsetof(dcast_chunk, start),
				      offsetof(dcast_chunk, count), offsetof(dcast_chunk, changed),
				      offsetof(dcast_chunk, payload_bytes) };
	int caught = 0;

	for (size_t f = 0; f < sizeof(off) / sizeof(off[0]); f++)
		for (unsigned bit = 0; bit < 32; bit++) {
			dcast_chunk c = *good;
			((uint8_t *)&c)[off[f] + bit / 8] ^= (uint8_t)(1u << (bit % 8));
			caught += dcast_chunk_verify_sum(&c, sum) == DCAST_ECHECKSUM;
		}
	CHECK(caught == 7 * 32);
	dcast_chunk c = *good;
	c.anchor ^= 1, c.elem_size ^= 4, c.encoding ^= 2;
	CHECK_ERR(dcast_chunk_verify_sum(&c, sum), DCAST_ECHECKSUM);
	c = *good;
	c.part ^= 1, c.seq ^= 9;
	CHECK_ERR(dcast_chunk_verify_sum(&c, sum), DCAST_OK);
}

static void test_payload_and_checksum(void)
{
	dcast_msg m;
	uint8_t payload[64];

	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (uint8_t)(i * 7);
	dcast_msg_init(&m, DCAST_MSG_CHUNK);
	strcpy(m.u.chunk.model, "m");
	m.u.chunk.version = 1, m.u.chunk.anchor = 1, m.u.chunk.count = 32;
	m.u.chunk.elem_size = 2, m.u.chunk.payload_bytes = 64;
	dcast_chunk_seal(&m.u.chunk, payload);
	CHECK(m.u.chunk.checksum == dcast_chunk_checksum(&m.u.chunk, dcast_checksum(payload, sizeof(payload))));
	CHECK_ERR(dcast_msg_validate(&m), DCAST_OK);
	CHECK_ERR(dcast_msg_check_payload(&m, 64), DCAST_OK);
	CHECK_ERR(dcast_msg_check_payload(&m, 63), DCAST_EPAYLOAD_SIZE);
	CHECK_ERR(dcast_chunk_verify(&m.u.chunk, payload), DCAST_OK);
	header_flips(&m.u.chunk, payload);
	payload[10] ^= 1;
	CHECK_ERR(dcast_chunk_verify(&m.u.chunk, payload), DCAST_ECHECKSUM);
	dcast_msg_init(&m, DCAST_MSG_CREDIT);
	m.u.credit.bytes = 1;
	CHECK_ERR(dcast_msg_check_payload(&m, 0), DCAST_OK);
	CHECK_ERR(dcast_msg_check_payload(&m, 1), DCAST_EPAYLOAD_SIZE);
}

static void test_extension_and_errors(void)
{
	/* {"proto":2,"type":"BYE","x-trace":"abc"}: extensions are ignored */
	static const uint8_t ext[] = {0x83, 0xa5, 'p', 'r', 'o', 't', 'o', 0x02, 0xa4, 't',
				      'y', 'p', 'e', 0xa3, 'B', 'Y', 'E', 0xa7, 'x', '-',
				      't', 'r', 'a', 'c', 'e', 0xa3, 'a', 'b', 'c'};
	dcast_msg m;

	CHECK_ERR(dcast_msg_decode(ext, sizeof(ext), &m), DCAST_OK);
	CHECK(m.type == DCAST_MSG_BYE && m.u.bye.reason[0] == '\0');
	uint8_t *bye = memchr(ext, 'B', sizeof(ext)), other[sizeof(ext)];
	REQUIRE(bye && bye[1] == 'Y' && bye[2] == 'E');
	memcpy(other, ext, sizeof(ext));
	other[bye + 2 - ext] = 'X'; /* "BYX": no such type */
	CHECK_ERR(dcast_msg_decode(other, sizeof(other), &m), DCAST_EMSG_TYPE);
	CHECK(strstr(dcast_last_error(), "unknown message type \"BYX\"") != NULL);
	CHECK_ERR(dcast_msg_decode(NULL, 0, &m), DCAST_ETRUNCATED);
	CHECK_ERR(dcast_msg_decode(ext, DCAST_MAX_HEADER_BYTES + 1ull, &m), DCAST_ETOO_LARGE);
	m.type = 99;
	CHECK_ERR(dcast_msg_validate(&m), DCAST_EMSG_TYPE);
	CHECK(strcmp(dcast_dtype_name(dcast_dtype_from_name("BF16")), "BF16") == 0);
	CHECK(dcast_dtype_size(DCAST_DTYPE_F8_E4M3) == 1 && dcast_dtype_size(99) == 0);
	/* 8-byte values: two 4-byte wire elements each */
	dcast_tensor_desc t = {.dtype = DCAST_DTYPE_F64, .ndim = 2, .shape = {3, 5}};
	CHECK(dcast_dtype_size(DCAST_DTYPE_I64) == 4 && dcast_dtype_lanes(DCAST_DTYPE_I64) == 2);
	CHECK(dcast_dtype_lanes(DCAST_DTYPE_BOOL) == 1 && dcast_dtype_lanes(99) == 0);
	CHECK(dcast_tensor_elems(&t) == 30 && dcast_dtype_from_name("U64") == DCAST_DTYPE_U64);
}

/* A BYE whose reason is `bytes` (n of them), as a peer could send it. */
static int decode_reason(const char *bytes, size_t n)
{
	dcast_msg m;
	void *buf;
	size_t len;
	int rc;

	dcast_msg_init(&m, DCAST_MSG_BYE);
	memset(m.u.bye.reason, 'x', n); /* encoded last: overwritten below */
	m.u.bye.reason[n] = '\0';
	REQUIRE(dcast_msg_encode(&m, &buf, &len) == 0 && len > n);
	REQUIRE(!memcmp((char *)buf + len - n, m.u.bye.reason, n));
	memcpy((char *)buf + len - n, bytes, n);
	rc = dcast_msg_decode(buf, len, &m);
	if (!rc)
		dcast_msg_free(&m);
	free(buf);
	return rc;
}

/* Strings must be UTF-8 (a model named ff fe fd reached
 * WELCOME and /metrics as raw bytes). */
static void test_utf8(void)
{
	static const char *good[] = {"plain", "h\xc3\xa9llo", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
				     "\xf4\x8f\xbf\xbf"};
	static const char *bad[] = {"\xff\xfe\xfd", "\xc0\x80", "\xed\xa0\x80", "ok\xe2\x82",
				    "\xf4\x90\x80\x80", "\x80", "\xc3\x28"};

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		CHECK_ERR(decode_reason(good[i], strlen(good[i])), DCAST_OK);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK_ERR(decode_reason(bad[i], strlen(bad[i])), DCAST_EFIELD_RANGE);
	CHECK(strstr(dcast_last_error(), "not UTF-8") != NULL);
}

/* The tensor name rule: 1..255 bytes of UTF-8, not "__metadata__"; the
 * MANIFEST validation names the entry, escapes the name. */
static void test_tensor_names(void)
{
	char max[DCAST_MAX_NAME + 2];
	dcast_tensor_desc t[2] = {{.name = "a", .ndim = 1, .shape = {4}},
				  {.name = "__metadata__", .ndim = 1, .shape = {4}}};
	dcast_msg m;

	memset(max, 'n', sizeof(max) - 1);
	max[DCAST_MAX_NAME] = '\0';
	CHECK_ERR(dcast_tensor_name_check(max, "t"), 0);
	CHECK_ERR(dcast_tensor_name_check("__metadata__x", "t"), 0);
	CHECK_ERR(dcast_tensor_name_check("h\xc3\xa9", "t"), 0);
	max[DCAST_MAX_NAME] = 'n', max[DCAST_MAX_NAME + 1] = '\0';
	CHECK_ERR(dcast_tensor_name_check(max, "t"), DCAST_ETOO_LARGE);
	CHECK_ERR(dcast_tensor_name_check("", "t"), DCAST_EFIELD_RANGE);
	CHECK_ERR(dcast_tensor_name_check(NULL, "t"), DCAST_EFIELD_RANGE);
	CHECK_ERR(dcast_tensor_name_check("\xc0\x80", "t"), DCAST_EFIELD_RANGE);
	CHECK(strcmp(dcast_last_error(), "t: tensor name \"\\xc0\\x80\" is not UTF-8 "
		     "(byte 0xc0 at offset 0)") == 0);
	CHECK_ERR(dcast_tensor_name_check("__metadata__", "t"), DCAST_EFIELD_RANGE);
	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	strcpy(m.u.manifest.model, "m");
	m.u.manifest.n_tensors = 2;
	m.u.manifest.tensors = t;
	CHECK_ERR(dcast_msg_validate(&m), DCAST_EFIELD_RANGE);
	CHECK(strstr(dcast_last_error(), "MANIFEST.tensors[1].name: tensor name \"__metadata__\" "
		     "is reserved") != NULL);
	strcpy(t[1].name, "a\n\"");
	CHECK_ERR(dcast_msg_validate(&m), 0);
	strcpy(t[0].name, t[1].name);
	CHECK_ERR(dcast_msg_validate(&m), DCAST_EFIELD_RANGE);
	CHECK(strstr(dcast_last_error(), "duplicate name \"a\\x0a\\x22\"") != NULL);
}

/* A one-tensor MANIFEST: shape 6x8, grid g0 x g1 (0 x 0: untiled). */
static void grid_manifest(dcast_msg *m, dcast_tensor_desc *t, uint32_t g0, uint32_t g1)
{
	dcast_msg_init(m, DCAST_MSG_MANIFEST);
	memset(t, 0, sizeof(*t));
	strcpy(m->u.manifest.model, "tp");
	strcpy(t->name, "w");
	t->ndim = 2, t->shape[0] = 6, t->shape[1] = 8;
	t->grid[0] = g0, t->grid[1] = g1;
	m->u.manifest.n_tensors = 1;
	m->u.manifest.tensors = t;
}

static uint8_t *find_bytes(uint8_t *p, size_t len, const char *what, size_t n)
{
	for (size_t i = 0; i + n <= len; i++)
		if (!memcmp(p + i, what, n))
			return p + i;
	return NULL;
}

/* A BYE header whose keys after "proto" and "type" are keys[0..n), each
 * with a str value, decoded: its result code. */
static int decode_keys(const char *const *keys, int n)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	dcast_msg m;
	int rc;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, (size_t)n + 2);
	msgpack_pack_str_with_body(&pk, "proto", 5);
	msgpack_pack_uint32(&pk, DCAST_PROTO_VERSION);
	msgpack_pack_str_with_body(&pk, "type", 4);
	msgpack_pack_str_with_body(&pk, "BYE", 3);
	for (int i = 0; i < n; i++) {
		msgpack_pack_str_with_body(&pk, keys[i], strlen(keys[i]));
		msgpack_pack_str_with_body(&pk, "r", 1);
	}
	rc = dcast_msg_decode(sb.data, sb.size, &m);
	if (!rc)
		dcast_msg_free(&m);
	msgpack_sbuffer_destroy(&sb);
	return rc;
}

/* The sum of decode_manifest's MANIFEST of n tensors. */
static uint64_t manifest_sum(uint32_t n)
{
	dcast_manifest mf = {.model = "m", .n_tensors = n};
	uint64_t sum;

	REQUIRE((mf.tensors = calloc(n, sizeof(*mf.tensors))));
	for (uint32_t i = 0; i < n; i++) {
		snprintf(mf.tensors[i].name, sizeof(mf.tensors[i].name), "t%u", i);
		mf.tensors[i].dtype = DCAST_DTYPE_BF16, mf.tensors[i].ndim = 1, mf.tensors[i].shape[0] = 1;
	}
	sum = dcast_manifest_sum(&mf);
	free(mf.tensors);
	return sum;
}

/* A MANIFEST of n tensors ("t0" .. , BF16, shape [1]) as a peer's bytes,
 * decoded: its result code. */
static int decode_manifest(uint32_t n)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	dcast_msg m;
	char name[16];
	int rc;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 5);
	msgpack_pack_str_with_body(&pk, "sum", 3);
	msgpack_pack_uint64(&pk, manifest_sum(n));
	msgpack_pack_str_with_body(&pk, "proto", 5);
	msgpack_pack_uint32(&pk, DCAST_PROTO_VERSION);
	msgpack_pack_str_with_body(&pk, "type", 4);
	msgpack_pack_str_with_body(&pk, "MANIFEST", 8);
	msgpack_pack_str_with_body(&pk, "model", 5);
	msgpack_pack_str_with_body(&pk, "m", 1);
	msgpack_pack_str_with_body(&pk, "tensors", 7);
	msgpack_pack_array(&pk, n);
	for (uint32_t i = 0; i < n; i++) {
		int len = snprintf(name, sizeof(name), "t%u", i);
		msgpack_pack_map(&pk, 3);
		msgpack_pack_str_with_body(&pk, "name", 4);
		msgpack_pack_str_with_body(&pk, name, (size_t)len);
		msgpack_pack_str_with_body(&pk, "dtype", 5);
		msgpack_pack_str_with_body(&pk, "BF16", 4);
		msgpack_pack_str_with_body(&pk, "shape", 5);
		msgpack_pack_array(&pk, 1);
		msgpack_pack_uint32(&pk, 1);
	}
	rc = dcast_msg_decode(sb.data, sb.size, &m);
	if (!rc) {
		CHECK(m.u.manifest.n_tensors == n && !strcmp(m.u.manifest.tensors[n - 1].name, name));
		dcast_msg_free(&m);
	}
	msgpack_sbuffer_destroy(&sb);
	return rc;
}

/* A key twice is refused, whatever it names: a field, "proto" or "type",
 * an extension; distinct extensions pass. */
static void test_duplicate_keys(void)
{
	static const char *const field[] = {"reason", "x-a", "reason"}, *const proto[] = {"proto"},
				 *const type[] = {"x-a", "type"}, *const ext[] = {"x-a", "reason", "x-a"},
				 *const fine[] = {"x-a", "x-b", "reason"};

	CHECK_ERR(decode_keys(field, 3), DCAST_EMALFORMED);
	CHECK(strstr(dcast_last_error(), "duplicate key \"reason\"") != NULL);
	CHECK_ERR(decode_keys(proto, 1), DCAST_EMALFORMED);
	CHECK(strstr(dcast_last_error(), "duplicate key \"proto\"") != NULL);
	CHECK_ERR(decode_keys(type, 2), DCAST_EMALFORMED);
	CHECK(strstr(dcast_last_error(), "duplicate key \"type\"") != NULL);
	CHECK_ERR(decode_keys(ext, 3), DCAST_EMALFORMED);
	CHECK(strstr(dcast_last_error(), "duplicate key \"x-a\"") != NULL);
	CHECK_ERR(decode_keys(fine, 3), DCAST_OK);
}

/* A frontier mixture-of-experts checkpoint: Kimi K2's fp8 expert tensors,
 * 60 layers of 384 experts, three projections each with its block scales
 * (138,240 tensors, the longest name 59 bytes), round-trips in one
 * MANIFEST.  One tensor over DCAST_MAX_TENSORS is refused; so is a
 * MANIFEST of DCAST_MAX_TENSORS 255-byte names, whose header would exceed
 * DCAST_MAX_HEADER_BYTES: by the encoder, with the limit named, rather
 * than by every receiver.  A receiver takes DCAST_MAX_TENSORS entries from
 * a peer and refuses one more. */
static void test_moe_manifest(void)
{
	static const char *proj[] = { "gate", "up", "down" };
	uint32_t n = 60 * 384 * 6;
	dcast_msg m;
	void *buf;
	size_t len;

	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	strcpy(m.u.manifest.model, "kimi-k2");
	REQUIRE((m.u.manifest.tensors = calloc(DCAST_MAX_TENSORS + 1u, sizeof(dcast_tensor_desc))));
	for (uint32_t i = 0; i < n; i++) {
		dcast_tensor_desc *d = &m.u.manifest.tensors[i];
		int scale = i % 2, down = i / 2 % 3 == 2;
		snprintf(d->name, sizeof(d->name), "model.layers.%u.mlp.experts.%u.%s_proj.weight%s", 1 + i / 2304,
			 i / 6 % 384, proj[i / 2 % 3], scale ? "_scale_inv" : "");
		d->dtype = scale ? DCAST_DTYPE_F32 : DCAST_DTYPE_F8_E4M3;
		d->ndim = 2;
		d->shape[0] = down ? 7168 : 2048;
		d->shape[1] = down ? 2048 : 7168;
		if (scale)
			d->shape[0] /= 128, d->shape[1] /= 128;
	}
	m.u.manifest.n_tensors = n;
	REQUIRE(dcast_msg_encode(&m, &buf, &len) == DCAST_OK);
	CHECK(len < DCAST_MAX_HEADER_BYTES);
	printf("moe manifest: %u tensors, header %zu bytes (limit %u)\n", n, len, DCAST_MAX_HEADER_BYTES);
	free(buf);
	roundtrip(&m);
	m.u.manifest.n_tensors = DCAST_MAX_TENSORS + 1u;
	for (uint32_t i = n; i < m.u.manifest.n_tensors; i++) {
		snprintf(m.u.manifest.tensors[i].name, DCAST_MAX_NAME + 1, "extra.%u", i);
		m.u.manifest.tensors[i].ndim = 1;
		m.u.manifest.tensors[i].shape[0] = 1;
	}
	CHECK_ERR(dcast_msg_encode(&m, &buf, &len), DCAST_ETOO_LARGE);
	m.u.manifest.n_tensors = DCAST_MAX_TENSORS;
	for (uint32_t i = 0; i < m.u.manifest.n_tensors; i++) {
		char *name = m.u.manifest.tensors[i].name;
		int at = snprintf(name, DCAST_MAX_NAME + 1, "%u.", i);
		memset(name + at, 'w', DCAST_MAX_NAME - (size_t)at);
		name[DCAST_MAX_NAME] = 0;
	}
	CHECK_ERR(dcast_msg_validate(&m), DCAST_OK);
	CHECK_ERR(dcast_msg_encode(&m, &buf, &len), DCAST_ETOO_LARGE);
	CHECK(strstr(dcast_last_error(), "MANIFEST") && strstr(dcast_last_error(), "DCAST_MAX_HEADER_BYTES"));
	dcast_msg_free(&m);
	/* a receiver: DCAST_MAX_TENSORS short entries pass, one more is refused */
	CHECK_ERR(decode_manifest(DCAST_MAX_TENSORS), DCAST_OK);
	CHECK_ERR(decode_manifest(DCAST_MAX_TENSORS + 1u), DCAST_ETOO_LARGE);
	CHECK(strstr(dcast_last_error(), "tensors") != NULL);
}

/* An entry of an array that fails is named by its index, when encoding and
 * when decoding (its path is formatted only then). */
static void test_entry_paths(void)
{
	static dcast_range_digest d[1000];
	dcast_msg m, back;
	void *buf;
	size_t len;

	make_commit(&m, d, 1000);
	d[777].tensor = DCAST_MAX_TENSORS;
	CHECK_ERR(dcast_msg_validate(&m), DCAST_EFIELD_RANGE);
	CHECK(strstr(dcast_last_error(), "COMMIT.digests[777].tensor") != NULL);
	d[777].tensor = 65535; /* the only one encoded as cd ff ff */
	REQUIRE(dcast_msg_encode(&m, &buf, &len) == 0);
	uint8_t *t = find_bytes((uint8_t *)buf, len, "\xa6tensor\xcd\xff\xff", 10);
	REQUIRE(t);
	memcpy(t + 7, "\xa2xy", 3); /* a str where a uint belongs */
	CHECK_ERR(dcast_msg_decode(buf, len, &back), DCAST_EFIELD_TYPE);
	CHECK(strstr(dcast_last_error(), "COMMIT.digests[777].tensor") != NULL);
	free(buf);
}

/* MANIFEST.tensors[].grid: sent only when tiled, checked against the shape. */
static void test_grid(void)
{
	dcast_msg m, back;
	dcast_tensor_desc t;
	void *a, *b;
	size_t la, lb;
	char *json;

	grid_manifest(&m, &t, 0, 0);
	REQUIRE(dcast_msg_encode(&m, &a, &la) == 0);
	grid_manifest(&m, &t, 1, 1); /* all ones: untiled, the same bytes */
	REQUIRE(dcast_msg_encode(&m, &b, &lb) == 0);
	CHECK(la == lb && !memcmp(a, b, la) && !find_bytes(a, la, "grid", 4));
	free(a), free(b);
	grid_manifest(&m, &t, 2, 4);
	roundtrip(&m);
	REQUIRE(dcast_msg_encode(&m, &a, &la) == 0);
	CHECK_ERR(dcast_msg_decode(a, la, &back), 0);
	CHECK(back.u.manifest.tensors[0].grid[0] == 2 && back.u.manifest.tensors[0].grid[1] == 4);
	CHECK(dcast_tensor_tiled(&back.u.manifest.tensors[0]));
	CHECK(dcast_msg_to_json(&back, &json) == 0 && strstr(json, "\"grid\": [2, 4]"));
	free(json);
	dcast_msg_free(&back);
	uint8_t *g = find_bytes(a, la, "\xa4grid\x92\x02\x04", 8);
	REQUIRE(g);
	g[7] = 3; /* 3 tiles do not divide 8 */
	CHECK_ERR(dcast_msg_decode(a, la, &back), DCAST_EFIELD_RANGE);
	CHECK(strstr(dcast_last_error(), "grid[1]") != NULL);
	g[7] = 0; /* 0 tiles */
	CHECK_ERR(dcast_msg_decode(a, la, &back), DCAST_EFIELD_RANGE);
	free(a);
	grid_manifest(&m, &t, 3, 0); /* one entry for two dims */
	CHECK_ERR(dcast_msg_encode(&m, &a, &la), DCAST_EFIELD_RANGE);
	grid_manifest(&m, &t, 4, 2); /* 4 does not divide 6 */
	CHECK_ERR(dcast_msg_encode(&m, &a, &la), DCAST_EFIELD_RANGE);
}

/* The manifest check (dcast_fit.h) over descriptors inside larger
 * records, as the consumer holds them: every case of chunk_fit_cases.h
 * with its code, a chunk that fits, and COMMIT digest ranges alike. */

/* dcast_chunk_dense_at on k, a chunk fitting d: the byte offset of a
 * dense one; none for another encoding, a payload not its range's size,
 * or a range outside its tensor. */
static void dense_at(const dcast_chunk *k, dcast_desc_array d)
{
	dcast_chunk x = *k;
	uint64_t off = 0;

	x.encoding = DCAST_ENC_DENSE, x.start = 2, x.count = 3, x.payload_bytes = 3 * x.elem_size;
	CHECK(dcast_chunk_dense_at(&x, d, &off) == 1 && off == 2 * x.elem_size);
	x.payload_bytes++;
	CHECK(dcast_chunk_dense_at(&x, d, &off) == 0);
	x.payload_bytes--, x.count = CFC_ELEMS;
	CHECK(dcast_chunk_dense_at(&x, d, &off) == 0);
	x.count = 3, x.encoding = DCAST_ENC_DENSE + 1;
	CHECK(dcast_chunk_dense_at(&x, d, &off) == 0);
}
static void test_manifest_fit(void)
{
	struct held { uint64_t before; dcast_tensor_desc desc; int after; } held[2];
	dcast_desc_array d = {&held[0].desc, sizeof(held[0]), 2};
	const chunk_fit_case *k = chunk_fit_cases;
	const void *payload;
	dcast_msg m;

	memset(held, 0, sizeof(held));
	chunk_fit_manifest(&m, &held[1].desc, "fit");
	held[0].desc = held[1].desc;
	held[0].desc.dtype = DCAST_DTYPE_F32;
	strcpy(held[0].desc.name, "v");
	for (unsigned i = 0; i < chunk_fit_n_cases; i++) {
		chunk_fit_chunk(&m, &k[i], "fit", 1, &payload);
		CHECK_ERR(dcast_chunk_fits(&m.u.chunk, dcast_manifest_descs(&(dcast_manifest){
			.n_tensors = 1, .tensors = &held[1].desc})), k[i].code);
		CHECK(strstr(dcast_last_error(), k[i].named) != NULL);
		if (m.u.chunk.tensor == 0) /* tensor 1 of d is the manifest's tensor 0 */
			m.u.chunk.tensor = 1;
		CHECK_ERR(dcast_chunk_fits(&m.u.chunk, d), k[i].code);
	}
	chunk_fit_chunk(&m, &k[2], "fit", 1, &payload); /* elem_size 4: F32 "v" */
	CHECK_ERR(dcast_chunk_fits(&m.u.chunk, d), 0);
	dense_at(&m.u.chunk, d);
	m.u.chunk.tensor = 2;
	CHECK_ERR(dcast_chunk_fits(&m.u.chunk, d), DCAST_EFIELD_RANGE);
	CHECK(strstr(dcast_last_error(), "outside the manifest's 2 tensors") != NULL);
	dcast_range_digest e = {.tensor = 1, .start = 0, .count = CFC_ELEMS};
	CHECK_ERR(dcast_digest_fits(&e, 3, d), 0);
	e.start = 1;
	CHECK_ERR(dcast_digest_fits(&e, 3, d), DCAST_ESHAPE);
	CHECK(strstr(dcast_last_error(), "COMMIT.digests[3]: range [1, +64) outside tensor w") != NULL);
	e.tensor = 2;
	CHECK_ERR(dcast_digest_fits(&e, 3, d), DCAST_EFIELD_RANGE);
	CHECK(strstr(dcast_last_error(), "COMMIT.digests[3].tensor: 2") != NULL);
}

/* The MANIFEST of the fault suite's seed 53165: a name whose one flipped
 * bit ('.' -> '/') is still a valid name, a tiled tensor and an untiled one. */
static void sum_manifest(dcast_msg *m, dcast_tensor_desc t[2])
{
	dcast_msg_init(m, DCAST_MSG_MANIFEST);
	memset(t, 0, 2 * sizeof(*t));
	strcpy(m->u.manifest.model, "faults");
	strcpy(t[0].name, "model.layers.1.mlp.down_proj.weight");
	t[0].dtype = DCAST_DTYPE_BF16, t[0].ndim = 2, t[0].shape[0] = 4096, t[0].shape[1] = 300;
	t[0].grid[0] = 2, t[0].grid[1] = 1;
	strcpy(t[1].name, "model.norm.weight");
	t[1].dtype = DCAST_DTYPE_F32, t[1].ndim = 1, t[1].shape[0] = 4096;
	m->u.manifest.n_tensors = 2, m->u.manifest.tensors = t;
}

/* Every single-bit flip of an encoded MANIFEST is refused: by msgpack, a
 * key or value check, or, where the flipped header is still a valid
 * MANIFEST (a name, a dtype, a shape, the sum itself), by its sum. */
static void test_manifest_bit_flips(void)
{
	dcast_tensor_desc t[2];
	dcast_msg m, back;
	size_t len, by_sum = 0;
	void *buf;

	sum_manifest(&m, t);
	m.u.manifest.sum = 12345; /* not read: the encoder computes it */
	REQUIRE(dcast_msg_encode(&m, &buf, &len) == 0);
	REQUIRE(dcast_msg_decode(buf, len, &back) == 0);
	CHECK(back.u.manifest.sum == dcast_manifest_sum(&m.u.manifest) && back.u.manifest.sum != 12345);
	dcast_msg_free(&back);
	for (size_t bit = 0; bit < len * 8; bit++) {
		((uint8_t *)buf)[bit / 8] ^= (uint8_t)(1u << bit % 8);
		int rc = dcast_msg_decode(buf, len, &back);
		((uint8_t *)buf)[bit / 8] ^= (uint8_t)(1u << bit % 8);
		CHECK(rc != 0);
		if (rc == 0)
			fprintf(stderr, "bit %zu of byte %zu: flipped MANIFEST decoded\n", bit % 8, bit / 8);
		CHECK(rc == 0 || dcast_last_error()[0] != '\0');
		by_sum += rc == DCAST_ECHECKSUM;
	}
	printf("manifest: %zu bit flips refused, %zu of them by the sum\n", len * 8, by_sum);
	CHECK(by_sum > 0);
	free(buf);
}

/* The flip seed 53165 found is refused naming the MANIFEST and both sums;
 * a MANIFEST without `sum` is refused from a peer, and read from a record
 * file (an older build's) with the same checks but that one. */
static void test_manifest_sum(void)
{
	dcast_tensor_desc t[2];
	dcast_msg m, back;
	char want[64];
	size_t len;
	void *buf;

	sum_manifest(&m, t);
	REQUIRE(dcast_msg_encode(&m, &buf, &len) == 0);
	uint8_t *dot = find_bytes(buf, len, "layers.1.mlp", 12);
	REQUIRE(dot);
	dot[8] ^= 1; /* "layers.1/mlp" */
	CHECK_ERR(dcast_msg_decode(buf, len, &back), DCAST_ECHECKSUM);
	CHECK_ERR(dcast_msg_decode_stored(buf, len, &back), DCAST_ECHECKSUM);
	snprintf(want, sizeof(want), "MANIFEST.sum says %016llx",
		 (unsigned long long)dcast_manifest_sum(&m.u.manifest));
	CHECK(strstr(dcast_last_error(), "MANIFEST of faults") && strstr(dcast_last_error(), want));
	strcpy(t[0].name, "model.layers.1/mlp.down_proj.weight");
	snprintf(want, sizeof(want), "sums to %016llx", (unsigned long long)dcast_manifest_sum(&m.u.manifest));
	CHECK(strstr(dcast_last_error(), want) != NULL);
	free(buf);
	sum_manifest(&m, t);
	REQUIRE(dcast_msg_encode(&m, &buf, &len) == 0);
	uint8_t *key = find_bytes(buf, len, "\xa3sum\xcf", 5);
	REQUIRE(key && key + 13 == (uint8_t *)buf + len); /* the last key: drop it */
	((uint8_t *)buf)[0]--; /* one key fewer in the fixmap */
	CHECK_ERR(dcast_msg_decode(buf, len - 13, &back), DCAST_EFIELD_MISSING);
	CHECK(strstr(dcast_last_error(), "MANIFEST.sum") != NULL);
	CHECK_ERR(dcast_msg_decode_stored(buf, len - 13, &back), 0);
	CHECK(back.u.manifest.n_tensors == 2 && !strcmp(back.u.manifest.tensors[0].name, t[0].name));
	CHECK(back.u.manifest.tensors[0].grid[0] == 2);
	dcast_msg_free(&back);
	key[1] = 'x', key[2] = '-'; /* "x-m": an extension, and no sum */
	((uint8_t *)buf)[0]++;
	CHECK_ERR(dcast_msg_decode(buf, len, &back), DCAST_EFIELD_MISSING);
	free(buf);
}

int main(void)
{
	test_manifest_fit();
	test_manifest_bit_flips();
	test_manifest_sum();
	test_utf8();
	test_tensor_names();
	test_grid();
	test_limits();
	test_big_manifest();
	test_moe_manifest();
	test_entry_paths();
	test_duplicate_keys();
	test_truncations();
	test_corruption();
	test_payload_and_checksum();
	test_extension_and_errors();
	return check_done("test_schema");
}
