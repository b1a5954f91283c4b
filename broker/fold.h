/* Private to broker/: broker-made anchors (fold.c).  Per model the broker
 * counts committed deltas; past --anchor-fraction / --anchor-every it folds
 * the log's chain (anchor, then every delta with the CPU codec) into a
 * state (foldstate.h: in the heap, or with --data-dir in a file there), each version checked against its own COMMIT digests
 * (foldcheck.h: a bad one is poisoned, broker_version_poison, and nothing
 * from it on is folded), cuts a dense anchor of the newest folded version V,
 * checks it against the producer's digests for V, puts it at the head of
 * the log in place of everything up to V, and frees the state.  docs/operations.md, "Broker-made anchors". */
#ifndef DCAST_BROKER_FOLD_H
#define DCAST_BROKER_FOLD_H

#include "broker.h"

/* Range of one made-anchor CHUNK, in elements. */
#define BROKER_FOLD_RANGE_ELEMS (1u << 20)

/* Parse and check --anchor-fraction (a decimal in [0, 1000]; 0 = off).
 * Errors: DCAST_EINVAL naming the flag and value. */
int broker_fold_config_check(const struct broker_config *cfg);

/* Start folding when either trigger is on: an eventfd in the poll set that
 * runs the bounded fold / cut steps after the commit that queued them, and
 * the state of every model restored from --data-dir folded from its log.
 * No-op with both triggers off.  Errors: DCAST_EIO (eventfd), poll-set
 * errors, DCAST_ENOMEM. */
int broker_fold_open(struct broker *b);

/* Close the work eventfd (the models' fold states go with the models).
 * Safe when folding was off or open failed. */
void broker_fold_close(struct broker *b);

/* Queue a committed version for folding (takes a reference of its own);
 * the work runs on a later loop turn, after the version is in the log and
 * acknowledged.  Never fails: a version that cannot be queued stops
 * folding for the model until its next producer anchor (logged). */
void broker_fold_committed(struct broker *b, struct broker_model *m, struct broker_version *v);

/* Before the producer's anchor w enters the log in place of it: when
 * consumers hold a version of the log and w has the same tensors, keep
 * the log aside, so that once w is committed the broker makes from it a
 * delta on the log's newest version V (a state folded from the log, each
 * range of w encoded against it, checked against w's digests) for the
 * consumers at V (broker_fold_next).  Needs folding on and no
 * --no-anchor-deltas; a failure only sends w whole (logged). */
void broker_fold_anchor_coming(struct broker *b, struct broker_model *m, struct broker_version *w);

/* For the fan-out: 1 while a delta is being made for consumers at `have`
 * (they wait for it rather than take the anchor). */
int broker_fold_holds(const struct broker_model *m, uint64_t have);

/* 1 when the model's producer anchors are made into deltas: an open
 * anchor is then not cut through to consumers at the newest version. */
int broker_fold_makes_deltas(const struct broker_model *m);

/* For the fan-out: the version to stream after `have` when `have` is no
 * longer in the log because a made anchor superseded it, from the chain
 * the made anchor replaced (kept while a connected consumer is on it), so
 * that a lagging consumer goes on with deltas.  NULL when not there. */
struct broker_version *broker_fold_next(const struct broker_model *m, uint64_t have);

/* Bytes of fold state held in the heap now, all models, made deltas'
 * states included (0 between cuts; with --data-dir only the range
 * buffers). */
uint64_t broker_fold_state_bytes(const struct broker *b);

/* Free the model's fold state (state copy, queue, cut, kept chain). */
void broker_fold_free(struct broker_model *m);

#endif
