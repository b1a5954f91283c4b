/* deltacast wire schema v1: the messages producers, brokers and consumers
 * exchange.  Each message is frame 0, a msgpack map (the header), plus for
 * CHUNK frame 1, the raw payload.  docs/protocol.md is normative; this header
 * is its C binding.
 *
 * Decoding is strict and bounded: nothing is allocated before the limits
 * below are checked, and every rejection returns a distinct dcast_err with a
 * detail (dcast_last_error()) naming the message type, field and limit. */
#ifndef DELTACAST_SCHEMA_H
#define DELTACAST_SCHEMA_H

#include <stddef.h>
#include <stdint.h>
#include "deltacast/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Protocol version spoken by this build; carried as "proto" in every header. */
#define DCAST_PROTO_VERSION 2

/* Limits (docs/protocol.md, "Limits").  Receivers enforce them before
 * allocating; ZMQ_MAXMSGSIZE is set to DCAST_MAX_FRAME_BYTES. */
#define DCAST_MAX_HEADER_BYTES (16u << 20)   /* header frame */
#define DCAST_MAX_NAME 255                   /* model and tensor names, bytes */
#define DCAST_MAX_CLIENT 64                  /* HELLO.client, bytes */
#define DCAST_MAX_TEXT 1024                  /* ERROR.text, BYE.reason, bytes */
#define DCAST_MAX_ENDPOINT 255               /* WELCOME.x-consumers, bytes */
#define DCAST_MAX_TENSORS 262144             /* MANIFEST.tensors (= DCAST_MAX_DIGESTS) */
#define DCAST_MAX_DIMS 8                     /* one tensor's shape */
#define DCAST_MAX_TENSOR_ELEMS (1ull << 48)  /* elements of one tensor */
#define DCAST_MAX_PARTS 4096                 /* producer parts of a version */
#define DCAST_MAX_DIGESTS 262144             /* COMMIT.digests */
#define DCAST_MAX_CHUNKS (1u << 31)          /* chunks of one version part */
#define DCAST_MAX_RANGE_ELEMS (1u << 26)     /* CHUNK.count (= codec limit) */
#define DCAST_MAX_CHUNK_BYTES ((1u << 28) + (1u << 20)) /* CHUNK payload */
#define DCAST_MAX_FRAME_BYTES DCAST_MAX_CHUNK_BYTES
#define DCAST_MAX_CREDIT_BYTES (1ull << 40)  /* one CREDIT grant */
#define DCAST_MAX_CODE 255                   /* ERROR.code */
#define DCAST_MAX_VERSION_STEP (1ull << 32)  /* a version above the newest committed */

/* "No version": have_version, base_version, ... absent or nil on the wire. */
#define DCAST_VERSION_NONE UINT64_MAX

typedef enum dcast_msg_type {
	DCAST_MSG_HELLO = 1,
	DCAST_MSG_WELCOME,
	DCAST_MSG_MANIFEST,
	DCAST_MSG_CHUNK,
	DCAST_MSG_COMMIT,
	DCAST_MSG_ACK,
	DCAST_MSG_CREDIT,
	DCAST_MSG_ERROR,
	DCAST_MSG_HEARTBEAT,
	DCAST_MSG_BYE,
	DCAST_MSG_BULK,
	DCAST_MSG_TYPE_COUNT
} dcast_msg_type;

typedef enum dcast_role { DCAST_ROLE_PRODUCER = 0, DCAST_ROLE_CONSUMER = 1 } dcast_role;

/* Element dtypes, named as in safetensors; the codec takes 1, 2, 4 bytes. */
typedef enum dcast_dtype {
	DCAST_DTYPE_BF16 = 0,
	DCAST_DTYPE_F16,
	DCAST_DTYPE_F32,
	DCAST_DTYPE_F8_E4M3,
	DCAST_DTYPE_F8_E5M2,
	DCAST_DTYPE_I8,
	DCAST_DTYPE_U8,
	DCAST_DTYPE_I16,
	DCAST_DTYPE_U16,
	DCAST_DTYPE_I32,
	DCAST_DTYPE_U32,
	DCAST_DTYPE_BOOL,       /* one byte, 0 or 1 (torch.bool, numpy bool_) */
	/* 8-byte values travel as two 4-byte wire elements each, low word
	 * first (the same bytes, little-endian): docs/protocol.md, MANIFEST. */
	DCAST_DTYPE_I64,
	DCAST_DTYPE_U64,
	DCAST_DTYPE_F64,
	DCAST_DTYPE_COUNT
} dcast_dtype;

/* HELLO: first message of a producer or consumer connection (and of every
 * re-join).  A producer's have_version is the newest version it knows the
 * broker acknowledged; a consumer's is the version it has applied. */
typedef struct dcast_hello {
	uint32_t role;          /* dcast_role */
	char model[DCAST_MAX_NAME + 1];
	uint32_t part, parts;   /* producer's share; consumers 0 of 1 */
	uint64_t have_version;  /* or DCAST_VERSION_NONE */
	uint64_t window_bytes;  /* consumer's initial credit, 0 = none yet */
	char client[DCAST_MAX_CLIENT + 1]; /* free-form name for logs, may be "" */
	/* Consumer: 1 when it takes an anchor over a bulk TCP connection
	 * (BULK); 0 (the default, not encoded): ZeroMQ only.  "x-bulk" on the
	 * wire, so brokers that predate it ignore it. */
	uint32_t bulk;
} dcast_hello;

/* WELCOME: the broker's answer to HELLO. */
typedef struct dcast_welcome {
	char model[DCAST_MAX_NAME + 1];
	uint64_t version;        /* newest committed version, or NONE */
	uint64_t anchor_version; /* newest anchor in the log, or NONE */
	uint32_t need_anchor;    /* producer: next version must be an anchor */
	uint32_t heartbeat_ms;   /* peer silent 3x this long is considered gone */
	uint64_t run;            /* run identity of the model's stream; 0: none */
	/* To a producer: the broker's consumer endpoint as bound (ZeroMQ's
	 * ZMQ_LAST_ENDPOINT, e.g. "tcp://0.0.0.0:5556"), where a new producer
	 * process fetches its baseline.  "" (the default): none named, and
	 * not encoded; printable ASCII, no spaces. */
	char consumers[DCAST_MAX_ENDPOINT + 1];
} dcast_welcome;

typedef struct dcast_tensor_desc {
	char name[DCAST_MAX_NAME + 1];
	uint32_t dtype;   /* dcast_dtype */
	uint32_t ndim;
	uint64_t shape[DCAST_MAX_DIMS];
	/* Tiles per dimension when the producer parts hold the tensor as a grid
	 * of equal tiles (tensor-parallel slices): grid[d] divides shape[d], and
	 * the tensor's element order on the wire (CHUNK.start, digests) is tile
	 * by tile, each tile row-major (docs/protocol.md, "Tiled tensors").  All
	 * 0 (or all 1): untiled, the flat row-major order. */
	uint32_t grid[DCAST_MAX_DIMS];
} dcast_tensor_desc;

/* MANIFEST: every tensor of the model (global shapes; every part sends the
 * same one).  CHUNK.tensor indexes this list. */
typedef struct dcast_manifest {
	char model[DCAST_MAX_NAME + 1];
	uint32_t n_tensors;
	dcast_tensor_desc *tensors; /* owned by the message: dcast_msg_free() */
	/* dcast_manifest_sum() of the fields above.  The encoder computes and
	 * writes it (what is set here is not read); decoded: the header's
	 * value, checked (0 for a stored one without it). */
	uint64_t sum;
} dcast_manifest;

/* CHUNK: one element range of one tensor; the payload is frame 1. */
typedef struct dcast_chunk {
	char model[DCAST_MAX_NAME + 1];
	uint64_t version;
	uint64_t base_version;  /* NONE for an anchor */
	uint32_t anchor;        /* 1: dense, every element; 0: delta on base */
	uint32_t part;
	uint32_t seq;           /* index of the chunk within its part's version */
	uint32_t tensor;        /* index into the manifest */
	uint64_t start, count;  /* element range */
	uint32_t elem_size;     /* 1, 2 or 4 */
	uint32_t encoding;      /* enum dcast_encoding (codec.h) */
	uint64_t changed;       /* changed elements, <= count */
	uint64_t payload_bytes; /* length of frame 1 */
	uint64_t checksum;      /* dcast_chunk_checksum(): payload and placement */
} dcast_chunk;

/* A digest of one tensor range at the committed version. */
typedef struct dcast_range_digest {
	uint32_t tensor;
	uint64_t start, count;
	uint64_t digest;
} dcast_range_digest;

/* COMMIT: closes a part's share of a version (producer -> broker) or a whole
 * version (broker -> consumer). */
typedef struct dcast_commit {
	char model[DCAST_MAX_NAME + 1];
	uint64_t version;
	uint64_t base_version;   /* NONE for an anchor */
	uint32_t anchor;
	uint32_t part, parts;
	uint32_t chunks;         /* CHUNK messages in this part / version */
	uint64_t bytes;          /* their payload bytes in total */
	uint32_t n_digests;
	dcast_range_digest *digests; /* owned by the message: dcast_msg_free() */
} dcast_commit;

/* ACK: broker -> producer: version committed (and durable with a data
 * dir); consumer -> broker: version applied. */
typedef struct dcast_ack {
	char model[DCAST_MAX_NAME + 1];
	uint64_t version;
	uint32_t part;
} dcast_ack;

/* CREDIT: grants the peer `bytes` more payload bytes in flight.  `model`
 * is optional on the wire: "" (the default) is not encoded. */
typedef struct dcast_credit {
	uint64_t bytes;
	char model[DCAST_MAX_NAME + 1]; /* may be "": the connection's model */
} dcast_credit;

/* ERROR: code is a dcast_err; text says what and why. */
typedef struct dcast_error_msg {
	uint32_t code;
	char text[DCAST_MAX_TEXT + 1];
	char model[DCAST_MAX_NAME + 1]; /* may be "" */
	uint64_t version;               /* or NONE */
} dcast_error_msg;

typedef struct dcast_heartbeat {
	uint64_t time_ms; /* sender's monotonic clock, informative */
	uint64_t version; /* sender's newest version, or NONE */
} dcast_heartbeat;

typedef struct dcast_bye {
	char reason[DCAST_MAX_TEXT + 1];
} dcast_bye;

/* BULK: broker -> a consumer whose HELLO said bulk: the committed anchor
 * `version` (chunks CHUNK messages, bytes payload bytes, then its COMMIT)
 * comes over a TCP connection the consumer opens to the broker's host at
 * `port` and starts with `token` (docs/protocol.md, "Bulk anchors").
 * Nothing else of the stream is sent on ZeroMQ until that COMMIT is
 * through. */
typedef struct dcast_bulk {
	char model[DCAST_MAX_NAME + 1];
	uint64_t version;
	uint32_t port;   /* 1..65535 */
	uint64_t token;  /* the connection's first 16 bytes carry it */
	uint32_t chunks; /* CHUNK frames before the COMMIT */
	uint64_t bytes;  /* their payload bytes in total */
} dcast_bulk;

/* One decoded or to-be-encoded header. */
typedef struct dcast_msg {
	uint32_t type; /* dcast_msg_type */
	union {
		dcast_hello hello;
		dcast_welcome welcome;
		dcast_manifest manifest;
		dcast_chunk chunk;
		dcast_commit commit;
		dcast_ack ack;
		dcast_credit credit;
		dcast_error_msg error;
		dcast_heartbeat heartbeat;
		dcast_bye bye;
		dcast_bulk bulk;
	} u;
} dcast_msg;

/* Zero `m`, set its type and the defaults of optional fields (versions
 * NONE, parts 1).  Never fails for a valid type. */
DCAST_API void dcast_msg_init(dcast_msg *m, dcast_msg_type type);

/* Free what a decoded or built message owns (manifest tensors, commit
 * digests) and zero those pointers.  NULL-safe; idempotent. */
DCAST_API void dcast_msg_free(dcast_msg *m);

/* Check every field of `m` against the limits and cross-field rules of
 * docs/protocol.md (the same checks decode makes).  Errors as for decode. */
DCAST_API int dcast_msg_validate(const dcast_msg *m);

/* Encode `m` as a msgpack header.  On success *out is a malloc'd buffer the
 * caller frees with free(), *out_len its length.  Validates first: an
 * invalid message is never encoded, nor one whose header would exceed
 * DCAST_MAX_HEADER_BYTES (a MANIFEST of many tensors with long names, a
 * COMMIT of many digests), which every receiver refuses.  Errors:
 * validation errors, DCAST_ETOO_LARGE (that size), DCAST_ENOMEM. */
DCAST_API int dcast_msg_encode(const dcast_msg *m, void **out, size_t *out_len);

/* Decode a header frame into `m` (which need not be initialised).  On
 * success the caller owns what `m` points to (dcast_msg_free()); on failure
 * nothing is left allocated.  Errors: DCAST_ETOO_LARGE (frame, string,
 * array), DCAST_ETRUNCATED, DCAST_EMALFORMED (not msgpack, not a map,
 * duplicate key, trailing bytes), DCAST_EPROTO_VERSION, DCAST_EMSG_TYPE,
 * DCAST_EFIELD_MISSING (a MANIFEST without `sum` included),
 * DCAST_EFIELD_TYPE, DCAST_EFIELD_RANGE, DCAST_EFIELD_UNKNOWN (keys
 * starting "x-" are extensions and ignored), DCAST_EDTYPE, DCAST_ECHECKSUM
 * (a MANIFEST whose `sum` is not dcast_manifest_sum() of what it carries,
 * naming both sums). */
DCAST_API int dcast_msg_decode(const void *data, size_t len, dcast_msg *m);

/* dcast_msg_decode for a header read back from a file whose own record
 * checksum covered it (broker segments, a consumer's record log): the same
 * checks, except that a MANIFEST may lack `sum` (records written before
 * MANIFESTs carried it); one that has it is checked.  Never for bytes
 * from a socket. */
DCAST_API int dcast_msg_decode_stored(const void *data, size_t len, dcast_msg *m);

/* Check that a payload frame of payload_len bytes (0: no frame) fits the
 * header: CHUNK needs exactly payload_bytes, every other type none.
 * Errors: DCAST_EPAYLOAD_SIZE. */
DCAST_API int dcast_msg_check_payload(const dcast_msg *m, size_t payload_len);

/* The checksum a CHUNK carries, given payload_sum = dcast_checksum() of
 * its payload: XXH3-64 (seed 0) of 11 little-endian u64s, payload_sum,
 * version, base_version, anchor, tensor, start, count, elem_size,
 * encoding, changed, payload_bytes (docs/protocol.md).  A header whose
 * placement changed on the way then fails the check as a damaged payload
 * does.  `part` and `seq` are left out: the broker renumbers them. */
DCAST_API uint64_t dcast_chunk_checksum(const dcast_chunk *c, uint64_t payload_sum);

/* The sum a MANIFEST carries: XXH3-64 (seed 0) of its canonical form,
 * the model name, the tensor count, then per tensor in order its name,
 * dtype name, dims, shape and grid (1 per dimension when untiled); each
 * string as a little-endian u32 length and its bytes, counts and grid
 * entries u32, shape entries u64, all little-endian (docs/protocol.md,
 * MANIFEST).  A bit flipped anywhere in a MANIFEST then fails its check,
 * names included.  m->sum is not read. */
DCAST_API uint64_t dcast_manifest_sum(const dcast_manifest *m);

/* Set c->checksum for its payload (payload_bytes long, every other field
 * already final): what a sender does last, the twin of dcast_chunk_verify. */
DCAST_API void dcast_chunk_seal(dcast_chunk *c, const void *payload);

/* Check a CHUNK's checksum against its payload (payload_bytes long).
 * Errors: DCAST_ECHECKSUM, naming the chunk (model, version, tensor,
 * start). */
DCAST_API int dcast_chunk_verify(const dcast_chunk *c, const void *payload);

/* The same check for a payload whose dcast_checksum() the caller has. */
DCAST_API int dcast_chunk_verify_sum(const dcast_chunk *c, uint64_t payload_sum);

/* Names used on the wire and in logs; "?" when out of range. */
DCAST_API const char *dcast_msg_type_name(int type);
DCAST_API const char *dcast_dtype_name(int dtype);

/* dtype from its wire name; -1 if unknown.  dcast_dtype_size: bytes of
 * one WIRE element (CHUNK.elem_size: 1, 2 or 4), 0 if the dtype is
 * unknown; dcast_dtype_lanes: wire elements per value (1; 2 for the 8-byte
 * dtypes I64, U64, F64), 0 if unknown. */
DCAST_API int dcast_dtype_from_name(const char *name);
DCAST_API unsigned dcast_dtype_size(int dtype);
DCAST_API unsigned dcast_dtype_lanes(int dtype);

/* Wire elements of a tensor: the product of its shape times its dtype's
 * lanes (CHUNK.start and count, digests and tiles count these). */
DCAST_API uint64_t dcast_tensor_elems(const dcast_tensor_desc *t);

/* 1 when the tensor is tiled (some grid[d] above 1 for d < ndim), else 0. */
DCAST_API int dcast_tensor_tiled(const dcast_tensor_desc *t);

/* Is `name` a valid tensor name (docs/protocol.md, MANIFEST)?  1 to
 * DCAST_MAX_NAME bytes of well-formed UTF-8, and not "__metadata__" (the
 * key a safetensors header keeps for its metadata, so a consumer could not
 * write the tensor to its anchor file).  One rule for every side: the
 * producer checks it at registration, MANIFEST validation (encode and
 * decode, so the broker and consumers) for each tensor, the safetensors
 * writer for each tensor it writes.  Returns 0, or DCAST_EFIELD_RANGE
 * (empty, not UTF-8, reserved) or DCAST_ETOO_LARGE (longer than
 * DCAST_MAX_NAME) with a detail that starts with `what` (where the name
 * is, e.g. "MANIFEST.tensors[3].name") and names the tensor (bytes outside
 * printable ASCII as \xHH) and the rule.  NULL counts as empty. */
DCAST_API int dcast_tensor_name_check(const char *name, const char *what);

/* Can `ep` go in WELCOME.x-consumers?  At most DCAST_MAX_ENDPOINT bytes of
 * printable ASCII without spaces ("" is allowed: none named).  The one
 * rule for the schema's validation and for the broker, which names its
 * consumer endpoint only when it passes.  Returns 0, or DCAST_ETOO_LARGE
 * or DCAST_EFIELD_RANGE with a detail that starts with `what` and names
 * the limit or the offending byte.  NULL counts as "". */
DCAST_API int dcast_endpoint_check(const char *ep, const char *what);

/* Write `m` as the JSON object a msgpack decoder yields for its header
 * (keys in encoding order), for test vectors and debugging.  On success
 * *out is a malloc'd NUL-terminated string the caller frees. */
DCAST_API int dcast_msg_to_json(const dcast_msg *m, char **out);

#ifdef __cplusplus
}
#endif
#endif
