/* Private to consumer/: the consumer object and the pieces it is made of.
 * One way down (no file calls a file above it), from the top:
 *   open.c (open, close);
 *   session.c (the session thread: socket, HELLO, credit, heartbeats);
 *   api.c (the calls on a live consumer);
 *   run.c (run identity: another run's staged versions dropped);
 *   intake.c (the version state machine, for the wire and the replay:
 *   the staged list, refusals);
 *   apply.c (one version, transactional),
 *   verify.c (digests), outbox.c (what callers leave for the session
 *   thread), recover.c (the recovery policy), staged.c (a staged
 *   version's chunks read back), bulk.c (an anchor's bulk TCP
 *   connection);
 *   the local checkpoint, behind store/store.h: store/store.c,
 *   store/ckpt_load.c, store/fold.c, store/anchor_new.c, store/anchor.c,
 *   store/ckpt.c, store/syncer.c;
 *   views.c (slices), devbatch.c (a device version's batch), fault.c,
 *   staging.c (the pinned pool), par.c,
 *   devmem.c (host or CUDA), state.c (the tensor table, the applied
 *   version, events, a version's memory).
 * tests/test_layers.sh checks this order and that no circle forms. */
#ifndef DCAST_CONSUMER_IMPL_H
#define DCAST_CONSUMER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <zmq.h>
#include "deltacast/codec.h"
#include "deltacast/consumer.h"
#include "deltacast/safetensors.h"
#include "deltacast/schema.h"
#include "dcast_bulkrx.h"
#include "dcast_fit.h"
#include "dcast_io.h"
#include "dcast_names.h"
#include "dcast_tiles.h"

/* par.c: fn(arg, i) for every i < n, on up to CS_PAR_THREADS threads (the
 * caller's included) when the work's size `bytes` is CS_PAR_MIN_BYTES or
 * more and the host has more than one CPU, else on the caller's thread
 * alone.  Items are taken in turn; fn must write only item i's output.
 * Returns once every item is done. */
#define CS_PAR_THREADS 8
#define CS_PAR_MIN_BYTES (8u << 20)
/* The work of one sparse change in cs_par_for's bytes: the cache line it
 * reads or writes in the live tensor, then its hashing (resolve) */
#define CS_CHANGE_COST 64
void cs_par_for(unsigned n, uint64_t bytes, void (*fn)(void *arg, unsigned i), void *arg);

/* ---- staging pool: pinned memory in three regions ----
 * resident: chunks kept until apply (bump-allocated, reset when empty);
 * scratch:  one chunk at a time on its way to disk, or read back for apply;
 * undo:     old values saved by apply for rollback, after the arrays of
 *           the chunks the check ahead resolved (verify.c), which the
 *           version named by undo_owner holds.
 * Each region is a quarter of the budget; the last quarter is the credit
 * the broker may have in flight inside ZeroMQ. */
typedef struct cs_pool {
	unsigned char *base;
	uint64_t bytes;                /* whole mapping */
	uint64_t region_bytes;         /* each of the three regions */
	uint64_t resident_used, resident_live; /* bump offset, live chunks */
	uint64_t in_use, peak;         /* bytes in use now / at most */
	dcast_io *io;                  /* registers the pool at its first use (cs_pool_attach) */
	int pinned;                    /* first used: faulted in, mlock tried, registered */
	int locked;                    /* mlock succeeded */
	int cuda_registered;           /* cudaHostRegister succeeded */
	uint64_t undo_owner;           /* the version that last took the undo region */
} cs_pool;

/* Map the pool for budget_bytes (three regions of a quarter each),
 * untouched: its pages are faulted in, locked (mlock, best effort: a
 * warning once when refused) and registered with the engine given to
 * cs_pool_attach at its first use, by the getters below.  Errors:
 * DCAST_ENOMEM (mmap). */
int cs_pool_open(cs_pool *p, uint64_t budget_bytes);
/* The I/O engine the pool registers its memory with at first use (the
 * consumer's; once, before any use). */
void cs_pool_attach(cs_pool *p, dcast_io *io);
void cs_pool_close(cs_pool *p);
unsigned char *cs_pool_scratch(cs_pool *p);
/* The undo region, now version's: what another version kept there is
 * gone (cs_pool_undo_owner says whose it is). */
unsigned char *cs_pool_undo_take(cs_pool *p, uint64_t version);
static inline uint64_t cs_pool_undo_owner(const cs_pool *p)
{
	return p->undo_owner;
}
/* A resident slot of n bytes, or NULL when the resident region is full. */
unsigned char *cs_pool_resident_get(cs_pool *p, uint64_t n);
void cs_pool_resident_put(cs_pool *p, uint64_t n);

/* devmem.c: host or CUDA tensors */
void cs_pool_cuda_register(cs_pool *p);
void cs_pool_cuda_unregister(cs_pool *p);

/* ---- digests of the live tensors (verify.c) ----
 * One entry per COMMIT digest range of the applied version, sorted by
 * (tensor, start, count): the producer's digest and ours (docs/protocol.md,
 * "Checksum and digest"); once installed as c->dcache the two are equal. */
typedef struct cs_dentry {
	dcast_range_digest d;  /* the range and the producer's digest */
	uint64_t have;         /* while verifying: cached value moved by the changes */
	int full;              /* while verifying: 0 moved, CS_FULL_TODO compute `have` over
				* the whole range, CS_FULL_DONE computed so (verify.c) */
} cs_dentry;

enum { CS_FULL_TODO = 1, CS_FULL_DONE = 2 };

typedef struct cs_dcache {
	cs_dentry *e;
	uint32_t n;
} cs_dcache;

/* The first entry of n (sorted by tensor, then start) of tensor
 * t that ends after element `lo`, or n->n: a binary search. */
static inline uint32_t cs_dcache_first(const cs_dcache *n, uint32_t t, uint64_t lo)
{
	uint32_t a = 0, b = n->n;

	while (a < b) {
		uint32_t mid = a + (b - a) / 2;
		const dcast_range_digest *d = &n->e[mid].d;
		if (d->tensor < t || (d->tensor == t && d->start + d->count <= lo))
			a = mid + 1;
		else
			b = mid;
	}
	return a;
}

/* state.c: forget the cached digests (they no longer describe the
 * tensors); d's memory is freed, d left empty. */
void cs_dcache_clear(cs_dcache *d);

/* ---- one staged chunk ---- */
typedef struct cs_chunk {
	uint32_t part, seq, tensor;
	uint64_t start;
	dcast_chunk_info info;
	uint64_t checksum;     /* dcast_checksum of the payload alone */
	uint64_t file_off;     /* payload offset in the version's record file, or
				* CS_IN_PLACE: the payload is the tensor's own bytes */
	unsigned char *resident; /* payload in the pool, or NULL: read from file */
	unsigned char *res;    /* resolved by the check ahead (verify.c): its positions,
				* old and new values, in v->res; NULL: decoded at apply */
} cs_chunk;

enum cs_vstate { CS_V_STAGING = 1, CS_V_READY };

#define CS_IN_PLACE UINT64_MAX

/* ---- one version being staged or ready ---- */
typedef struct cs_version {
	uint64_t version, base_version;
	int anchor, state;
	cs_chunk *chunks;
	uint32_t n_chunks, cap_chunks;
	uint64_t *seen;        /* open-addressed set of (part << 32 | seq) + 1 */
	uint32_t seen_cap;
	uint64_t bytes;
	dcast_commit commit;   /* digests owned here once READY */
	int fd;                /* record file, open while staged */
	dcast_io *io;          /* the engine fd is added to, as io_file */
	int io_file;
	uint64_t file_bytes;
	uint64_t first_ns, ready_ns;
	uint64_t spilled;
	cs_dcache ahead;       /* checked ahead: the digests after it, n 0 = not checked */
	uint64_t ahead_base;   /* the applied version it was checked against */
	uint64_t ahead_hashed; /* tensor bytes read to check it */
	int ahead_tried;       /* cs_verify_ahead ran (once per version) */
	unsigned char *res;    /* the resolved chunks' arrays: the undo region, while
				* this version owns it; valid with `ahead` only */
	uint64_t res_bytes;    /* of it, used */
	int write_failed;      /* a chunk record's write failed: never READY */
	int in_place;          /* an anchor received straight into the library's own host
				* tensors, which held no version (intake.c) */
	int direct;            /* in place, and written straight to model.safetensors.new
				* at its final offsets instead of a record file (store/anchor_new.c) */
	int held;              /* READY, not announced yet: an anchor's file is still
				* written from the tensors its apply changes (intake.c,
				* cs_intake_release) */
} cs_version;

/* ---- the live tensors ---- */

/* A box of a tensor kept in the caller's memory, row-major in the box
 * (views.c). */
typedef struct cs_view {
	dcast_box box;
	unsigned char *ptr;
	int mem;               /* dcast_mem */
} cs_view;

typedef struct cs_tensor {
	dcast_tensor_desc desc;
	unsigned elem_size;
	uint64_t bytes;
	unsigned char *ptr;    /* live data, in wire order */
	unsigned char *host;   /* our host copy in the arena: ptr while owned */
	int mem;               /* dcast_mem */
	int owned;             /* ptr is our host copy (ptr == host) */
	dcast_tiles map;       /* wire order against natural order */
	cs_view *views;        /* only while owned: the host copy feeds them */
	uint32_t n_views;
} cs_tensor;

#define CS_MAX_STAGED 16
#define CS_IO_DEPTH 56 /* 16 chunk records written behind (up to 3 writes each) and room */
#define CS_EVENTS 32

/* Test faults armed at open (fault.c). */
typedef struct cs_fault {
	int kind;                      /* CS_FAULT_*, NONE when unarmed */
	uint64_t version;
	uint64_t taken;                /* cut: CHUNKs of the version let through */
} cs_fault;

/* A sparse chunk's changes on their way to the views (views.c). */
typedef struct cs_vscratch {
	uint32_t *pos;
	void *ch;
	unsigned char *buf;
	uint64_t pos_cap, ch_cap, buf_cap;
} cs_vscratch;

/* The cause of a refusal that re-joins (outbox.c, cs_refusal_backoff):
 * what was refused, the error, and where: how many of the version's chunks
 * were taken before it (a version damaged on the way fails at another
 * chunk each time; one damaged in the log fails at the same one). */
enum { CS_REFUSED_VERSION, CS_REFUSED_MANIFEST, CS_REFUSED_MESSAGE };
typedef struct cs_refusal {
	int what;                      /* CS_REFUSED_*: a version, a MANIFEST not taken, a
					* message that does not decode */
	int code;                      /* dcast_err */
	uint64_t version;              /* CS_REFUSED_VERSION's, else NONE */
	uint32_t place;                /* the version's chunks taken before, else 0 */
} cs_refusal;

/* What a caller leaves for the session thread, which alone sends
 * (outbox.c): a HELLO (hello_due) or an ACK (ack_due), and the eventfd
 * that wakes it. */
typedef struct cs_outbox {
	int wake_fd;                   /* eventfd in the thread's zmq_poll set */
	int hello_due;                 /* send HELLO on the thread's next turn */
	uint64_t ack_due;              /* newest applied version not ACKed yet, or NONE */
	uint64_t hello_at_ms;          /* a HELLO due goes out no earlier than this */
	cs_refusal refused;            /* the cause refused last, and how many times in a */
	uint32_t refusals;             /* row: the re-join backs off (cs_refusal_backoff) */
} cs_outbox;

/* An anchor coming over a bulk TCP connection (bulk.c; docs/protocol.md,
 * "Bulk anchors"): the connection, the frame being read, and its payload
 * bytes received and freed since it began (cs_credit_free counts the
 * freed bytes of `version` here, not as CREDIT: they are outside the
 * ZeroMQ window).  The session thread's alone. */
typedef struct cs_bulk {
	dcast_bulkrx rx;               /* the connection and the frame being read */
	int off;                       /* never asked for again (a transfer failed) */
	struct sockaddr_storage addr;  /* the endpoint's host, resolved at open */
	socklen_t addr_len;            /* 0: none (not tcp://, or it did not resolve) */
	uint64_t received, freed;      /* its payload bytes */
	uint64_t last_ms;              /* bytes last moved (or the window held them back) */
	unsigned char *into;           /* payload read straight into a tensor here
					  (cs_intake_in_place_dest), else NULL, */
	dcast_chunk into_chunk;        /* for this CHUNK */
	struct dcast_landing *land;    /* such a payload hashed as it lands
					  (allocated at the first), */
	const unsigned char *land_into; /* the payload it hashes, NULL: none */
} cs_bulk;

/* The session with the broker (session.c): its thread, socket, timers,
 * credit and the fold it asks of the store (fold_due: the policy wants
 * one, cs_store_fold_start on its next turn).  Fields under `own` are the thread's alone,
 * so that it may use them without `lock` while a caller holds it for long
 * work (an apply). */
typedef struct cs_session {
	pthread_t thread;
	int thread_started;
	_Atomic int stop;
	int err_code;                  /* the thread's last failure for poll(), 0 = none */
	char err_text[512];
	void *zctx, *sock;
	int welcomed, fold_due;
	uint64_t hellos;               /* HELLOs sent since open */
	uint64_t hello_ms;
	uint32_t heartbeat_ms;
	uint64_t last_send_ms, last_recv_ms;
	uint64_t broker_newest;        /* from WELCOME and HEARTBEAT, or NONE */
	uint64_t progress_ms;          /* the stream last moved (stalled() in session.c) */
	uint64_t window_bytes;
	uint64_t drop_version;         /* chunks of this version are refused until it ends */
	int own_joined;                /* own: welcomed and no HELLO pending */
	uint32_t own_hb_ms;            /* own: the heartbeat interval in force */
	uint64_t credit_pending;       /* freed bytes not yet granted */
	uint64_t chunk_ms;             /* a CHUNK was last taken (commit_overdue in session.c) */
} cs_session;

/* One consumer.  Each module's state is a sub-struct it owns; what stays
 * here is shared: the tensors, the applied version, the staged versions,
 * the pool and I/O engine, the events, the locks. */
/* How the apply in progress launches a device batch's scatter
 * (dcast_consumer_apply_async; all 0 otherwise: the legacy default
 * stream, waited for). */
typedef struct cs_pause {
	int async;                     /* on stream, not waited for */
	void *stream;                  /* the caller's cudaStream_t (NULL: the legacy default) */
	void *event;                   /* the caller's cudaEvent_t recorded after it, or NULL */
	int launched;                  /* set by cs_dbatch_scatter: one was left pending */
} cs_pause;

struct dcast_consumer {
	char model[DCAST_MAX_NAME + 1];
	char *dir, *endpoint;
	int lock_fd;                   /* DIR/lock, flock()ed while open (open.c) */
	dcast_consumer_opts opts;      /* its strings point at the copies below (open.c) */
	char opt_client[DCAST_MAX_CLIENT + 1];
	char opt_curve[3][41];         /* server, public, secret key (Z85) */
	uint64_t budget;

	cs_tensor *tensors;
	uint32_t n_tensors;
	dcast_names names;             /* tensor name -> index in tensors */
	uint32_t device_tensors;       /* bound in CUDA memory: undo from the checkpoint */
	unsigned char *arena;          /* the owned tensors' host copies (state.c) */
	uint64_t arena_bytes;
	int arena_huge;                /* huge pages for it: 0 where DELTACAST_HUGE_PAGES=0 (open.c) */

	_Atomic uint64_t applied;      /* live version, NONE before the first */
	pthread_mutex_t mu;            /* for wait_version (taken after `lock`, never before) */
	pthread_cond_t cv;

	/* The session thread owns the socket; every other field is shared
	 * with the caller's threads under `lock`. */
	pthread_mutex_t lock;
	pthread_cond_t ev_cv;          /* an event was pushed, or the thread stopped */
	cs_session ss;
	cs_outbox ob;
	cs_bulk bulk;
	struct cs_store *store;        /* the local checkpoint (store/store.h): the pointer
					* fixed from open to close, its fields under its own mutex */
	cs_vscratch vs;
	cs_fault fault;
	cs_pause pause;                /* set only inside dcast_consumer_apply_async */

	uint64_t run;                  /* run of the state held (DIR/run), 0 unknown */
	pthread_mutex_t run_mu;        /* DIR/run's writes and syncs (run.c) */
	_Atomic int run_unsynced;      /* DIR/run may not be on the disk yet */
	_Atomic uint64_t run_confirmed; /* run a WELCOME confirmed, 0 until then */

	cs_dcache dcache;              /* digests at the applied version; n 0 = none */
	uint64_t verify_bytes;         /* tensor bytes read by the last version's check */

	cs_pool pool;
	dcast_io *io;                  /* record writes/reads: io_uring or plain */
	cs_version staged[CS_MAX_STAGED]; /* in version order */
	uint32_t n_staged;

	dcast_event events[CS_EVENTS];
	uint32_t ev_head, ev_count;

	dcast_consumer_stats stats;
	uint64_t total_received;
};

/* Where chunk k's range starts in its live tensor (host or device). */
static inline unsigned char *cs_chunk_dst(const dcast_consumer *c, const cs_chunk *k)
{
	return c->tensors[k->tensor].ptr + k->start * k->info.elem_size;
}

/* fault.c: test faults (DELTACAST_CONSUMER_FAULT=KIND:V), at the seams
 * only.  cs_fault_parse: arm from the environment, at open.
 * cs_fault_wire: how many times a decoded broker message is delivered to
 * the state machine (0, 1 or 2), after changing it as the fault says.
 * cs_fault_holds_ahead: v must not be checked ahead (its fault is for the
 * check at apply).  cs_fault_apply: at the start of v's apply; the chunk
 * index at which apply must refuse v, or UINT32_MAX.  cs_fault_fold: at
 * the start of a fold from the disk and before the fdatasync of an anchor
 * file's seal (store/anchor_new.c).  cs_fault_fold_piece: in a fold from
 * the disk, after each piece is durable and before it is punched out of
 * the anchor file (store/fold.c).  cs_fault_bulk_cut: after a frame of
 * a bulk connection was delivered, 1 when the connection is to be cut
 * there (once).  cs_fault_file_write: as a write of an anchor's own file
 * that completes after its COMMIT is reaped, 1 when it is to fail (once). */
enum { CS_FAULT_NONE, CS_FAULT_CORRUPT, CS_FAULT_SKIP, CS_FAULT_DIGEST, CS_FAULT_DUP, CS_FAULT_PREDIGEST,
       CS_FAULT_AHEADFAIL, CS_FAULT_FOLDHOLD, CS_FAULT_CUT, CS_FAULT_FOLDPIECE, CS_FAULT_BULK_CUT,
       CS_FAULT_FILE_WRITE, CS_FAULT_KINDS };
void cs_fault_parse(dcast_consumer *c);
struct dcast_wire_in;
int cs_fault_wire(dcast_consumer *c, struct dcast_wire_in *in);
int cs_fault_holds_ahead(const dcast_consumer *c, const cs_version *v);
uint32_t cs_fault_apply(dcast_consumer *c, cs_version *v, int ahead);
void cs_fault_fold(const dcast_consumer *c);
int cs_fault_bulk_cut(dcast_consumer *c, const struct dcast_wire_in *in);
void cs_fault_fold_piece(const dcast_consumer *c);
int cs_fault_file_write(dcast_consumer *c, uint64_t version);

/* state.c: a fresh version (every field zero, no record file) and its
 * release (its tables and digests freed, its record file descriptor
 * closed and taken off the I/O engine; then fresh again). */
void cs_version_init(cs_version *v, uint64_t version);
void cs_version_free(cs_version *v);
/* Does chunk k write anything (dense, or changed > 0)? */
int cs_chunk_writes(const cs_chunk *k);
/* intake.c: the version state machine, the only code that changes a
 * staged version's state (STAGING -> READY, dropped) and the staged list,
 * fed alike by the broker's messages (session.c) and by the replay of the
 * record log (the store).
 * cs_intake_chunk: a CHUNK from the wire, not below the applied version:
 * checked whole before anything of its version is begun (dcast_chunk_sound:
 * its checksum, its fit to the tensors), its version begun when new (a gap, a
 * version not above the newest staged or a full staging refuses it:
 * cs_refuse, cs_refuse_message, cs_rejoin_refused), its payload staged in
 * the pool or written straight from `payload` (held until written) to the
 * version's record file, and taken; a duplicate gives its credit back.
 * `landed`: the payload's hashes taken as a bulk connection read it into
 * its tensor (cs_bulk_landed), used for its checksum and the file
 * digest's blocks instead of a pass of their own; NULL: none.
 * cs_intake_commit: a COMMIT from the wire closes its version when it
 * announces exactly what was staged; once its record is written the
 * version is READY (*ready = 1), checked ahead where it can be, and a
 * VERSION_READY event pushed; but while an anchor taken in place still
 * has its file written from the tensors (an apply would wait for the
 * disk, in the caller's pause), a version that is not that anchor is
 * held: READY, neither announced nor in the chain apply() and
 * auto_apply take (dcast_consumer_ready_version), until
 * cs_intake_release.  Both return 0 when the stream goes on
 * (refusals re-join), DCAST_EIO for a record that cannot be written, or
 * the error of a re-join.  `lock` held, session thread.
 * cs_intake_replay_chunk, _commit: the store's replay of its record
 * files (store.h, cs_store_sink, as open.c gives it): the same steps for
 * a CHUNK and a COMMIT record (a fresh version begins at the first); the
 * version is then applied by cs_intake_apply.  Errors: those of
 * dcast_chunk_sound, DCAST_EFIELD_RANGE (anchor or base differ from
 * v's), DCAST_ENOMEM; DCAST_ECORRUPT for a COMMIT that does not match
 * what was taken. */
int cs_intake_chunk(dcast_consumer *c, const dcast_chunk *h, zmq_msg_t *payload,
		    const struct dcast_landing *landed);
int cs_intake_commit(dcast_consumer *c, dcast_commit *m, int *ready);
/* Once no write of an anchor's own file is left, the held versions are
 * announced, in order (their VERSION_READY events; their READY time is
 * now).  Every turn of the session thread; `lock` held. */
void cs_intake_release(dcast_consumer *c);
int cs_intake_replay_chunk(dcast_consumer *c, cs_version *v, const dcast_chunk *h, uint64_t sum,
			   uint64_t file_off);
int cs_intake_replay_commit(dcast_consumer *c, cs_version *v, dcast_commit *m);
/* cs_intake_holds: the store's word that the tensors hold `version` (an
 * anchor file loaded, a replay's end, NONE while a restore rebuilds them).
 * cs_intake_apply: READY v applied to the tensors (cs_apply_version) and
 * the applied version moved to it, for both sources: apply() (api.c) and
 * the store's replay (its sink's apply: recover 1 at load, 0 for a
 * restore); one that tears the tensors goes to the recovery policy
 * (cs_ckpt_recover) when `recover`.  Errors: those of cs_apply_version
 * and cs_ckpt_recover. */
void cs_intake_holds(dcast_consumer *c, uint64_t version);
int cs_intake_apply(dcast_consumer *c, cs_version *v, int recover);
/* The store's word that a chunk record of `version` was written (failed
 * 0) or not (1): `credit` bytes of the pool are free again (granted to the
 * broker), and a version whose record failed is never READY (its COMMIT
 * drops it; it is fetched again).  `lock` held. */
void cs_intake_written(dcast_consumer *c, uint64_t version, uint64_t credit, int failed);
/* The staged list at open: every slot fresh, none staged; at close: every
 * slot freed (record files stay, for the next open's replay). */
void cs_staged_open(dcast_consumer *c);
void cs_staged_close(dcast_consumer *c);
/* The staged version `version`, or NULL. */
cs_version *cs_version_find(dcast_consumer *c, uint64_t version);
/* Forget v (staged[] stays in order); its record file goes when unlink_file. */
void cs_version_drop(dcast_consumer *c, cs_version *v, int unlink_file);
void cs_drop_all(dcast_consumer *c);
/* Drop every staged version at or after `version` (a refused one and what
 * builds on it). */
void cs_drop_from(dcast_consumer *c, uint64_t version);
/* Drop the anchor received in place and every version after it (a whole
 * bind moves the tensors it was written into); 1 when there was one (the
 * caller re-joins for it), else 0. */
int cs_drop_in_place(dcast_consumer *c);
/* Where the payload of CHUNK h, not yet received, may be read straight
 * into: its range of the tensor when h is a dense anchor chunk that fits
 * the tensors (dcast_chunk_dense_at) and its version is, or would be,
 * taken in place (in_place_ok) and has not taken h yet; else NULL.  The pointer
 * stays good while the session holds the lock and nothing binds or
 * stages; a caller reading across turns asks again before each read.
 * The checksum is still the intake's (cs_intake_chunk). */
unsigned char *cs_intake_in_place_dest(dcast_consumer *c, const dcast_chunk *h);
/* The staging invariant (asserted): at most CS_MAX_STAGED versions, each
 * staging or READY, versions increasing past the applied one. */
void cs_staged_check(const dcast_consumer *c);
/* The READY versions at the front of staged[] that apply in a chain from
 * the live tensors. */
uint32_t cs_ready_chain(const dcast_consumer *c);
/* Join again after what we hold (READY versions in a chain stay, the rest is
 * dropped), then cs_stream_restart.  Callers hold `lock`. */
int cs_rejoin(dcast_consumer *c);
/* Join again after a refusal: cs_refusal_backoff (outbox.c, the one
 * back-off), then cs_rejoin.  Callers hold `lock`. */
int cs_rejoin_refused(dcast_consumer *c, int what, uint64_t version, int code);
/* The broker aborted `version` before its COMMIT (ERROR DCAST_EABORTED,
 * `why` its text): staged and not READY, it is dropped with what builds on
 * it (an ERROR event, a log line, stats.versions_aborted), then cs_rejoin
 * (READY versions stay).  A version not held, or READY, is passed over
 * (0).  Callers hold `lock`. */
int cs_intake_abort(dcast_consumer *c, uint64_t version, const char *why);
/* Refuse `version` for `code` (dcast_last_error() says why): an ERROR
 * event, the version dropped with every one after it (cs_drop_from), then
 * cs_rejoin_refused.  Callers hold `lock`. */
int cs_refuse(dcast_consumer *c, uint64_t version, int code);
/* The same for a message that is the peer's error and names no version
 * held: the versions staged stay (READY ones across the re-join). */
int cs_refuse_message(dcast_consumer *c, uint64_t version, int code);

/* devmem.c (needs cs_tensor) */
int cs_to_tensor(cs_tensor *t, uint64_t off, const void *src, uint64_t n);
int cs_from_tensor(const cs_tensor *t, uint64_t off, void *dst, uint64_t n);
int cs_tensor_apply(cs_tensor *t, const dcast_chunk_info *info, const void *payload, uint64_t start,
		    void *old);
int cs_tensor_digest(const cs_tensor *t, uint64_t off, uint64_t n, uint64_t *digest);
/* The COMMIT digest of elements [start, start+count) of t, manifest index `index`. */
int cs_tensor_ldigest(const cs_tensor *t, uint32_t index, uint64_t start, uint64_t count, uint64_t *digest);

/* views.c: slices of tensors in the caller's memory */
/* Bind ptr (bytes long, in mem) as the box off/ext (ndim 0: the whole
 * tensor) of t, filled with t's current contents.  Errors as
 * dcast_consumer_bind_slice. */
int cs_bind_view(dcast_consumer *c, cs_tensor *t, void *ptr, dcast_mem mem, uint32_t ndim,
		 const uint64_t *off, const uint64_t *ext, uint64_t bytes);
/* Write chunk k into its tensor's host copy (the tensor has views), old
 * values to old unless NULL, as cs_tensor_apply does; *pos: the changed
 * positions the codec decoded on the way (in c->vs.pos; NULL for a dense
 * chunk), for cs_views_chunk.  Errors as dcast_codec_apply, DCAST_ENOMEM. */
int cs_views_write_host(dcast_consumer *c, const cs_chunk *k, const unsigned char *payload, void *old,
			const uint32_t **pos);
/* Elements [n0, n0 + count) of t in natural (row-major) order, out to the
 * host buffer dst or in from src: t's memory is in wire order (tile by
 * tile when tiled; host or device).  Errors: those of cs_to/from_tensor. */
int cs_tensor_read_natural(const cs_tensor *t, uint64_t n0, uint64_t count, void *dst);
int cs_tensor_write_natural(cs_tensor *t, uint64_t n0, uint64_t count, const void *src);
/* Bring t's views up to date with chunk k, just written to t's host copy by
 * cs_views_write_host (pos: the changed positions it gave; NULL for a dense
 * chunk).  Errors: DCAST_ENOMEM, DCAST_ECUDA. */
int cs_views_chunk(dcast_consumer *c, const cs_chunk *k, const uint32_t *pos);
/* Copy every view whole from its tensor (after a load or a rollback). */
int cs_views_refresh(dcast_consumer *c);
static inline void cs_views_free(cs_tensor *t)
{
	free(t->views);
	t->views = NULL;
	t->n_views = 0;
}

/* state.c */
void cs_event_push(dcast_consumer *c, int type, uint64_t version, int code, const char *text);
/* Free the tensor table (our host copies, the views' tables). */
void cs_tensors_free(dcast_consumer *c);
/* The library's own host copies of the tensors lie in one arena, each
 * tensor at an address congruent modulo CS_FILE_ALIGN to its offset in
 * model.safetensors (whose data section starts at a multiple of it,
 * cs_anchor_layout; tensors packed in order), so that an anchor received
 * in place goes from the tensors to that file with O_DIRECT (ckpt.c);
 * a tensor whose offset there does not suit its element size starts on a
 * page of its own instead (and is written buffered).  Tensors' bytes are
 * disjoint; neighbours may share a page.  The arena is allocated zeroed,
 * CS_FILE_ALIGN-aligned, by cs_host_alloc: NULL
 * when out of memory; from CS_HUGE_PAGE bytes on a mapping of its own,
 * aligned to and advised into transparent huge pages (where the kernel has
 * them: "madvise" or "always" in /sys/kernel/mm/transparent_hugepage/
 * enabled), so that an anchor written into it does not fault in 4 KiB at
 * a time; with huge 0 (DELTACAST_HUGE_PAGES=0 in the environment when the
 * consumer opened), advised out of them instead.  cs_host_free takes it
 * back given the same size; cs_host_release gives the whole pages of
 * [p, p + bytes) back to the kernel (a tensor bound to the caller's memory
 * since). */
#define CS_HUGE_PAGE (2u << 20)
#define CS_FILE_ALIGN DCAST_IO_DIRECT_ALIGN
void *cs_host_alloc(uint64_t bytes, int huge);
void cs_host_free(void *p, uint64_t bytes);
void cs_host_release(void *p, uint64_t bytes);
cs_tensor *cs_tensor_find(dcast_consumer *c, const char *name);
/* Is any tensor tiled (wire order in memory, natural order in files)? */
int cs_tensors_tiled(const dcast_consumer *c);
/* The tensors' descriptors in place, for the manifest checks of
 * dcast_fit.h (dcast_chunk_sound, dcast_digest_fits). */
dcast_desc_array cs_tensor_descs(const dcast_consumer *c);
int cs_tensors_from_manifest(dcast_consumer *c, const dcast_manifest *m);
/* A MANIFEST, from the wire or the record log: the tensor table when none
 * is held yet, else checked against it.  Errors: DCAST_ESHAPE (it differs:
 * names, dtypes, shapes or grids), DCAST_ENOMEM. */
int cs_manifest_take(dcast_consumer *c, const dcast_manifest *m);
void cs_set_applied(dcast_consumer *c, uint64_t v);

/* staged.c: a staged version's chunks, as apply and verification read them */
/* Sort v's chunks by (tensor, start); refuse overlaps and, for an anchor,
 * any element not covered (DCAST_ECORRUPT). */
int cs_sort_chunks(const dcast_consumer *c, cs_version *v);
/* k's checked payload: resident, or read back into the scratch region. */
int cs_chunk_payload(dcast_consumer *c, const cs_version *v, const cs_chunk *k, const unsigned char **out);

/* outbox.c: what a caller leaves for the session thread */
/* Ask for a HELLO on the session thread's next turn (from here on the old
 * stream is ignored); any thread, `lock` held. */
int cs_request_hello(dcast_consumer *c);
/* The stream starts over: credit not granted yet is forgotten (the
 * broker's window starts afresh), no version's chunks are dropped any
 * more, the stall timer restarts, and the HELLO goes out on the session
 * thread's next turn (cs_request_hello).  What is staged is the caller's
 * (cs_rejoin, intake.c).  Callers hold `lock`. */
int cs_stream_restart(dcast_consumer *c);
/* A refusal `now` (what: CS_REFUSED_*, a version names it; its code),
 * dcast_last_error() saying why, counted for the one back-off of every
 * re-join that follows a refusal (cs_rejoin_refused, intake.c): the first
 * refusal of a cause re-joins at once; the same cause again in a row
 * (what, version, code, and for a version the chunks of it taken before
 * the refusal) is persistent: an ERROR event and an E line,
 * and the HELLO waits 100 ms, doubling to 30 s (a version no consumer can
 * take, a MANIFEST that never decodes or never fits in memory, cost a
 * bounded rate of re-sends, not thousands a second, and are never given
 * up).  A version applied resets it (refusals = 0), as does
 * cs_refusal_clear.  Callers hold `lock`. */
void cs_refusal_backoff(dcast_consumer *c, cs_refusal now);
/* What was refused last is taken now (a MANIFEST): its count starts over. */
void cs_refusal_clear(dcast_consumer *c, int what);
/* Freed staging bytes of `version`, granted to the broker as CREDIT on
 * the session thread's next turn (the store's write-behind reports them
 * through its sink, cs_intake_written); those of the version coming over
 * a bulk connection are counted there instead (c->bulk.freed), never
 * granted: they were never in the ZeroMQ window. */
void cs_credit_free(dcast_consumer *c, uint64_t version, uint64_t bytes);
/* Wake the session thread out of its wait (work was left for it). */
void cs_wake(dcast_consumer *c);
/* ACK `version` as applied, from the session thread's next turn. */
void cs_ack(dcast_consumer *c, uint64_t version);
/* *ts = now (CLOCK_REALTIME) + timeout_ms, for pthread_cond_timedwait. */
void cs_deadline(struct timespec *ts, int timeout_ms);

/* bulk.c: the connection that brings an anchor (BULK) outside ZeroMQ,
 * read by the session thread beside its socket.
 * cs_bulk_init: no connection (at open, before anything can fail).
 * cs_bulk_resolve: at open, before the session starts, the endpoint's
 * host resolved once (an IPv4 address first), so that no name lookup
 * runs under the consumer's lock; one that fails is logged, and anchors
 * come over ZeroMQ; it resolves nothing with the option off, CURVE on or
 * an endpoint that is not tcp://.  cs_bulk_wanted: HELLO may say x-bulk
 * (an address resolved at open, no transfer failed since).  cs_bulk_start: connect (non-blocking) to that address at
 * b->port for version b->version, the opening queued; errors: DCAST_EIO
 * (socket, connect refused at once), naming the port; nothing is left
 * open then (on this host, the broker's local listener is tried first:
 * dcast_bulkrx_start).  cs_bulk_events: the poll events its fd waits for
 * (0: none; the window is full).  cs_bulk_file_ready: a payload the broker
 * passed by reference is being read and the window has room: the next
 * turn reads it without waiting on the socket.
 * cs_bulk_read: move what the connection has; *got 1 when `in` holds a
 * whole frame (header decoded and checked as a ZeroMQ message would be, a
 * CHUNK or the COMMIT of the version; the caller owns it, as from
 * dcast_wire_recv), 0 when nothing more is there now; payload bytes are
 * read only while those received and not freed stay within the window
 * (c->ss.window_bytes); a CHUNK's payload goes where dest(c, chunk)
 * says (asked again before each read of it: the same pointer, or the
 * transfer fails with DCAST_ESTATE), or into a buffer of its own when it
 * says NULL (session.c passes cs_intake_in_place_dest).  Errors (the
 * transfer failed; the detail says why): DCAST_EIO (connect failed, the connection ended or broke before
 * the COMMIT), DCAST_EMALFORMED (a prefix out of its limits, a message
 * other than CHUNK or COMMIT, or of another version), the decode errors,
 * DCAST_EPAYLOAD_SIZE, DCAST_ENOMEM.  cs_bulk_close: close the
 * connection, forget the frame; NULL-safe, idempotent. */
void cs_bulk_init(dcast_consumer *c);
void cs_bulk_resolve(dcast_consumer *c);
int cs_bulk_wanted(const dcast_consumer *c);
int cs_bulk_start(dcast_consumer *c, const dcast_bulk *b);
static inline int cs_bulk_active(const dcast_consumer *c)
{
	return dcast_bulkrx_active(&c->bulk.rx);
}
short cs_bulk_events(const dcast_consumer *c);
int cs_bulk_file_ready(const dcast_consumer *c);
struct dcast_wire_in;
typedef unsigned char *(*cs_bulk_dest_fn)(dcast_consumer *c, const dcast_chunk *h);
int cs_bulk_read(dcast_consumer *c, struct dcast_wire_in *in, int *got, cs_bulk_dest_fn dest);
void cs_bulk_close(dcast_consumer *c);
/* The hashes of `payload`, the last frame's, taken as it was read into its
 * tensor (its checksum and the file digest's blocks it holds whole), or
 * NULL when it was not read so; valid until the next cs_bulk_read. */
const struct dcast_landing *cs_bulk_landed(const dcast_consumer *c, zmq_msg_t *payload);
/* Is a frame's payload being read straight into a tensor? */
static inline int cs_bulk_into_tensor(const dcast_consumer *c)
{
	return cs_bulk_active(c) && c->bulk.into != NULL;
}

/* session.c: the session thread */
/* Open the socket (c->ss.zctx set) and start the session thread, which sends
 * HELLO.  Errors: DCAST_EZMQ, DCAST_EIO (eventfd), DCAST_ENOMEM (thread). */
int cs_session_start(dcast_consumer *c);
/* Stop the session thread and wait for it, then the store's fold thread;
 * NULL-safe, idempotent. */
void cs_session_stop(dcast_consumer *c);
/* Keep a failure of a background thread (the session's, the store's fold
 * thread) for the next poll(), wake a poll() waiting, and tell the log.
 * `lock` held. */
void cs_session_failed(dcast_consumer *c, int err);
/* With opts.auto_apply, apply the newest READY version (session thread,
 * `lock` held); 0 when there is none.  Errors: as dcast_consumer_apply. */
int cs_auto_apply(dcast_consumer *c);
/* Check the first staged version ahead of apply once its base is live
 * (after each apply, and on every turn of the thread), so that a bad one
 * is refused (cs_refuse) without touching the tensors.  Holds `lock`. */
int cs_check_next(dcast_consumer *c);

/* verify.c: plan v's check (every range computed whole with `full` or
 * without a cached value; v's chunks sorted, each that writes held whole
 * by the COMMIT's ranges, else DCAST_ECORRUPT), move the digests by each chunk as it is written
 * (cs_verify_written after chunk k of v, with the payload it wrote and the
 * old values it saved, NULL when none were kept), then finish: check every
 * digest; on success *n becomes c->dcache. */
int cs_verify_plan(dcast_consumer *c, const cs_version *v, int full, cs_dcache *n);
void cs_verify_written(dcast_consumer *c, cs_dcache *n, const cs_chunk *k, const unsigned char *payload,
		       const unsigned char *old);
int cs_verify_finish(dcast_consumer *c, const cs_version *v, cs_dcache *n);
/* Check READY delta v, whose base the tensors hold, before apply: each
 * cached digest moved by the changes of v's payloads (old values read from
 * the live tensors, nothing written, nothing copied) and compared.  0 also
 * when v cannot be checked ahead (apply checks it then); DCAST_EDIGEST
 * refuses v.  cs_verify_ahead_done: v applied, its digests become c->dcache. */
int cs_verify_ahead(dcast_consumer *c, cs_version *v);
void cs_verify_ahead_done(dcast_consumer *c, cs_version *v);
/* The check ahead also resolves v's sparse chunks of host tensors without
 * views, as far as the pool's region_bytes holds their arrays (k->res:
 * positions, the base's values there and the new ones), so that apply
 * writes them without decoding again and undoes them without saving old
 * values.  The arrays live at the start of the pool's undo region, which
 * v takes (apply then saves old values after them).  cs_resolved_valid:
 * v still owns that region and no slice was bound to a resolved chunk's
 * tensor since (apply checks it, then drops the arrays unless 1).
 * cs_resolved_scatter: write k's new values (undo 0) or its old
 * ones (undo 1) into its tensor.  cs_resolved_drop: forget v's arrays
 * (valid only against the base checked ahead). */
int cs_resolved_valid(const dcast_consumer *c, const cs_version *v);
/* The tensors moved to other memory (a whole bind, an unbind): every
 * staged version's check ahead and resolved chunks are forgotten (a device
 * batch names the old addresses), so it is checked and resolved again
 * against the tensors where they are now. */
void cs_ahead_forget(dcast_consumer *c);
void cs_resolved_scatter(dcast_consumer *c, const cs_chunk *k, int undo);
void cs_resolved_drop(cs_version *v);

/* recover.c: the recovery policy after an apply of `version` failed with
 * err and left the tensors torn (cs_apply_version): bring the applied
 * version back from the store (cs_ckpt_restore), or, when that fails too,
 * forget the state (version NONE: the re-join asks for an anchor).
 * Returns err, its detail saying which.  cs_forget_state: the tensors hold
 * no committed version any more: version NONE, cached digests forgotten,
 * no fold owed, the local checkpoint removed. */
int cs_ckpt_recover(dcast_consumer *c, uint64_t version, int err);
void cs_forget_state(dcast_consumer *c);

/* run.c: the run identity of the state held (docs/protocol.md,
 * WELCOME.run).  cs_run_load: c->run from DIR/run (0 when absent).
 * cs_run_check: a WELCOME's run against it; the state and the staged
 * versions of another run are dropped (returns 1 when anything was: the
 * caller re-joins, its HELLO naming what is left), an unknown run is
 * adopted and kept in DIR/run, written there but not synced: no fsync
 * holds up the join.  cs_run_durable: DIR/run and its name made durable
 * if they may not be yet; every path that makes state in DIR durable
 * (record syncs, an anchor file's seal, folds) calls it first, so that
 * after a power failure no durable state lies beside the run file of
 * another run (any thread; a no-op once synced).  Errors: DCAST_EIO,
 * the detail naming the file; the caller's state is then not made
 * durable either. */
void cs_run_load(dcast_consumer *c);
int cs_run_check(dcast_consumer *c, uint64_t run);
int cs_run_durable(dcast_consumer *c);

/* apply.c */
int cs_apply_version(dcast_consumer *c, cs_version *v, int verify, int *torn);

/* devbatch.c: a version's sparse chunks of device tensors resolved ahead
 * into one batch (kernels/dcast_batch.h) at a place `at` in the pool's
 * undo region (a header, then the batch's buffer), applied and undone in
 * one launch each.  cs_dbatch_tensor: t's sparse chunks go through the
 * batch (device memory, or the DELTACAST_DEVICE_TWIN test seam);
 * cs_dbatch_chunk: k is one of them (a sparse chunk that writes).
 * cs_dbatch_bytes: the undo-region bytes v's batch takes (0: none);
 * cs_dbatch_layout: lay it out at `at` (8-aligned), segments in chunk
 * order, and map b onto it (DCAST_EINVAL: its device tensors are on
 * several devices); cs_dbatch_decode: chunk k's payload p into segment
 * seg (any thread): a compact one's header checked and the payload put
 * for the device's decode, another decoded; cs_dbatch_resolve: the
 * compact payloads decoded (*refuse with the decoder's error when one is
 * damaged), old values, new ones and each segment's digest move, on the
 * device or by the twin (values: the device's changes copied back too),
 * returning when done; cs_dbatch_map: b onto the batch at `at`; cs_dbatch_scatter:
 * apply (undo 0) or undo (1) segments [0, seg_hi), returning when the
 * device is done, except for an apply under c->pause.async: enqueued on
 * its stream, its event recorded after, not waited for (pause.launched
 * set).  Errors:
 * DCAST_ENOMEM, DCAST_ECUDA, the decoder's.  cs_dbatch_settle: return
 * when every scatter not waited for (any consumer's) is done, before the
 * library touches device tensors otherwise (DCAST_ECUDA: one failed).
 * cs_dbatch_release: the device copy kept for pool p freed (at close),
 * after its pending scatter. */
#include "dcast_batch.h"
int cs_dbatch_tensor(const dcast_consumer *c, const cs_tensor *t);
int cs_dbatch_chunk(const dcast_consumer *c, const cs_chunk *k);
uint64_t cs_dbatch_bytes(const dcast_consumer *c, const cs_version *v);
int cs_dbatch_layout(const dcast_consumer *c, const cs_version *v, unsigned char *at, dcast_batch *b);
int cs_dbatch_decode(unsigned char *at, uint64_t seg, const cs_chunk *k, const unsigned char *p);
int cs_dbatch_resolve(dcast_consumer *c, unsigned char *at, int values, int *refuse);
void cs_dbatch_map(unsigned char *at, dcast_batch *b);
int cs_dbatch_scatter(dcast_consumer *c, unsigned char *at, int undo, uint64_t seg_hi);
int cs_dbatch_settle(void);
void cs_dbatch_release(const cs_pool *p);

#endif
