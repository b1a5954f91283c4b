/* deltacast consumer: embedded in a rollout worker, it receives versions of
 * one model from a broker, stages them through a bounded pinned pool into a
 * local checkpoint, and applies each whole, checked version to the live
 * tensors in one short, transactional step.
 *
 * States: empty -> syncing -> ready(V) -> applied(V) (docs/protocol.md,
 * "Consumer and broker").  Live tensors are always exactly one committed
 * version: apply() either moves them to the next version completely or
 * leaves them as they were.
 *
 * Local checkpoint in `dir`: DIR/model.safetensors (the newest folded
 * anchor, loadable by any safetensors reader, metadata "deltacast.version")
 * and DIR/model.dlog/ (one record file per staged version after it).  On
 * open the consumer loads it, reaches the last complete version and joins
 * the broker with that have_version.
 *
 * Threads: each consumer runs its own thread, which owns the broker
 * connection: it answers heartbeats, grants credit, stages, checks and logs
 * versions, and folds the checkpoint, whether or not the caller calls in.
 * A rollout engine calls apply() at its own pause points, minutes apart if
 * it likes, and stays joined meanwhile; poll() only hands out events.
 * Every function is safe from any thread (they take the consumer's lock);
 * close() must not race with the others. */
#ifndef DELTACAST_CONSUMER_H
#define DELTACAST_CONSUMER_H

#include <stddef.h>
#include <stdint.h>
#include "deltacast/err.h"
#include "deltacast/schema.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dcast_consumer dcast_consumer;

/* Where a bound tensor lives (the same type as in producer.h, which
 * defines it when included first). */
#if !defined(DCAST_MEM_DEFINED)
#define DCAST_MEM_DEFINED
typedef enum dcast_mem {
	DCAST_MEM_HOST = 0,
	DCAST_MEM_CUDA = 1
} dcast_mem;
#endif

/* Options; dcast_consumer_opts_init() fills the defaults.  dcast_consumer_open
 * copies what it keeps (the strings too): opts may go after it returns. */
typedef struct dcast_consumer_opts {
	int verify_digests;          /* check COMMIT digests: 1 (default) moves the digests
					of the last checked version by the elements this one
					changes (O(changed), before apply where it can);
					ranges without a cached digest (anchors, after a
					restart) are computed whole; 2 computes every range
					whole after every apply (also catches changes made
					to bound tensors outside the consumer); 0 does not
					check */
	uint32_t heartbeat_ms;       /* 0: the broker's WELCOME value (default 0) */
	uint32_t fold_every;         /* also fold the log into a new anchor after this many
					applied deltas; 1 = after every version; 0 (the
					default): by fold_fraction alone */
	uint32_t max_staged;         /* versions staged ahead of apply before credit
					pauses (default 4) */
	const char *client;          /* HELLO.client, may be NULL */
	const char *curve_server_key; /* Z85 broker public key; NULL = no CURVE */
	const char *curve_public_key; /* Z85 own key pair; required with server key */
	const char *curve_secret_key;
	double fold_fraction;        /* fold once the record log written since the last fold
					exceeds this fraction of the model's bytes (default
					0.25; an applied anchor always does); 0: fold_every
					alone.  Folds run on the consumer's thread, never
					inside apply() */
	int auto_apply;              /* 1: the consumer's thread applies each version as soon
					as it is READY (for callers that let weights change at
					any moment, e.g. deltacast subscribe); 0 (default):
					only dcast_consumer_apply() changes the live tensors */
	uint32_t commit_timeout_ms;  /* a staged version whose COMMIT has not come this long
					after its last chunk (a broker with --cut-through
					sends an open version's chunks ahead) is dropped, and
					the consumer joins again, fetching it anew if it
					committed meanwhile; 0: DELTACAST_COMMIT_TIMEOUT_MS
					from the environment, else 60000 */
	int bulk;                    /* 1 (default): an anchor may come over a bulk TCP
					connection to the broker's host (HELLO x-bulk;
					docs/protocol.md, "Bulk anchors"), asked only over
					tcp:// without CURVE, and no more once a bulk
					transfer failed (the anchor then comes over
					ZeroMQ); DELTACAST_BULK=0 in the environment at
					open turns it off; 0: ZeroMQ only */
} dcast_consumer_opts;

/* Fill *o with the defaults above.  Never fails. */
DCAST_API void dcast_consumer_opts_init(dcast_consumer_opts *o);

/* Events returned by dcast_consumer_poll(). */
typedef enum dcast_event_type {
	DCAST_EV_NONE = 0,      /* timeout, nothing happened */
	DCAST_EV_VERSION_READY, /* version: staged, checked, committed; apply() may take it */
	DCAST_EV_ANCHOR,        /* version: an anchor started arriving (recovery point) */
	DCAST_EV_GAP,           /* have_version / version: a delta on a base we do not
				   have; staged versions dropped, re-joined */
	DCAST_EV_ERROR,         /* code, version, text: a version was refused (checksum,
				   range, broker ERROR); re-joined, live tensors untouched */
} dcast_event_type;

typedef struct dcast_event {
	int type;              /* dcast_event_type */
	uint64_t version;      /* the version concerned, or DCAST_VERSION_NONE */
	uint64_t have_version; /* GAP: the version we had */
	int code;              /* ERROR: dcast_err */
	uint64_t bytes;        /* VERSION_READY: payload bytes received for it */
	char text[256];        /* ERROR: what was wrong */
} dcast_event;

/* Per-version numbers, for the version last applied. */
typedef struct dcast_consumer_stats {
	uint64_t version;        /* NONE before the first apply */
	int anchor;              /* 1 if it was an anchor */
	uint64_t chunks;         /* chunks in it */
	uint64_t bytes;          /* payload bytes it carried */
	uint64_t stage_ns;       /* first chunk to READY */
	uint64_t apply_ns;       /* inside apply(): the pause a serving engine sees */
	uint64_t spilled_chunks; /* chunks that went through the on-disk log only */
	uint64_t total_bytes_received; /* payload bytes received since open */
	uint64_t peak_pool_bytes;      /* most staging pool bytes in use at once */
	uint64_t pool_bytes;           /* size of the staging pool */
	uint64_t log_write_bytes;      /* bytes written to the record log since open */
	uint64_t log_write_ns;         /* time spent writing them (syncs included) */
	uint64_t verify_bytes;         /* tensor bytes read to check the last version's
					  digests: old and new value of each changed element
					  (every element of a dense chunk), plus every byte
					  of a range computed whole (verify_digests 2, no
					  earlier version checked, device tensors not
					  checked ahead, old values not kept); 0 unverified */
	uint64_t rejoins;              /* HELLOs sent again since open: re-joins after a gap,
					  a refusal or a lost session, and reconnects */
	uint64_t folds;                /* folds of the local checkpoint since open, seals
					  of an anchor written straight to its file included */
	int folding;                   /* a fold is running now, on the consumer's fold
					  thread (apply() does not wait for it) */
	uint64_t folds_from_tensors;   /* of folds, those written from the live tensors
					  under the consumer's lock, where an apply() waits:
					  where a fold from the disk could not be or failed
					  (a damaged or missing record file); folds
					  otherwise read the disk alone */
	uint64_t ready_backlog;        /* READY versions not yet applied that apply() can
					  take now (the chain up to
					  dcast_consumer_ready_version()); apply() of the
					  newest takes them all in one call */
	uint64_t versions_aborted;     /* staged versions dropped on the broker's ERROR
					  DCAST_EABORTED (an open version it sent ahead and
					  then dropped, --cut-through) */
	uint64_t commit_timeouts;      /* staged versions dropped because their COMMIT did
					  not come within commit_timeout_ms */
	uint64_t bulk_versions;        /* anchors taken over a bulk TCP connection */
	uint64_t bulk_failures;        /* bulk transfers that failed (connect refused, cut
					  short, a bad frame): bulk is off after the first,
					  and the anchor came over ZeroMQ */
	uint64_t bulk_in_place_bytes;  /* anchor payload bytes a bulk connection read
					  straight into the tensors (an anchor taken in
					  place: no copy after the socket's) */
	uint64_t direct_write_bytes;   /* of log_write_bytes, those an anchor received in
					  place wrote to model.safetensors.new with O_DIRECT
					  (its whole pages; 0 where O_DIRECT is off or
					  refused: DELTACAST_DIRECT_IO=0, docs/operations.md) */
} dcast_consumer_stats;

/* Connect to the broker at `endpoint` (e.g. "tcp://127.0.0.1:5556") as a
 * consumer of `model`, with local checkpoint directory `dir` (created if
 * missing) and a staging budget: the pinned pool plus the credit the broker
 * may have in flight stay within staging_budget_bytes (at least 1 MiB; one
 * chunk payload must fit in a quarter of it).  The pool is mapped here and
 * faulted in, pinned (mlock) and registered with io_uring at its first
 * use: never, while the consumer only takes anchors in place.  Checking digests keeps 48
 * bytes per COMMIT digest range (the producer's range_elems, 2^20
 * elements by default) for the live version and for each version checked
 * ahead of apply.  Loads the checkpoint in dir
 * first.  opts NULL = defaults.  On success *out owns the consumer (close it
 * with dcast_consumer_close).  Errors: DCAST_EINVAL (argument, option
 * combination such as a CURVE server key without a key pair), DCAST_ENOMEM,
 * DCAST_EIO (dir, checkpoint), DCAST_ESTATE (dir holds another model's
 * checkpoint: model.safetensors or a record file names another model; the
 * files are left as they are), DCAST_EBUSY (another consumer, in this
 * process or another, has dir open: the detail names dir and its pid;
 * one consumer per directory, held by DIR/lock until close), DCAST_EZMQ.
 * A checkpoint that is damaged
 * (fails its checksums or digests) is not an error: it is logged and
 * dropped, and the consumer fetches an anchor (as is one that is
 * truncated, malformed or of a format this build does not read).  The
 * consumer's own host copies of the tensors are advised into transparent
 * huge pages, or out of them where DELTACAST_HUGE_PAGES=0 is in the
 * environment at open (docs/operations.md, "Huge pages").  On error *out is NULL. */
DCAST_API int dcast_consumer_open(const char *endpoint, const char *model, const char *dir,
			uint64_t staging_budget_bytes, const dcast_consumer_opts *opts,
			dcast_consumer **out);

/* Say BYE, release everything, set *c to NULL.  NULL-safe.  Bound tensors
 * stay with the caller, unchanged.  An anchor taken in place and applied
 * whose file is still being written is waited for and sealed first (the
 * disk's time for what is left of it); one READY and not applied is not
 * written further (the next open fetches it again). */
DCAST_API void dcast_consumer_close(dcast_consumer **c);

/* Make the caller's buffer `ptr` (bytes long, in `mem`) the live tensor
 * `name`.  The tensor must be known (manifest received or checkpoint loaded:
 * dcast_consumer_tensor_count() > 0) and bytes must equal its size.  Its
 * current contents (if a version is applied) are copied into ptr, and the
 * pages of the consumer's own host copy are given back to the kernel.  The caller keeps ownership of ptr and
 * must keep it valid until close or dcast_consumer_unbind.  A tiled tensor (desc.grid, from
 * producers that publish tensor-parallel slices) is bound as the slice
 * that covers all of it (dcast_consumer_bind_slice): ptr gets the natural
 * row-major layout and the host copy stays.  Errors: DCAST_ENOTFOUND
 * (name), DCAST_ESHAPE (size), DCAST_ENODEVICE (CUDA without a device),
 * DCAST_ESTATE (already bound, or slices of it are bound). */
DCAST_API int dcast_consumer_bind(dcast_consumer *c, const char *name, void *ptr, dcast_mem mem,
			uint64_t bytes);

/* Bind the caller's buffer `ptr` (bytes long, in `mem`) as a box of tensor
 * `name`: elements offset[d] <= x[d] < offset[d] + extent[d] of each of its
 * ndim dimensions (ndim must be the tensor's), row-major in the box, e.g.
 * the column block a tensor-parallel rank holds, whatever the producers'
 * own split.  The box's current contents are copied into ptr, and every
 * version applied from then on updates it in the same apply() (O(changed)
 * for deltas).  Several boxes of one tensor may be bound, overlapping or
 * not.  The consumer keeps the whole tensor in its host memory as well:
 * that copy is what it applies, verifies and checkpoints, so a slice costs
 * host memory for the whole tensor (docs/protocol.md, "Tiled tensors").
 * The caller keeps ownership of ptr and must keep it valid until close
 * or dcast_consumer_unbind.  Errors: DCAST_EINVAL (NULL argument, ndim 0, unknown mem),
 * DCAST_ENOTFOUND (name), DCAST_ESHAPE (ndim not the tensor's, a box
 * outside it, bytes not the box's size), DCAST_ENODEVICE (CUDA without a
 * device), DCAST_ESTATE (the tensor is bound whole by
 * dcast_consumer_bind()), DCAST_ENOMEM, DCAST_ECUDA. */
DCAST_API int dcast_consumer_bind_slice(dcast_consumer *c, const char *name, void *ptr, dcast_mem mem,
			      uint32_t ndim, const uint64_t *offset, const uint64_t *extent,
			      uint64_t bytes);

/* Drop the binding of tensor `name` (NULL: of every tensor bound), for an
 * engine that reloads its model into new storage: bind or bind_slice the
 * new memory afterwards, as a first bind (it is filled with the current
 * version).  A tensor bound whole goes back into the consumer's own host
 * copy: its current bytes are read from the bound memory, which must still
 * hold them, unchanged (unbind before freeing or reusing it; verify_digests
 * 2 notices a change at the next apply, 1 does not).  A tensor bound in slices
 * keeps its host copy, values and all; its slices are dropped.  From the
 * call on the consumer no longer touches the old memory; the caller owns
 * it as before.  Versions staged or READY stay; what was decoded and
 * checked ahead of apply against the old memory is forgotten and done
 * again at once against the consumer's host copies (O(changed)), and
 * again by a bind, which forgets it too.  An apply running on another thread finishes
 * first (the consumer's lock); call it between applies.  Errors:
 * DCAST_EINVAL (NULL consumer), DCAST_ENOTFOUND (name not in the
 * manifest), DCAST_ESTATE (name is not bound), DCAST_ECUDA (the bytes of
 * a tensor bound in device memory could not be copied back: nothing is
 * unbound). */
DCAST_API int dcast_consumer_unbind(dcast_consumer *c, const char *name);

/* Copy a box of live tensor `name` (as for dcast_consumer_bind_slice; ndim
 * 0 with NULL offset and extent: the whole tensor) into the caller's host
 * buffer dst (bytes long) in natural row-major order.  What a reader of a
 * tiled tensor uses instead of dcast_consumer_tensor()'s pointer.
 * Errors: DCAST_EINVAL (NULL argument), DCAST_ENOTFOUND, DCAST_ESHAPE (as
 * for bind_slice), DCAST_ECUDA (a tensor bound in device memory). */
DCAST_API int dcast_consumer_read_slice(dcast_consumer *c, const char *name, uint32_t ndim,
			      const uint64_t *offset, const uint64_t *extent, void *dst,
			      uint64_t bytes);

/* The live tensor `name`: *ptr (host or device, see *mem) and its manifest
 * entry.  The pointer stays valid until close or a bind or unbind of that name; its
 * contents change only inside dcast_consumer_apply.  Any out pointer may be
 * NULL.  For a tiled tensor (dcast_tensor_tiled(desc)) the memory is the
 * consumer's host copy in wire (tile) order, not row-major: read it with
 * dcast_consumer_read_slice() or bind it.  Errors: DCAST_ENOTFOUND. */
DCAST_API int dcast_consumer_tensor(dcast_consumer *c, const char *name, void **ptr,
			  dcast_tensor_desc *desc, dcast_mem *mem);

/* Number of tensors known (0 before the manifest); desc of tensor i. */
DCAST_API uint32_t dcast_consumer_tensor_count(const dcast_consumer *c);
DCAST_API int dcast_consumer_tensor_at(const dcast_consumer *c, uint32_t i, dcast_tensor_desc *desc);

/* Wait up to timeout_ms (0: do not wait; -1: forever) for the next event
 * of the consumer's thread.  Optional: the thread keeps the consumer
 * joined whether or not anyone polls (the 32 newest events are kept).
 * Returns 0 with *ev set as soon as an event is due, or with ev->type
 * DCAST_EV_NONE when the time is up (or sooner, when the only events due
 * were READY ones whose versions are no longer READY: applied since with
 * a later one, or dropped, e.g. by a bind that moved the host copy they
 * were written into, then fetched again; these are not given, so a READY
 * event names a version apply() can take).  Errors (returned once, not as
 * events): what the thread last failed on, e.g. DCAST_EZMQ, DCAST_EIO (a
 * record or fold write failed; the version is dropped, or the fold is
 * tried again at the policy's next trigger). */
DCAST_API int dcast_consumer_poll(dcast_consumer *c, int timeout_ms, dcast_event *ev);

/* Apply READY version `version` to the live tensors, after the READY
 * versions staged before it (each its own transaction; an anchor makes the
 * ones before it unnecessary: they are dropped).  Every chunk is range-checked and written with its old values saved, then
 * the COMMIT digests are checked (verify_digests).  A delta checked ahead
 * (before READY, against the live tensors) only has its new values
 * scattered here, decoded before.  Ranges computed whole (an anchor's
 * every range, all with verify_digests 2) are split over up to 8 threads,
 * the calling one included, once they hold 8 MiB or more of host
 * tensors: O(model), while the caller waits anyway (the file digest of an
 * anchor received in place, before its READY, and of model.safetensors at
 * open and checkpoint() are split the same way).  While an anchor taken
 * in place still has its checkpoint file written from the tensors (after
 * its READY), a later version is announced READY only once those writes
 * are done, so that its apply never waits for the disk; named by number
 * before that, it is applied after waiting for them.  On any failure the
 * tensors are restored exactly to the previous version and the error is
 * returned; the refused version is dropped and re-requested.  Errors:
 * DCAST_ESTATE (not ready), DCAST_EGAP (its base is not the applied
 * version), DCAST_ECORRUPT / DCAST_ECHECKSUM (staged data), DCAST_EDIGEST,
 * DCAST_EIO. */
DCAST_API int dcast_consumer_apply(dcast_consumer *c, uint64_t version);

/* dcast_consumer_apply, except that a version's device changes checked
 * ahead (one batch: see docs/architecture.md) are scattered on the
 * caller's CUDA stream `stream` (a cudaStream_t; NULL: the legacy default
 * stream) and the caller's event `event` (a cudaEvent_t it created; NULL:
 * none) is recorded on `stream` after the scatter; the call returns
 * without waiting for the device.  Kernels the engine enqueues on
 * `stream` afterwards, or on any stream after a cudaStreamWaitEvent on
 * `event`, see the new version; its host tensors are written before the
 * call returns.  stream, event and the device tensors must be on one
 * device.  The version counts as applied on return (version(), stats,
 * the local checkpoint), as the check ahead already proved its data.
 * The consumer keeps the scatter's inputs (and the old values, its undo)
 * until it is done: the next check ahead (on the consumer's thread, so
 * this call does not wait for it) waits for it on the device, and every
 * other step of the library that touches the device tensors or the batch
 * (a bind, an unbind, an undo, a read for a checkpoint, close) waits for
 * it on the host.  When there is no such batch (no device, the
 * DELTACAST_DEVICE_TWIN path, host tensors only, a version applied chunk
 * by chunk) it is dcast_consumer_apply exactly: every write is done on
 * return and `event` is not recorded (an event never recorded is
 * complete for cudaEventSynchronize and cudaStreamWaitEvent).  Errors: those of
 * dcast_consumer_apply, with the same codes for the same arguments;
 * DCAST_ECUDA when the launch or a record failed: the version is undone
 * then, as for a failed apply.  The caller keeps its stream and event. */
DCAST_API int dcast_consumer_apply_async(dcast_consumer *c, uint64_t version, void *stream, void *event);

/* Newest READY version that apply() can take now, or NONE. */
DCAST_API uint64_t dcast_consumer_ready_version(const dcast_consumer *c);

/* The READY versions apply() can take now, oldest first (the chain that
 * ends at dcast_consumer_ready_version()): the first min(count, cap) into
 * out (may be NULL with cap 0).  Returns the count, which the staging
 * window (max_staged) bounds; 0 for a NULL consumer.  What ranks of one
 * engine compare to pick a version every rank can apply.  Any thread. */
DCAST_API uint32_t dcast_consumer_ready_versions(const dcast_consumer *c, uint64_t *out, uint32_t cap);

/* The version the live tensors hold (atomic; any thread); NONE before the
 * first apply. */
DCAST_API uint64_t dcast_consumer_version(const dcast_consumer *c);

/* The run identity of the broker's stream that the state held belongs
 * to, once a WELCOME confirmed it; 0 before (the version loaded from the
 * local checkpoint may still be an earlier run's: a WELCOME naming another
 * run drops it, logs why and fetches an anchor).  Any thread. */
DCAST_API uint64_t dcast_consumer_run(const dcast_consumer *c);

/* Block until the applied version is >= min_version or timeout_ms passes
 * (-1: forever).  Any thread.  Errors: DCAST_ETIMEDOUT; its detail says
 * when min_version is READY but not applied (only apply(), or auto_apply,
 * moves the live tensors) and which version the tensors hold. */
DCAST_API int dcast_consumer_wait_version(dcast_consumer *c, uint64_t min_version, int timeout_ms);

/* Fold now: write DIR/model.safetensors as the applied version (atomic:
 * written in pieces beside it from the disk, each punched out of the old
 * file once durable, renamed over it; from the live tensors where the
 * record files cannot make it) and drop the record files it covers;
 * first waits for a fold the policy started, seals an anchor received in
 * place that the consumer's thread has not sealed yet (DIR/model.safetensors.new:
 * fsync, rename), and writes nothing when the file then holds the applied
 * version.  The fold policy (fold_fraction,
 * fold_every) folds in the background, from the disk, without blocking
 * apply(); call this to have the file current at once (O(model): for exit
 * or export, not for every version).  Errors: DCAST_EIO, DCAST_ENOMEM, DCAST_ENODEVICE (a CUDA
 * tensor without a device). */
DCAST_API int dcast_consumer_checkpoint(dcast_consumer *c);

/* Numbers for the version last applied plus totals.  Never fails. */
DCAST_API void dcast_consumer_stats_get(const dcast_consumer *c, dcast_consumer_stats *st);

#ifdef __cplusplus
}
#endif
#endif
