/* Model digest shared by the fault-suite tools: one 64-bit value over every
 * tensor of a model, independent of file layout, so a consumer's live
 * tensors can be compared with the producer's safetensors file for the same
 * version.  It is the checksum of the sequence (name, dcast_digest(bytes))
 * over tensors in name order; the caller hands tensors in any order. */
#ifndef FAULT_DIGEST_H
#define FAULT_DIGEST_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "deltacast/codec.h"
#include "deltacast/schema.h"

#define FAULT_MAX_TENSORS 4096

typedef struct fault_entry {
	char name[DCAST_MAX_NAME + 1];
	uint64_t digest;
} fault_entry;

static int fault_entry_cmp(const void *a, const void *b)
{
	return strcmp(((const fault_entry *)a)->name, ((const fault_entry *)b)->name);
}

/* Fold n entries (sorted here) into one model digest. */
static inline uint64_t fault_model_digest(fault_entry *e, size_t n)
{
	qsort(e, n, sizeof(*e), fault_entry_cmp);
	return dcast_checksum(e, n * sizeof(*e));
}

/* Fill entry i from a tensor's name and bytes. */
static inline void fault_entry_set(fault_entry *e, const char *name, const void *data,
				   uint64_t bytes)
{
	size_t len = strnlen(name, DCAST_MAX_NAME);

	memset(e, 0, sizeof(*e));
	memcpy(e->name, name, len);
	e->digest = dcast_digest(data, bytes);
}

#endif
