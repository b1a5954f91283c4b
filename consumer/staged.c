/* The staged versions (c->staged, in version order): finding one, dropping
 * it (its resident payloads and, when asked, its record file), sorting and
 * checking its chunks, and reading a chunk's payload back (resident in
 * the pool, or from its record file).  Below apply, verification and the
 * session, which all work on staged versions. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "store/store.h"

static void release_resident(dcast_consumer *c, cs_version *v)
{
	for (uint32_t i = 0; i < v->n_chunks; i++)
		if (v->chunks[i].resident) {
			cs_pool_resident_put(&c->pool, v->chunks[i].info.payload_bytes);
			v->chunks[i].resident = NULL;
		}
}

/* Forget v (staged[] stays in order); its record file goes when unlink_file. */
void cs_version_drop(dcast_consumer *c, cs_version *v, int unlink_file)
{
	uint32_t i = (uint32_t)(v - c->staged);

	DCAST_ASSERT(i < c->n_staged);
	cs_ckpt_settle(c); /* no record write still reads its slots or file */
	release_resident(c, v);
	if (unlink_file && v->direct) {
		cs_anchor_new_drop(c);
	} else if (unlink_file) {
		cs_ckpt_remove(c, v->version);
	}
	cs_version_free(v);
	memmove(&c->staged[i], &c->staged[i + 1], (c->n_staged - i - 1) * sizeof(*v));
	c->n_staged--;
	cs_version_init(&c->staged[c->n_staged], DCAST_VERSION_NONE);
}

void cs_drop_all(dcast_consumer *c)
{
	while (c->n_staged)
		cs_version_drop(c, &c->staged[c->n_staged - 1], 1);
}

void cs_drop_from(dcast_consumer *c, uint64_t version)
{
	while (c->n_staged && c->staged[c->n_staged - 1].version >= version)
		cs_version_drop(c, &c->staged[c->n_staged - 1], 1);
}

int cs_drop_in_place(dcast_consumer *c)
{
	if (!c->n_staged || !c->staged[0].in_place)
		return 0;
	cs_drop_from(c, c->staged[0].version);
	return 1;
}

static int chunk_cmp(const void *a, const void *b)
{
	const cs_chunk *x = a, *y = b;

	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	return x->start < y->start ? -1 : x->start > y->start;
}

static int uncovered(const dcast_consumer *c, const cs_version *v, uint32_t t, uint64_t from, uint64_t to)
{
	return dcast_fail(DCAST_ECORRUPT, "anchor %" PRIu64 ": tensor %s elements [%" PRIu64 ", %" PRIu64
			  ") not covered", v->version, c->tensors[t].desc.name, from, to);
}

/* Chunks in (tensor, start) order, so that writes and digest updates walk
 * memory forward; they must not overlap, and an anchor's must cover every
 * element of every tensor. */
int cs_sort_chunks(const dcast_consumer *c, cs_version *v)
{
	uint64_t next = 0;
	uint32_t t = 0;

	qsort(v->chunks, v->n_chunks, sizeof(*v->chunks), chunk_cmp);
	for (uint32_t i = 0; i < v->n_chunks; i++) {
		const cs_chunk *k = &v->chunks[i];
		if (i && k->tensor == v->chunks[i - 1].tensor && k->start < next)
			return dcast_fail(DCAST_ECORRUPT, "version %" PRIu64 ": chunks of tensor %s overlap at element %"
					  PRIu64, v->version, c->tensors[k->tensor].desc.name, k->start);
		for (; v->anchor && t < k->tensor; t++, next = 0)
			if (next != dcast_tensor_elems(&c->tensors[t].desc))
				return uncovered(c, v, t, next, dcast_tensor_elems(&c->tensors[t].desc));
		if (v->anchor && k->start != next)
			return uncovered(c, v, t, next, k->start);
		next = k->start + k->info.count;
	}
	for (; v->anchor && t < c->n_tensors; t++, next = 0)
		if (next != dcast_tensor_elems(&c->tensors[t].desc))
			return uncovered(c, v, t, next, dcast_tensor_elems(&c->tensors[t].desc));
	return 0;
}

int cs_chunk_payload(dcast_consumer *c, const cs_version *v, const cs_chunk *k, const unsigned char **out)
{
	int err;

	if (k->resident) {
		*out = k->resident;
		return 0;
	}
	if (k->file_off == CS_IN_PLACE) {
		*out = cs_chunk_dst(c, k);
		return 0;
	}
	if ((err = cs_ckpt_read_payload(c, v, k, cs_pool_scratch(&c->pool))))
		return err;
	if (dcast_checksum(cs_pool_scratch(&c->pool), k->info.payload_bytes) != k->checksum)
		return dcast_fail(DCAST_ECHECKSUM, "version %" PRIu64 ": staged chunk of tensor %s at %" PRIu64
				  " fails its checksum on disk", v->version, c->tensors[k->tensor].desc.name, k->start);
	*out = cs_pool_scratch(&c->pool);
	return 0;
}

/* Staged versions at the front that are READY and apply in a chain from
 * the live tensors: complete, committed to the record log and checked as
 * far as they can be before apply. */
uint32_t cs_ready_chain(const dcast_consumer *c)
{
	uint64_t have = dcast_consumer_version(c);
	uint32_t n = 0;

	for (; n < c->n_staged && c->staged[n].state == CS_V_READY; n++) {
		const cs_version *v = &c->staged[n];
		if (!v->anchor && v->base_version != have)
			break;
		have = v->version;
	}
	return n;
}

void cs_staged_check(const dcast_consumer *c)
{
	uint64_t prev = dcast_consumer_version(c);

	DCAST_ASSERT(c->n_staged <= CS_MAX_STAGED);
	for (uint32_t i = 0; i < c->n_staged; i++) {
		const cs_version *v = &c->staged[i];
		DCAST_ASSERT(v->state == CS_V_STAGING || v->state == CS_V_READY);
		DCAST_ASSERT(prev == DCAST_VERSION_NONE || v->version > prev);
		DCAST_ASSERT(v->anchor || v->base_version < v->version);
		prev = v->version;
	}
}
