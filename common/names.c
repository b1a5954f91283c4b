/* Names to positions, O(1) a lookup (dcast_names.h). */
#include <stdlib.h>
#include <string.h>
#include "dcast_common.h"
#include "dcast_names.h"
#include "deltacast/codec.h" /* dcast_checksum */

static uint32_t name_hash(const char *name)
{
	return (uint32_t)dcast_checksum(name, strlen(name));
}

/* Place one slot value in a table with room (cap a power of two). */
static void place(uint64_t *slot, uint32_t cap, uint64_t v)
{
	uint32_t k = (uint32_t)(v >> 32) & (cap - 1);

	while (slot[k])
		k = (k + 1) & (cap - 1);
	slot[k] = v;
}

static int grow(dcast_names *x)
{
	uint32_t cap = x->cap ? x->cap * 2 : 64;
	uint64_t *slot;

	if (x->cap > UINT32_MAX / 2 || !(slot = calloc(cap, sizeof(*slot))))
		return dcast_fail(DCAST_ENOMEM, "name index of %u names", x->n + 1);
	for (uint32_t k = 0; k < x->cap; k++)
		if (x->slot[k])
			place(slot, cap, x->slot[k]);
	free(x->slot);
	x->slot = slot;
	x->cap = cap;
	return 0;
}

int dcast_names_put(dcast_names *x, const char *name, uint32_t i)
{
	int err;

	DCAST_ASSERT(i < UINT32_MAX);
	if ((uint64_t)(x->n + 1) * 2 > x->cap && (err = grow(x)))
		return err;
	place(x->slot, x->cap, (uint64_t)name_hash(name) << 32 | (i + 1));
	x->n++;
	return 0;
}

int64_t dcast_names_get(const dcast_names *x, const char *name, dcast_name_at at, const void *ctx)
{
	uint32_t h = name_hash(name), k;

	if (!x->cap)
		return -1;
	for (k = h & (x->cap - 1); x->slot[k]; k = (k + 1) & (x->cap - 1)) {
		uint32_t i = (uint32_t)x->slot[k] - 1;
		if ((uint32_t)(x->slot[k] >> 32) == h && !strcmp(at(ctx, i), name))
			return i;
	}
	return -1;
}

void dcast_names_free(dcast_names *x)
{
	free(x->slot);
	*x = (dcast_names){0};
}
