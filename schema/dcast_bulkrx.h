/* Private: the receiving side of a bulk connection (docs/protocol.md,
 * "Bulk anchors"), shared by the consumer (consumer/bulk.c) and the
 * relay (broker/relaybulk.c).  After a BULK the receiver connects to the
 * broker's host at the port it names (on that host, to the broker's unix
 * socket first: payloads in its files then come as references), sends the
 * opening ("DCB1", 4 zero bytes, the token) and reads frames: a 12-byte prefix (header length u32
 * LE, payload length u64 LE), the header as ZeroMQ carries it, the
 * payload.  Each header is decoded and checked as dcast_wire_recv checks
 * a message (and against the frame's payload length and the version the
 * BULK named) before its payload is read, so that a frame that cannot be
 * taken fails at once.  Where a payload lands is the caller's choice
 * (dcast_bulkrx_payload_buffer, dcast_bulkrx_payload_at), and so is how
 * much of it to read per turn.  The socket is non-blocking: every call
 * moves what is there and returns.  Not thread-safe: one owner. */
#ifndef DCAST_BULKRX_H
#define DCAST_BULKRX_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <zmq.h>
#include "deltacast/schema.h"

#define DCAST_BULK_PREFIX 12
#define DCAST_BULK_OPENING 16
/* A connect still under way this long has failed: a reachable port
 * answers in a round trip, and this leaves two SYN retransmissions.  One
 * that never answers is a port closed to this host by a firewall (the
 * broker's --bulk not opened), which should cost a joiner seconds before
 * it takes the anchor over ZeroMQ, not the transfer's quiet limit. */
#define DCAST_BULK_CONNECT_MS 5000
/* A transfer that moves no byte for 3 heartbeats, and at least this long,
 * has failed: the rule both sides keep (the broker closes such a
 * connection, the consumer or relay gives it up). */
#define DCAST_BULK_QUIET_MIN_MS 30000

/* A transfer's quiet limit, ms, under heartbeats of heartbeat_ms. */
static inline uint64_t dcast_bulk_quiet_ms(uint64_t heartbeat_ms)
{
	return 3 * heartbeat_ms > DCAST_BULK_QUIET_MIN_MS ? 3 * heartbeat_ms : DCAST_BULK_QUIET_MIN_MS;
}

/* A reference frame's offset for a payload that follows inline (on a
 * local connection, a payload the broker keeps in memory). */
#define DCAST_BULK_REF_INLINE UINT64_MAX
#define DCAST_BULK_REF 8

/* Where a broker whose --bulk listens on `port` takes local connections:
 * the abstract unix socket "@deltacast-bulk-PORT" of its network
 * namespace.  There, a payload that lies in one of its files goes as a
 * reference to it (docs/protocol.md, "Bulk anchors on the broker's
 * host").  The address's length. */
static inline socklen_t dcast_bulk_local_addr(struct sockaddr_un *a, unsigned port)
{
	int n;

	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "deltacast-bulk-%u", port);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

struct dcast_wire_in;

typedef struct dcast_bulkrx {
	int fd;                        /* the connection, -1 when none */
	int connected;                 /* connect done, the opening being sent or sent */
	const char *endpoint;          /* whose host it reached (error texts; the caller's) */
	uint64_t version;              /* the version coming, NONE when no connection */
	uint32_t port;                 /* the broker's bulk port */
	uint64_t frames;               /* frames read whole */
	unsigned char opening[DCAST_BULK_OPENING];
	uint32_t opening_sent;
	unsigned char prefix[DCAST_BULK_PREFIX]; /* the frame being read: its prefix, */
	uint32_t prefix_got;
	unsigned char *head;           /* its header (head_cap bytes allocated), */
	uint32_t head_cap, head_len, head_got;
	dcast_msg msg;                 /* the header decoded, once read whole */
	int has_msg;
	zmq_msg_t payload;             /* its payload, once placed */
	uint64_t payload_len, payload_got;
	int has_payload;
	int local;                     /* the broker's local listener (a unix socket) */
	struct sockaddr_storage addr;  /* the broker's host (TCP, and the fallback from local) */
	socklen_t addr_len;
	int file_fd;                   /* local: the last file passed, -1 before one */
	unsigned char ref[DCAST_BULK_REF]; /* local: the frame's reference, */
	uint32_t ref_got;
	int by_ref;                    /* its payload read from file_fd at ref_off */
	uint64_t ref_off;
} dcast_bulkrx;

/* No connection (before anything can fail; dcast_bulkrx_close is then
 * safe). */
void dcast_bulkrx_init(dcast_bulkrx *r);

/* The host of tcp:// endpoint `ep` (brackets of an IPv6 address taken
 * off) resolved, an IPv4 address first (the broker's --bulk listens on
 * IPv4), into *a and *len; *len 0 for an endpoint that is not tcp://.
 * May block on a name lookup: call it where that is fine.  Errors:
 * DCAST_EINVAL (a host of over 255 bytes), DCAST_ENOTFOUND. */
int dcast_bulkrx_resolve(const char *ep, struct sockaddr_storage *a, socklen_t *len);

/* Connect (non-blocking) to address a at b->port for version b->version,
 * the opening queued; `ep` (kept, not copied) names the host in error
 * texts.  Where a is an address of this host, the broker's local listener
 * (dcast_bulk_local_addr) is tried first, and taken when it accepts: its
 * payloads in files then come as references, read from the file it
 * passes (r->local).  Errors: DCAST_EIO (socket, a connect refused at
 * once), naming the port; nothing is left open then. */
int dcast_bulkrx_start(dcast_bulkrx *r, const struct sockaddr_storage *a, socklen_t len,
		       const dcast_bulk *b, const char *ep);

static inline int dcast_bulkrx_active(const dcast_bulkrx *r)
{
	return r->fd >= 0;
}

/* The connect finished and the opening sent: *open 1 then, 0 while
 * either is under way (poll for ZMQ_POLLOUT).  Errors: DCAST_EIO. */
int dcast_bulkrx_open_step(dcast_bulkrx *r, int *open);

/* The connection's quiet limit, ms: DCAST_BULK_CONNECT_MS while the
 * connect is under way, else a transfer's (dcast_bulk_quiet_ms). */
static inline uint64_t dcast_bulkrx_quiet_limit(const dcast_bulkrx *r, uint64_t heartbeat_ms)
{
	return r->connected ? dcast_bulk_quiet_ms(heartbeat_ms) : DCAST_BULK_CONNECT_MS;
}

/* Why a connection hit its quiet limit after `ms`, set as the last error
 * (dcast_fail): a connect that never finished names the port and asks
 * whether it is open to this host.  Returns DCAST_ETIMEDOUT. */
int dcast_bulkrx_quiet_fail(const dcast_bulkrx *r, uint64_t ms);

/* Up to n (> 0) bytes into p: *got of them, 0 when none is there now.
 * A local connection closed before any byte of the first frame (another
 * broker's unix socket of that name refused the token) goes over to the
 * broker's TCP port, with *got 0 and r->connected 0 (poll for
 * ZMQ_POLLOUT; the descriptor number stays), once.  Errors: DCAST_EIO
 * (the peer closed before the COMMIT, a recv error, that TCP socket or
 * connect refused). */
int dcast_bulkrx_take(dcast_bulkrx *r, void *p, uint64_t n, uint64_t *got);

/* The frame's prefix and header are read, decoded and checked (the
 * payload is next). */
static inline int dcast_bulkrx_head_done(const dcast_bulkrx *r)
{
	return r->prefix_got == DCAST_BULK_PREFIX && r->head_got == r->head_len && r->has_msg &&
	       (!r->local || !r->payload_len || r->ref_got == DCAST_BULK_REF);
}

/* One recv into the prefix, the header or (local) the reference,
 * whichever is being read (not after dcast_bulkrx_head_done); *got bytes
 * came.  A prefix read whole is checked against the schema's limits; a
 * header read whole is decoded and checked: a CHUNK or the COMMIT of
 * r->version, its payload length the frame's; a reference to a file needs
 * a file passed.  Errors: those of dcast_bulkrx_take, DCAST_EMALFORMED,
 * every dcast_msg_decode error, DCAST_EPAYLOAD_SIZE, DCAST_ENOMEM. */
int dcast_bulkrx_head_step(dcast_bulkrx *r, uint64_t *got);

/* Up to n (> 0) bytes of the payload into p, from payload_got on: *got of
 * them, 0 when none is there now.  From the socket, or for a payload by
 * reference from the broker's file.  The caller adds *got to payload_got.
 * Errors: those of dcast_bulkrx_take; DCAST_EIO (the file unreadable or
 * shorter than the reference says). */
int dcast_bulkrx_take_payload(dcast_bulkrx *r, void *p, uint64_t n, uint64_t *got);

/* A payload by reference is being read: the next read needs no wait on
 * the socket. */
static inline int dcast_bulkrx_file_ready(const dcast_bulkrx *r)
{
	return r->by_ref && r->has_payload && r->payload_got < r->payload_len;
}

/* After the header: the payload is read into a buffer of its own
 * (recycled process-wide, so that an anchor's chunks reuse warm memory;
 * the message's last close gives it back, on any thread).  Errors:
 * DCAST_ENOMEM. */
int dcast_bulkrx_payload_buffer(dcast_bulkrx *r);

/* After the header: the payload is read into a buffer meant to be kept
 * for long, carved from huge-page regions (common/dcast_slab.h) when it
 * is 64 KiB or more, from `pool` (the log's own):
 * what a relay's log in memory holds.  Errors: DCAST_ENOMEM. */
struct dcast_slab_pool;
int dcast_bulkrx_payload_kept(dcast_bulkrx *r, struct dcast_slab_pool *pool);

/* After the header: the payload is read into `into` (payload_len bytes,
 * the caller's and kept valid until the frame is finished or closed). */
void dcast_bulkrx_payload_at(dcast_bulkrx *r, void *into);

/* Every byte of the frame is read (its payload placed and filled). */
static inline int dcast_bulkrx_whole(const dcast_bulkrx *r)
{
	return dcast_bulkrx_head_done(r) && r->has_payload && r->payload_got == r->payload_len;
}

/* The whole frame's message and payload move into `in` (initialised
 * here; the caller owns it as from dcast_wire_recv, no routing id); the
 * next frame starts afresh. */
void dcast_bulkrx_finish(dcast_bulkrx *r, struct dcast_wire_in *in);

/* Close the connection and forget the frame being read; idempotent. */
void dcast_bulkrx_close(dcast_bulkrx *r);

#endif
