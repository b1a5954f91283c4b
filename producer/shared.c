/* What files on every floor of producer/ read of the producer's state, from
 * the device batches (device.c) up to the publishing thread (publish.c): how
 * many elements a chunk range holds, and how long ago the pending version
 * was published.  This file stands below all of them and calls none, so no
 * file reaches up for these (tests/test_layers.sh). */
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
