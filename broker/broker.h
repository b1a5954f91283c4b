/* Private to broker/: the deltacast-broker service.  One thread, one event
 * loop (loop.c) over the producer ROUTER, the consumer ROUTER, the upstream
 * DEALERs of a relay and a few extra fds; per model a log of committed
 * versions (log.c) filled by producer ingest (ingest.c) or by the relay
 * (relay.c) and streamed to consumers under credit (fanout.c).  The wire
 * contract is docs/protocol.md; the operator's view is docs/operations.md.
 *
 * Hook points for durability, folding, security and metrics are the
 * functions under "Hooks" below: each is one clearly named call site. */
#ifndef DCAST_BROKER_H
#define DCAST_BROKER_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <zmq.h>
#include "deltacast/err.h"
#include "deltacast/schema.h"
#include "dcast_bulkrx.h"
#include "dcast_common.h"
#include "dcast_slab.h"
#include "dcast_wire.h"

#define BROKER_MAX_MODELS 256
#define BROKER_MAX_UPSTREAM_MODELS 16
#define BROKER_BULK_CLIENTS 64  /* bulk connections at once (bulk.c) */
#define BROKER_BULK_THREADS_MAX 16 /* --bulk-threads (bulkpump.c) */
#define BROKER_MAX_EXTRA_FDS (34 + BROKER_BULK_CLIENTS + BROKER_MAX_UPSTREAM_MODELS) /* eventfds, local listeners and
							   clients (17 + 5), a signalfd, bulk */
#define BROKER_REFUSE_LOG_MAX 20 /* refusal log lines a second */
#define BROKER_MAX_RID 255
#define BROKER_BURST_MSGS 64   /* messages sent to one consumer per loop turn */
#define BROKER_RECV_BURST 256  /* messages read from one socket per loop turn */

/* ---- configuration (config.c: one table row per flag) ---- */
#define BROKER_CONFIG_OWNED 256 /* --config lines kept */

struct broker_config {
	const char *producers;      /* --producers ENDPOINT (required) */
	const char *consumers;      /* --consumers ENDPOINT (required) */
	const char *data_dir;       /* --data-dir DIR */
	const char *upstream;       /* --upstream ENDPOINT: relay */
	const char *upstream_models[BROKER_MAX_UPSTREAM_MODELS]; /* --upstream-model */
	uint32_t n_upstream_models;
	const char *log_level;      /* --log-level error|warn|info|debug */
	uint64_t retain_versions;   /* --retain-versions: log entries per model */
	uint64_t retain_bytes;      /* --retain-bytes: payload bytes per model log */
	uint64_t max_pending_bytes; /* --max-pending-bytes: one open version */
	uint64_t max_pending_total_bytes; /* --max-pending-total-bytes: all open versions
					     (0 in the flags: a quarter of physical memory) */
	uint64_t producer_window_bytes; /* --producer-window-bytes */
	uint64_t upstream_window_bytes; /* --upstream-window-bytes */
	uint64_t consumer_sndbuf_bytes; /* --consumer-sndbuf-bytes: SO_SNDBUF per consumer (io.c) */
	uint64_t part_timeout_ms;   /* --part-timeout-ms */
	uint64_t heartbeat_ms;      /* --heartbeat-ms */
	uint64_t io_threads;        /* --io-threads: ZeroMQ I/O threads */
	uint64_t max_consumers;     /* --max-consumers */
	uint64_t max_producers;     /* --max-producers */
	uint64_t max_models;        /* --max-models */
	/* Other broker features add their fields here (one line each). */
	const char *curve_secret, *producer_keys, *consumer_keys, *metrics;
	const char *upstream_curve_secret, *upstream_server_key; /* the relay's CURVE client (auth.c) */
	const char *anchor_fraction; uint64_t anchor_every; /* broker-made anchors (fold.c) */
	int no_anchor_deltas;       /* --no-anchor-deltas: producer anchors go whole */
	uint64_t anchor_delta_max_ms; /* --anchor-delta-max-ms: a made delta's deadline (folddelta.c; 0 none) */
	uint64_t fault_slowdisk_ms; /* DELTACAST_BROKER_FAULT=slowdisk:MS (tests; durable.c) */
	int fault_nomap;            /* DELTACAST_BROKER_FAULT=nomap (tests; ondisk.c) */
	uint64_t fault_relay_bulk_cut; /* DELTACAST_BROKER_FAULT=relay_bulk_cut:K (tests; relaybulk.c) */
	uint64_t fault_bulk_ref_off;   /* DELTACAST_BROKER_FAULT=bulk_ref_off:BYTES (tests; bulk.c) */
	int fault_bulk_noproc;         /* DELTACAST_BROKER_FAULT=bulk_noproc (tests; bulk.c) */
	uint64_t fault_relay_bulk_hold_ms; /* DELTACAST_BROKER_FAULT=relay_bulk_hold:MS (tests) */
	uint64_t fault_slowfold_ms;    /* DELTACAST_BROKER_FAULT=slowfold:MS (tests; folddelta.c) */
	uint64_t model_idle_s;      /* --model-idle-s: an idle model is removed (retire.c; 0 never) */
	uint64_t read_cache_bytes;  /* --read-cache-bytes: frames read from disk shared (ondisk.c) */
	const char *admin_socket;   /* --admin-socket PATH: operator requests (admin.c) */
	int upstream_no_bulk;       /* --upstream-no-bulk: anchors from --upstream over ZeroMQ only */
	int cut_through;            /* --cut-through: an open version's chunks go to consumers as
				       they are accepted (ingest.c, fanout.c) */
	const char *bulk;           /* --bulk HOST:PORT: anchors over plain TCP (bulk.c) */
	const char *bulk_send;      /* --bulk-send auto | sendfile | copy (bulk.c) */
	int bulk_no_local;          /* --bulk-no-local: no unix listener for consumers on this host (bulk.c) */
	uint64_t bulk_threads;      /* --bulk-threads: threads that write bulk transfers (bulkpump.c) */
	char *owned[BROKER_CONFIG_OWNED]; /* strings read from a --config file */
	unsigned n_owned;
};

#define BROKER_CONFIG_HELP (-1)
#define BROKER_CONFIG_VERSION (-2)
/* Parse argv (and --config FILE) into cfg, after setting defaults, and
 * DELTACAST_BROKER_FAULT from the environment (read once, here).  Returns
 * 0, BROKER_CONFIG_HELP when --help was asked for, BROKER_CONFIG_VERSION
 * for --version, or a dcast_err with a detail
 * naming the flag or config line.  Strings point into argv or into storage
 * owned by cfg until broker_config_free(cfg) (struct broker keeps a copy
 * of the pointers: free after broker_close). */
int broker_config_parse(struct broker_config *cfg, int argc, char **argv);
/* Check cross-flag rules (a feature enabled without its setting). */
int broker_config_check(const struct broker_config *cfg);
void broker_config_free(struct broker_config *cfg);
void broker_config_usage(FILE *to);

/* ---- the log ---- */

/* A manifest shared by every version sent under it.  Refcounted. */
struct broker_manifest {
	unsigned refs;
	dcast_manifest m;  /* owns m.tensors */
	void *enc;         /* encoded MANIFEST header, for comparing and sending */
	size_t enc_len;
};

/* A segment file that committed payloads are read from (--data-dir,
 * ondisk.c): a read-only handle of its own, so a segment deleted when a
 * newer anchor superseded it stays readable to the versions that still
 * point into it.  Refcounted on the loop's thread: every chunk served from
 * it and every durable job copying from it holds one. */
struct broker_segfile {
	unsigned refs;
	int fd;
	uint64_t dev, ino;
};

/* One stored chunk: the header frame as consumers get it (part 0, seq = its
 * index in the version) and its payload, in one of two places.  In memory
 * (file NULL): the payload frame as it arrived, sent with zmq_msg_copy, so
 * every consumer shares the one payload.  On disk (file set, payload an
 * empty message): payload_len bytes at file_off of a segment file, read
 * when a consumer's credit lets it go (ondisk.c); with --data-dir a
 * version's payloads move there once its records are durable.
 * payload_sum is dcast_checksum() of the payload, computed once where the
 * chunk enters (checked on ingest, made by a fold, read back from disk) and
 * handed to the durable record, which would otherwise hash it again. */
struct broker_chunk {
	zmq_msg_t hdr, payload;
	uint64_t payload_sum;
	uint64_t payload_len;          /* bytes, wherever they are */
	struct broker_segfile *file;   /* reference; NULL: in memory */
	uint64_t file_off;
	uint32_t cache_slot;           /* its frame in the read cache (ondisk.c); 0: none */
};

/* A committed version.  Refcounted: the log holds one reference and every
 * consumer streaming it one more, so dropping it from the log never pulls
 * it from under a consumer mid-stream.  With --cut-through the version is
 * made when its first chunk is accepted (open set: chunks are appended as
 * they are accepted, numbered in that order, and no COMMIT frame exists
 * yet) and becomes the committed one, the same object, at its COMMIT. */
struct broker_version {
	unsigned refs;
	uint64_t version, base_version; /* base NONE for an anchor */
	int anchor;
	int open;                       /* --cut-through: not committed yet (ingest.c) */
	uint32_t n_chunks, cap_chunks;  /* cap_chunks: slots of chunks (an open version grows) */
	struct broker_chunk *chunks;
	uint64_t payload_bytes;
	zmq_msg_t commit_hdr;           /* COMMIT(part 0 of 1) for consumers */
	uint32_t n_digests;
	dcast_range_digest *digests;    /* every part's, owned */
	struct broker_manifest *manifest; /* reference */
	uint64_t mem_bytes;             /* broker_version_mem(), set as it enters the log */
};

/* A chunk of an open version, before it is numbered for consumers.  With
 * --data-dir its payload is in the version's spill file (file set, payload
 * empty) rather than in memory. */
struct broker_pending_chunk {
	dcast_chunk c;
	zmq_msg_t payload;
	uint64_t payload_sum; /* checked against c.checksum on ingest */
	struct broker_segfile *file; /* reference, or NULL: payload */
	uint64_t file_off;
};

struct broker_part {
	int seen, committed;
	uint64_t *seq_seen;          /* --cut-through: bitmap of the seqs accepted (duplicates
					are dropped as they arrive), NULL until the first */
	uint32_t seq_bits;           /* bits of seq_seen */
	uint64_t last_ms;            /* last progress (chunk or commit) */
	uint32_t n, cap;
	struct broker_pending_chunk *chunks;
	uint64_t bytes;
	uint32_t n_digests;
	dcast_range_digest *digests; /* from its COMMIT, owned */
};

/* A version whose parts are still arriving: invisible to consumers. */
struct broker_pending {
	uint64_t version, base_version;
	int anchor;
	uint32_t parts, n_committed;
	uint64_t mem_bytes;               /* held in memory: payloads, chunk slots, digests */
	uint64_t created_ms;
	struct broker_manifest *manifest; /* reference: chunks checked against it */
	struct broker_part *part;         /* [parts] */
	struct broker_segfile *spill;     /* --data-dir: its payloads as they arrive (ondisk.c),
					     a reference; NULL until the first */
	uint64_t spill_end;
	struct broker_version *cut;       /* --cut-through: its chunks in acceptance order, as
					     consumers get them (open set), a reference; it is
					     the version that enters the log at commit */
};

struct broker_model {
	char name[DCAST_MAX_NAME + 1];
	struct broker_manifest *manifest; /* current; NULL until one arrives */
	struct broker_version **log;      /* [0] the newest anchor, then deltas */
	uint32_t n_log, cap_log;
	uint64_t log_bytes;               /* sum of the versions' mem_bytes (--retain-bytes) */
	int need_anchor;                  /* next version must be an anchor */
	uint64_t run;                     /* run identity (broker/run.c); 0 only for a relayed
					     model before its upstream's WELCOME */
	uint64_t clears;                  /* broker_model_clear calls: a durable job queued
					     before the last one skips its completion */
	int relayed;                      /* filled from --upstream, not producers */
	int held;                         /* relayed, its log restored from --data-dir and not yet
					     matched against its upstream's run: none of it is
					     served or announced (relay.c) */
	struct broker_pending *pending;   /* at most one open version */
	uint64_t versions_committed, versions_aborted;
	struct broker_fold *fold;         /* broker-made anchors (fold.c), NULL if off */
	uint64_t durable_version;         /* newest ACKed on its durable completion (--data-dir) */
	uint64_t lost_version;            /* newest version lost from a damaged segment that was
					     whole on disk (maybe ACKed): no version at or below
					     it is taken again; NONE if none (durable.c) */
	uint64_t poisoned;                /* the oldest version in the log that the fold found bad
					     (commit.c): it and every version after it are never
					     served nor folded; NONE if none.  An anchor clears it */
	struct broker_version **tail;     /* deltas restored past a damaged segment record
					     (durable.c), each on the one before, the first
					     on a lost version: served only to consumers that
					     hold what they build on, until the next anchor */
	uint32_t n_tail;
	uint64_t active_ms;               /* last time a peer was on it (retire.c: --model-idle-s) */
	struct broker_segfile *segfile;   /* read handle of the newest segment payloads moved to
					     (--data-dir; ondisk.c), a reference; NULL if none */
	int deleting;                     /* removed: out of the table, its files being deleted
					     by the durable writer, which then frees it (retire.c) */
	struct dcast_slab_pool slab;      /* the log's payloads kept in memory (ingest.c) */
};

/* ---- peers ---- */
struct broker_peer {
	int used;
	uint8_t rid[BROKER_MAX_RID];
	size_t rid_len;
	int role;                    /* dcast_role */
	struct broker_model *model;
	char client[DCAST_MAX_CLIENT + 1];
	uint64_t last_recv_ms, last_send_ms;
	/* producer */
	uint32_t part, parts;
	int manifest_ok;
	uint64_t credit_owed;        /* bytes stored, not yet granted back */
	/* consumer */
	char want[DCAST_MAX_NAME + 1]; /* the model its HELLO named; model stays NULL until a
					  producer creates it (consumers take no model slot) */
	uint64_t credit_bytes, sent_bytes; /* granted in total, payload sent */
	uint64_t window_bytes;       /* HELLO.window_bytes: no chunk larger can ever go */
	uint64_t too_large_told;     /* version whose oversized chunk was reported, or 0 */
	uint64_t have_version;       /* newest version whose COMMIT went out */
	uint64_t acked_version;      /* newest the consumer says it applied */
	struct broker_version *cur;  /* streaming this one (reference) */
	uint32_t next_chunk;         /* next chunk of cur; n_chunks: COMMIT next */
	struct broker_manifest *manifest_sent; /* reference */
	int blocked;                 /* pipe full on the last send */
	int welcome_due;             /* HELLO answered by the next send */
	int abort_due;               /* ERROR(DCAST_EABORTED, abort_version) is sent next */
	int poison_due;              /* HELLO named a version: ERROR(DCAST_EPOISONED) after the
					WELCOME if the model poisoned it or one before it */
	uint64_t abort_version;      /* an open version it was sent chunks of, aborted */
	int bulk_ok;                 /* HELLO x-bulk: it takes anchors over --bulk */
	uint64_t bulk_token;         /* cur offered over --bulk (BULK sent): its stream waits
					for the transfer (bulk.c); 0: none */
	int bulk_taken;              /* a connection named bulk_token */
};

/* A table of peers: cap slots, found by routing id through an index.
 * Slots [hi, cap) are all free, so loops over peers stop at hi. */
struct broker_peers {
	struct broker_peer *arr;     /* [cap] */
	uint64_t cap, n, hi;         /* slots, slots in use, 1 + highest in use */
	uint32_t *index;             /* [mask + 1]: slot + 1, 0 empty */
	uint64_t mask;
};

struct broker_upstream {
	void *sock;
	void *mon;                   /* PAIR on sock's monitor: handshake outcomes */
	int handshaken, failed;      /* the current connection's handshake succeeded / failed */
	uint32_t refusals;           /* connections refused since the last handshake */
	uint64_t refused_log_ms;     /* the last E line about them, 0: none since */
	uint32_t generation;         /* sockets made so far (monitor addresses) */
	struct broker_model *model;
	uint64_t last_recv_ms, last_send_ms, hello_ms;
	uint64_t credit_owed;
	int joined;
	uint64_t kept_run;           /* the upstream run its restored log was relayed from
					(the data dir's run file), 0 if none was kept */
	dcast_bulkrx bulk;           /* an anchor coming over the upstream's --bulk (relaybulk.c) */
	struct sockaddr_storage bulk_addr; /* the upstream's host, resolved at open */
	socklen_t bulk_addr_len;     /* 0: no bulk (--upstream-no-bulk, CURVE, not tcp://) */
	int bulk_off;                /* a transfer failed: none asked for until a COMMIT over ZeroMQ */
	uint64_t bulk_last_ms;       /* bytes last moved on the connection */
	uint64_t bulk_held_until;    /* test fault relay_bulk_hold: no frame read before, 0: none */
};

/* Kept up to date by the core; read by metrics and status. */
struct broker_stats {
	uint64_t versions_committed, versions_aborted;
	uint64_t chunks_in, bytes_in;    /* payload stored from producers / upstream */
	uint64_t chunks_out, bytes_out;  /* payload sent to consumers */
	uint32_t producers_connected, consumers_connected;
	uint64_t errors[DCAST_ERR_COUNT]; /* inbound messages refused, by code */
	uint64_t peers_timed_out;
	uint64_t consumer_joins;         /* consumer HELLOs taken: joins and re-joins */
	uint64_t anchors_made, anchor_digest_errors; /* broker-made anchors (fold.c) */
	uint64_t anchor_deltas, anchor_deltas_failed; /* producer anchors made into deltas (fold.c) */
	uint64_t anchor_delta_bytes_saved;  /* the anchors' bytes less their deltas' */
	uint64_t versions_poisoned;      /* committed versions the fold found bad (commit.c) */
	uint64_t durable_failures;       /* versions that did not become durable */
	uint64_t loop_stall_max_ns;      /* longest loop turn spent on durable work */
	uint64_t heap_trims, heap_trim_max_ns; /* malloc_trim on quiet turns (log.c) */
	uint64_t models_expired, models_deleted; /* models removed (retire.c) */
	uint64_t versions_to_disk;       /* versions whose payloads left the heap (ondisk.c) */
	uint64_t cut_through_chunks;     /* chunks sent before their version's COMMIT (fanout.c) */
	uint64_t cut_through_aborted;    /* aborted versions some of whose chunks had gone out */
	uint64_t bulk_versions, bulk_bytes; /* anchors sent over bulk connections, their bytes */
	uint64_t bulk_sendfile_bytes;       /* of bulk_bytes, payload bytes sent with sendfile(2) */
	uint64_t bulk_local_bytes;          /* payload bytes passed by reference to a file (local) */
	uint64_t bulk_thread_bytes[BROKER_BULK_THREADS_MAX]; /* of bulk_bytes, each thread's */
	uint64_t relay_bulk_versions, relay_bulk_bytes; /* anchors the relay took over its
						  upstream's --bulk, their payload bytes */
	uint64_t relay_bulk_failures;       /* such transfers that failed (re-joined over ZeroMQ) */
};

struct broker;
typedef void (*broker_fd_fn)(struct broker *b, int fd, void *arg);

/* ---- io.c: the I/O primitives under everything that sends or waits ---- */
/* Add an fd to the poll set for ZMQ_POLLIN (eventfds, local listeners and
 * clients, a signalfd); fn runs when it is ready for its events or has an
 * error.  fn may add and remove fds.  Errors: DCAST_EBUSY (the set is full). */
int broker_poll_add(struct broker *b, int fd, broker_fd_fn fn, void *arg);
/* Poll fd for these events instead (ZMQ_POLLIN, ZMQ_POLLOUT or both). */
void broker_poll_events(struct broker *b, int fd, short events);
/* Take fd out of the poll set, before closing it.  No-op if absent. */
void broker_poll_del(struct broker *b, int fd);
/* Run the callbacks of the extra fds that it[0..n) says are ready (loop.c). */
void broker_poll_dispatch(struct broker *b, const zmq_pollitem_t *it, uint32_t n);
/* Refuse an inbound message: count it by code, log it (at most
 * BROKER_REFUSE_LOG_MAX lines a second: a dropped producer's in-flight
 * chunks would log one line each) and send ERROR back, every time. */
void broker_refuse(struct broker *b, void *sock, const zmq_msg_t *rid, int code,
		   const char *model, uint64_t version);
/* A message other than HELLO from a peer that has not sent one on sock:
 * refused with DCAST_ESTATE, or, a BYE, dropped without an answer. */
void broker_refuse_unjoined(struct broker *b, void *sock, const dcast_wire_in *in);
/* Once a second (the timer turn): close the refusal log's window, saying
 * how many refusals it left out. */
void broker_refuse_log_roll(struct broker *b, uint64_t now);
/* Send a header built from `m` to a peer (best effort, never blocks). */
int broker_send_msg(struct broker *b, void *sock, struct broker_peer *p, const dcast_msg *m);
/* Encode m into *out (uninitialised; a header frame kept in the log, owning
 * the bytes).  Errors: the encoder's, DCAST_EZMQ; *out is then untouched. */
int broker_frame_encode(const dcast_msg *m, zmq_msg_t *out);
/* v's COMMIT for consumers (part 0 of 1: its version, base, chunks,
 * bytes and digests, model named) into v->commit_hdr (initialised; what
 * it held is closed).  Errors: broker_frame_encode's; the frame is then
 * empty. */
int broker_commit_frame(struct broker_version *v, const char *model);
/* Options of every ROUTER before bind (which: "producers"/"consumers") and
 * upstream DEALER before connect ("upstream"): CURVE (auth.c) among them,
 * and on "consumers" --consumer-sndbuf-bytes (ZMQ_SNDBUF, which
 * broker_bind's own listeners copy).  Errors: DCAST_EZMQ, named. */
int broker_socket_setup(struct broker *b, void *sock, const char *which);

/* Bind sock (a ROUTER) to endpoint: a TCP endpoint of an IPv4 address or
 * "*" once per ZeroMQ I/O thread, each listener's connections on its own
 * thread (listen.c), with sock's ZMQ_SNDBUF as ZeroMQ's own listeners get
 * it; any other endpoint as ZeroMQ binds it.  Returns 0, or
 * DCAST_EZMQ naming the flag (which), the endpoint and the reason (the
 * port held by anything else, a bad address). */
int broker_bind(struct broker *b, void *sock, const char *endpoint, const char *which);

/* ---- where a committed version's outcome goes ----
 * A version came from producer parts (ingest.c) or from the upstream
 * (relay.c, m->relayed); each registers at open how it is told that a
 * version it committed is acknowledged (durable, or at once without a
 * data dir), lost (its write failed) or poisoned (the fold found it bad;
 * text names it and why).  Durability and ingest report through
 * broker_version_ack / broker_version_lost below, and poison.c through
 * `poisoned`, so none names the other; a NULL hook: nobody to tell. */
struct broker_outcome {
	void (*acked)(struct broker *b, struct broker_model *m, uint64_t version);
	void (*lost)(struct broker *b, struct broker_model *m, uint64_t version, const char *why);
	void (*poisoned)(struct broker *b, struct broker_model *m, uint64_t version,
			 const char *text);
};

/* ---- clients.c: bounded local clients of one listener ----
 * The metrics page and the admin socket each accept a few non-blocking
 * clients into the loop's poll set; every client has a slot (a struct
 * that begins with struct broker_client), a deadline from accept, and is
 * closed when its time is up, checked on each readiness and on the timer
 * turn.  A client beyond the slots is closed as soon as accepted. */
struct broker_client {
	int used, fd;
	int busy;                     /* another thread writes fd: out of the poll set, no
					 deadline here, never closed (bulk.c) */
	uint64_t deadline_ms;
};

struct broker_clients {
	const char *what;             /* for logs: "metrics", "admin" */
	int listen_fd;                /* -1: not listening */
	uint32_t cap, burst;          /* slots; accepts per listener readiness */
	size_t slot_bytes;            /* each slot begins with struct broker_client */
	uint64_t client_ms;           /* accept to close */
	unsigned char *slots;         /* cap * slot_bytes, owned */
	broker_fd_fn on_client;       /* readiness of a client fd; arg: its slot */
	/* After a slot is taken for fd (fields past the base zeroed); may be NULL. */
	void (*on_accept)(struct broker *b, struct broker_client *c);
	/* Before a slot is cleared: release what it owns; may be NULL. */
	void (*on_free)(struct broker_client *c);
};

struct broker {
	struct broker_config cfg;
	void *ctx, *producers, *consumers;
	/* The consumer endpoint as bound (ZMQ_LAST_ENDPOINT), named to
	 * producers in WELCOME.x-consumers; "" where it breaks that field's rule. */
	char consumers_bound[DCAST_MAX_ENDPOINT + 1];
	volatile int stop;             /* broker_run returns at the next turn */
	struct broker_model *models[BROKER_MAX_MODELS];
	uint32_t n_models;
	struct broker_peers prod, cons; /* max_producers, max_consumers slots */
	struct broker_upstream up[BROKER_MAX_UPSTREAM_MODELS];
	uint32_t n_up;
	struct {
		int fd;
		short events; /* ZMQ_POLLIN and/or ZMQ_POLLOUT */
		broker_fd_fn fn;
		void *arg;
	} extra[BROKER_MAX_EXTRA_FDS];
	uint32_t n_extra;
	int fanout_more;   /* a consumer has more to send now */
	int fanout_blocked; /* a consumer's pipe was full */
	uint64_t last_timer_ms;
	uint64_t trim_ms, trim_seen; /* the last heap trim: when, and at which log change */
	/* This timer turn came more than a heartbeat late (the loop was busy):
	 * heartbeats go out, but no peer or part is judged silent. */
	int late_turn;
	struct broker_stats stats;
	uint64_t pending_total_bytes; /* payload of every model's open version (ingest.c) */
	/* Refusal log lines: at most BROKER_REFUSE_LOG_MAX a second, the rest
	 * counted and summed up in one line when the second is over. */
	uint64_t refuse_window_ms;
	uint32_t refuse_logged, refuse_quiet;
	struct broker_outcome outcome[2]; /* [m->relayed]: ingest.c, relay.c */
	struct broker_auth *auth;     /* CURVE and the ZAP handler (auth.c); NULL: off */
	struct broker_durable *dur;   /* --data-dir: the writer thread (durable.c); NULL: off */
	struct broker_clients metrics_clients, admin_clients, bulk_clients, bulk_local_clients;
	uint16_t bulk_port;           /* --bulk: the port bound; 0: off */
	struct bulk_pumps *bulk_pumps; /* --bulk: the threads that write transfers (bulkpump.c) */
	uint32_t bulk_threads;        /* how many */
	struct broker_watch {         /* accept failures of a listener (limits.c) */
		void *mon;            /* its socket monitor */
		const char *which;
		uint64_t failures, logged_ms, unlogged;
	} watch[2];
	unsigned n_watch;
	struct {                      /* broker-made anchors (fold.c) */
		int efd;              /* work queued; -1: folding off */
		double fraction;      /* --anchor-fraction */
		uint64_t every;       /* --anchor-every */
		int deltas;           /* producer anchors made into deltas (no --no-anchor-deltas) */
	} fold;
	char *metrics_page;           /* the response buffer (metrics.c) */
	char admin_path[108];         /* the socket file to unlink at close (admin.c) */
};

/* Take over listen_fd (non-blocking, listening): allocate t's slots and
 * add the listener to the poll set.  On error listen_fd is closed.
 * Errors: DCAST_ENOMEM, those of broker_poll_add. */
int broker_clients_start(struct broker *b, struct broker_clients *t, int listen_fd);
/* A non-blocking TCP listener on addr ("IPv4:PORT"; port 0 picks a free
 * one, then in *port if port is not NULL), SO_REUSEADDR, backlog 64.
 * Returns its fd, or a negative dcast_err: DCAST_EINVAL (addr, naming
 * flag), DCAST_EIO (socket, bind or listen refused, with the reason). */
int broker_tcp_listen(const char *flag, const char *addr, uint16_t *port);
/* The address a socket is bound to, "IPv4:PORT", and its port. */
struct broker_addr {
	char text[32];
	uint16_t port;
};
struct broker_addr broker_tcp_bound(int fd);
/* A thread count flag's value: n, or for 0 half the CPUs, at least 2 and
 * at most 8 (--io-threads, --bulk-threads). */
uint64_t broker_threads_auto(uint64_t n);
/* Close client c of t (not busy) and clear its slot. */
void broker_clients_close(struct broker *b, struct broker_clients *t, struct broker_client *c);
/* Slot i (< t->cap) of a started t, used or not. */
struct broker_client *broker_clients_slot(const struct broker_clients *t, uint32_t i);
/* Close t's clients past their deadline (busy ones keep theirs elsewhere). */
void broker_clients_timers(struct broker *b, struct broker_clients *t, uint64_t now_ms);
/* Close every client and the listener, free the slots.  Safe when t never
 * started. */
void broker_clients_stop(struct broker *b, struct broker_clients *t);

/* ---- loop.c ---- */
/* 1 when a peer or part last heard from at `last` has been silent past
 * `limit` ms at `now`; never on a late turn (the silence may be the loop's
 * own: what was sent meanwhile is still queued). */
static inline int broker_silent(const struct broker *b, uint64_t now, uint64_t last,
				uint64_t limit)
{
	return !b->late_turn && now - last > limit;
}
int broker_open(struct broker *b, const struct broker_config *cfg);
int broker_run(struct broker *b);
void broker_close(struct broker *b);
/* Set up an empty table of cap slots (broker/peers.c).  Errors:
 * DCAST_ENOMEM (nothing left allocated). */
int broker_peers_init(struct broker_peers *s, uint64_t cap);
/* Release every peer's references and the table's memory; s is left empty.
 * Safe on a table that init failed on or never saw. */
void broker_peers_free(struct broker_peers *s);
/* The peer of a routing id, found through the index; with create, the
 * lowest free slot set up for it (used, rid, all else 0).  NULL when not
 * found and not created: a routing id over BROKER_MAX_RID, or every slot
 * taken (DCAST_EBUSY set). */
struct broker_peer *broker_peer_find(struct broker_peers *s, const zmq_msg_t *rid, int create);
/* Release p's references (the version it streams, the manifest last sent)
 * and restart its stream; p stays in its table. */
void broker_peer_reset(struct broker_peer *p);
/* Drop p from s: its references released (broker_peer_reset), its slot
 * zeroed and free again.  No-op on a free slot. */
void broker_peer_forget(struct broker_peers *s, struct broker_peer *p);

/* ---- log.c ---- */
/* One allocation's cost beyond its bytes: the allocator's header plus
 * ZeroMQ's content block of a kept message (the caps count
 * what a message costs in memory, not its payload). */
#define BROKER_ALLOC_BYTES 64
/* What a committed version holds in memory: the struct, per chunk its
 * broker_chunk (two zmq_msg_t), header frame and payload with their
 * allocations, the COMMIT frame and the digests.  --retain-bytes counts it;
 * a payload served from its segment (ondisk.c) counts all the same, so the
 * cap bounds the log on disk as it does in memory. */
uint64_t broker_version_mem(const struct broker_version *v);
struct broker_model *broker_model_get(struct broker *b, const char *name, int create);

/* run.c: a model's run identity (set at creation by broker_model_get, not
 * kept; the creator keeps or restores it).  broker_run_new: a random non-zero id.
 * broker_run_save: keep m->run in the data dir (if any; a failure is
 * logged, not fatal).  broker_run_restore: m->run from the data dir, or
 * keep the new one and save it. */
uint64_t broker_run_new(void);
void broker_run_save(const struct broker *b, const struct broker_model *m);
void broker_run_restore(const struct broker *b, struct broker_model *m);
/* broker_run_load: the run kept for m in the data dir into *run (0 on an
 * error).  Errors: DCAST_ENOTFOUND (no data dir or no run file: the detail
 * names it), DCAST_EIO, DCAST_ECORRUPT (dcast_runfile_load). */
int broker_run_load(const struct broker *b, const struct broker_model *m, uint64_t *run);
/* broker_run_forget: delete m's run file from the data dir (if any), so a
 * model created again under the name starts a new run (retire.c). */
void broker_run_forget(const struct broker *b, const struct broker_model *m);
void broker_model_free(struct broker_model *m);
struct broker_manifest *broker_manifest_new(dcast_manifest *m); /* takes m->tensors */
void broker_manifest_put(struct broker_manifest *mf);
void broker_version_put(struct broker_version *v);
uint64_t broker_model_newest(const struct broker_model *m); /* NONE if empty */
/* Give the heap's free memory back to the system (malloc_trim) on a quiet
 * timer turn after the log changed (a commit, an abort, a made anchor), at
 * most once a second: what retired versions and consumed messages freed
 * stays in glibc's heap otherwise (10-30 MB of a 116 MB log). */
void broker_heap_trim(struct broker *b, uint64_t now_ms);
/* 1 while the log changed since the last trim (a trim is due). */
int broker_heap_trim_due(const struct broker *b);
/* The newest version consumers are told of: NONE while m is held (a relay's
 * restored log whose run is not yet confirmed), else broker_model_newest. */
uint64_t broker_model_offered(const struct broker_model *m);
/* A WELCOME for model m into w: its newest version, its log's anchor (NONE
 * if empty) and the broker's heartbeat; need_anchor left 0. */
void broker_welcome_init(const struct broker *b, const struct broker_model *m, dcast_msg *w);
/* broker_welcome_init, for a producer: naming the consumer endpoint
 * (WELCOME.x-consumers), where a new producer process fetches its baseline. */
void broker_welcome_producer_init(const struct broker *b, const struct broker_model *m,
				  dcast_msg *w);
/* Append a committed version to the model's log (an anchor replaces what
 * came before).  Takes the caller's reference on success only.  Errors:
 * DCAST_EVERSION (not above the newest, or a delta not on it),
 * DCAST_ENOMEM; the log is unchanged then. */
int broker_log_append(struct broker *b, struct broker_model *m, struct broker_version *v);
/* 1 when v may be streamed to consumers: below the model's first
 * poisoned version (m->poisoned), if any. */
int broker_version_servable(const struct broker_model *m, const struct broker_version *v);
/* Keep v (the caller's reference) at the end of the model's tail: deltas
 * past a damaged segment record, above the log's newest, each on the one
 * before.  Errors: DCAST_EVERSION (v does not chain: nothing kept),
 * DCAST_ENOMEM. */
int broker_log_tail_append(struct broker_model *m, struct broker_version *v);
/* The tail's version to stream after `have` (the version the tail's first
 * builds on, or one of the tail's), or NULL. */
struct broker_version *broker_log_tail_next(const struct broker_model *m, uint64_t have);
/* Drop the tail (an anchor covers it now, or the model is emptied). */
void broker_log_tail_clear(struct broker_model *m);
/* Empty the model's log and its tail (an anchor replaces them, or the
 * model is emptied): each version's log reference put (a consumer
 * mid-stream keeps its own), log_bytes 0.  The array stays allocated. */
void broker_log_clear(struct broker_model *m);
/* Index of `version` in the log, -1 if absent. */
int broker_log_find(const struct broker_model *m, uint64_t version);
/* Put a broker-made anchor (fold.c) at the head of the log in place of the
 * delta of the same version and everything before it.  Takes the caller's
 * reference of `anchor`; each removed version's reference goes to
 * keep(arg, v) in log order (NULL: put).  Errors: DCAST_EVERSION when the
 * anchor's version is not a delta in the log (nothing changed then). */
int broker_log_replace_anchor(struct broker *b, struct broker_model *m,
			      struct broker_version *anchor,
			      void (*keep)(void *arg, struct broker_version *v), void *arg);
/* Ask the model's producers for an anchor: need_anchor set, WELCOME with
 * need_anchor to each (log.c; retention and a lost durable write). */
void broker_log_need_anchor(struct broker *b, struct broker_model *m);

/* ---- ondisk.c: committed payloads served from the segment files ---- */
/* At most this many payload bytes read from segment files and not yet sent
 * (held by ZeroMQ's queues), over all consumers; a consumer waits past it,
 * unless what it has been sent and not yet credited back is under
 * BROKER_DISK_FLOOR_BYTES: so a slow consumer's queued frames never stall
 * the others (each keeps a floor of its own), and a chunk larger than
 * either still goes. */
#define BROKER_DISK_INFLIGHT_BYTES (64ull << 20)
#define BROKER_DISK_FLOOR_BYTES (4ull << 20)
/* A segment file handle over fd (the caller's, taken on success and on
 * failure): one reference.  NULL (fd closed) with DCAST_EIO (fstat) or
 * DCAST_ENOMEM set. */
struct broker_segfile *broker_segfile_new(int fd);
/* *cur when it is the file fd is open on (closes fd), else a new handle
 * over fd that replaces *cur (whose reference is put).  Returns a new
 * reference for the caller, or NULL as broker_segfile_new. */
struct broker_segfile *broker_segfile_share(struct broker_segfile **cur, int fd);
/* Drop one reference; the last closes the file (broker_file_close).
 * NULL-safe. */
void broker_segfile_put(struct broker_segfile *f);
/* Close fd.  The last descriptor of an unlinked file (a spill file, the
 * fold's state) frees its blocks inside close(), about 0.6 ms per MB: one
 * of BROKER_CLOSE_ASYNC_BYTES or more on disk is closed by a detached
 * thread, so that the event loop does not wait for it.  Nothing to
 * report: close errors are ignored, as the file is gone.  -1: nothing. */
#define BROKER_CLOSE_ASYNC_BYTES (64ull << 20)
void broker_file_close(int fd);
/* Initialise *out (uninitialised) with ch's payload to send: a copy of the
 * frame kept in memory, or its bytes in its segment file, mapped read-only
 * (16 KiB and more; unmapped once sent) or else read into a buffer of
 * their own (freed once sent; a refused mmap is logged once); the read
 * cache is neither asked nor filled.  Errors: DCAST_ENOMEM, DCAST_EIO (a
 * failed or short read, naming the offset: a chunk past the end of its
 * file is read, never mapped); *out is then untouched. */
int broker_chunk_payload(const struct broker_chunk *ch, zmq_msg_t *out);
/* broker_chunk_payload for a consumer, through the read cache: a send of
 * the frame kept there for ch (one of its expected takes counted off),
 * else a read, kept (when the cache is on and it fits under the cap) for
 * `others` more consumers expected to take it, and for anyone while a
 * send still holds it.  Errors: broker_chunk_payload's. */
int broker_chunk_serve(struct broker_chunk *ch, uint32_t others, zmq_msg_t *out);
/* n bytes of segment or spill file f from offset off on, read into buf
 * (the caller's), counted in broker_disk_read_bytes; safe on any thread
 * while the caller holds a reference of f.  A read goes through the
 * kernel's own mapping of the page cache, where a mapping of ours would
 * be faulted in page by page (a cost that some VMs make high).  Errors:
 * dcast_pread_full's (DCAST_EIO naming the offset; a file cut short). */
int broker_file_pread(const struct broker_segfile *f, uint64_t off, void *buf, size_t n);
/* 1 when ch's payload may be read now for a consumer with `unacked` bytes
 * sent and not yet credited back: in memory or in the read cache, or the
 * bytes read from disk and not yet sent (the cache's included: it gives
 * them up first) leave room for it under BROKER_DISK_INFLIGHT_BYTES, or
 * unacked is under BROKER_DISK_FLOOR_BYTES. */
int broker_chunk_readable(const struct broker_chunk *ch, uint64_t unacked);
/* Payload bytes read from disk and not yet sent (metrics, tests). */
uint64_t broker_disk_inflight_bytes(void);
/* Payload bytes read from disk for consumers since start (the fold's
 * reads not counted), and frames the read cache served in place of a
 * read (metrics, tests). */
uint64_t broker_disk_read_bytes(void);
uint64_t broker_read_cache_hits(void);
/* Of broker_disk_read_bytes, those served from a mapping of the segment
 * (no copy) rather than read into the heap (metrics, tests). */
uint64_t broker_disk_mapped_bytes(void);
/* Tests (DELTACAST_BROKER_FAULT=nomap): 1 makes every mmap of a segment
 * fail as on a file system without mmap, so payloads are read. */
void broker_disk_map_fault(int refuse);
/* Bytes of frames the read cache holds now. */
uint64_t broker_read_cache_bytes(void);
/* The read cache's cap in bytes (--read-cache-bytes; 0: off); what is held
 * past it goes, least recently used first. */
void broker_read_cache_set(uint64_t cap_bytes);
/* Drop the kept frames that no consumer is expected to take and no send
 * holds any more (a send's end marks a sweep due; the loop calls this each
 * turn, broker_fanout).  Without it such frames stay until evicted. */
void broker_read_cache_sweep(void);
/* Drop every kept frame and the cache's table (broker_close). */
void broker_read_cache_free(void);
/* Drop what the read cache keeps for ch / for each chunk of v: the chunk
 * is freed, or its bytes must not go out again (poisoned, model removed). */
void broker_chunk_uncache(struct broker_chunk *ch);
void broker_version_uncache(struct broker_version *v);
/* --data-dir: append a payload still being built into a spill file (an
 * unnamed file in dir, made at the first write: *spill, *end): an open
 * version's chunk as it arrives, a made anchor's chunk as it is cut, so
 * that neither is held in memory.  On 0, *file (a new reference) and *off
 * say where it went.  The durable write copies it from there into the
 * segment, and the file's space is freed with its last reference (the
 * version durable, or dropped).  Errors: DCAST_EIO, DCAST_ENOMEM (the
 * caller keeps the payload in memory then). */
int broker_spill_write(const char *dir, struct broker_segfile **spill, uint64_t *end,
		       const void *data, size_t len, struct broker_segfile **file, uint64_t *off);
/* Serve v's payloads from file from now on: chunk i at off[i] (a new
 * reference of file each); the frames in memory are released (consumers
 * and jobs holding copies keep theirs).  A chunk already on disk moves to
 * the new place. */
void broker_version_to_disk(struct broker_version *v, struct broker_segfile *file,
			    const uint64_t *off);

/* ---- retire.c: removing models (idle expiry, operator deletion) ---- */
/* Remove model m now: its open version is dropped, its producers and
 * consumers get ERROR(DCAST_ENOTFOUND, "model M deleted: why") and are
 * dropped (they HELLO again and wait; a producer's HELLO creates the name
 * afresh, as a new run), its slot is free at once, and with --data-dir its
 * segments and run file are deleted (the writer removes the segments, in
 * order after the model's queued writes, and then frees m; without a data
 * dir m is freed here).  `expired` picks the counter and the log line.
 * Errors: DCAST_ESTATE (a relayed model: its --upstream-model flag keeps
 * it), DCAST_ENOMEM (the file removal could not be queued; nothing done). */
int broker_model_remove(struct broker *b, struct broker_model *m, int expired, const char *why);
/* Idle expiry (--model-idle-s, the loop's timer turn): a model with no
 * producer, no consumer and no open version for that long is removed. */
void broker_models_idle(struct broker *b, uint64_t now_ms);
/* Empty model m in place for a new run (a relay whose upstream's run
 * changed): its open version dropped quietly, its log, manifest and fold
 * state freed, its consumers' cursors reset, its segments deleted (queued
 * after its writes, whose completions are then skipped).  The caller sets
 * the new run. */
void broker_model_clear(struct broker *b, struct broker_model *m);

/* ---- ingest.c: producers, and the open-version logic the relay reuses ---- */
void broker_producer_msg(struct broker *b, dcast_wire_in *in);
void broker_producer_timers(struct broker *b, uint64_t now_ms);
void broker_producer_flush_credit(struct broker *b);
int broker_pending_open(struct broker *b, struct broker_model *m, const dcast_chunk *c,
			uint32_t parts);
int broker_pending_chunk(struct broker *b, struct broker_model *m, uint32_t part,
			 dcast_wire_in *in);
/* Close `part` of the open version with its COMMIT; when every part has
 * committed, the version enters the log (returns 0; *committed set).  With
 * no open version, a COMMIT of 0 chunks (a part with nothing changed)
 * opens one under the same rules as a first CHUNK; one with chunks is
 * refused (DCAST_ESTATE).  A version this COMMIT opened is dropped quietly
 * when the COMMIT is refused. */
int broker_pending_commit(struct broker *b, struct broker_model *m, uint32_t part,
			  dcast_commit *c, int *committed);
/* Register the producers' outcomes (b->outcome[0]: a poisoned version
 * gives them ERROR(DCAST_EPOISONED) and WELCOME need_anchor); broker_open. */
void broker_ingest_init(struct broker *b);
/* Drop the open version: ERROR(DCAST_EABORTED, why) to the model's
 * producers; why == NULL drops it quietly (nothing was accepted into it).
 * With --cut-through its consumers stop streaming it (broker_cut_abort). */
void broker_pending_abort(struct broker *b, struct broker_model *m, const char *why);

/* ---- fanout.c: consumers ---- */
void broker_consumer_msg(struct broker *b, dcast_wire_in *in);
void broker_fanout(struct broker *b);
/* Send every consumer streaming `m` a WELCOME again, before what it is sent
 * next: the model's run became known (created for consumers that waited, or
 * adopted from a relay's upstream).  A WELCOME mid-stream changes nothing
 * in the consumer's stream; it confirms or refutes the run of its state. */
void broker_rewelcome(struct broker *b, const struct broker_model *m);
/* A producer created m: consumers that said HELLO for it before it existed
 * stream it from now on, and all of them learn its run (WELCOME). */
void broker_model_announce(struct broker *b, struct broker_model *m);
void broker_consumer_timers(struct broker *b, uint64_t now_ms);
/* --cut-through: m's open version `open` is dropped.  Every consumer
 * streaming it goes back to the newest committed version (its cursor
 * emptied, its reference put); those sent any chunk of it get
 * ERROR(DCAST_EABORTED, version) before anything else, and the abort is
 * counted once when there was any (stats.cut_through_aborted). */
void broker_cut_abort(struct broker *b, struct broker_model *m, struct broker_version *open);

/* ---- relay.c ---- */
/* With --upstream: one connected DEALER per --upstream-model (a CURVE
 * client with --upstream-server-key, auth.c), each with a monitor of its
 * handshakes, each model created and marked relayed; nothing sent yet.
 * Returns DCAST_EZMQ, DCAST_EBUSY (no model slot left) or a key file's
 * error, with dcast_last_error() set. */
int broker_relay_open(struct broker *b);
/* Say HELLO upstream for every relayed model, with have_version its newest
 * version: called once the data dir is restored, so a restarted relay asks
 * only for what follows what it kept. */
void broker_relay_start(struct broker *b);
void broker_relay_msg(struct broker *b, struct broker_upstream *u);
/* On the timer turn: heartbeats and silence upstream, and the handshake
 * outcomes the monitors saw (a refused key is logged at E level). */
void broker_relay_timers(struct broker *b, uint64_t now_ms);
void broker_relay_flush_credit(struct broker *b);
/* ACK `version` upstream on the DEALER of relayed model m (it is in the
 * relay's log, durable with --data-dir); no-op when m is not relayed. */
void broker_relay_close(struct broker *b);
/* ---- relaybulk.c: a relay's anchor over its upstream's --bulk, the
 * connection's side (relay.c takes the frames) ---- */
/* No connection, the upstream's host resolved (at open: a name lookup
 * may block) unless --upstream-no-bulk, CURVE to the upstream (bulk
 * travels in the clear) or an upstream that is not tcp://.  One that does
 * not resolve is logged, and anchors come over ZeroMQ. */
void broker_relay_bulk_init(struct broker *b, struct broker_upstream *u);
/* The HELLO upstream may say x-bulk (an address, no failed transfer since
 * the last COMMIT over ZeroMQ). */
int broker_relay_bulk_wanted(const struct broker_upstream *u);
/* BULK from the upstream: connect to its host at the port it names, the
 * connection in the poll set with fn (arg u), which reads it with
 * broker_relay_bulk_read.  Errors (nothing left open): DCAST_ESTATE (not
 * asked for, or one under way), DCAST_EIO (the connect refused at once),
 * DCAST_EBUSY (the poll set is full). */
int broker_relay_bulk_start(struct broker *b, struct broker_upstream *u, const dcast_bulk *m,
			    broker_fd_fn fn);
/* Move what the connection has: *got 1 when `in` (the caller's, zeroed
 * with an empty payload) holds a whole frame (a CHUNK or the COMMIT of the
 * version, checked as a ZeroMQ message is; the caller closes it as one
 * from dcast_wire_recv, also on an error), 0 when no more is there now.
 * Errors: those of dcast_bulkrx_*, DCAST_EIO (the test fault
 * relay_bulk_cut). */
int broker_relay_bulk_read(struct broker *b, struct broker_upstream *u, dcast_wire_in *in, int *got);
/* On the timer turn: 1 (dcast_last_error() says why) when the connection
 * moved no byte for 3 heartbeats, at least 30 s, as the upstream's side
 * gives up on it; 0 otherwise. */
int broker_relay_bulk_quiet(struct broker *b, struct broker_upstream *u, uint64_t now_ms);
/* Close the connection, if any; idempotent. */
void broker_relay_bulk_close(struct broker *b, struct broker_upstream *u);
/* What the loop polls u's DEALER for: nothing while a bulk transfer is
 * under way.  The upstream's stream goes on over ZeroMQ right after the
 * transfer's COMMIT frame, and a delta read before that frame would find
 * the anchor still open; the DEALER is read again once the frames are in. */
static inline short broker_relay_events(const struct broker_upstream *u)
{
	return dcast_bulkrx_active(&u->bulk) ? 0 : ZMQ_POLLIN;
}

/* ---- commit.c: the commit pipeline ---- */

/* A committed version is durable (or there is no data dir): ACK it where
 * it came from (b->outcome: the model's producers, or upstream for a
 * relayed model).  The one place an ACK of a version goes out; with
 * --data-dir only durable.c calls it. */
static inline void broker_version_ack(struct broker *b, struct broker_model *m, uint64_t version)
{
	DCAST_ASSERT(b->outcome[m->relayed != 0].acked);
	b->outcome[m->relayed != 0].acked(b, m, version);
}
/* A committed version (served, never ACKed) did not become durable: the
 * producers get ERROR(DCAST_EIO, why) and the model takes only an anchor
 * from now on (WELCOME need_anchor), which starts a whole segment again;
 * a relayed model has no lost outcome (its upstream decides what comes). */
static inline void broker_version_lost(struct broker *b, struct broker_model *m, uint64_t version,
				       const char *why)
{
	if (b->outcome[m->relayed != 0].lost)
		b->outcome[m->relayed != 0].lost(b, m, version, why);
}

/* Called once a version has all its parts, just before it enters the log
 * (the same loop turn): an anchor, which replaces the log, lets the anchor
 * folder keep the log aside to make consumers on it a delta of the
 * anchor (fold.h, broker_fold_anchor_coming). */
void broker_version_entering(struct broker *b, struct broker_model *m, struct broker_version *v);

/* Called once a version has all its parts and is in the log, before any
 * ACK goes out or any consumer sees it (the same loop turn).  Durability
 * queues its write here (the ACK follows the completion); the anchor
 * folder queues it here.  Returns 0, or DCAST_ENOMEM when the write could
 * not be queued (the caller then reports the version lost). */
int broker_version_committed(struct broker *b, struct broker_model *m,
			     struct broker_version *v);
/* Called once at start-up, before the endpoints bind: re-insert durable
 * versions with broker_log_append(), then start the anchor folder over the
 * restored logs. */
int broker_log_restore(struct broker *b);

/* ---- poison.c ---- */
/* The fold (fold.c) found committed `version` of m bad: a payload that does
 * not decode, or a state whose digest differs from its COMMIT's (code and
 * why say which).  The version is poisoned: it and every version after it
 * are never served nor folded into an anchor (m->poisoned); consumers
 * streaming them stop and every consumer of m gets ERROR(DCAST_EPOISONED,
 * version); the model's producers get the same ERROR and WELCOME
 * need_anchor; with --data-dir the mark is written to the model's segment
 * so that a restart keeps it.  An E-level log line and
 * stats.versions_poisoned.  No-op when an older version is poisoned. */
void broker_version_poison(struct broker *b, struct broker_model *m, uint64_t version, int code,
			   const char *why);

#endif
