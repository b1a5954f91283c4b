/* Private: the order of COMMIT digest ranges, shared by every reader that
 * keeps a table of them (consumer/verify.c, broker/foldcheck.c). */
#ifndef DCAST_RANGES_H
#define DCAST_RANGES_H

#include "deltacast/schema.h"

/* Order of two ranges by (tensor, start, count), the digest ignored:
 * -1, 0 (the same range) or 1. */
static inline int dcast_range_key_cmp(const dcast_range_digest *a, const dcast_range_digest *b)
{
	if (a->tensor != b->tensor)
		return a->tensor < b->tensor ? -1 : 1;
	if (a->start != b->start)
		return a->start < b->start ? -1 : 1;
	return a->count < b->count ? -1 : a->count > b->count;
}

#endif
