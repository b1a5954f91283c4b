/* A small strict JSON parser for safetensors headers: objects, arrays,
 * strings (with every escape, UTF-8 checked) and integers.  Everything else
 * (floats, true/false/null, duplicate keys, trailing bytes, nesting deeper
 * than DCAST_JSON_MAX_DEPTH) is rejected with DCAST_EMALFORMED and a detail
 * naming the byte offset.  Private to kernels/safetensors.c. */
#ifndef DCAST_SAFETENSORS_JSON_H
#define DCAST_SAFETENSORS_JSON_H

#include <stddef.h>
#include <stdint.h>

#define DCAST_JSON_MAX_DEPTH 16

enum dcast_json_type { DCAST_JSON_OBJECT, DCAST_JSON_ARRAY, DCAST_JSON_STRING, DCAST_JSON_INT };

typedef struct dcast_json {
	int type;                /* enum dcast_json_type */
	char *key;               /* member name inside an object (NUL-terminated), else NULL */
	size_t key_len;
	char *str;               /* DCAST_JSON_STRING: decoded, NUL-terminated */
	size_t str_len;
	int negative;            /* DCAST_JSON_INT: value is -num */
	uint64_t num;            /* DCAST_JSON_INT: magnitude */
	struct dcast_json *kids; /* members of an object or items of an array */
	size_t nkids;
} dcast_json;

/* Parse text[0..len) into *root (zeroed first).  `label` prefixes error
 * details.  On success the caller owns the tree (dcast_json_free); on error
 * nothing is left to free. */
int dcast_json_parse(const char *text, size_t len, const char *label, dcast_json *root);

/* Free everything below root and zero it. */
void dcast_json_free(dcast_json *root);

/* Member `key` of an object, or NULL. */
const dcast_json *dcast_json_get(const dcast_json *obj, const char *key);

#endif
