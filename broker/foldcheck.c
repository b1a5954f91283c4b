/* The fold's check of each version it folds (foldcheck.h): the COMMIT
 * digests of the folded state, kept per range and moved in O(changed) by
 * each delta, as a verifying consumer does (consumer/verify.c). */
#include <stdlib.h>
#include <string.h>
#include "dcast_common.h"
#include "dcast_fit.h"
#include "dcast_ranges.h"
#include "deltacast/codec.h"
#include "foldcheck.h"

static int range_cmp(const void *a, const void *b)
{
	return dcast_range_key_cmp(a, b);
}

/* Index of the range equal to key in d, or -1. */
static int64_t find_same(const struct fold_digests *d, const dcast_range_digest *key)
{
	uint32_t lo = 0, hi = d->n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		int r = dcast_range_key_cmp(&d->want[mid], key);

		if (!r)
			return mid;
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

/* First range of tensor t that ends past element lo (ranges disjoint). */
static uint32_t find_first(const struct fold_digests *d, uint32_t t, uint64_t lo)
{
	uint32_t a = 0, b = d->n;

	while (a < b) {
		uint32_t mid = a + (b - a) / 2;
		const dcast_range_digest *r = &d->want[mid];

		if (r->tensor < t || (r->tensor == t && r->start + r->count <= lo))
			a = mid + 1;
		else
			b = mid;
	}
	return a;
}

int fold_digest_fits(const struct broker_manifest *mf, const dcast_range_digest *d, uint32_t i)
{
	if (dcast_digest_fits(d, i, dcast_manifest_descs(&mf->m)))
		return dcast_fail(DCAST_EDIGEST, "%s", dcast_last_error());
	return 0;
}

/* Overlapping ranges cannot be moved chunk by chunk (find_first assumes
 * disjoint ones): every range is then computed whole. */
static int disjoint(const struct fold_digests *d)
{
	for (uint32_t i = 1; i < d->n; i++)
		if (d->want[i].tensor == d->want[i - 1].tensor &&
		    d->want[i].start < d->want[i - 1].start + d->want[i - 1].count)
			return 0;
	return 1;
}

/* The common case costs O(ranges): a producer sends its ranges in order,
 * and the same ones every version. */
static int sorted(const struct fold_digests *d)
{
	for (uint32_t i = 1; i < d->n; i++)
		if (dcast_range_key_cmp(&d->want[i - 1], &d->want[i]) > 0)
			return 0;
	return 1;
}

static int same_ranges(const struct fold_digests *a, const struct fold_digests *b)
{
	if (a->n != b->n)
		return 0;
	for (uint32_t i = 0; i < a->n; i++)
		if (dcast_range_key_cmp(&a->want[i], &b->want[i]))
			return 0;
	return 1;
}

int fold_check_begin(struct fold_digests *next, const struct fold_digests *prev,
		     const struct broker_version *v, const struct broker_manifest *mf)
{
	uint32_t n = v->n_digests;
	int rc = 0, moved, same;

	memset(next, 0, sizeof(*next));
	for (uint32_t i = 0; !rc && i < n; i++)
		rc = fold_digest_fits(mf, &v->digests[i], i);
	if (rc)
		return rc;
	next->want = malloc((n ? n : 1) * sizeof(*next->want));
	next->have = calloc(n ? n : 1, sizeof(*next->have));
	next->whole = calloc(n ? n : 1, sizeof(*next->whole));
	if (!next->want || !next->have || !next->whole) {
		fold_digests_free(next);
		return dcast_fail(DCAST_ENOMEM, "fold: digests of version %llu",
				  (unsigned long long)v->version);
	}
	if (n) /* a version of no digests has none to copy (v->digests NULL) */
		memcpy(next->want, v->digests, n * sizeof(*next->want));
	next->n = n;
	if (!sorted(next))
		qsort(next->want, n, sizeof(*next->want), range_cmp);
	moved = !v->anchor && disjoint(next);
	same = moved && same_ranges(next, prev);
	for (uint32_t i = 0; i < n; i++) {
		int64_t j = same ? (int64_t)i : moved ? find_same(prev, &next->want[i]) : -1;

		next->whole[i] = j < 0;
		next->have[i] = j < 0 ? 0 : prev->have[j];
	}
	return 0;
}

int fold_digests_claimed(struct fold_digests *d, const struct broker_version *v,
			 const struct broker_manifest *mf)
{
	static const struct fold_digests none;
	int rc = fold_check_begin(d, &none, v, mf);

	for (uint32_t i = 0; !rc && i < d->n; i++) {
		d->have[i] = d->want[i].digest;
		d->whole[i] = 0;
	}
	return rc;
}

int fold_check_chunk(struct fold_digests *next, const dcast_chunk *c, const void *payload,
		     const void *range)
{
	const dcast_chunk_info info = {c->encoding, c->elem_size, c->count, c->changed, c->payload_bytes};
	uint64_t end = c->start + c->count;
	int rc = 0;

	for (uint32_t i = find_first(next, c->tensor, c->start);
	     !rc && i < next->n && next->want[i].tensor == c->tensor && next->want[i].start < end; i++) {
		const dcast_range_digest *r = &next->want[i];
		uint64_t lo = r->start > c->start ? r->start - c->start : 0;
		uint64_t hi = r->start + r->count < end ? r->start + r->count - c->start : c->count;

		if (!next->whole[i])
			rc = dcast_ldigest_payload(&next->have[i], c->tensor, c->start, &info, payload,
						   range, NULL, lo, hi);
	}
	return rc;
}

int fold_check_end(struct fold_digests *next, struct fold_state *st)
{
	int rc;

	for (uint32_t i = 0; i < next->n; i++) {
		const dcast_range_digest *r = &next->want[i];

		if (next->whole[i] &&
		    (rc = fold_state_digest(st, r->tensor, r->start, r->count, &next->have[i])))
			return rc;
		next->whole[i] = 0;
		if (next->have[i] != r->digest)
			return dcast_fail(DCAST_EDIGEST, "tensor %s [%llu, +%llu): the digest of the folded "
					  "state differs from the COMMIT's", st->mf->m.tensors[r->tensor].name,
					  (unsigned long long)r->start, (unsigned long long)r->count);
	}
	return 0;
}

void fold_digests_free(struct fold_digests *d)
{
	free(d->want);
	free(d->have);
	free(d->whole);
	memset(d, 0, sizeof(*d));
}
