/* Random batches for the batch scatter's tests (tests/batch_cases.h). */
#include <stdlib.h>
#include <string.h>
#include "../batch_cases.h"

uint64_t bc_rnd(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static const unsigned sizes[4] = {1, 2, 4, 8};

/* n increasing positions below elems, chosen at random. */
static void pick_positions(uint32_t *pos, uint64_t n, uint64_t elems, uint64_t *rng)
{
	uint64_t at = 0;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t room = elems - at - (n - i); /* positions left after this one */
		pos[i] = (uint32_t)(at + (room ? bc_rnd(rng) % (room / (n - i) + 1) : 0));
		at = pos[i] + 1;
	}
}

void tbatch_make(tbatch *t, uint64_t n_seg, uint64_t max_changes, uint64_t *rng)
{
	dcast_batch_dims d = { n_seg, 0, 0, 0 };
	uint64_t *count = calloc(n_seg, 8), *es = calloc(n_seg, 8);

	t->range_off = calloc(n_seg, 8), t->range_elems = calloc(n_seg, 8), t->range_bytes = 0;
	for (uint64_t k = 0; k < n_seg; k++) {
		es[k] = sizes[bc_rnd(rng) % 4];
		count[k] = bc_rnd(rng) % 5 == 0 ? 0 : bc_rnd(rng) % (max_changes + 1);
		t->range_elems[k] = count[k] + bc_rnd(rng) % (4 * count[k] + 8);
		t->range_off[k] = t->range_bytes;
		t->range_bytes += (t->range_elems[k] * es[k] + 7) & ~7ull;
		d.n_tile += dcast_batch_tiles(count[k]);
		d.n += count[k];
		d.val_bytes += dcast_batch_val_bytes(count[k], (unsigned)es[k]);
	}
	t->buf = malloc(dcast_batch_bytes(&d));
	memset(t->buf, BC_POISON, dcast_batch_bytes(&d));
	dcast_batch_map(&t->b, t->buf, &d);
	t->ranges = malloc(t->range_bytes + 1), t->before = malloc(t->range_bytes + 1);
	for (uint64_t i = 0; i < t->range_bytes; i++)
		t->ranges[i] = (unsigned char)bc_rnd(rng);
	memcpy(t->before, t->ranges, t->range_bytes);
	for (uint64_t k = 0, first = 0, val = 0; k < n_seg; k++) {
		t->b.seg[k] = (dcast_batch_seg){ .dst = (uintptr_t)(t->ranges + t->range_off[k]), .start = bc_rnd(rng) % 1000,
						 .first = first, .val_off = val, .count = (uint32_t)count[k],
						 .tensor = (uint32_t)k, .elem_size = (uint32_t)es[k] };
		pick_positions(t->b.pos + first, count[k], t->range_elems[k], rng);
		for (uint64_t i = 0; i < count[k] * es[k]; i++)
			t->b.new_vals[val + i] = (unsigned char)bc_rnd(rng);
		first += count[k];
		val += dcast_batch_val_bytes(count[k], (unsigned)es[k]);
	}
	dcast_batch_tile_up(&t->b);
	free(count), free(es);
}

void tbatch_free(tbatch *t)
{
	free(t->buf), free(t->ranges), free(t->before), free(t->range_off), free(t->range_elems);
}

int tbatch_applied_as(const tbatch *t, uint64_t lo, uint64_t hi)
{
	unsigned char *want = malloc(t->range_bytes + 1);
	int same;

	memcpy(want, t->before, t->range_bytes);
	for (uint64_t k = lo; k < hi; k++) {
		const dcast_batch_seg *s = &t->b.seg[k];
		for (uint64_t i = 0; i < s->count; i++) {
			uint64_t at = t->range_off[k] + (uint64_t)t->b.pos[s->first + i] * s->elem_size;
			if (memcmp(t->b.old_vals + s->val_off + i * s->elem_size, t->before + at, s->elem_size))
				return free(want), 0;
			memcpy(want + at, t->b.new_vals + s->val_off + i * s->elem_size, s->elem_size);
		}
	}
	same = !memcmp(want, t->ranges, t->range_bytes);
	free(want);
	return same;
}

