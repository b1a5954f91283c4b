/* A staged version: its chunk table and duplicate set (both grow by
 * doubling, amortised, never per message, bounded by DCAST_MAX_CHUNKS).
 * The steps that change its state are intake.c's. */
#include <inttypes.h>
#include <string.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static int seen_insert(uint64_t *set, uint32_t cap, uint64_t key)
{
	for (uint32_t i = (uint32_t)mix(key) & (cap - 1), n = 0; n < cap; i = (i + 1) & (cap - 1), n++) {
		if (set[i] == key)
			return 1;
		if (set[i] == 0) {
			set[i] = key;
			return 0;
		}
	}
	DCAST_ASSERT(0 && "duplicate set full");
	return 0;
}

static int grow(cs_version *v)
{
	uint32_t cap = v->cap_chunks ? v->cap_chunks * 2 : 64;
	cs_chunk *ch;
	uint64_t *set;

	if (cap > DCAST_MAX_CHUNKS / 2)
		return dcast_fail(DCAST_ETOO_LARGE, "version %" PRIu64 ": more than %u chunks",
				  v->version, DCAST_MAX_CHUNKS / 2);
	ch = realloc(v->chunks, (size_t)cap * sizeof(*ch));
	if (!ch)
		return dcast_fail(DCAST_ENOMEM, "chunk table of version %" PRIu64, v->version);
	v->chunks = ch;
	set = calloc((size_t)cap * 2, sizeof(*set));
	if (!set)
		return dcast_fail(DCAST_ENOMEM, "chunk set of version %" PRIu64, v->version);
	for (uint32_t i = 0; i < v->n_chunks; i++)
		seen_insert(set, cap * 2, ((uint64_t)ch[i].part << 32 | ch[i].seq) + 1);
	free(v->seen);
	v->seen = set;
	v->seen_cap = cap * 2;
	v->cap_chunks = cap;
	return 0;
}

int cs_version_seen(const cs_version *v, uint32_t part, uint32_t seq)
{
	uint64_t key = ((uint64_t)part << 32 | seq) + 1;

	if (!v->seen_cap)
		return 0;
	for (uint32_t i = (uint32_t)mix(key) & (v->seen_cap - 1), n = 0; n < v->seen_cap;
	     i = (i + 1) & (v->seen_cap - 1), n++) {
		if (v->seen[i] == key)
			return 1;
		if (v->seen[i] == 0)
			return 0;
	}
	return 0;
}

int cs_chunk_writes(const cs_chunk *k)
{
	return k->info.encoding == DCAST_ENC_DENSE || k->info.changed;
}

int cs_version_add(cs_version *v, const cs_chunk *k)
{
	int err;

	if (v->n_chunks == v->cap_chunks && (err = grow(v)))
		return err;
	seen_insert(v->seen, v->seen_cap, ((uint64_t)k->part << 32 | k->seq) + 1);
	v->chunks[v->n_chunks++] = *k;
	v->bytes += k->info.payload_bytes;
	return 0;
}

void cs_version_free(cs_version *v)
{
	free(v->chunks);
	free(v->seen);
	free(v->commit.digests);
	cs_dcache_clear(&v->ahead);
	if (v->io && v->io_file >= 0)
		dcast_io_file_remove(v->io, v->io_file);
	if (v->fd >= 0)
		close(v->fd);
	cs_version_init(v, DCAST_VERSION_NONE);
}

void cs_version_init(cs_version *v, uint64_t version)
{
	memset(v, 0, sizeof(*v));
	v->version = version;
	v->base_version = DCAST_VERSION_NONE;
	v->fd = -1;
	v->io_file = -1;
}
