/* The consumer's store: its local checkpoint in DIR, which it alone owns.
 * DIR/model.safetensors (the newest folded anchor), the record log
 * DIR/model.dlog/<version>.rec (one file per version staged after it,
 * written behind), an anchor received in place written straight to
 * DIR/model.safetensors.new, the sync thread that makes committed record
 * files durable, and folds.  Its fields are its own (struct cs_store,
 * private to consumer/store/); the consumer reaches it only through this
 * header, and it reaches back only through the replay sink the consumer
 * gives it at open.  Every call is made with the consumer's `lock` held
 * unless it says otherwise: the calls on a `cs_store *` alone need nothing
 * of the consumer and take no lock of it.
 *
 * Locks, in the one order they are taken (never the other way):
 *   1. the consumer's `lock` (c->lock): the tensors, the staged versions,
 *      the session's fields.  The store takes it only as a caller hands it
 *      over, where it reads the live tensors or calls the sink, and names
 *      it nowhere.  Its fold thread takes it (handed at
 *      cs_store_fold_start) and lets go of it only while a fold runs from
 *      the disk (cs_fold_run: the job's copies, the paths fixed at open,
 *      the atomic `stop` and `gen` alone) and while an anchor's seal syncs
 *      (cs_anchor_new_seal), taking it back before it touches the tensors;
 *      a caller waiting for the fold thread lets go of it in the wait
 *      (cs_store_fold_wait).
 *   2. the store's own mutex (struct cs_store's `mu`, store_impl.h): every
 *      field of struct cs_store but the paths and the sink (fixed at open)
 *      and the atomics; taken inside the store's calls, held only around
 *      its fields, its write-behind queue and that queue's I/O, never
 *      while calling the sink (but `written`, which takes no lock) or
 *      another store call that takes it.  Asserted: it is never taken
 *      twice, and the consumer's `lock` is never taken by the store while
 *      its thread holds it (cs_store_handed_lock); the fold's helpers that
 *      need it held check it in the debug tier (DCAST_DEBUG_ASSERT, make
 *      test SAN=1), and tests/test_consumer_store.sh fails on a function
 *      that reaches its fields without taking it, asserting it, or being
 *      called only by functions that do.
 *   3. the sync thread's mutex (cs_syncer.mu, syncer.c): innermost; held
 *      only around its queue, never while calling out of syncer.c.
 * The consumer's `mu` (wait_version) is taken inside `lock` and never with
 * the store's mutex held (the sink's `holds` takes it; the store calls it
 * without its mutex).  The sink's calls come back into the consumer with
 * `lock` held as the store held it; only `holds` takes a lock of its own. */
#ifndef DCAST_CONSUMER_STORE_H
#define DCAST_CONSUMER_STORE_H

#include "consumer_impl.h"

/* The store's own fields (store/store_impl.h), guarded by its own mutex;
 * the calls that need nothing of the consumer take it alone, and need no
 * lock of the consumer's. */
typedef struct cs_store cs_store;

/* What the store reports to the consumer.  Where it replays a record
 * file, one message at a time, in the order written: the consumer's
 * version state machine (intake.c).
 * manifest: a MANIFEST record (an anchor's), as from the wire.  holds:
 * the tensors hold `version` now (the anchor file's, loaded; the version
 * a replay reached; NONE while a restore rebuilds them).  chunk: a
 * CHUNK record h at file_off of v's file, its payload summing to sum
 * (unread: checked when applied).  commit: the COMMIT record m that closes
 * v; v must be READY after it.  apply: v, READY, applied to the tensors;
 * at_load 1 when opening (a version that tears them is the consumer's to
 * recover: cs_ckpt_recover), 0 for a restore.  Each returns 0 or an error,
 * which cuts the file (at load) or fails the restore.  written: a chunk
 * record of `version` written behind is done (failed 1: it could not be
 * written, and that version must never be READY); `credit` bytes of the
 * staging pool are free again (called with the store's mutex held: it
 * takes no lock).  failed: the fold thread failed with err
 * (dcast_last_error() says why), `lock` held: for the consumer's next
 * poll().  durable: called before the store makes state of its own
 * durable (a record file's sync, an anchor file's seal, a fold), from any
 * of its threads, with or without `lock`, never with the store's mutex:
 * what must be on the disk before that state (the run file: cs_run_durable),
 * synced; an error (its detail set) keeps that state from being made
 * durable; it takes no lock but its own, innermost. */
typedef struct cs_store_sink {
	int (*manifest)(dcast_consumer *c, const dcast_manifest *m);
	void (*holds)(dcast_consumer *c, uint64_t version);
	int (*chunk)(dcast_consumer *c, cs_version *v, const dcast_chunk *h, uint64_t sum, uint64_t file_off);
	int (*commit)(dcast_consumer *c, cs_version *v, dcast_commit *m);
	int (*apply)(dcast_consumer *c, cs_version *v, int at_load);
	void (*written)(dcast_consumer *c, uint64_t version, uint64_t credit, int failed);
	void (*failed)(dcast_consumer *c, int err);
	int (*durable)(dcast_consumer *c);
} cs_store_sink;

/* ---- its life ---- */
/* Open c->store for c->dir (model.dlog made when missing), its sync
 * thread and its write-behind queue; `sink` (kept, not copied: static)
 * takes what it replays and reports.  Errors: DCAST_ENOMEM, DCAST_EIO (mkdir).  On an
 * error c->store may be left set: cs_store_close frees it. */
int cs_store_open(dcast_consumer *c, const cs_store_sink *sink);
/* Load the checkpoint at open; when it gives no version (none there, or
 * an error), no tensor table is left either.  Errors: DCAST_ESTATE
 * (another model's files), the damage the open drops (DCAST_ECORRUPT also
 * for a model.dlog that is not a directory: cs_ckpt_discard makes it one
 * again), I/O. */
int cs_ckpt_load(dcast_consumer *c);
/* At close, with no session thread and no fold thread left (cs_store_fold_stop): the records written behind
 * waited for, an anchor applied sealed, the fold the policy owes (fold
 * owed) done, every committed record synced, and c->store freed.  Failures
 * are logged.  NULL-safe (c->store NULL: nothing). */
void cs_store_close(dcast_consumer *c, int fold_owed);

/* ---- a version's file, written behind ----
 * A staged version's file is its record file (DIR/model.dlog/<version>.rec),
 * or, for an anchor received in place into a model with no tiled tensor
 * (v->direct), DIR/model.safetensors.new at its final offsets (no record
 * file, no fold of it later).  cs_store_version_create: make it (a record
 * file with its FILE and, for an anchor, MANIFEST records; the .new file
 * at its full size, any other anchor in place dropped).
 * cs_store_version_commit, after its chunks: a record file's COMMIT
 * record, queued for fdatasync; the .new file's header, with the file
 * digest of the tensors, which hold the anchor whole, while its chunks'
 * writes still run (the file is the store's from then on; its seal waits
 * for them).  cs_store_version_drop (v dropped): every record write
 * waited for, so that none still reads its slots or file (an anchor's own
 * file's writes before its COMMIT too, those still waiting for a slot
 * dropped when the file goes; past it they read neither), and with
 * unlink_file its file removed (the .new one forgotten, once its writes
 * are done).  Errors: DCAST_EIO (also a chunk record that failed),
 * DCAST_ENOMEM. */
int cs_store_version_create(dcast_consumer *c, cs_version *v);
int cs_store_version_commit(dcast_consumer *c, cs_version *v);
void cs_store_version_drop(dcast_consumer *c, const cs_version *v, int unlink_file);
/* Write chunk k's record behind: a small one (payload up to 64 KiB) is
 * copied into a combined write, and the caller's payload and held message
 * are free at return (held is left to the caller); a larger payload (in
 * the pool) stays valid until the write is done, or held, the message
 * payload is the data of, is moved into the queue and closed then.  k's
 * payload bytes go back to the broker as credit once written (for a
 * version received in place, whose payload is the tensor's range, the
 * caller gives it back at once).  On an error nothing was taken: the
 * payload, held and the credit are the caller's.  *payload_off: where the
 * payload lands in v's file. */
int cs_ckpt_chunk_submit(dcast_consumer *c, cs_version *v, const dcast_chunk *k, zmq_msg_t *held,
			 const void *payload, uint64_t payload_sum, uint64_t *payload_off);
/* Chunk k of v, an anchor written straight to its file (v->direct; for
 * any other version nothing), landed in its tensor at payload: the file
 * digest's blocks it holds whole are hashed for the COMMIT's header, from
 * `landed` (the hashes taken as it was read there, kernels/dcast_landing.h)
 * or, NULL, from payload now, while its bytes may still be in cache.
 * Nothing fails. */
struct dcast_landing;
void cs_ckpt_chunk_landed(dcast_consumer *c, const cs_version *v, const dcast_chunk *k, const void *payload,
			  const struct dcast_landing *landed);
/* Wait for every chunk record written behind, keeping a failure for the
 * next cs_ckpt_progress. */
void cs_ckpt_settle(dcast_consumer *c);
/* Wait for the record writes alone (each reads a version's slot or held
 * message, and writes its record file), leaving an anchor's own file's
 * writes from the tensors running: what drops a version's slots or file
 * calls it first.  A failure is kept as cs_ckpt_settle's. */
void cs_ckpt_settle_log(dcast_consumer *c);
/* Wait until no write of an anchor's own file (received in place, written
 * behind from the tensors) is queued or under way, leaving the record
 * writes of other versions running: whatever changes or frees the
 * tensors calls it first. */
void cs_ckpt_settle_direct(dcast_consumer *c);
/* The same for an anchor's own file being dropped: its ranges still
 * waiting for a slot are never written (they would read the tensors at
 * the disk's pace, for a file that goes), those under way are waited
 * for, and the file is marked as lost, so that nothing seals it. */
void cs_ckpt_forget_direct(dcast_consumer *c);
/* Reap the writes already done (their credit goes back), without waiting;
 * the first failure since the last report, else 0. */
int cs_ckpt_progress(dcast_consumer *c);
/* How soon the session thread's next turn must come for the writes
 * behind (records and anchor ranges queued or under way), so that their
 * completions are reaped as they come: -1, no bound (none under way; or
 * *fd, the I/O ring's, polls readable when one finishes); 0, at once (the
 * engine has completions to hand back or a write to push,
 * dcast_io_has_work, or ranges wait for slots none of which is busy);
 * 1 ms (writes under way and no fd to wake on: the engine without
 * io_uring).  *fd: the ring's fd while writes are under
 * way, else -1; owned by the engine.  Needs no lock of the consumer's. */
int cs_ckpt_wait_hint(dcast_consumer *c, int *fd);
/* Is a write of an anchor's own file (model.safetensors.new, read from
 * the tensors) queued or under way?  Needs no lock of the consumer's. */
int cs_ckpt_direct_pending(cs_store *s);
/* Chunk k's payload from v's record file into dst (pool memory).  Errors:
 * DCAST_EIO, DCAST_ETRUNCATED. */
int cs_ckpt_read_payload(dcast_consumer *c, const cs_version *v, const cs_chunk *k, void *dst);
/* A failed background fdatasync since the last call (set as the last
 * error), else 0.  Needs no lock of the consumer's. */
int cs_store_error(cs_store *s);

/* ---- an anchor received in place, applied: its seal ----
 * cs_anchor_new_seal (`release`: the lock the caller holds, let go while
 * the file syncs, the fold thread's; NULL: held on, at close, restore and
 * checkpoint) fdatasyncs DIR/model.safetensors.applied and renames it over
 * model.safetensors, unless the files changed meanwhile; on failure the
 * file goes and the tensors are folded instead.  Errors: DCAST_EIO,
 * DCAST_ENOMEM. */
int cs_anchor_new_seal(dcast_consumer *c, pthread_mutex_t *release);

/* ---- what the consumer tells it ---- */
/* v was applied: a delta's record is one more to fold; an anchor written
 * in place is renamed to DIR/model.safetensors.applied (what a restart
 * may adopt).  1 when its seal is due (on the fold thread: cs_anchor_new_seal),
 * else 0. */
int cs_store_applied(dcast_consumer *c, const cs_version *v);
/* Its counters into st (log_write_bytes, log_write_ns, folds,
 * folds_from_tensors, folding).  Needs no lock of the consumer's. */
void cs_store_stats(cs_store *s, dcast_consumer_stats *st);

/* ---- folds ---- */
/* The fold policy: the record log since the last fold is over
 * fold_fraction of the model's bytes (an applied anchor always is), or
 * fold_every deltas were applied since. */
int cs_fold_wanted(const dcast_consumer *c);
/* Fold now, from the live tensors (O(model): at open and close, on
 * request, and for models with tiled tensors).  Errors: DCAST_EIO,
 * DCAST_ENOMEM, DCAST_ENODEVICE. */
int cs_ckpt_fold(dcast_consumer *c);
/* A fold from the disk, off `lock`.  cs_fold_plan: fill *j (mode NONE:
 * nothing to fold; LIVE: fold with cs_ckpt_fold instead, as there is no
 * tensor table or a fold stopped halfway punched the anchor file; DISK: cs_fold_run
 * without `lock`, then cs_fold_finish under it).  Errors: DCAST_ENOMEM,
 * DCAST_EIO (the log's directory), DCAST_ECORRUPT (no file holds the
 * applied version).  cs_fold_run: write DIR/model.safetensors.fold as
 * version j->version piece by piece, each piece's range punched out of
 * the anchor file once it is durable in the new one (the directory holds
 * about the model plus one piece, not two models), checked against the
 * target's digests (j->dig, else its COMMIT record's), abandoned
 * (DCAST_ESTATE) once *stop is set or the files moved on (cs_store_gen)
 * and the anchor file is not the one planned any more.  On error it is removed, unless the anchor file was punched already
 * and is still the checkpoint's: then it stays with its progress record,
 * for a fold from the tensors to replace both or the next open to finish
 * it (cs_fold_resume).  At nice 19 and best-effort I/O level 7 (but j->here:
 * at the caller's).  Errors: DCAST_EIO, DCAST_ENOMEM,
 * DCAST_ECORRUPT / DCAST_ECHECKSUM (a damaged record file), DCAST_EDIGEST
 * (the result is not the applied version), the codec's.  cs_fold_finish:
 * rename it over the anchor file and drop its progress record and the
 * record files it covers, unless the files moved since the plan
 * (cs_store_gen) and the anchor file was replaced (then it is removed and
 * 0 returned).  Errors: DCAST_EIO. */
enum { CS_FOLD_NONE, CS_FOLD_LIVE, CS_FOLD_DISK };
typedef struct cs_fold_job {
	dcast_consumer *c;             /* for its paths and model name (fixed at open) */
	int mode;
	uint64_t version, have, gen;   /* target, anchor file's version, cs_store_gen at the plan */
	cs_tensor *t;                  /* geometry of the tensors (no memory) */
	uint32_t n;
	cs_dcache dig;                 /* the target's COMMIT digests (a copy of c->dcache) */
	uint64_t *vers;                /* record files to replay, in order */
	uint32_t n_vers;
	uint64_t folded_bytes;         /* their bytes */
	const _Atomic int *stop;       /* set: the consumer is closing (cs_fold_run's) */
	uint64_t anchor_ino;           /* the anchor file's inode at the plan (0: not checked) */
	uint64_t resume_from, resume_seq; /* a fold resumed at open: its progress record's */
	uint64_t descs;                /* cs_descs_sum of t: the tensor table it folds */
	int here;                      /* on the caller's thread, at its priority, `lock` held */
} cs_fold_job;
int cs_fold_plan(dcast_consumer *c, cs_fold_job *j);
int cs_fold_run(cs_fold_job *j, const _Atomic int *stop);
int cs_fold_finish(dcast_consumer *c, cs_fold_job *j);
void cs_fold_job_free(cs_fold_job *j);
/* At open, before the anchor file loads: a fold from the disk that a dead
 * process left half done (DIR/model.safetensors.fold.state, its progress:
 * the anchor file's ranges below it already punched) is finished from the
 * record files, so that the anchor file is whole again; a progress record
 * that no longer describes the files (the fold renamed, the anchor file
 * replaced) is removed.  Errors: DCAST_ECORRUPT (a record file it needs is
 * missing or damaged: the checkpoint is dropped), DCAST_ESTATE (another
 * model's files), those of cs_fold_run. */
int cs_fold_resume(dcast_consumer *c);
/* Fold now, on the caller's thread with `lock` held (at open and close,
 * and a checkpoint asked for): from the disk, so that the directory stays
 * near one model, else (it cannot be, or fails) from the tensors
 * (cs_ckpt_fold).  Errors: cs_ckpt_fold's. */
int cs_store_fold_now(dcast_consumer *c);
/* The fold thread: the seal of an anchor written in place, then the fold
 * the policy asks for (if it still does: a checkpoint may have folded
 * first) from the disk, or from the live tensors when that cannot be or
 * fails while the files stayed as planned.  It holds the lock it is
 * handed, `held` (the consumer's `lock`, which the caller of
 * cs_store_fold_start holds), but while it syncs and folds from the disk,
 * so that the caller's thread (the session's) heartbeats meanwhile; a
 * failure goes to the sink's `failed`.
 * cs_store_fold_start: start it (0), or, where no thread can be made,
 * fold from the tensors here (its error); nothing while one runs or the
 * store is closing.  cs_store_folding (no lock of the consumer's needed):
 * join one that is done; 1 while one runs.  cs_store_fold_wait: wait until none runs, `held` (the
 * consumer's `lock`, which the caller holds) let go meanwhile: a restore
 * or a checkpoint reads the files it writes.  cs_store_fold_stop: at
 * close, without `lock` (which it may need to end): one running is
 * abandoned (its work from the disk) and joined, and none starts after.
 * NULL-safe. */
int cs_store_fold_start(dcast_consumer *c, pthread_mutex_t *held);
int cs_store_folding(cs_store *s);
void cs_store_fold_wait(cs_store *s, pthread_mutex_t *held);
void cs_store_fold_stop(cs_store *s);
/* The generation of the files: it moves whenever they change (a fold, a
 * discard, a seal), so that work planned before is dropped, not renamed
 * over them.  Any thread. */
uint64_t cs_store_gen(const cs_store *s);

/* ---- recovery ---- */
/* Rebuild the applied version in the tensors from the files: the anchor
 * file, then the record files up to it, replayed into the sink.  Errors:
 * DCAST_ECORRUPT (it was not reached), those of the load and the sink. */
int cs_ckpt_restore(dcast_consumer *c);
/* Remove the anchor file and every record file (they could not rebuild
 * the applied version), and make model.dlog an empty directory if it is
 * not one; the next anchor applied is folded afresh. */
void cs_ckpt_discard(dcast_consumer *c);

#endif
