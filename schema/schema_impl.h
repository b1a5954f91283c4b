/* Private to schema/: the field tables that drive encode, decode,
 * validation and JSON output of every message type. */
#ifndef DCAST_SCHEMA_IMPL_H
#define DCAST_SCHEMA_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include "deltacast/schema.h"

enum field_kind {
	F_U32,     /* uint32_t */
	F_U64,     /* uint64_t */
	F_BOOL,    /* uint32_t 0/1 */
	F_VER,     /* uint64_t, nil <-> DCAST_VERSION_NONE */
	F_STR,     /* char[max + 1] */
	F_ROLE,    /* uint32_t dcast_role, as a string */
	F_DTYPE,   /* uint32_t dcast_dtype, as a string */
	F_SHAPE,   /* uint32_t ndim at off, uint64_t shape[] after it */
	F_GRID,    /* dcast_tensor_desc.grid: sent only when tiled */
	F_TENSORS, /* dcast_manifest: n_tensors + tensors */
	F_DIGESTS, /* dcast_commit: n_digests + digests */
	F_SUM,     /* uint64_t dcast_manifest.sum: computed when encoded, checked when decoded */
};

struct field {
	const char *key;
	uint8_t kind;
	uint8_t required;
	uint16_t off;  /* offset in the message struct */
	uint64_t min;  /* integers: least value; strings: least length */
	uint64_t max;  /* integers: greatest value; strings, arrays: most entries */
};

struct msg_table {
	const char *name;           /* "CHUNK" */
	const struct field *fields;
	unsigned n_fields;
};

/* Table of a message type; NULL for an invalid type. */
const struct msg_table *schema_table(int type);

/* Wire name of a dcast_role ("producer", "consumer"). */
const char *schema_role_name(uint32_t role);

/* Where an array field (F_TENSORS, F_DIGESTS) of the message at `base`
 * keeps its entries: the count, the pointer slot, one entry's size and the
 * table of an entry. */
struct schema_array {
	uint32_t *count;
	void **entries;
	size_t entry_size;
	const struct msg_table *table;
};
struct schema_array schema_array_of(const struct field *f, const void *base);

/* Tables of the nested maps. */
extern const struct msg_table schema_tensor_table;
extern const struct msg_table schema_digest_table;

/* Bounded walk over raw msgpack: well-formed, depth and container counts
 * plausible for the bytes left, nothing after the root object. */
int schema_prescan(const uint8_t *p, size_t len);

/* Is field f of the map at base sent?  Every field but an untiled grid
 * and an empty CREDIT.model. */
int schema_field_present(const struct field *f, const void *base);

/* Offset of the first byte of s[0..n) that is not well-formed UTF-8
 * (RFC 3629: shortest forms, no surrogates, at most U+10FFFF), or n. */
size_t schema_utf8_bad_at(const char *s, size_t n);

/* Range and cross-field checks of a message, shared by encode and decode. */
int schema_validate_fields(const struct msg_table *t, const void *base, const char *path);

#endif
