/* Open-addressing int64 histogram and its entropy (see histogram.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "histogram.h"

static uint64_t slot_of(int64_t key, uint64_t cap)
{
	uint64_t z = (uint64_t)key * 0x9e3779b97f4a7c15ull;
	return (z ^ (z >> 29)) & (cap - 1);
}

static void insert(int64_t *keys, uint64_t *counts, uint64_t cap, int64_t key, uint64_t n,
		   uint64_t *used)
{
	uint64_t i = slot_of(key, cap);
	while (counts[i] && keys[i] != key)
		i = (i + 1) & (cap - 1);
	if (!counts[i])
		(*used)++;
	keys[i] = key;
	counts[i] += n;
}

static int grow(cli_hist *h)
{
	uint64_t cap = h->cap ? h->cap * 2 : 1024, used = 0;
	int64_t *keys = malloc(cap * sizeof(*keys));
	uint64_t *counts = calloc(cap, sizeof(*counts));
	if (!keys || !counts) {
		free(keys);
		free(counts);
		h->failed = 1;
		return -1;
	}
	for (uint64_t i = 0; i < h->cap; i++)
		if (h->counts[i])
			insert(keys, counts, cap, h->keys[i], h->counts[i], &used);
	free(h->keys);
	free(h->counts);
	h->keys = keys, h->counts = counts, h->cap = cap, h->used = used;
	return 0;
}

void cli_hist_add(cli_hist *h, int64_t key, uint64_t n)
{
	if ((h->used + 1) * 10 > h->cap * 7 && grow(h) != 0)
		return;
	insert(h->keys, h->counts, h->cap, key, n, &h->used);
	h->total += n;
}

void cli_hist_merge(cli_hist *dst, const cli_hist *src)
{
	for (uint64_t i = 0; i < src->cap; i++)
		if (src->counts[i])
			cli_hist_add(dst, src->keys[i], src->counts[i]);
	dst->failed |= src->failed;
}

double cli_hist_bits(const cli_hist *h)
{
	if (!h->total)
		return 0.0;
	double sum = 0.0;
	for (uint64_t i = 0; i < h->cap; i++)
		if (h->counts[i])
			sum += (double)h->counts[i] * log2((double)h->counts[i]);
	double bits = (double)h->total * log2((double)h->total) - sum;
	return bits > 0 ? bits : 0.0;
}

void cli_hist_free(cli_hist *h)
{
	free(h->keys);
	free(h->counts);
	memset(h, 0, sizeof(*h));
}
