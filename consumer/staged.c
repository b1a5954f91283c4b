/* A staged version's chunks as apply and verification read them: sorted
 * and checked for overlap and cover, and a chunk's payload read back
 * (resident in the pool, or from its record file).  The staged list
 * itself (c->staged) is intake.c's. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "store/store.h"

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
