/* Private to consumer/store/: the store's own fields and the calls its
 * files make on each other.  From the top: ckpt_load.c (load, replay into
 * the sink, restore, discard); store.c (open, close, the fold thread);
 * anchor_new.c (an anchor received in place, once applied: its seal);
 * fold.c (folds from the disk); anchor.c (the anchor file, one received
 * in place made and given its header, the fold policy, a fold from the
 * tensors); ckpt.c (the record log, written behind; the store's mutex);
 * syncer.c (the sync thread). */
#ifndef DCAST_CONSUMER_STORE_IMPL_H
#define DCAST_CONSUMER_STORE_IMPL_H

#include "store.h"

/* The record log's background fdatasync (syncer.c): a queue of duplicated
 * record-file descriptors, one per committed version, synced in order. */
#define CS_SYNC_QUEUE 64
typedef struct cs_syncer {
	dcast_consumer *c;             /* whose sink's `durable` goes first */
	pthread_mutex_t mu;
	pthread_cond_t cv;             /* work queued, work done, or stop */
	pthread_t th;
	int inited, started, stop;
	int fds[CS_SYNC_QUEUE];
	uint64_t vers[CS_SYNC_QUEUE];
	uint32_t head, n;
	_Atomic uint64_t synced;       /* newest version the disk has, or NONE */
	int err;                       /* a failed fdatasync, for the next poll() */
	char err_text[256];
} cs_syncer;

/* The store (c->store): anchor file, record log, their threads.  `mu`
 * guards every field below it but the atomics (`gen`, `stop`: read
 * anywhere, `gen` moved under `mu`); `sink` and the paths are fixed at
 * open.  The order of the locks is in store.h. */
/* An anchor in place's 1 MiB digest blocks (DCAST_DIGEST_BLOCK_BYTES)
 * that a chunk holds whole, hashed as the chunk lands, while its bytes are
 * in cache (ckpt.c): the file digest at its COMMIT hashes only the others
 * (anchor.c).  Tensor t's blocks are hash[block[t] .. block[t + 1]),
 * have[] says which are hashed.  hash NULL: none kept (they could not be
 * allocated), the COMMIT hashes every block. */
typedef struct cs_landed {
	uint64_t *hash, *block;
	uint8_t *have;
} cs_landed;

struct cs_store {
	const cs_store_sink *sink;     /* what a replay feeds (cs_store_open) */
	char *anchor_path, *log_dir;
	pthread_mutex_t mu;            /* the store's own lock: cs_store_lock */
	uint64_t anchor_file_version;  /* version in model.safetensors, or NONE */
	uint64_t log_since_fold;       /* record-log bytes written since the last fold */
	uint32_t deltas_since_fold;
	_Atomic uint64_t gen;          /* moves whenever the files change (a fold, a discard,
					* a seal): a fold from the disk planned before is
					* abandoned, never renamed over them (fold.c) */
	uint64_t folds;                /* folds done since open */
	uint64_t folds_live;           /* of them, from the live tensors under `lock` (cs_ckpt_fold) */
	struct cs_wb *wb;              /* chunk records written behind (ckpt.c) */
	cs_syncer syncer;              /* makes committed record files durable */
	uint64_t log_write_bytes, log_write_ns;
	uint64_t direct_write_bytes;   /* of them, written with O_DIRECT (an anchor in place) */
	/* An anchor written straight to model.safetensors.new (anchor_new.c):
	 * each tensor's offset there while it streams in; once applied, its
	 * version until the fold thread seals it (fdatasync, rename).
	 * new_version NONE: none to seal. */
	uint64_t *new_offs;
	uint64_t new_version;
	cs_landed new_landed;          /* its digest blocks hashed as they landed */
	/* From its COMMIT on, the file's descriptor and the I/O engine's handle
	 * are the store's (the version goes at its apply, its writes may still
	 * run: ckpt.c writes behind); released once every write to it is done
	 * (cs_anchor_new_release).  new_write_lost: one of them failed, so
	 * the file is never sealed; new_write_why: the first such failure
	 * after its COMMIT ("" before), which the seal reports (ckpt.c,
	 * direct_lost). */
	int new_fd, new_file, new_write_lost;
	unsigned char *new_header;     /* its header, written behind from here (anchor.c, new_commit);
					* freed with the descriptor (cs_anchor_new_release) */
	char new_write_why[256];
	pthread_cond_t direct_cv;      /* a write of it done (waited on with `mu`) */
	/* The fold thread (store.c): holds `lock` but while it syncs or folds
	 * from the disk; joined by the next cs_store_folding or at close. */
	pthread_t fold_thread;
	int fold_running, fold_joinable;
	pthread_cond_t fold_cv;        /* fold_running went to 0 (waited on with `mu`) */
	pthread_mutex_t *fold_lock;    /* the consumer's `lock`, handed at cs_store_fold_start:
					* the fold thread's but while it syncs or folds from the disk */
	_Atomic int stop;              /* closing: a fold running is abandoned, none starts */
};

/* ckpt.c: the store's mutex, s->mu.  cs_store_lock takes it (asserted:
 * never while this thread holds it already), cs_store_unlock lets go of
 * it, cs_store_wait waits on cv with it, cs_store_held: does this thread
 * hold it (what DCAST_DEBUG_ASSERT checks in the helpers that need it)?
 * What the store calls with it held takes no lock (the sink's `written`,
 * the I/O engine) but the sync thread's. */
void cs_store_lock(cs_store *s);
void cs_store_unlock(cs_store *s);
void cs_store_wait(cs_store *s, pthread_cond_t *cv);
int cs_store_held(const cs_store *s);
/* ckpt.c: take the consumer's `lock`, handed over to the store (its fold
 * thread, a wait for it, a seal), asserting that this thread holds no
 * store's mutex: the order of store.h, never the other way. */
void cs_store_handed_lock(pthread_mutex_t *lock);
/* ckpt.c: wait, holding neither the consumer's `lock` nor the store's
 * mutex, until no write of an anchor's own file is queued or under way.
 * It reaps nothing: whoever holds `lock` does (the session thread's
 * turns come as each write finishes, the I/O ring's fd in its poll set,
 * cs_ckpt_wait_hint; and they call into the consumer's state); so it
 * returns 1, early, once the store stops
 * (closing: no session thread; cs_store_close's seal waits itself).
 * It sleeps until cs_ckpt_direct_wake, with no timeout. */
int cs_ckpt_await_direct(dcast_consumer *c);
/* ckpt.c: wake cs_ckpt_await_direct's waiters to look again, the store's
 * mutex held: whoever ends a write of an anchor's own file, drops the
 * ranges still waiting, closes the write queue, or sets `stop` calls it. */
void cs_ckpt_direct_wake(cs_store *s);

/* syncer.c */
/* Start c's sync thread.  Errors: DCAST_ENOMEM (no thread: push syncs
 * inline then). */
int cs_syncer_open(cs_syncer *s, dcast_consumer *c);
/* Queue record file `fd` (duplicated; the caller keeps its own) of
 * `version` for fdatasync, the sink's `durable` called first; waits while CS_SYNC_QUEUE files are pending.
 * Errors: DCAST_EIO only when it had to sync inline and that failed. */
int cs_syncer_push(cs_syncer *s, int fd, uint64_t version);
/* A failed background fdatasync since the last call (set as the last
 * error), else 0. */
int cs_syncer_error(cs_syncer *s);
/* Sync everything queued, stop the thread.  Safe on a zeroed syncer. */
void cs_syncer_close(cs_syncer *s);

/* ckpt.c: record files "DIR/model.dlog/<version>.rec", each: chunk
 * records then one commit record; see ckpt.c for the layout.
 * cs_ckpt_version_create: v's record file with its FILE and, for an
 * anchor, MANIFEST records.  cs_ckpt_commit_write: v's COMMIT record,
 * after its chunk records; queued for fdatasync.  cs_ckpt_remove: the
 * record file of `version` removed.  Errors: DCAST_EIO (also a chunk
 * record that failed), DCAST_ENOMEM. */
int cs_ckpt_version_create(dcast_consumer *c, cs_version *v);
int cs_ckpt_commit_write(dcast_consumer *c, cs_version *v);
void cs_ckpt_remove(dcast_consumer *c, uint64_t version);
/* v's file, open as v->fd at `path`, bound to the I/O engine (v->io,
 * v->io_file).  Errors: those of dcast_io_file_add, naming path. */
int cs_ckpt_io_attach(dcast_consumer *c, cs_version *v, const char *path);
/* Wait for every chunk record written behind; the first failure since the
 * last call (its version is marked write_failed), else 0. */
int cs_ckpt_flush(dcast_consumer *c);
/* Bytes [off, off + len) of v's own file (an anchor in place, v->direct)
 * written behind from src, as its chunks' ranges are: src stays valid
 * until every write of the file is done (cs_anchor_new_release); a
 * failure marks the file, which is then never sealed (direct_lost).
 * Takes the store's mutex.  Errors: DCAST_EIO (nothing went). */
int cs_ckpt_direct_bytes(dcast_consumer *c, const cs_version *v, const void *src, uint64_t off, uint64_t len);
int cs_ckpt_wb_open(dcast_consumer *c);
void cs_ckpt_wb_close(dcast_consumer *c);
void cs_ckpt_version_path(const dcast_consumer *c, uint64_t version, char *out, size_t cap);
int cs_ckpt_list(dcast_consumer *c, uint64_t *out, uint32_t cap, uint32_t *n);
int cs_io_read(dcast_consumer *c, int file, void *dst, uint64_t len, uint64_t off, const char *what);
#define CS_MAX_LOG_FILES 4096

/* anchor.c: DCAST_ESTATE, naming c->dir, the other model and what showed it: a
 * checkpoint directory of another model is neither served nor deleted. */
int cs_ckpt_foreign(const dcast_consumer *c, const char *what, const char *name);
/* anchor.c: the layout of model.safetensors for tensors t[0..n) as
 * version `version` with file digest `digest` (16 hex digits: the header's
 * size does not depend on it).  Errors: those of dcast_st_layout_compute. */
int cs_anchor_layout(const char *model, const cs_tensor *t, uint32_t n, uint64_t version, const char *digest,
		     dcast_st_layout *lay);
/* The file digest in model.safetensors' metadata, from each tensor's
 * dcast_digest td[i], into *out (anchor.c).  Errors: DCAST_ENOMEM. */
int cs_file_digest(const cs_tensor *t, uint32_t n, uint64_t version, const uint64_t *td, uint64_t *out);
/* XXH3-64 of n tensors' names, dtypes, shapes and grids, in order, and
 * of the data section's alignment (cs_anchor_layout): what a fold's
 * progress record holds of the layout it began with, so that a resumed
 * fold refuses an anchor file whose header changed since. */
uint64_t cs_descs_sum(const cs_tensor *t, uint32_t n);
/* anchor.c: DIR/model.safetensors through dcast_io and the pool.  Load it
 * into the tensors, its version into *version; DCAST_ESTATE before reading
 * them when it is another model's (cs_ckpt_foreign). */
int cs_anchor_load(dcast_consumer *c, uint64_t *version);
/* anchor.c: the anchor file's header only: its version into *version, and
 * the tensor table from it when none is known yet.  Errors: DCAST_ESTATE
 * (cs_ckpt_foreign), DCAST_ECORRUPT (no version), the header's. */
int cs_anchor_header_read(dcast_consumer *c, uint64_t *version);

/* anchor.c: the paths of a fold's file while it is written and of its
 * progress record (fold.c). */
void cs_fold_tmp_path(const dcast_consumer *c, char *out, size_t cap);
void cs_fold_state_path(const dcast_consumer *c, char *out, size_t cap);
/* anchor.c: once the anchor file is whole again (a fold from the tensors
 * renamed over it, a discard removed it, an open found them stale): a
 * fold's file and its progress record removed. */
void cs_fold_leftovers_drop(const dcast_consumer *c);
/* fold.c: after a rename over model.safetensors holding `version`: the
 * checkpoint's generation moves, its version and fold count, the folder
 * fsynced.  Errors: DCAST_EIO. */
int cs_fold_renamed(dcast_consumer *c, uint64_t version);
/* fold.c: the calling thread at nice 19 and best-effort I/O level 7
 * (background 1, its priority saved), or back (0): for the fold thread's
 * work without `lock` only, never while holding it. */
void cs_fold_priority(int background, int *saved);

/* anchor.c: an anchor received in place (see store.h,
 * cs_store_version_create) keeps each tensor's offset in the .new file in
 * new_offs for cs_ckpt_chunk_submit.  cs_anchor_new_path names the .new
 * file (applied 0) or the .applied one.  cs_anchor_new_drop removes both
 * and forgets the anchor, its file's writes still waiting for a slot
 * never written (cs_ckpt_forget_direct: the file is moot); whoever changes
 * the files while one is pending calls it.  cs_anchor_new_forget frees
 * what anchor.c keeps of it (its offsets, its block hashes), with the
 * store's mutex held or at close.  cs_anchor_new_release waits for the
 * writes (cs_ckpt_settle: all of them, so that none is left on the file
 * it takes from the I/O engine) and closes the descriptor and the engine's handle the store took at the
 * COMMIT (new_fd, new_file), and frees the header written behind from
 * new_header; the seal and cs_anchor_new_drop call it,
 * without the store's mutex.
 * anchor_new.c:
 * cs_anchor_new_applied, once apply() has checked it, renames it to
 * DIR/model.safetensors.applied and arms the seal (1: armed).
 * cs_anchor_new_adopt, at open before the anchor file loads, seals an
 * .applied file a dead process left (its digest is checked by the load
 * like any; another model's refuses the open, cs_ckpt_foreign, and stays);
 * a .new one (not applied, not checked) is removed and the anchor fetched
 * again.  cs_anchor_new_drop moves gen when one was armed.  Errors:
 * DCAST_EIO, DCAST_ENOMEM. */
void cs_anchor_new_path(const dcast_consumer *c, int applied, char *out, size_t cap);
void cs_anchor_new_drop(dcast_consumer *c);
void cs_anchor_new_release(dcast_consumer *c);
void cs_anchor_new_forget(struct cs_store *s);
int cs_anchor_new_applied(dcast_consumer *c, const cs_version *v);
int cs_anchor_new_adopt(dcast_consumer *c);

#endif
