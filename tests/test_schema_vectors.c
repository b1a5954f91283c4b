/* schema/vectors/: every good vector decodes, re-encodes to the same bytes
 * and renders to the JSON beside it; every bad vector is rejected with the
 * error code and detail its JSON names. */
#include <dirent.h>
#include "check.h"
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
	printf("%d good, %d bad vectors\n", n_good, n_bad);
	return check_done("test_schema_vectors");
}
