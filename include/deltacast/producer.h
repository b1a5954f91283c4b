/* deltacast producer: the library a trainer embeds to publish versions of a
 * model to a broker.  Each trainer rank opens one producer for its part of
 * the model, registers its tensors (or its shards of them) once, and calls
 * dcast_producer_publish() after each optimizer step.  The first version
 * goes out as a dense anchor, later ones as sparse deltas against the last
 * version the broker acknowledged, which the producer keeps as a baseline in
 * pinned host memory and updates in O(changed) while it encodes.
 *
 * An anchor of host tensors is a snapshot: publish() copies the tensors
 * into the baseline and returns, and a sender thread of the producer sends
 * the version from there (dcast_producer_flush() waits for its ACK).
 *
 * Encoder threads (opts.encode_threads) diff the chunk ranges in parallel;
 * the calling thread sends them in order, so ZeroMQ's I/O thread sends chunk
 * k while chunks k+1... are encoded (payloads go out zero-copy from a
 * bounded pool of encode buffers; one of 64 KiB or less is copied and its
 * buffer reused at once).  Sends stay within the broker's credit,
 * and a lost connection is re-joined a bounded number of times.  Wire
 * protocol: docs/protocol.md.
 *
 * Thread safety: one producer is used by one thread at a time (its encoder
 * and sender threads are its own).  Different producers are independent. */
#ifndef DELTACAST_PRODUCER_H
#define DELTACAST_PRODUCER_H

#include <stddef.h>
#include <stdint.h>
#include "deltacast/err.h"
#include "deltacast/schema.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dcast_producer dcast_producer;

/* Where a registered tensor's memory lives (consumer.h shares the type:
 * whichever header comes first defines it). */
#if !defined(DCAST_MEM_DEFINED)
#define DCAST_MEM_DEFINED
typedef enum dcast_mem {
	DCAST_MEM_HOST = 0, /* ordinary (or pinned) host memory */
	DCAST_MEM_CUDA = 1  /* CUDA device memory */
} dcast_mem;
#endif

/* Options of dcast_producer_open().  Fill with dcast_producer_opts_init()
 * and change what you need; NULL means all defaults. */
typedef struct dcast_producer_opts {
	uint64_t range_elems;        /* elements per chunk, 1..2^26; default 1<<20 */
	uint64_t max_inflight_bytes; /* encode buffers handed to ZeroMQ at once;
					default 64 MiB, at least two chunks */
	uint64_t undo_bytes;         /* rollback log of a delta until its ACK;
					0 = model bytes / 8, at least 1 MiB.  When a
					delta outgrows it and then fails, the next
					version is sent as an anchor instead */
	uint32_t connect_timeout_ms; /* open / re-join: WELCOME within; default 5000 */
	uint32_t ack_timeout_ms;     /* a publish waiting for credit, or for the
					previous version's ACK, without progress
					for this long fails; default 30000 */
	uint32_t max_reconnects;     /* re-joins per call after a lost connection;
					default 3, 0 = fail at once */
	uint32_t reconnect_backoff_ms; /* first backoff, doubling to 2 s; default 100 */
	int baseline_on_device;      /* CUDA tensors: keep their baseline in device
					memory where cudaMalloc finds room (else
					pinned host memory); needs a CUDA build and
					device, else open fails DCAST_ENODEVICE */
	const char *client;          /* HELLO.client, for the broker's logs; may be NULL */
	/* CURVE: all three set (Z85, 40 characters each) or all NULL. */
	const char *curve_server_key;
	const char *curve_public_key;
	const char *curve_secret_key;
	uint32_t encode_threads;     /* encoders diffing chunk ranges, the calling
					thread included (it encodes while the range
					it sends next is not ready); 0 = one per CPU,
					at most 8; 1..64 */
	uint32_t close_timeout_ms;   /* close(): wait this long for the last
					version's ACK while the connection is up
					(no re-join); default 5000, 0 = abandon it */
} dcast_producer_opts;

/* Set every option to its default.  Never fails. */
DCAST_API void dcast_producer_opts_init(dcast_producer_opts *opts);

/* Counters of one producer, for progress displays and tests.  Values are
 * those of the latest publish unless named total_. */
typedef struct dcast_producer_stats {
	uint64_t version;          /* latest version published (or NONE) */
	int anchor;                /* it was an anchor */
	uint64_t chunks_total;     /* chunk ranges of this part */
	uint64_t chunks_sent;      /* CHUNK messages sent for it */
	uint64_t changed_elems;    /* elements that differ from the baseline */
	uint64_t elems;            /* elements of this part */
	uint64_t payload_bytes;    /* CHUNK payload bytes sent */
	uint64_t model_bytes;      /* bytes of this part's tensors */
	uint64_t acked_version;    /* newest version the broker acknowledged */
	uint64_t total_reconnects; /* re-joins since open */
	uint64_t total_payload_bytes;
	uint64_t total_resends;    /* versions sent again after a re-join found
				      the broker without them */
	uint64_t baseline_version; /* the broker's version taken as the baseline by
				      dcast_producer_fetch_baseline() or
				      dcast_producer_adopt_baseline(), or NONE */
	uint64_t broker_version;   /* the broker's newest committed version of the
				      model (WELCOME, ACK), or NONE: a new process
				      that sees one may take it as its baseline */
	uint64_t failed_version;   /* the latest version that failed, or NONE:
				      publish() returned its error, or it failed
				      after publish() returned 0 (the broker
				      refused it, the connection was lost, no
				      credit came back) */
	int failed_err;            /* its dcast_err (its text: dcast_producer_wait()
				      of it); 0 when none failed */
} dcast_producer_stats;

/* Where the version being published stands, for progress displays: read
 * with dcast_producer_progress_get() from any thread while publish() runs
 * on another.  Each field is read atomically, not the set as one. */
typedef struct dcast_producer_progress {
	uint64_t version;       /* being published (active) or the last one; NONE before */
	int active;             /* published and not yet settled: from publish()
				   until the broker's ACK (or its failure) */
	int anchor;             /* it goes as an anchor */
	uint64_t ranges_done;   /* chunk ranges diffed and handed to the connection */
	uint64_t ranges_total;  /* chunk ranges of this part */
	uint64_t bytes_sent;    /* CHUNK payload bytes handed to the connection */
	uint64_t bytes_taken;   /* of those, the bytes the broker has stored (its
				   credit came back for them): what went over the
				   wire; after publish() returns, this goes on
				   moving while dcast_producer_wait() or the next
				   publish() waits for the ACK */
	uint64_t bytes_total;   /* an anchor: this part's tensor bytes; a delta: 0
				   (its size is known once every range is diffed) */
	uint64_t elapsed_ms;    /* since that publish() began (to its ACK, once settled) */
	int err;                /* it failed (active 0): its dcast_err; else 0 */
} dcast_producer_progress;

/* Connect to the broker at `endpoint` (a ZeroMQ endpoint such as
 * "tcp://127.0.0.1:5555") as part `part` of `parts` of model `model`: send
 * HELLO and wait for WELCOME within opts->connect_timeout_ms.  `opts` is
 * copied (NULL: defaults); the strings it points to are copied too.
 * On success *out owns the producer (dcast_producer_close()).  On error *out
 * is NULL.  Errors: DCAST_EINVAL (NULL or bad argument, a bad option, naming
 * it), DCAST_ECLOSED (no WELCOME in time: the broker is down or unreachable,
 * naming the endpoint), DCAST_EAUTH (CURVE handshake refused), DCAST_EZMQ,
 * DCAST_ENOMEM, or an ERROR code the broker answered with. */
DCAST_API int dcast_producer_open(const char *endpoint, const char *model, uint32_t part, uint32_t parts,
			const dcast_producer_opts *opts, dcast_producer **out);

/* Register a tensor (or this part's shard of it) before the first publish.
 * name: unique, and valid on the wire (dcast_tensor_name_check: 1..255
 * bytes of UTF-8, not "__metadata__").  dtype: a dcast_dtype.  ndim/shape: the GLOBAL
 * shape (every part registers the same one).  ptr: shard_count_elems
 * contiguous elements holding elements [shard_offset_elems, shard_offset_elems
 * + shard_count_elems) of the flattened global tensor; for an unsharded
 * tensor pass offset 0 and the tensor's element count.  The memory stays the
 * caller's and must stay valid and unchanged during each publish.  mem says
 * where ptr points.  Registering a name again after a publish only replaces
 * the pointer (the tensor moved), and must keep dtype, shape, shard and
 * memory kind (host or CUDA; DCAST_EINVAL otherwise).
 * Errors: DCAST_EINVAL (NULL, a name dcast_tensor_name_check refuses,
 * naming it and the rule, ptr NULL with elements,
 * shard outside the tensor), DCAST_EDTYPE (dtype the codec cannot take),
 * DCAST_ESHAPE (ndim over 8, too many elements, or a shape, dtype or shard
 * different from the first registration), DCAST_ESTATE (a new tensor after
 * the first publish), DCAST_ETOO_LARGE (more than DCAST_MAX_TENSORS),
 * DCAST_ENODEVICE (mem CUDA without a usable CUDA device, or in a build
 * without CUDA), DCAST_ECUDA (the pointer's attributes could not be read),
 * DCAST_ENOMEM.  A CUDA tensor (ptr device memory, on any device) is diffed
 * on its device; only payloads cross PCIe.  Its changes keep no old values,
 * so a failed version that touched one is followed by an anchor.  The CUDA
 * path has not run on the development machines (no GPU there): see
 * producer/device.c. */
DCAST_API int dcast_producer_register(dcast_producer *p, const char *name, int dtype, uint32_t ndim,
			    const uint64_t *shape, const void *ptr, int mem,
			    uint64_t shard_offset_elems, uint64_t shard_count_elems);

/* Register this part's tile of a tensor that the producer parts hold as a
 * grid of equal N-D slices, as tensor-parallel ranks do (a column block of
 * a row-major matrix: offset {0, c0}, extent {rows, cols / tp}).
 * ndim/shape: the GLOBAL shape.  offset/extent (ndim entries each): the
 * box this part holds; it must be one tile of an even grid: extent[d]
 * divides shape[d] and offset[d] is a multiple of extent[d], so the grid
 * is shape[d] / extent[d] tiles along dimension d.  ptr: the box's
 * elements, contiguous, row-major in the box (what a rank's local shard
 * tensor holds); NULL: this part holds no tile of the tensor but declares
 * its grid (every part must register every tensor with the same grid, or
 * the broker sees the manifest change).  mem, re-registration, lifetime
 * and errors as dcast_producer_register(), plus DCAST_ESHAPE for a scalar,
 * a box outside the tensor, of other dims, or not a tile of an even grid.
 * A tensor registered with its whole shape as the box is untiled.  On the
 * wire the tensor is sent in tile order (docs/protocol.md, "Tiled
 * tensors"), so the tile is one contiguous range and costs what a
 * contiguous shard costs; consumers see the tensor in its natural layout
 * and may bind any box of it (dcast_consumer_bind_slice()). */
DCAST_API int dcast_producer_register_slice(dcast_producer *p, const char *name, int dtype,
				  uint32_t ndim, const uint64_t *shape, const uint64_t *offset,
				  const uint64_t *extent, const void *ptr, int mem);

/* Publish the registered tensors' current contents as `version`: an anchor
 * (every element) the first time, after the broker asked for one, or when no
 * acknowledged baseline exists; otherwise a delta against the last version
 * the broker acknowledged, skipping chunks that did not change.  If the
 * previous version is still unacknowledged, waits for its ACK first (up to
 * ack_timeout_ms; a failed previous version is rolled back and logged, and
 * this one is sent against the version before it).  A lost connection is
 * re-joined (bounded) and the version re-sent from its first chunk.
 * Returns 0 once every chunk and the COMMIT are handed to the connection:
 * the caller may then change its tensors.  That is not yet the broker's
 * acknowledgement: dcast_producer_wait() reports it.
 * An anchor of tensors that are all in host memory returns sooner: once
 * the tensors are copied into the baseline (one memcpy of this part's
 * bytes, spread over the encoder threads); the caller may change its
 * tensors at once.  The producer's sender thread then sends the version
 * from the baseline under the broker's credit, re-joining as above;
 * progress_get() shows it going (active, bytes_sent, bytes_taken).  A
 * publish(), wait(), flush() or close() called meanwhile first waits for
 * that sending to end, as long as it goes on (the ack_timeout_ms and
 * max_reconnects bounds end it; a wait() or flush() with timeout 0
 * returns DCAST_ETIMEDOUT instead): versions go one at a time, never
 * interleaved.
 * An error the sender meets after publish() returned fails the version
 * (nothing of it committed; the next version is an anchor) and is
 * reported, with its text, by dcast_producer_wait() of that version and
 * by dcast_producer_flush() while it is the last one published; by
 * progress_get() (active 0, err its code); by stats_get() (failed_version,
 * failed_err); and in the log (a warning).  The next publish() does not
 * return it: it sends its own version, as an anchor.
 * A CUDA tensor's anchor is sent before publish() returns, as a delta is.
 * Errors: DCAST_EVERSION (version not above the last published or the
 * broker's newest), DCAST_ESTATE (nothing registered), DCAST_ECLOSED (the
 * connection could not be re-joined), DCAST_ETIMEDOUT (no credit or ACK in
 * ack_timeout_ms), DCAST_ENODEVICE, an ERROR code from the broker (its text
 * in the detail), DCAST_ENOMEM.  On error the baseline stays the last
 * acknowledged state and nothing of the version is committed. */
DCAST_API int dcast_producer_publish(dcast_producer *p, uint64_t version);

/* Wait up to timeout_ms for the broker's ACK of `version` (0 returns at
 * once).  Returns 0 only when the broker acknowledged that very version
 * (for an earlier version: when it was acknowledged; the outcomes of the
 * last 64 versions are kept).  If the connection was lost after the COMMIT
 * went out, wait re-joins (bounded) and asks the broker: a WELCOME naming
 * this version as its newest counts as the ACK; an older newest version
 * means the broker never took it (or lost it), and the version is sent
 * again from the baseline (the same delta, or an anchor if the broker lost
 * its state), not from the caller's tensors, which may have changed; a
 * re-join and re-send may outlast timeout_ms.
 * An anchor the sender thread still sends is waited for first, as long
 * as its sending goes on (it fails after ack_timeout_ms without progress),
 * as publish() itself took before it returned: timeout_ms then bounds the
 * wait for the ACK; timeout_ms 0 returns DCAST_ETIMEDOUT at once while it
 * sends.  A broker with --data-dir ACKs once the version is durable (a
 * large anchor's fsync on a slow disk may take minutes); its HEARTBEATs
 * name the versions it has committed.  When timeout_ms passes with no
 * ACK but a HEARTBEAT within it named this version, wait re-joins and
 * asks: a WELCOME naming it as the broker's newest counts as the ACK, as
 * after a lost connection (so does an ACK lost on the way).
 * Errors: DCAST_ETIMEDOUT (not yet: the version is still pending, call
 * again), DCAST_ENOTFOUND (never published, or too old to be kept),
 * DCAST_EABORTED / another broker ERROR code (the broker refused or dropped
 * it), DCAST_ECLOSED (connection lost and not re-joined, or re-sent
 * max_reconnects times without an ACK), DCAST_EVERSION (the re-joined
 * broker's newest version is above it: whether it was taken is unknown).
 * On any error but DCAST_ETIMEDOUT the version is abandoned and the
 * baseline rolled back to the last acknowledged version; publish a newer
 * version (or this one again) to retry.  Asking again for a failed version
 * returns its error again. */
DCAST_API int dcast_producer_wait(dcast_producer *p, uint64_t version, int timeout_ms);

/* Set up the producer's memory now rather than at the first publish():
 * the tensor table is fixed (a new tensor is then refused with
 * DCAST_ESTATE, as after a first publish), and the host baseline, one
 * copy of this part's tensors, is mapped, its pages faulted in (zeroed by
 * the kernel) and pinned (best effort).  A trainer calls it once after
 * registering, at start-up, so that its first anchor's publish() is one
 * copy into memory that is already there.  A second call does nothing.
 * Errors: DCAST_EINVAL (NULL), DCAST_ESTATE (nothing registered),
 * DCAST_ENOMEM, DCAST_ETOO_LARGE (more chunk ranges than digests). */
DCAST_API int dcast_producer_prepare(dcast_producer *p);

/* Wait for the broker's ACK of the last version that publish() returned
 * 0 for: dcast_producer_wait() of that version (its sending by the sender
 * thread ended first; timeout_ms bounds the wait for the ACK).  0 at once
 * when nothing was published.  Errors: as dcast_producer_wait(), DCAST_EINVAL for NULL;
 * DCAST_ETIMEDOUT: no ACK yet, or still being sent with timeout_ms 0
 * (call again). */
DCAST_API int dcast_producer_flush(dcast_producer *p, int timeout_ms);

/* Copy the counters into *out.  Never fails for valid pointers.  From the
 * producer's own thread only (use dcast_producer_progress_get() from
 * another).  While the sender thread still sends an anchor, version,
 * anchor, chunks_total and elems name it, chunks_sent and payload_bytes
 * read 0 (progress_get() has its bytes), the rest as before it. */
DCAST_API void dcast_producer_stats_get(const dcast_producer *p, dcast_producer_stats *out);

/* The newest version of the model the broker has committed, as its
 * WELCOME (at open and at each re-join) and its ACKs since said; NONE when
 * it has none (a new model).  What a restarted trainer publishes above.
 * Thread safety as the other calls.  NULL-safe (NONE). */
DCAST_API uint64_t dcast_producer_broker_version(const dcast_producer *p);

/* Copy the progress of the version being published (or the last one) into
 * *out.  Safe from any thread, also while publish() runs: a display thread
 * polls it to show bytes, rate and time left (ranges_done / ranges_total
 * also holds for a delta).  Never fails for valid pointers. */
DCAST_API void dcast_producer_progress_get(const dcast_producer *p, dcast_producer_progress *out);

/* The broker's consumer endpoint as this producer reaches it, into
 * out[cap] (NUL-terminated): the endpoint the broker named in its last
 * WELCOME (WELCOME.consumers, the endpoint as bound), with a wildcard
 * host (0.0.0.0, *, [::], ::) replaced by the host of the endpoint this
 * producer connected to (tcp://10.1.2.3:5555 and tcp://0.0.0.0:5556 give
 * tcp://10.1.2.3:5556; 127.0.0.1 when that endpoint is not TCP); any other
 * host, and ipc:// or inproc:// endpoints, as named.  Where the
 * baseline calls below fetch from when given NULL.  Errors: DCAST_EINVAL
 * (NULL, cap 0), DCAST_ENOTFOUND (the broker named none: one from before
 * WELCOME.consumers, or whose endpoint breaks its rule), DCAST_ETOO_LARGE
 * (cap too small).  Thread safety as the other calls. */
DCAST_API int dcast_producer_consumer_endpoint(const dcast_producer *p, char *out, size_t cap);

/* Take the broker's newest committed version of the model as the baseline,
 * so that the first publish() sends a delta on it rather than an anchor:
 * for a new producer process (a trainer restarted after a crash or a
 * preemption) whose workers already hold that version.  Call it after
 * registering every tensor and before the first publish.  The version is
 * fetched through the consumer library from consumer_endpoint (the same
 * broker's consumer endpoint: the producer endpoint serves no versions;
 * NULL: the one the broker named in its WELCOME, as
 * dcast_producer_consumer_endpoint() gives it) into `dir` (created if missing;
 * kept, so a later call with the same dir fetches only the deltas after
 * what it holds; NULL: a directory of its own under $TMPDIR, removed
 * afterwards), every chunk checked and the state checked against the
 * broker's COMMIT digests; it must be of the run the broker named in its
 * WELCOME, and its tensors must be exactly the registered ones (names,
 * dtypes, shapes, grids).  This part's shards are then copied into the
 * baseline: O(model) once, and the consumer's host copy of the model is
 * held meanwhile.  A broker that holds no version of the model (or asks
 * for an anchor) leaves nothing to fetch: returns 0, and stats
 * baseline_version stays NONE.  timeout_ms: for the version to arrive (-1:
 * no limit).  Errors: DCAST_EINVAL (NULL producer, an empty endpoint),
 * DCAST_ENOTFOUND (endpoint NULL and the broker named none: an older
 * broker; give the endpoint), DCAST_ESTATE (after a publish;
 * the broker served another version than its newest, or another run's),
 * DCAST_ESHAPE (the broker's tensors differ from the registered ones,
 * naming the first that does: publish an anchor instead), DCAST_ETIMEDOUT,
 * what dcast_consumer_open() fails with (a directory, the broker), and
 * those of a publish's first steps (DCAST_ENOMEM).  An error before the
 * copy leaves the baseline as it was (none, or an earlier call's); one
 * during it leaves none, and the first publish sends an anchor. */
DCAST_API int dcast_producer_fetch_baseline(dcast_producer *p, const char *consumer_endpoint,
				  const char *dir, int timeout_ms);

/* Take the caller's copy of the broker's newest committed version as the
 * baseline, as dcast_producer_fetch_baseline() does with a fetched one, at
 * no more than O(changed) wire bytes: for a caller that holds that version
 * already (the checkpoint it published last).  Call it after registering
 * every tensor and before the first publish.  bases: n pointers, n the
 * number of registered tensors, in registration order: host memory laid
 * out as that registration's ptr (this part's shard or tile, as many
 * elements), holding the version; read during the call only, they stay
 * the caller's.  Before it is trusted, the copy is checked against the
 * digests of the broker's COMMIT of that version, read on a connection to
 * consumer_endpoint (the same broker's consumer endpoint; NULL: the one
 * the broker named, as for dcast_producer_fetch_baseline()) that asks for
 * the deltas after the log's anchor, dropping their payloads, or the
 * anchor itself when the newest version is one (then O(model) bytes to
 * this process, never to the workers).  The broker's tensors must be the
 * registered ones, in order, and its digest ranges must cover this part's
 * shards (a version published with the same parts).  O(model) reads of the
 * copy.  Errors: DCAST_EINVAL (NULL producer, an empty endpoint, n not
 * the tensors registered, a NULL base), DCAST_ESTATE (after a publish; the broker's newest version
 * changed meanwhile, or its run is another; its digests do not cover the
 * shards), DCAST_ENOTFOUND (the broker holds no version, or asks for an
 * anchor; endpoint NULL and the broker named none), DCAST_ESHAPE (another model: naming the tensor), DCAST_EDIGEST
 * (the copy is not that version: naming the tensor and elements),
 * DCAST_ETIMEDOUT, DCAST_EZMQ, a broker ERROR code, DCAST_ENOMEM.  An
 * error before the copy (every check above) leaves the baseline as it was
 * (none, or an earlier call's); one during it leaves none, and the first
 * publish sends an anchor. */
DCAST_API int dcast_producer_adopt_baseline(dcast_producer *p, const char *consumer_endpoint,
				  const void *const *bases, uint32_t n, int timeout_ms);

/* Flush, bounded: wait for the sender thread to end an anchor's sending,
 * then up to opts.close_timeout_ms for the last version's ACK while the
 * connection is up (no re-join).  Then send BYE, close the connection and
 * free everything, including the baseline; set *p to NULL.  NULL or *p ==
 * NULL is a no-op.  A version still not acknowledged is abandoned (the
 * broker drops it; a warning is logged). */
DCAST_API void dcast_producer_close(dcast_producer **p);

#ifdef __cplusplus
}
#endif
#endif
