/* A bounded walk over raw msgpack bytes, run before msgpack-c unpacks a
 * header: it proves the bytes are one well-formed object, no deeper than
 * the schema needs, whose containers claim no more entries than bytes
 * remain.  msgpack-c allocates per claimed entry, so this check is what
 * keeps a 5-byte frame from asking for gigabytes. */
#include <string.h>
#include "dcast_common.h"
#include "schema_impl.h"

#define PRESCAN_MAX_DEPTH 6

struct scan {
	const uint8_t *p;
	size_t len, pos;
	uint64_t pending[PRESCAN_MAX_DEPTH + 1]; /* objects still due per level */
	int depth;
};

static uint64_t be(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

/* Bytes of the fixed part after the type byte, and how a length follows:
 * *len_bytes > 0 for str/bin/ext (length of data), *entries for
 * containers. */
static int classify(uint8_t b, unsigned *fixed, unsigned *len_bytes, int *container,
		    uint64_t *entries)
{
	*fixed = 0, *len_bytes = 0, *container = 0, *entries = 0;
	if (b <= 0x7f || b >= 0xe0 || (b >= 0xc0 && b <= 0xc3 && b != 0xc1))
		return 0;
	if ((b & 0xf0) == 0x80 || (b & 0xf0) == 0x90) {
		*container = (b & 0xf0) == 0x80 ? 2 : 1;
		*entries = b & 0x0f;
		return 0;
	}
	if ((b & 0xe0) == 0xa0) {
		*fixed = b & 0x1f;
		return 0;
	}
	switch (b) {
	case 0xc4: case 0xd9: *len_bytes = 1; return 0;
	case 0xc5: case 0xda: *len_bytes = 2; return 0;
	case 0xc6: case 0xdb: *len_bytes = 4; return 0;
	case 0xc7: *len_bytes = 1, *fixed = 1; return 0; /* ext8: len, type */
	case 0xc8: *len_bytes = 2, *fixed = 1; return 0;
	case 0xc9: *len_bytes = 4, *fixed = 1; return 0;
	case 0xca: *fixed = 4; return 0;
	case 0xcb: *fixed = 8; return 0;
	case 0xcc: case 0xd0: *fixed = 1; return 0;
	case 0xcd: case 0xd1: *fixed = 2; return 0;
	case 0xce: case 0xd2: *fixed = 4; return 0;
	case 0xcf: case 0xd3: *fixed = 8; return 0;
	case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
		*fixed = 1 + (1u << (b - 0xd4)); return 0;
	case 0xdc: case 0xde: *len_bytes = 2, *container = b == 0xdc ? 1 : 2; return 0;
	case 0xdd: case 0xdf: *len_bytes = 4, *container = b == 0xdd ? 1 : 2; return 0;
	}
	return dcast_fail(DCAST_EMALFORMED, "header: byte 0x%02x is not a msgpack type", b);
}

static int need(struct scan *s, uint64_t n)
{
	if (n > s->len - s->pos)
		return dcast_fail(DCAST_ETRUNCATED,
				  "header: truncated at byte %zu (%llu more needed, %zu left)",
				  s->pos, (unsigned long long)n, s->len - s->pos);
	return 0;
}

static int open_container(struct scan *s, uint64_t entries)
{
	if (entries == 0)
		return 0;
	if (s->depth == PRESCAN_MAX_DEPTH)
		return dcast_fail(DCAST_ETOO_LARGE, "header: nesting deeper than %d levels",
				  PRESCAN_MAX_DEPTH);
	/* every entry takes at least one byte */
	if (entries > s->len - s->pos)
		return dcast_fail(DCAST_ETRUNCATED,
				  "header: container at byte %zu claims %llu entries, %zu bytes left",
				  s->pos, (unsigned long long)entries, s->len - s->pos);
	s->pending[++s->depth] = entries;
	return 0;
}

/* Consume one object's own bytes; open it if it is a container. */
static int scan_object(struct scan *s)
{
	unsigned fixed, len_bytes;
	int container, rc;
	uint64_t entries, n = 0;

	if ((rc = need(s, 1)))
		return rc;
	if ((rc = classify(s->p[s->pos++], &fixed, &len_bytes, &container, &entries)))
		return rc;
	if ((rc = need(s, len_bytes)))
		return rc;
	n = be(s->p + s->pos, len_bytes);
	s->pos += len_bytes;
	if (container)
		return open_container(s, (len_bytes ? n : entries) * (uint64_t)container);
	if ((rc = need(s, fixed + n)))
		return rc;
	s->pos += fixed + n;
	return 0;
}

int schema_prescan(const uint8_t *p, size_t len)
{
	struct scan s = {.p = p, .len = len};
	int rc;

	s.pending[0] = 1;
	while (s.depth > 0 || s.pending[0] > 0) {
		s.pending[s.depth]--;
		if ((rc = scan_object(&s)))
			return rc;
		while (s.depth > 0 && s.pending[s.depth] == 0)
			s.depth--;
	}
	if (s.pos != len)
		return dcast_fail(DCAST_EMALFORMED, "header: %zu trailing bytes after the map",
				  len - s.pos);
	return 0;
}
