/* bench_sync_floor: the compute floor of one delta version for
 * scripts/bench_sync.sh.  For each pair of consecutive files (FILE[i-1],
 * FILE[i]) it encodes FILE[i] against FILE[i-1] in chunks of RANGE_ELEMS
 * elements per tensor (the producer's default 2^20, smallest encoding, as
 * the producer picks it), then decodes and scatters every payload into a
 * copy of FILE[i-1] (dcast_codec_apply), one thread, and checks the result
 * equals FILE[i].  Both files are read once before the timing.  Best of
 * REPEATS (3) for each phase; one line per pair:
 *   floor V encode_ns E apply_ns A payload_bytes P changed C model_bytes M
 * usage: bench_sync_floor FILE0 FILE1 [FILE2...]
 * Exit 1 on an error or a mismatch. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dcast_common.h"
#include "deltacast/codec.h"
#include "deltacast/safetensors.h"

#define RANGE_ELEMS (1u << 20)
#define REPEATS 3

/* The encoded delta: every chunk's info and payload, back to back. */
typedef struct delta {
	dcast_chunk_info *info;
	size_t n, cap;
	unsigned char *payload;
	size_t used, payload_cap;
	uint64_t changed;
} delta;

static int delta_add(delta *d, const dcast_chunk_info *info, const void *payload)
{
	if (d->n == d->cap) {
		d->cap = d->cap ? 2 * d->cap : 256;
		if (!(d->info = realloc(d->info, d->cap * sizeof(*d->info))))
			return -1;
	}
	while (d->used + info->payload_bytes > d->payload_cap) {
		d->payload_cap = d->payload_cap ? 2 * d->payload_cap : 1u << 20;
		if (!(d->payload = realloc(d->payload, d->payload_cap)))
			return -1;
	}
	memcpy(d->payload + d->used, payload, info->payload_bytes);
	d->used += info->payload_bytes;
	d->info[d->n++] = *info;
	d->changed += info->changed;
	return 0;
}

/* Encode every chunk of cur against base into d. */
static int encode_all(const dcast_st_file *base, const dcast_st_file *cur, delta *d, void *out,
		      size_t cap)
{
	d->n = d->used = d->changed = 0;
	for (size_t i = 0; i < dcast_st_count(cur); i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(cur, i), *b = dcast_st_tensor_at(base, i);
		if (!b || b->nbytes != t->nbytes || b->elem_size != t->elem_size || strcmp(b->name, t->name))
			return -1; /* not two versions of one model */
		for (uint64_t off = 0; off < t->count; off += RANGE_ELEMS) {
			uint64_t n = t->count - off < RANGE_ELEMS ? t->count - off : RANGE_ELEMS;
			uint64_t at = off * t->elem_size;
			dcast_chunk_info info;
			if (dcast_codec_encode((const unsigned char *)t->data + at,
					       (unsigned char *)b->data + at, n, t->elem_size, -1, 0, out,
					       cap, &info) ||
			    delta_add(d, &info, out))
				return -1;
		}
	}
	return 0;
}

/* Decode and scatter d into dst, laid out as the file's data area. */
static int apply_all(const dcast_st_file *f, const delta *d, unsigned char *dst)
{
	const unsigned char *p = d->payload;
	size_t k = 0;

	for (size_t i = 0; i < dcast_st_count(f); i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		for (uint64_t off = 0; off < t->count; off += RANGE_ELEMS, k++) {
			if (dcast_codec_apply(&d->info[k], p, dst + t->data_offset + off * t->elem_size, NULL))
				return -1;
			p += d->info[k].payload_bytes;
		}
	}
	return 0;
}

/* Copy f's tensors into dst at their data offsets (also reads f once). */
static void copy_data(const dcast_st_file *f, unsigned char *dst)
{
	for (size_t i = 0; i < dcast_st_count(f); i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		memcpy(dst + t->data_offset, t->data, t->nbytes);
	}
}

static int same_data(const dcast_st_file *f, const unsigned char *dst)
{
	for (size_t i = 0; i < dcast_st_count(f); i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		if (memcmp(dst + t->data_offset, t->data, t->nbytes))
			return 0;
	}
	return 1;
}

static uint64_t data_bytes(const dcast_st_file *f)
{
	const dcast_st_tensor *t = dcast_st_tensor_at(f, dcast_st_count(f) - 1);
	return t->data_offset + t->nbytes;
}

/* Best-of-REPEATS encode and apply of base -> cur; one output line. */
static int floor_pair(const dcast_st_file *base, const dcast_st_file *cur, uint64_t v)
{
	uint64_t bytes = data_bytes(cur), enc = UINT64_MAX, app = UINT64_MAX;
	size_t cap = dcast_codec_bound(RANGE_ELEMS, 4);
	unsigned char *dst = malloc(bytes), *out = malloc(cap);
	delta d = {0};
	int err = !dst || !out;

	if (!err)
		copy_data(cur, dst); /* reads cur once, faults dst in */
	for (int r = 0; r < REPEATS && !err; r++) {
		copy_data(base, dst);
		uint64_t t0 = dcast_now_ns();
		err = encode_all(base, cur, &d, out, cap);
		uint64_t t1 = dcast_now_ns();
		err = err || apply_all(cur, &d, dst);
		uint64_t t2 = dcast_now_ns();
		err = err || !same_data(cur, dst);
		enc = t1 - t0 < enc ? t1 - t0 : enc;
		app = t2 - t1 < app ? t2 - t1 : app;
	}
	if (!err)
		printf("floor %" PRIu64 " encode_ns %" PRIu64 " apply_ns %" PRIu64 " payload_bytes %zu"
		       " changed %" PRIu64 " model_bytes %" PRIu64 "\n", v, enc, app, d.used, d.changed, bytes);
	free(d.info);
	free(d.payload);
	free(dst);
	free(out);
	return err;
}

int main(int argc, char **argv)
{
	dcast_st_file *base = NULL, *cur = NULL;
	int err;

	if (argc < 3) {
		fprintf(stderr, "usage: bench_sync_floor FILE0 FILE1 [FILE2...]\n");
		return 2;
	}
	err = dcast_st_open(argv[1], &base);
	for (int i = 2; i < argc && !err; i++) {
		if ((err = dcast_st_open(argv[i], &cur)) || (err = floor_pair(base, cur, (uint64_t)i - 1)))
			break;
		dcast_st_close(&base);
		base = cur;
		cur = NULL;
	}
	if (err)
		fprintf(stderr, "bench_sync_floor: failed: %s\n", dcast_last_error());
	dcast_st_close(&base);
	dcast_st_close(&cur);
	return err ? 1 : 0;
}
