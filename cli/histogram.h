/* Counting histogram over int64 keys (open addressing), and the empirical
 * entropy of what it counted: used by `deltacast diff` for the entropy bound
 * of value changes. */
#ifndef DCAST_CLI_HISTOGRAM_H
#define DCAST_CLI_HISTOGRAM_H

#include <stdint.h>

typedef struct cli_hist {
	int64_t *keys;
	uint64_t *counts; /* 0 marks an empty slot */
	uint64_t cap;     /* power of two */
	uint64_t used;
	uint64_t total;
	int failed;       /* an allocation failed: counts are incomplete */
} cli_hist;

/* Add `n` occurrences of key (n > 0). */
void cli_hist_add(cli_hist *h, int64_t key, uint64_t n);

/* Add every count of src to dst. */
void cli_hist_merge(cli_hist *dst, const cli_hist *src);

/* total * H(empirical distribution), in bits. */
double cli_hist_bits(const cli_hist *h);

/* Free and zero. */
void cli_hist_free(cli_hist *h);

/* Sortable-integer image of a w-bit pattern (w = 8, 16 or 32): sign set ->
 * all bits flipped, sign clear -> sign bit set; orders patterns as floats. */
static inline uint32_t cli_sortable(uint32_t x, unsigned w)
{
	uint32_t sb = 1u << (w - 1), mask = w >= 32 ? 0xffffffffu : (1u << w) - 1;
	return (x & sb) ? (~x & mask) : (x | sb);
}

#endif
