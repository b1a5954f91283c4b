/* Private to broker/fold.c: checking what the fold folds (foldcheck.c).
 * Each version the fold applies to its state is checked against its own
 * COMMIT digests: the fold keeps the digest of each COMMIT range of the
 * folded state and moves it by every change a delta makes, before the
 * change is applied (the additive digest, docs/protocol.md "Checksum and
 * digest"), so a delta costs O(changed) more; an anchor's ranges, and any
 * range with no value from the version before (another range size), are
 * computed whole.  A range that differs, or a payload the codec refuses,
 * makes the version bad: the fold marks it poisoned (commit.c). */
#ifndef DCAST_BROKER_FOLDCHECK_H
#define DCAST_BROKER_FOLDCHECK_H

#include "broker.h"
#include "foldstate.h"

/* Digests of the folded state, one per COMMIT range of the version folded
 * last, sorted by (tensor, start, count). */
struct fold_digests {
	dcast_range_digest *want;  /* [n] the COMMIT's ranges and digests, sorted */
	uint64_t *have;            /* [n] the state's digest of each range */
	uint8_t *whole;            /* [n] 1: computed whole once the version is in */
	uint32_t n;
};

/* Does COMMIT digest i, d, fit manifest mf (dcast_digest_fits)?  0, or
 * DCAST_EDIGEST naming what does not: a version with one is bad. */
int fold_digest_fits(const struct broker_manifest *mf, const dcast_range_digest *d, uint32_t i);

/* Set up `next` for version v folded onto a state whose digests are `prev`
 * (after the version before v; ignored for an anchor): every range of v's
 * COMMIT checked against mf, its starting value taken from prev where prev
 * has the same range, else computed whole at the end.  Errors:
 * DCAST_EDIGEST (a range outside the manifest: named), DCAST_ENOMEM
 * (nothing left allocated). */
int fold_check_begin(struct fold_digests *next, const struct fold_digests *prev,
		     const struct broker_version *v, const struct broker_manifest *mf);

/* d (empty) as the digests v's COMMIT claims for each of its ranges,
 * taken as the state's: a fold that applied v unchecked starts a check
 * of the next version from them (folddelta.c), and that check fails
 * unless the state's digests are the claimed ones.  Errors: those of
 * fold_check_begin. */
int fold_digests_claimed(struct fold_digests *d, const struct broker_version *v,
			 const struct broker_manifest *mf);

/* Before the chunk c (payload, elements [c->start, +c->count) of its
 * tensor at `range` in the state) is applied: move every range it
 * overlaps by its changes.  Errors: the codec's (a payload that does not
 * decode: dcast_ldigest_payload); the digests are then unusable. */
int fold_check_chunk(struct fold_digests *next, const dcast_chunk *c, const void *payload,
		     const void *range);

/* The version is in the state st: compute the ranges due whole (read
 * one bounded range at a time, fold_state_digest), then compare every
 * range with the COMMIT's digest.  Errors: DCAST_EDIGEST naming the first
 * range that differs; fold_state_digest's (DCAST_EIO reading a file state). */
int fold_check_end(struct fold_digests *next, struct fold_state *st);

/* Free the arrays; d is left empty.  Safe on an empty one. */
void fold_digests_free(struct fold_digests *d);

#endif
