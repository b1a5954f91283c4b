/* Private to producer/, shared by all its files and named after none of
 * them (a name like producer_impl.h would count as producer.c's in
 * tests/test_layers.sh): the producer object (producer.c), its connection to
 * the broker (conn.c), its memory (baseline, encode slots, undo log:
 * memory.c), the encoder threads (encode.c), the publish pipeline
 * (publish.c, send.c) and the end of a version: ACK or failure
 * (outcome.c, under the connection), wait() and flush() (settle.c), and the
 * sender thread that sends an anchor after publish() returned (sender.c).
 * One way down (no file calls a file above it), from the top:
 *   baseline.c (the broker's newest version as the baseline, through the
 *   consumer library); base_check.c (the caller's copy of it, checked
 *   against the broker's digests); consumers.c (the broker's consumer
 *   endpoint as the producer reaches it); producer.c (open, register, close);
 *   publish.c; settle.c; sender.c; send.c;
 *   conn.c; outcome.c; encode.c; memory.c; device.c; shared.c (what
 *   several of them read).
 * tests/test_layers.sh checks this order and that no circle forms.
 * The public surface is deltacast/producer.h. */
#ifndef DCAST_PRODUCER_SHARED_H
#define DCAST_PRODUCER_SHARED_H

#include <pthread.h>
#include <stdint.h>
#include "dcast_common.h"
#include "dcast_names.h"
#include "dcast_wire.h"
#include "deltacast/codec.h"
#include "deltacast/producer.h"

#define PROD_ENDPOINT_MAX 512
#define PROD_KEY_LEN 40
#define PROD_BACKOFF_MAX_MS 2000u

/* One registered tensor (or shard). */
typedef struct prod_tensor {
	dcast_tensor_desc desc;  /* global name, dtype, shape */
	unsigned elem_size;
	uint64_t shard_off, shard_count; /* elements of the flat global tensor */
	const unsigned char *ptr;        /* caller's memory: shard_count elements */
	int mem;                         /* dcast_mem */
	int device;                      /* CUDA: the device ptr is on */
	int base_on_device;              /* CUDA: base is cudaMalloc'd (device.c) */
	unsigned char *base;             /* baseline of the shard (in the region) */
	uint32_t first_chunk, n_chunks;  /* chunk ranges of this shard */
} prod_tensor;

/* An encode buffer handed to ZeroMQ; back in the pool when ZeroMQ frees it
 * (from its I/O thread, hence the lock). */
typedef struct prod_slot {
	unsigned char *buf;
	struct prod_pool *pool;
	uint32_t next_free; /* free-list link, UINT32_MAX ends it */
} prod_slot;

typedef struct prod_pool {
	pthread_mutex_t lock;
	pthread_cond_t freed;
	prod_slot *slots;
	uint32_t n_slots, free_head, n_free;
	size_t slot_bytes;
} prod_pool;

/* How a published version ended: 0 acknowledged, else its error. */
typedef struct prod_outcome {
	uint64_t version;
	int err;
} prod_outcome;

#define PROD_HISTORY 64

/* One undo record; its payload copy and old values follow, 8-aligned. */
typedef struct prod_undo_rec {
	uint32_t tensor, chunk;
	uint64_t off_elems;     /* first element of the range within the shard */
	dcast_chunk_info info;
	uint64_t old_digest;
	uint64_t payload_len, old_len;
} prod_undo_rec;

/* Rollback log of the version in flight: for each delta chunk, what it
 * changed in the baseline (a copy of its payload and the old values), so a
 * failed version restores the last acknowledged state. */
typedef struct prod_undo {
	unsigned char *buf;
	size_t cap, used;
	uint32_t n_records;
	int lost;  /* a record did not fit: rollback impossible, send an anchor */
} prod_undo;

/* One chunk range of the version being published: encoded by a worker,
 * taken (recorded and sent) by the publishing thread in range order. */
typedef struct prod_job {
	prod_slot *slot;        /* payload, then the old values; NULL: nothing to send */
	dcast_chunk_info info;
	uint64_t digest;        /* of the range at this version (if it changed) */
	uint32_t tensor;
	int no_old;             /* changed on a device: no old values (device.c) */
	int done, rc;           /* under the encoder's lock */
	uint64_t run;           /* the encoder run that claimed it */
} prod_job;

/* Consecutive chunk ranges of CUDA tensors on one device, of one element
 * size, diffed and encoded at once by the first encoder of a run that
 * claims one of them (device.c); the others wait on the lock. */
typedef struct prod_dev_batch {
	pthread_mutex_t lock;
	struct dcast_cuda_ranges *ranges; /* NULL until first used */
	struct dcast_cuda_range *desc;    /* its n ranges, for the encode */
	uint32_t first, n;      /* chunks first .. first + n - 1 */
	uint64_t elems;
	int device;
	unsigned elem_size;
	uint64_t run;           /* the encoder run it was made for (0: none) */
	int held;               /* ranges holds that run's payloads, else range by range */
	int rc;                 /* its error in that run */
} prod_dev_batch;

/* What an encoder run does with each range. */
typedef enum prod_enc_mode {
	PROD_ENC_DELTA,    /* diff the tensor against the baseline, fold the change in */
	PROD_ENC_ANCHOR,   /* the tensor dense: payload, baseline copy, digest */
	PROD_ENC_SNAPSHOT, /* the tensor copied into the baseline; no payload, no digest */
	PROD_ENC_BASE      /* the baseline dense (a snapshot taken before): payload, digest */
} prod_enc_mode;

typedef struct prod_encoder {
	pthread_t *threads;
	uint32_t n_threads;
	int ready;              /* lock and conditions initialised */
	pthread_mutex_t lock;
	pthread_cond_t work_cv, done_cv;
	prod_job *jobs;         /* one per chunk range */
	uint64_t run;           /* bumped by every start: the workers' signal */
	uint32_t next, end;     /* next range to claim, end of this run */
	uint32_t busy;          /* workers inside the current run */
	int mode;               /* prod_enc_mode of this run */
	int abort, stop;
	int dev_moved;          /* a device batch moved a baseline this run (atomic) */
	int err;                /* the first error of this run, its detail */
	char err_text[DCAST_MAX_TEXT];
} prod_encoder;

/* The version being published, for dcast_producer_progress_get() from
 * another thread: each field written and read with __atomic builtins. */
typedef struct prod_progress {
	uint64_t version, ranges_done, ranges_total, bytes_sent, bytes_taken, bytes_total;
	uint64_t start_ms, end_ms, active, anchor;
	uint64_t err;          /* the version failed: its dcast_err, else 0 */
	uint64_t credit_from;  /* credit back (prod_credit_back) at the attempt's
				  start (this thread's own: not atomic) */
} prod_progress;

#define PROD_PROGRESS_SET(p, f, v) __atomic_store_n(&(p)->progress.f, (v), __ATOMIC_RELEASE)

/* One attempt at sending a version. */
typedef struct prod_run {
	uint64_t version, base_version;
	int anchor;
	int from_base;        /* an anchor sent from the baseline (a snapshot of the
				 tensors taken by publish()), not from the tensors */
	uint32_t gen, seq;
	uint64_t bytes, changed;
	uint64_t progress_ms; /* last time credit or a slot came back */
	uint64_t checked_ms;  /* last poll for the broker's messages between chunks */
} prod_run;

#define PROD_RESTART (-1)   /* the broker asked for an anchor mid-version */
#define PROD_POLL_MS 100
#define PROD_HANDSHAKE_DROPS 3u /* see conn.dropped_in_handshake */

typedef struct prod_conn {
	void *sock, *mon;       /* DEALER to the broker, PAIR of its monitor */
	int up;                 /* HELLO answered and not disconnected since */
	int manifest_sent;      /* on this connection */
	int auth_failed;        /* the monitor saw a handshake fail: the event */
	int handshaken;         /* ... or one succeed on this socket */
	unsigned dropped_in_handshake; /* connections closed before their handshake
					  ended: PROD_HANDSHAKE_DROPS of them in one
					  join mean a refusal (wrong server key, or a
					  broker that wants CURVE), not a restart */
	uint32_t generation;    /* bumped on every (re-)join */
	const char *drop_why;   /* up cleared by a call, not the socket: why (a
				   string literal, for the re-join's log); NULL: lost */
	uint64_t credit_granted, credit_used;
	uint64_t credit_window;  /* the first CREDIT after HELLO: the window; what
				    comes after it is credit back for stored chunks */
	uint64_t broker_version; /* newest committed, from WELCOME / ACK */
	uint64_t hb_version;     /* newest committed a HEARTBEAT named (ACKed or
				    still being made durable), or NONE */
	uint64_t hb_ms;          /* when that HEARTBEAT came */
	uint64_t run;            /* the broker's run of the model, from WELCOME */
	uint64_t anchor_version; /* the newest anchor in its log, from WELCOME */
	char consumers[DCAST_MAX_ENDPOINT + 1]; /* its consumer endpoint as bound,
						   from WELCOME; "" if not named */
	int need_anchor;
	uint32_t heartbeat_ms;
	uint64_t last_send_ms;
	/* An ERROR from the broker not yet consumed by a call. */
	int peer_err;
	uint64_t peer_err_version;
	char peer_err_text[DCAST_MAX_TEXT + 1];
} prod_conn;

/* The thread that sends an anchor after publish() returned (sender.c).
 * While it runs (started and not joined) it alone uses the connection, the
 * encoders, the pool, the undo log and the version's state; the caller's
 * thread joins it before any of those (publish, wait, flush, close) and
 * reads stats from `shown` meanwhile. */
typedef int (*prod_send_fn)(dcast_producer *p, prod_run *r);

typedef struct prod_sender {
	pthread_mutex_t lock;   /* guards done and shown against the caller's reads */
	pthread_cond_t done_cv;
	pthread_t thread;
	int ready;              /* lock and condition initialised */
	int running;            /* started and not joined */
	int done;               /* it has returned: join it */
	prod_send_fn send;
	prod_run run;           /* the version it sends */
	dcast_producer_stats shown; /* dcast_producer_stats_get() while it runs */
} prod_sender;

struct dcast_producer {
	void *zctx;
	char endpoint[PROD_ENDPOINT_MAX];
	char model[DCAST_MAX_NAME + 1];
	uint32_t part, parts;
	dcast_producer_opts opts;
	char client[DCAST_MAX_CLIENT + 1];
	char curve_server[PROD_KEY_LEN + 1], curve_public[PROD_KEY_LEN + 1],
		curve_secret[PROD_KEY_LEN + 1];
	prod_conn conn;

	prod_tensor *tensors;
	uint32_t n_tensors, cap_tensors;
	dcast_names names;       /* tensor name -> index in tensors */
	int frozen;              /* manifest fixed: first publish done */

	/* Allocated at the first publish. */
	unsigned char *base_region;
	size_t base_region_bytes;
	int base_registered;     /* with CUDA, for device tensors' kernels */
	int base_pinned;         /* mlock tried on it (prod_mem_pin) */
	uint64_t *chunk_digest;  /* per chunk range: digest of the baseline */
	uint64_t publish_ns;     /* the pending version's publish call (debug log) */
	prod_dev_batch *dev_batch; /* with CUDA tensors (device.c) */
	uint32_t n_dev_batches;
	struct dcast_cuda_range *dev_ranges; /* per chunk: the batches' range lists */
	uint32_t *chunk_batch;   /* per chunk: its batch, or UINT32_MAX */
	dcast_range_digest *commit_digests;
	uint32_t n_chunks;
	prod_pool pool;
	prod_undo undo;
	prod_encoder enc;
	uint32_t resume_from;    /* ranges below are encoded and recorded */

	int baseline_valid;      /* baseline holds acked_version */
	uint64_t base_fold;      /* debug tier (outcome.c): chunk_digest folded into one
				    value when the baseline last became valid */
	uint64_t acked_version;  /* newest acknowledged by the broker */
	uint64_t pending_version; /* committed-sent, awaiting ACK, or NONE */
	int pending_anchor;
	int commit_sent;         /* the pending version's COMMIT went out */
	int resend;              /* a re-join found the broker without the
				    pending version: send it again (wait()) */
	uint32_t resends;        /* of the pending version */
	uint64_t last_version;   /* newest version passed to publish */
	uint64_t failed_version; /* the last version that failed, its error */
	int failed_err;
	char failed_text[DCAST_MAX_TEXT + 64];
	prod_outcome history[PROD_HISTORY]; /* the latest settled versions */
	uint64_t n_history;
	dcast_producer_stats stats;
	prod_progress progress;
	prod_sender sender;
};

/* shared.c: below every other file here */
/* Elements of t's chunk range that starts at element off of its shard:
 * opts.range_elems, or what is left of the shard. */
uint64_t prod_range_count(const dcast_producer *p, const prod_tensor *t, uint64_t off);
/* Milliseconds since the pending version's publish call (debug lines). */
double prod_since_publish_ms(const dcast_producer *p);
/* 0 when the broker's tensor i (got) is registered tensor i: name, dtype,
 * shape, grid; else DCAST_ESHAPE naming the difference, `call` first. */
int prod_tensor_matches(const dcast_producer *p, uint32_t i, const dcast_tensor_desc *got,
			const char *call);
int prod_tensor_count_matches(const dcast_producer *p, uint32_t n, const char *call);

/* publish.c */
int prod_freeze(dcast_producer *p);

/* conn.c */
int prod_conn_curve(const dcast_producer *p, void *sock);
int prod_conn_join(dcast_producer *p);
int prod_conn_rejoin(dcast_producer *p, const char *why);
void prod_conn_close(dcast_producer *p, int send_bye);
int prod_conn_send(dcast_producer *p, const dcast_msg *m, zmq_msg_t *payload, uint64_t deadline_ms);
int prod_conn_poll(dcast_producer *p, int timeout_ms);
int prod_conn_take_error(dcast_producer *p, uint64_t version);

/* consumers.c */
/* The consumer endpoint a baseline call uses, into out[cap]: `given` when
 * not NULL, else the one the broker named in its WELCOME with a wildcard
 * host replaced by the producer endpoint's.  DCAST_EINVAL (given empty or
 * too long), DCAST_ENOTFOUND (none named), DCAST_ETOO_LARGE; `what` first. */
int prod_consumer_endpoint(const dcast_producer *p, const char *given, char *out, size_t cap,
			   const char *what);

/* memory.c */
int prod_mem_setup(dcast_producer *p);
void prod_mem_free(dcast_producer *p);
void prod_mem_pin(dcast_producer *p);
/* The baseline's pages faulted in, then pinned (dcast_producer_prepare). */
void prod_mem_prefault(dcast_producer *p);
int prod_pool_get(prod_pool *pool, uint64_t deadline_ms, prod_slot **out);
void prod_pool_free_cb(void *data, void *hint);
void prod_undo_reset(prod_undo *u);
void prod_undo_record(dcast_producer *p, uint32_t chunk, const prod_job *job);
void prod_undo_rollback(dcast_producer *p);
const prod_undo_rec *prod_undo_next(const prod_undo *u, size_t *at);
int prod_base_fill(dcast_producer *p, uint32_t i, const unsigned char *src);

/* device.c: CUDA tensors (compiled without CUDA: refused at register) */
int prod_dev_register(prod_tensor *t, const void *ptr);
void prod_dev_alloc(dcast_producer *p);
int prod_dev_map(dcast_producer *p);
void prod_dev_free(dcast_producer *p);
int prod_dev_encode(dcast_producer *p, const prod_tensor *t, int anchor, uint64_t off,
		    uint64_t count, prod_job *job);
int prod_base_read(const prod_tensor *t, uint64_t off, void *dst, size_t bytes);
int prod_base_write(prod_tensor *t, const void *src, size_t bytes);

/* encode.c */
int prod_enc_setup(dcast_producer *p);
void prod_enc_free(dcast_producer *p);
void prod_enc_start(dcast_producer *p, prod_enc_mode mode, uint32_t from);
int prod_enc_wait(dcast_producer *p, uint32_t j, int timeout_ms, prod_job **out);
uint32_t prod_enc_stop(dcast_producer *p);

/* sender.c */
int prod_sender_start(dcast_producer *p, const prod_run *r, prod_send_fn send);
int prod_sender_join(dcast_producer *p, int timeout_ms);
int prod_sender_shown(const dcast_producer *p, dcast_producer_stats *out);
void prod_sender_free(dcast_producer *p);

/* settle.c */
void prod_close_flush(dcast_producer *p);

/* send.c */
int prod_need_anchor(const dcast_producer *p);
void prod_init_run(dcast_producer *p, uint64_t version, int anchor, prod_run *r);
int prod_check_broker(dcast_producer *p, const prod_run *r, int timeout_ms);
int prod_send_slot(dcast_producer *p, prod_run *r, const prod_tensor *t, uint64_t off,
		   const dcast_chunk_info *info, prod_slot *slot);
int prod_send_manifest(dcast_producer *p);
int prod_send_commit(dcast_producer *p, const prod_run *r);
int prod_replay_records(dcast_producer *p, prod_run *r);
int prod_resend_pending(dcast_producer *p);

/* outcome.c: the pending version's end (ACK or failure), remembered */
void prod_version_acked(dcast_producer *p, uint64_t version);
void prod_version_failed(dcast_producer *p, int err, const char *why);
void prod_progress_end(dcast_producer *p);
void prod_progress_taken(dcast_producer *p);
/* An adopt (base_check.c, baseline.c) calls prod_baseline_dropped() before
 * its first prod_base_fill() and prod_baseline_adopted() after its last:
 * a baseline copied in part is never taken for a version. */
void prod_baseline_dropped(dcast_producer *p);
void prod_baseline_adopted(dcast_producer *p, uint64_t version);
uint64_t prod_credit_back(const dcast_producer *p);
int prod_fail_pending(dcast_producer *p, int rc);
void prod_stats_now(const dcast_producer *p, dcast_producer_stats *out);

#endif
