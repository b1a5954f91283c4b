/* What files on every floor of producer/ read of the producer's state, from
 * the device batches (device.c) up to the publishing thread (publish.c): how
 * many elements a chunk range holds, how long ago the pending version was
 * published, and whether the broker's tensor i is registered tensor i.  This file stands below all of them and calls none, so no
 * file reaches up for these (tests/test_layers.sh). */
#include <string.h>
#include "dcast_tiles.h"
#include "producer_shared.h"

uint64_t prod_range_count(const dcast_producer *p, const prod_tensor *t, uint64_t off)
{
	return t->shard_count - off < p->opts.range_elems ? t->shard_count - off
							 : p->opts.range_elems;
}

double prod_since_publish_ms(const dcast_producer *p)
{
	return (double)(dcast_now_ns() - p->publish_ns) / 1e6;
}

int prod_tensor_matches(const dcast_producer *p, uint32_t i, const dcast_tensor_desc *got,
			const char *call)
{
	const dcast_tensor_desc *want = &p->tensors[i].desc;

	if (strcmp(got->name, want->name))
		return dcast_fail(DCAST_ESHAPE, "%s: tensor %u of the broker's %s is %s, registered is "
				  "%s (names and order must match)", call, i, p->model, got->name,
				  want->name);
	if (got->dtype != want->dtype || got->ndim != want->ndim ||
	    memcmp(got->shape, want->shape, want->ndim * sizeof(want->shape[0])) ||
	    !dcast_grid_same(got, want))
		return dcast_fail(DCAST_ESHAPE, "%s: tensor %s is %s with %u dims at the broker, %s "
				  "with %u dims (or another shape or grid) registered", call,
				  want->name, dcast_dtype_name(got->dtype), got->ndim,
				  dcast_dtype_name(want->dtype), want->ndim);
	return 0;
}

int prod_tensor_count_matches(const dcast_producer *p, uint32_t n, const char *call)
{
	if (n != p->n_tensors)
		return dcast_fail(DCAST_ESHAPE, "%s: the broker's %s has %u tensors, %u are "
				  "registered: publish an anchor instead", call, p->model, n,
				  p->n_tensors);
	return 0;
}
