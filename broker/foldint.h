/* Private to broker/fold.c, folddelta.c and foldmade.c: the per-model fold
 * (made anchors, the kept chain, made deltas) and the helpers both use. */
#ifndef DCAST_BROKER_FOLDINT_H
#define DCAST_BROKER_FOLDINT_H

#include "broker.h"
#include "foldcheck.h"
#include "foldstate.h"

#define FOLD_QUEUE 4096              /* committed versions waiting per model */
#define FOLD_VERSIONS_PER_TURN 16
#define FOLD_STEP_BYTES (16u << 20)  /* anchor-cut work per loop turn: ~10 ms */
#define FOLD_FRACTION_MAX 1000.0

/* Where made chunks' payloads go: with --data-dir a spill file there,
 * else (dir NULL, or after a failed write) the heap. */
struct fold_spill {
	const char *dir;
	struct broker_segfile *file; /* reference, NULL until the first chunk */
	uint64_t end;
};

struct fold_cut {
	struct broker_version *src; /* V as committed (reference): its digests */
	struct broker_version *v;   /* the anchor being built (reference) */
	struct fold_spill sp;
	uint32_t next_digest, next_chunk;
	uint32_t tensor;            /* next range: tensor, first element */
	uint64_t start;
	uint64_t t0_ns;
};

/* A producer's anchor W made into a delta for the consumers that hold V,
 * the log's newest version when W came: the log as it was (its anchor,
 * then deltas up to V) folded into a state of its own (unchecked), then
 * each of W's dense chunks encoded against it, checked and applied as a
 * consumer would, W's digests reached from V's claimed ones; the delta
 * joins the kept chain after V (broker_fold_next).  Consumers at V wait
 * for it (broker_fold_holds). */
struct fold_diff {
	struct broker_version *w;   /* the producer's anchor (reference); NULL: none */
	int started;                /* w is committed: the work runs, V is held */
	uint64_t base;              /* V */
	struct broker_version **src; /* the log when w came (references) */
	uint32_t n_src, folded;
	struct broker_version *v;   /* the delta being made (reference) */
	struct fold_state st;
	struct fold_digests dg, next; /* V's as its COMMIT claims; W's, moved by each made chunk */
	struct fold_spill sp;
	uint32_t next_chunk;        /* of w */
	int checking;               /* the log is folded: W's chunks go in, checked */
	uint8_t *buf;               /* a chunk's payload, encoded */
	size_t buf_cap;
	uint64_t t0_ns;
};

struct broker_fold {
	int make_deltas;            /* producer anchors become deltas (no --no-anchor-deltas) */
	struct fold_diff diff;
	struct fold_state st;       /* st.mf set: a state is held (its manifest) */
	uint64_t version;           /* of the state; NONE: unusable until an anchor */
	struct fold_digests dg;     /* the state's digests per COMMIT range of `version` */
	uint64_t delta_bytes, deltas; /* folded since the log's anchor */
	/* With no state (between cuts): deltas committed since the log's
	 * anchor, counted only, and the model's dense size. */
	uint64_t pend_bytes, pend_deltas, model_bytes;
	int broken;                 /* the last state failed: none until an anchor */
	struct broker_version *queue[FOLD_QUEUE];
	uint32_t q_head, q_n;
	struct fold_cut cut;        /* cut.v set: a cut is under way */
	struct broker_version **old; /* the chains made anchors replaced, joined */
	uint32_t n_old, cap_old;
	uint64_t old_bytes;
};

/* Wake the loop for fold work (the eventfd; a no-op with folding off). */
void fold_signal(const struct broker *b);

/* Fold v's chunks into the state st, checked against v's digests; *dg,
 * the digests of st before, become v's.  Errors: the chunks' decode and
 * range checks, the state's reads and writes, DCAST_EDIGEST. */
int fold_checked(struct fold_state *st, struct fold_digests *dg, const struct broker_version *v);

/* Fold v's chunks into the state st unchecked (each chunk's decode and
 * range still are): a made delta checks the result once, at the end.
 * Errors: as fold_checked's but DCAST_EDIGEST. */
int fold_applied(struct fold_state *st, const struct broker_version *v);

/* A made version (one reference) of `version` on `base` (NONE: an
 * anchor) with mf's tensors: room for n chunks, each set empty (none
 * counted yet), and a copy of src's digests.  NULL on no memory. */
struct broker_version *fold_made_version(uint64_t version, uint64_t base,
					 struct broker_manifest *mf, uint32_t n,
					 const struct broker_version *src);

/* A made chunk's payload (of `what` version): into the spill file with
 * --data-dir, else a frame of its own; a failed spill write leaves the
 * rest of the version in memory (logged).  Errors: DCAST_ENOMEM. */
int fold_made_payload(const char *model, const char *what, uint64_t version, struct fold_spill *sp,
		      struct broker_chunk *ch, const uint8_t *data, uint64_t bytes);

/* Encode msg into out (initialised, empty or not); out is empty on error. */
int fold_frame_encode(const dcast_msg *msg, zmq_msg_t *out);

/* The header of a stored chunk (the log keeps encoded frames) into *c,
 * checked: a CHUNK whose range fits mf.  Errors: the decoder's,
 * DCAST_ECORRUPT (another message), dcast_chunk_fits' (named "fold:
 * stored ..."). */
int fold_stored_chunk(const struct broker_chunk *ch, const struct broker_manifest *mf, dcast_chunk *c);

/* Does the kept chain end at the log's anchor, so that the log's versions
 * continue it (as after a made anchor)?  Else a producer anchor came
 * between, and a chain kept from now starts afresh. */
int fold_old_continues(const struct broker_fold *f, const struct broker_model *m);

/* The kept chain (broker_fold_next): drop it; room for n more; keep v
 * (a reference handed over), or drop it when it does not continue the
 * chain's one run of deltas. */
void fold_old_free(struct broker_fold *f);
void fold_old_reserve(struct broker_fold *f, uint32_t n);
void fold_old_keep(void *arg, struct broker_version *v);

/* folddelta.c: v is committed (the armed delta starts, or goes); a
 * bounded share of the work (1 while some remains); drop it all. */
void fold_diff_committed(struct broker *b, struct broker_model *m, struct broker_fold *f,
			 struct broker_version *v);
int fold_diff_turn(struct broker *b, struct broker_model *m, struct broker_fold *f);
void fold_diff_drop(struct broker_fold *f);

#endif
