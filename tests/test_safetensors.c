/* safetensors reader/writer: a written file reads back exactly (through
 * dcast_st_open), its layout is the reference one, and a set of corrupt
 * images is each rejected with the right error code; the Hugging Face
 * index reader's lookups, and each malformed index refused. */
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "deltacast/safetensors.h"
#include "deltacast/schema.h"

static char dir[] = "/tmp/dcast_test_st_XXXXXX";

static void path_in_dir(char *out, size_t cap, const char *name)
{
	snprintf(out, cap, "%s/%s", dir, name);
}

static void test_round_trip(void)
{
	uint16_t a[6] = {1, 2, 3, 4, 5, 0xffff};
	float b[3] = {1.0f, -2.5f, 3.25f};
	uint8_t c[1] = {7};
	dcast_st_spec specs[] = {
		{"layer.a", DCAST_ST_BF16, 2, {2, 3}, a},
		{"b \"quoted\"\n", DCAST_ST_F32, 1, {3}, b},
		{"empty", DCAST_ST_I32, 2, {0, 4}, NULL},
		{"scalar", DCAST_ST_U8, 0, {0}, c},
	};
	dcast_st_meta meta[] = {{"format", "pt"}, {"step", "42"}};
	char path[256];
	path_in_dir(path, sizeof(path), "rt.safetensors");
	REQUIRE(dcast_st_write(path, specs, 4, meta, 2) == 0);

	dcast_st_file *f = NULL;
	REQUIRE(dcast_st_open(path, &f) == 0);
	CHECK(dcast_st_count(f) == 4);
	const dcast_st_tensor *t = dcast_st_find(f, "layer.a");
	REQUIRE(t);
	CHECK(t->dtype == DCAST_ST_BF16 && t->elem_size == 2 && t->ndim == 2);
	CHECK(t->shape[0] == 2 && t->shape[1] == 3 && t->count == 6 && t->nbytes == 12);
	CHECK(memcmp(t->data, a, sizeof(a)) == 0);
	t = dcast_st_find(f, "b \"quoted\"\n");
	REQUIRE(t);
	CHECK(t->dtype == DCAST_ST_F32 && memcmp(t->data, b, sizeof(b)) == 0);
	t = dcast_st_find(f, "empty");
	REQUIRE(t);
	CHECK(t->count == 0 && t->nbytes == 0);
	t = dcast_st_find(f, "scalar");
	REQUIRE(t);
	CHECK(t->ndim == 0 && t->count == 1 && ((const uint8_t *)t->data)[0] == 7);
	CHECK(dcast_st_find(f, "nope") == NULL);
	CHECK(dcast_st_metadata_count(f) == 2);
	CHECK(dcast_st_metadata_get(f, "step") && strcmp(dcast_st_metadata_get(f, "step"), "42") == 0);

	size_t hlen = 0;
	const unsigned char *h = dcast_st_header_bytes(f, &hlen);
	CHECK(hlen % 8 == 0);
	CHECK(memcmp(h + 8, "{\"__metadata__\":{\"format\":\"pt\"", 30) == 0);
	CHECK(h[hlen - 1] == ' ' || h[hlen - 1] == '}');
	CHECK(dcast_st_data_bytes(f) == 12 + 12 + 0 + 1);

	/* The layout alone gives the same header and offsets. */
	dcast_st_layout lay;
	REQUIRE(dcast_st_layout_compute(specs, 4, meta, 2, &lay) == 0);
	CHECK(lay.header_bytes == hlen && memcmp(lay.header, h, hlen) == 0);
	CHECK(lay.file_offsets[0] == hlen && lay.file_offsets[1] == hlen + 12);
	CHECK(lay.file_bytes == hlen + 25);
	dcast_st_layout_free(&lay);
	dcast_st_close(&f);
	CHECK(f == NULL);
}

static void test_writer_rejects(void)
{
	uint16_t a[2] = {0};
	dcast_st_spec dup[] = {{"x", DCAST_ST_BF16, 1, {2}, a}, {"x", DCAST_ST_BF16, 1, {2}, a}};
	dcast_st_spec bad_dtype[] = {{"x", 99, 1, {2}, a}};
	dcast_st_spec meta_name[] = {{"__metadata__", DCAST_ST_BF16, 1, {2}, a}};
	dcast_st_spec no_data[] = {{"x", DCAST_ST_BF16, 1, {2}, NULL}};
	dcast_st_spec not_utf8[] = {{"\xc3(", DCAST_ST_BF16, 1, {2}, a}};
	char path[256], long_name[DCAST_MAX_NAME + 2];
	dcast_st_spec too_long[] = {{long_name, DCAST_ST_BF16, 1, {2}, a}};

	memset(long_name, 'n', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	path_in_dir(path, sizeof(path), "bad.safetensors");
	CHECK_ERR(dcast_st_write(path, dup, 2, NULL, 0), DCAST_EINVAL);
	CHECK_ERR(dcast_st_write(path, bad_dtype, 1, NULL, 0), DCAST_EDTYPE);
	CHECK_ERR(dcast_st_write(path, meta_name, 1, NULL, 0), DCAST_EINVAL);
	CHECK(strstr(dcast_last_error(), "\"__metadata__\" is reserved") != NULL);
	CHECK_ERR(dcast_st_write(path, not_utf8, 1, NULL, 0), DCAST_EINVAL);
	CHECK_ERR(dcast_st_write(path, too_long, 1, NULL, 0), DCAST_EINVAL);
	CHECK_ERR(dcast_st_write(path, no_data, 1, NULL, 0), DCAST_EINVAL);
	CHECK(access(path, F_OK) != 0);
}

/* A file image: 8-byte length, json, then data_len bytes of 0xab. */
static size_t image(unsigned char *buf, const char *json, size_t data_len)
{
	uint64_t n = strlen(json);
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)(n >> (8 * i));
	memcpy(buf + 8, json, n);
	memset(buf + 8 + n, 0xab, data_len);
	return 8 + n + data_len;
}

static int parse_json(const char *json, size_t data_len)
{
	static unsigned char buf[4096];
	size_t len = image(buf, json, data_len);
	dcast_st_file *f = NULL;
	int err = dcast_st_parse(buf, len, "img", &f);
	if (!err && !f)
		err = -1;
	dcast_st_close(&f);
	return err;
}

#define T1(off) "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":" off "}}"

static void test_json_rejects(void)
{
	CHECK_ERR(parse_json(T1("[0,4]"), 4), DCAST_OK);
	CHECK_ERR(parse_json("{}", 0), DCAST_OK);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}   ", 4),
		  DCAST_OK);
	CHECK_ERR(parse_json("{\"__metadata__\":{\"k\":\"v\\u00e9\\ud83d\\ude00\"}}", 0), DCAST_OK);
	CHECK_ERR(parse_json("{\"a\":", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("[1,2]", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"a\":1}", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{}x", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{},", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2.0],\"data_offsets\":[0,4]}}", 4),
		  DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"BF16\",\"shape\":[-2],\"data_offsets\":[0,4]}}", 4),
		  DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"BF16\",\"shape\":[02],\"data_offsets\":[0,4]}}", 4),
		  DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4],}}", 4),
		  DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2]}}", 4), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4],\"x\":[]}}", 4),
		  DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4,4]}}", 4),
		  DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"__metadata__\":{\"k\":1}}", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"__metadata__\":{\"k\":\"a\\x\"}}", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"__metadata__\":{\"k\":\"\\u0000\"}}", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"__metadata__\":{\"k\":\"\\ud800\"}}", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"__metadata__\":{\"k\":\"\xc3\x28\"}}", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"__metadata__\":{\"k\":\"tab\there\"}}", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"__metadata__\":{\"k\":true}}", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0), DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"BF16\",\"shape\":[99999999999999999999],"
			     "\"data_offsets\":[0,4]}}", 4),
		  DCAST_EMALFORMED);
	CHECK_ERR(parse_json("[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]", 0), DCAST_EMALFORMED);
}

static void test_entry_rejects(void)
{
	/* duplicate tensor names */
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			     "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2),
		  DCAST_EMALFORMED);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"BF17\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4),
		  DCAST_EDTYPE);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
			     "\"data_offsets\":[0,1]}}", 1),
		  DCAST_ESHAPE);
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
			     "\"data_offsets\":[0,4]}}", 4),
		  DCAST_ESHAPE);
	CHECK_ERR(parse_json(T1("[0,6]"), 6), DCAST_ECORRUPT);  /* wrong size */
	CHECK_ERR(parse_json(T1("[4,0]"), 4), DCAST_ECORRUPT);  /* end before begin */
	CHECK_ERR(parse_json(T1("[2,6]"), 6), DCAST_ECORRUPT);  /* gap at the start */
	CHECK_ERR(parse_json(T1("[0,4]"), 6), DCAST_ECORRUPT);  /* bytes after the data */
	CHECK_ERR(parse_json(T1("[0,4]"), 3), DCAST_ETRUNCATED); /* data cut short */
	CHECK_ERR(parse_json(T1("[1000,1004]"), 4), DCAST_ECORRUPT); /* out of range */
	/* overlapping */
	CHECK_ERR(parse_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
			     "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3),
		  DCAST_ECORRUPT);
	/* out of order in the header is fine: offsets decide */
	CHECK_ERR(parse_json("{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
			     "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 4),
		  DCAST_OK);
}

static void test_header_len_rejects(void)
{
	unsigned char buf[64] = {0};
	dcast_st_file *f = NULL;
	CHECK_ERR(dcast_st_parse(buf, 5, "short", &f), DCAST_ETRUNCATED);
	buf[0] = 1; /* 1-byte header */
	CHECK_ERR(dcast_st_parse(buf, 16, "tiny", &f), DCAST_EMALFORMED);
	buf[0] = 0, buf[7] = 0x10; /* 2^60 */
	CHECK_ERR(dcast_st_parse(buf, 64, "huge", &f), DCAST_ETOO_LARGE);
	buf[7] = 0, buf[0] = 100; /* more than the 56 bytes there */
	CHECK_ERR(dcast_st_parse(buf, 64, "long", &f), DCAST_ETRUNCATED);
	CHECK(f == NULL);
}

/* A real file cut short, and a missing one. */
static void test_open_rejects(void)
{
	uint16_t a[64] = {0};
	dcast_st_spec spec = {"a", DCAST_ST_BF16, 1, {64}, a};
	char path[256];
	path_in_dir(path, sizeof(path), "cut.safetensors");
	REQUIRE(dcast_st_write(path, &spec, 1, NULL, 0) == 0);
	struct stat st;
	REQUIRE(stat(path, &st) == 0);
	REQUIRE(truncate(path, st.st_size - 1) == 0);
	dcast_st_file *f = NULL;
	CHECK_ERR(dcast_st_open(path, &f), DCAST_ETRUNCATED);
	CHECK(strstr(dcast_last_error(), "cut.safetensors") != NULL);
	REQUIRE(truncate(path, 20) == 0);
	CHECK_ERR(dcast_st_open(path, &f), DCAST_ETRUNCATED);
	path_in_dir(path, sizeof(path), "missing.safetensors");
	CHECK_ERR(dcast_st_open(path, &f), DCAST_ENOTFOUND);
	CHECK(f == NULL);
}

static void test_parse_header(void)
{
	const char *json = T1("[0,4]");
	dcast_st_file *f = NULL;
	CHECK_ERR(dcast_st_parse_header(json, strlen(json), 4, "hdr", &f), DCAST_OK);
	REQUIRE(f);
	CHECK(dcast_st_count(f) == 1 && dcast_st_tensor_at(f, 0)->data == NULL);
	CHECK(dcast_st_tensor_at(f, 1) == NULL);
	dcast_st_close(&f);
	CHECK_ERR(dcast_st_parse_header(json, strlen(json), 8, "hdr", &f), DCAST_ECORRUPT);
}

static int parse_index(const char *json, dcast_st_index **keep)
{
	dcast_st_index *x = NULL;
	int err = dcast_st_index_parse(json, strlen(json), "idx.json", &x);
	CHECK(err ? x == NULL : x != NULL);
	if (keep && !err)
		*keep = x;
	else
		dcast_st_index_close(&x);
	return err;
}

/* model.safetensors.index.json: lookups, and each malformed index refused. */
static void test_index(void)
{
	dcast_st_index *x = NULL;
	const char *t = NULL, *f = NULL;
	CHECK_ERR(parse_index("{\"metadata\":{\"total_size\":24},\"weight_map\":{"
			      "\"b\":\"m-2.safetensors\",\"a\":\"m-1.safetensors\","
			      "\"c\":\"m-2.safetensors\"}}", &x), DCAST_OK);
	REQUIRE(x);
	CHECK(dcast_st_index_count(x) == 3 && dcast_st_index_file_count(x) == 2);
	CHECK(strcmp(dcast_st_index_file_at(x, 0), "m-1.safetensors") == 0);
	CHECK(strcmp(dcast_st_index_file_at(x, 1), "m-2.safetensors") == 0);
	CHECK(dcast_st_index_file_at(x, 2) == NULL);
	CHECK(strcmp(dcast_st_index_file_of(x, "c"), "m-2.safetensors") == 0);
	CHECK(dcast_st_index_file_of(x, "d") == NULL);
	CHECK_ERR(dcast_st_index_at(x, 0, &t, &f), DCAST_OK);
	CHECK(strcmp(t, "b") == 0 && strcmp(f, "m-2.safetensors") == 0);
	CHECK_ERR(dcast_st_index_at(x, 3, &t, &f), DCAST_EINVAL);
	dcast_st_index_close(&x);
	CHECK(x == NULL);
	dcast_st_index_close(&x);

	CHECK_ERR(parse_index("{\"weight_map\":{\"a\":\"m.safetensors\"}}", NULL), DCAST_OK);
	CHECK_ERR(parse_index("{\"weight_map\":{\"a\":\"m.safetensors\",\"a\":\"n.safetensors\"}}",
			      NULL), DCAST_EMALFORMED); /* a tensor listed twice */
	CHECK(strstr(dcast_last_error(), "idx.json") && strstr(dcast_last_error(), "\"a\""));
	CHECK_ERR(parse_index("{}", NULL), DCAST_EMALFORMED);
	CHECK(strstr(dcast_last_error(), "weight_map"));
	CHECK_ERR(parse_index("{\"weight_map\":{}}", NULL), DCAST_EMALFORMED);
	CHECK_ERR(parse_index("{\"weight_map\":[]}", NULL), DCAST_EMALFORMED);
	CHECK_ERR(parse_index("[]", NULL), DCAST_EMALFORMED);
	CHECK_ERR(parse_index("{\"metadata\":3,\"weight_map\":{\"a\":\"m.safetensors\"}}", NULL),
		  DCAST_EMALFORMED);
	CHECK_ERR(parse_index("{\"weight_map\":{\"a\":7}}", NULL), DCAST_EMALFORMED);
	CHECK_ERR(parse_index("{\"weight_map\":{\"a\":\"m.bin\"}}", NULL), DCAST_EMALFORMED);
	CHECK_ERR(parse_index("{\"weight_map\":{\"a\":\"../m.safetensors\"}}", NULL), DCAST_EMALFORMED);
	CHECK(strstr(dcast_last_error(), "../m.safetensors") && strstr(dcast_last_error(), "\"a\""));
	CHECK_ERR(parse_index("{\"weight_map\":{\"a\":\".safetensors\"}}", NULL), DCAST_EMALFORMED);
	CHECK_ERR(parse_index("{\"weight_map\":{\"a\":\"d/m.safetensors\"}}", NULL), DCAST_EMALFORMED);
	CHECK_ERR(parse_index("{\"weight_map\":{\"\":\"m.safetensors\"}}", NULL), DCAST_EMALFORMED);
	CHECK_ERR(parse_index("{\"weight_map\":{\"a\":\"m.safetensors\"}", NULL), DCAST_EMALFORMED);
}

static void cleanup(void)
{
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cleanup of %s failed\n", dir);
}

/* A file's dtypes are the wire's: the same values, names and sizes (one
 * table), and a file of each reads back as that dtype. */
static void test_dtypes(void)
{
	char path[256];
	uint8_t data[16] = {0};

	for (int d = 0; d < DCAST_DTYPE_COUNT; d++) {
		const char *name = dcast_dtype_name(d);
		unsigned bytes = dcast_dtype_size(d) * dcast_dtype_lanes(d);
		dcast_st_spec spec = {"t", d, 1, {2}, data};
		dcast_st_file *f = NULL;
		const dcast_st_tensor *t;

		CHECK(strcmp(dcast_st_dtype_name(d), name) == 0);
		CHECK(dcast_st_dtype_from_name(name, strlen(name)) == d);
		CHECK(dcast_st_dtype_size(d) == bytes);
		path_in_dir(path, sizeof(path), "dtype.safetensors");
		REQUIRE(dcast_st_write(path, &spec, 1, NULL, 0) == 0);
		REQUIRE(dcast_st_open(path, &f) == 0);
		t = dcast_st_find(f, "t");
		CHECK(t && t->dtype == d && t->elem_size == bytes && t->nbytes == 2 * bytes);
		dcast_st_close(&f);
	}
	CHECK((int)DCAST_ST_BF16 == (int)DCAST_DTYPE_BF16 && (int)DCAST_ST_COUNT == (int)DCAST_DTYPE_COUNT);
	CHECK(dcast_st_dtype_from_name("F32\0", 4) == -1 && dcast_st_dtype_from_name("F32x", 3) == DCAST_ST_F32);
	CHECK(dcast_st_dtype_from_name("F", 1) == -1 && dcast_st_dtype_size(DCAST_ST_COUNT) == 0);
	CHECK(strcmp(dcast_st_dtype_name(-1), "?") == 0);
}

int main(void)
{
	REQUIRE(mkdtemp(dir));
	test_dtypes();
	test_round_trip();
	test_writer_rejects();
	test_json_rejects();
	test_entry_rejects();
	test_header_len_rejects();
	test_open_rejects();
	test_parse_header();
	test_index();
	cleanup();
	return check_done("test_safetensors");
}
