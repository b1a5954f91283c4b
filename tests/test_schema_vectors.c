/* schema/vectors/: every good vector decodes, re-encodes to the same bytes
 * and renders to the JSON beside it; every bad vector is rejected with the
 * error code and detail its JSON names.  Each compact v2 payload of codec/
 * decodes to the positions and codes its JSON names, applies to its
 * values after, is written again byte for byte by the encoder, and is
 * refused once damaged. */
#include <dirent.h>
#include "check.h"
#include "dcast_batch.h"
#include "deltacast/codec.h"
#include "deltacast/schema.h"

#define VEC_DIR "schema/vectors"

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	REQUIRE(f != NULL);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	REQUIRE(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
	buf[n] = '\0';
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* Value of "key": "value" in a flat JSON object, unescaping \" only. */
static void json_field(const char *json, const char *key, char *out, size_t cap)
{
	char pat[64];
	const char *p;
	size_t n = 0;

	snprintf(pat, sizeof(pat), "\"%s\": \"", key);
	REQUIRE((p = strstr(json, pat)) != NULL);
	for (p += strlen(pat); *p && *p != '"' && n + 1 < cap; p++) {
		if (*p == '\\')
			p++;
		out[n++] = *p;
	}
	out[n] = '\0';
}

/* The numbers of "key": [a, b, ...] into a new array (*n of them). */
static uint32_t *json_numbers(const char *json, const char *key, uint64_t *n)
{
	char pat[64];
	const char *p;
	char *end;
	uint32_t *v = malloc(4 * strlen(json) / 2 + 4);

	snprintf(pat, sizeof(pat), "\"%s\": [", key);
	REQUIRE(v && (p = strstr(json, pat)) != NULL);
	for (*n = 0, p += strlen(pat); *p != ']'; p = end + (end[0] == ',')) {
		v[(*n)++] = (uint32_t)strtoul(p, &end, 10);
		REQUIRE(end != p);
	}
	return v;
}

static uint64_t json_uint(const char *json, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\": ", key);
	REQUIRE((p = strstr(json, pat)) != NULL);
	return strtoull(p + strlen(pat), NULL, 10);
}

static uint8_t *packed(const uint32_t *v, uint64_t n, unsigned es)
{
	uint8_t *p = malloc(n * es + 1);
	REQUIRE(p);
	for (uint64_t i = 0; i < n; i++)
		memcpy(p + i * es, &v[i], es);
	return p;
}

/* Apply refuses the payload with a flipped bit of its stream's last word
 * (a leftover bit set, or a code that no longer ends where the index
 * says), dst untouched. */
static void check_codec_damaged(const dcast_chunk_info *info, uint8_t *pl, const uint8_t *base)
{
	uint8_t *dst = malloc(info->count * info->elem_size + 1);
	REQUIRE(dst);
	memcpy(dst, base, info->count * info->elem_size);
	pl[info->payload_bytes - 1] ^= 0x80;
	CHECK_ERR(dcast_codec_apply(info, pl, dst, NULL), DCAST_ECORRUPT);
	CHECK(!memcmp(dst, base, info->count * info->elem_size));
	pl[info->payload_bytes - 1] ^= 0x80;
	free(dst);
}

static void check_codec(const char *name)
{
	char path[512];
	size_t jl, pl_len;
	uint64_t nb, np, nc, na;
	snprintf(path, sizeof(path), VEC_DIR "/codec/%s.json", name);
	char *json = slurp(path, &jl);
	snprintf(path, sizeof(path), VEC_DIR "/codec/%s.bin", name);
	uint8_t *pl = (uint8_t *)slurp(path, &pl_len), *out;
	dcast_chunk_info info = { (uint32_t)json_uint(json, "encoding"), (uint32_t)json_uint(json, "elem_size"),
				  json_uint(json, "count"), json_uint(json, "changed"), pl_len };
	uint32_t *base = json_numbers(json, "base", &nb), *pos = json_numbers(json, "positions", &np);
	uint32_t *codes = json_numbers(json, "codes", &nc), *after = json_numbers(json, "after", &na);
	uint32_t *gpos = calloc(np + 1, 4), *gcode = calloc(np + 1, 4);
	uint8_t *b = packed(base, nb, info.elem_size), *a = packed(after, na, info.elem_size);
	unsigned mode;

	REQUIRE(gpos && gcode && info.encoding == DCAST_ENC_COMPACT2 && nb == info.count && na == info.count);
	CHECK(json_uint(json, "payload_bytes") == pl_len && np == info.changed && nc == info.changed);
	CHECK_ERR(dcast_batch_decode(&info, pl, gpos, gcode, &mode), DCAST_OK);
	CHECK(!memcmp(gpos, pos, np * 4) && !memcmp(gcode, codes, nc * 4));
	CHECK((mode == DCAST_BATCH_ULP) == (json_uint(json, "value_mode") == 1));
	REQUIRE((out = malloc(dcast_codec_bound(info.count, info.elem_size))) != NULL);
	dcast_chunk_info again;
	CHECK_ERR(dcast_codec_encode(a, b, info.count, info.elem_size, DCAST_ENC_COMPACT2, 0, out,
				     dcast_codec_bound(info.count, info.elem_size), &again), DCAST_OK);
	CHECK(again.payload_bytes == pl_len && !memcmp(out, pl, pl_len));
	check_codec_damaged(&info, pl, b);
	CHECK_ERR(dcast_codec_apply(&info, pl, b, NULL), DCAST_OK);
	CHECK(!memcmp(b, a, info.count * info.elem_size));
	free(json), free(pl), free(out), free(base), free(pos), free(codes), free(after), free(gpos), free(gcode);
	free(b), free(a);
}

static int check_codec_dir(void)
{
	DIR *d = opendir(VEC_DIR "/codec");
	struct dirent *e;
	char name[256];
	int n = 0;

	REQUIRE(d != NULL);
	while ((e = readdir(d))) {
		size_t len = strlen(e->d_name);
		if (len < 5 || strcmp(e->d_name + len - 4, ".bin") != 0)
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)(len - 4), e->d_name);
		check_codec(name), n++;
	}
	closedir(d);
	return n;
}

static void check_good(const char *name)
{
	char path[512], *bytes, *json, *rendered;
	size_t len, jlen, out_len;
	void *out;
	dcast_msg m;

	snprintf(path, sizeof(path), VEC_DIR "/%s.msgpack", name);
	bytes = slurp(path, &len);
	snprintf(path, sizeof(path), VEC_DIR "/%s.json", name);
	json = slurp(path, &jlen);
	CHECK_ERR(dcast_msg_decode(bytes, len, &m), DCAST_OK);
	CHECK_ERR(dcast_msg_encode(&m, &out, &out_len), DCAST_OK);
	CHECK(out_len == len && memcmp(out, bytes, len) == 0);
	CHECK_ERR(dcast_msg_to_json(&m, &rendered), DCAST_OK);
	if (strcmp(rendered, json) != 0)
		fprintf(stderr, "%s: JSON differs:\n%s\nvs\n%s\n", name, rendered, json);
	CHECK(strcmp(rendered, json) == 0);
	free(out), free(rendered), free(bytes), free(json);
	dcast_msg_free(&m);
}

static void check_bad(const char *name)
{
	char path[512], want[64], detail[256], *bytes, *json;
	size_t len, jlen;
	dcast_msg m;

	snprintf(path, sizeof(path), VEC_DIR "/%s.msgpack", name);
	bytes = slurp(path, &len);
	snprintf(path, sizeof(path), VEC_DIR "/%s.json", name);
	json = slurp(path, &jlen);
	json_field(json, "error", want, sizeof(want));
	json_field(json, "detail", detail, sizeof(detail));
	REQUIRE(dcast_err_from_name(want) > 0);
	CHECK_ERR(dcast_msg_decode(bytes, len, &m), dcast_err_from_name(want));
	if (!strstr(dcast_last_error(), detail)) {
		fprintf(stderr, "%s: detail \"%s\" lacks \"%s\"\n", name, dcast_last_error(), detail);
		check_failures++;
	}
	free(bytes), free(json);
}

int main(void)
{
	DIR *d = opendir(VEC_DIR);
	struct dirent *e;
	int n_good = 0, n_bad = 0, types_seen[DCAST_MSG_TYPE_COUNT] = {0};
	char name[256];

	REQUIRE(d != NULL);
	while ((e = readdir(d))) {
		size_t n = strlen(e->d_name);
		if (n < 9 || strcmp(e->d_name + n - 8, ".msgpack") != 0)
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)(n - 8), e->d_name);
		if (strncmp(name, "bad_", 4) == 0) {
			check_bad(name), n_bad++;
			continue;
		}
		check_good(name), n_good++;
		for (int t = 1; t < DCAST_MSG_TYPE_COUNT; t++)
			if (strncasecmp(name, dcast_msg_type_name(t), strlen(dcast_msg_type_name(t))) == 0)
				types_seen[t] = 1;
	}
	closedir(d);
	for (int t = 1; t < DCAST_MSG_TYPE_COUNT; t++)
		CHECK(types_seen[t]); /* a good vector for every type */
	CHECK(n_bad >= 20);
	int n_codec = check_codec_dir();
	CHECK(n_codec >= 3);
	printf("%d good, %d bad vectors, %d compact v2 payloads\n", n_good, n_bad, n_codec);
	return check_done("test_schema_vectors");
}
