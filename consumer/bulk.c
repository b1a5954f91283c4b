/* An anchor over a bulk TCP connection (docs/protocol.md, "Bulk
 * anchors"): after a BULK, the session thread connects to the broker's
 * host at the port it names, sends the opening ("DCB1", 4 zero bytes, the
 * token) and reads frames (a 12-byte prefix, the header as ZeroMQ carries
 * it, the payload) beside its socket, each frame's payload straight into
 * a zmq_msg_t, so that the frame is handed to the version state machine
 * as a ZeroMQ message would be.  The message's bytes are a buffer of its
 * own, or, for a CHUNK of an anchor taken in place, its range of the
 * tensor: the header is read first, and the caller's `dest` says where.
 * Such a payload is hashed as it lands, a piece per recv() (its checksum
 * and the file digest's blocks, kernels/dcast_landing.h), while the
 * piece is in cache, so that no later pass reads it back for them.
 * The socket is non-blocking: a turn reads what is there and returns.
 * Payload bytes are read only while those received and not yet freed
 * (cs_credit_free) stay within the consumer's window; TCP's flow control
 * holds the broker back meanwhile. */
#include <inttypes.h>
#include <string.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "dcast_landing.h"
#include "dcast_wire.h"

#define LAND_PIECE_BYTES (512u << 10) /* a recv() into a tensor: hashed while in L2 */

void cs_bulk_init(dcast_consumer *c)
{
	memset(&c->bulk, 0, sizeof(c->bulk));
	dcast_bulkrx_init(&c->bulk.rx);
}

int cs_bulk_wanted(const dcast_consumer *c)
{
	return c->bulk.addr_len && !c->bulk.off; /* an address: cs_bulk_resolve's conditions held */
}

void cs_bulk_resolve(dcast_consumer *c)
{
	c->bulk.addr_len = 0;
	if (!c->opts.bulk || c->opts.curve_server_key)
		return;
	if (dcast_bulkrx_resolve(c->endpoint, &c->bulk.addr, &c->bulk.addr_len))
		DCAST_LOG_W("consumer %s: %s; anchors come over ZeroMQ", c->model, dcast_last_error());
}

int cs_bulk_start(dcast_consumer *c, const dcast_bulk *b)
{
	int err;

	if ((err = dcast_bulkrx_start(&c->bulk.rx, &c->bulk.addr, c->bulk.addr_len, b, c->endpoint)))
		return err;
	c->bulk.received = c->bulk.freed = 0;
	c->bulk.last_ms = dcast_now_ms();
	return 0;
}

void cs_bulk_close(dcast_consumer *c)
{
	if (!c)
		return;
	dcast_landing_free(c->bulk.land);
	c->bulk.land = NULL;
	c->bulk.land_into = NULL;
	c->bulk.into = NULL;
	dcast_bulkrx_close(&c->bulk.rx);
}

/* Payload bytes that may be read now: the window less what was received
 * and not freed (a duplicate's credit, freed twice by a test fault, counts
 * nothing).  A frame larger than the window is read whole once nothing
 * else is held, for the intake to refuse it as it would on ZeroMQ. */
static uint64_t window_room(const dcast_consumer *c)
{
	const cs_bulk *b = &c->bulk;
	uint64_t held = b->received > b->freed ? b->received - b->freed : 0;

	if (held < c->ss.window_bytes)
		return c->ss.window_bytes - held;
	return held == b->rx.payload_got ? b->rx.payload_len - b->rx.payload_got : 0;
}

int cs_bulk_file_ready(const dcast_consumer *c)
{
	return dcast_bulkrx_file_ready(&c->bulk.rx) && window_room(c);
}

short cs_bulk_events(const dcast_consumer *c)
{
	const dcast_bulkrx *r = &c->bulk.rx;

	if (!dcast_bulkrx_active(r))
		return 0;
	if (!r->connected || r->opening_sent < DCAST_BULK_OPENING)
		return ZMQ_POLLOUT;
	return dcast_bulkrx_head_done(r) && r->has_payload && !window_room(c) ? 0 : ZMQ_POLLIN;
}

/* Bytes moved: the session's stall and silence timers hear of it. */
static void moved_now(dcast_consumer *c)
{
	c->bulk.last_ms = c->ss.progress_ms = c->ss.chunk_ms = c->ss.last_recv_ms = dcast_now_ms();
}

/* A payload read into its tensor is hashed as it lands, when the hasher
 * can be had (else the intake hashes it after). */
static void land_start(cs_bulk *b, const dcast_chunk *h, uint64_t tensor_bytes)
{
	if (!b->land && !(b->land = dcast_landing_new()))
		return;
	if (!dcast_landing_start(b->land, h->start * h->elem_size, b->rx.payload_len, tensor_bytes))
		b->land_into = b->into;
}

/* The header read: the payload goes straight into its tensor's range when
 * the anchor is taken in place (no copy out of a buffer after), else into
 * a buffer of its own. */
static int payload_place(dcast_consumer *c, cs_bulk_dest_fn dest)
{
	cs_bulk *b = &c->bulk;

	b->land_into = NULL;
	b->into = b->rx.payload_len && b->rx.msg.type == DCAST_MSG_CHUNK ? dest(c, &b->rx.msg.u.chunk) : NULL;
	if (!b->into)
		return dcast_bulkrx_payload_buffer(&b->rx);
	b->into_chunk = b->rx.msg.u.chunk;
	dcast_bulkrx_payload_at(&b->rx, b->into);
	land_start(b, &b->into_chunk, c->tensors[b->into_chunk.tensor].bytes);
	return 0;
}

/* A payload read into a tensor: its range is still the one to read into
 * (nothing bound or staged since; cs_drop_in_place ends the frame on a
 * bind, this is the check that it did). */
static int into_still(dcast_consumer *c, cs_bulk_dest_fn dest)
{
	cs_bulk *b = &c->bulk;

	if (!b->into || dest(c, &b->into_chunk) == b->into)
		return 0;
	return dcast_fail(DCAST_ESTATE, "bulk frame %" PRIu64 ": the tensors changed while its payload "
			  "was read into them", b->rx.frames);
}

/* One recv of the payload, at most room bytes (a piece at a time into a
 * tensor, each hashed as it lands); *n: bytes came. */
static int payload_take(dcast_consumer *c, uint64_t room, uint64_t *n)
{
	cs_bulk *b = &c->bulk;
	unsigned char *at = (unsigned char *)zmq_msg_data(&b->rx.payload) + b->rx.payload_got;
	uint64_t left = b->rx.payload_len - b->rx.payload_got, want = left < room ? left : room;
	int err;

	if (b->land_into && want > LAND_PIECE_BYTES)
		want = LAND_PIECE_BYTES;
	err = dcast_bulkrx_take_payload(&b->rx, at, want, n);
	if (b->land_into && *n)
		dcast_landing_add(b->land, at, (size_t)*n);
	b->rx.payload_got += *n;
	b->received += *n;
	return err;
}

/* One recv into the part of the frame being read (none while the window
 * is full); *moved: bytes came. */
static int read_step(dcast_consumer *c, cs_bulk_dest_fn dest, int *moved)
{
	cs_bulk *b = &c->bulk;
	uint64_t n = 0, room;
	int err = 0;

	if (!dcast_bulkrx_head_done(&b->rx)) {
		err = dcast_bulkrx_head_step(&b->rx, &n);
		if (!err && dcast_bulkrx_head_done(&b->rx))
			err = payload_place(c, dest);
	} else if ((room = window_room(c)) && !(err = into_still(c, dest))) {
		err = payload_take(c, room, &n);
	} else if (!err) {
		b->last_ms = dcast_now_ms(); /* held back by our own window, not silent */
	}
	if (n)
		moved_now(c);
	*moved = n > 0;
	return err;
}

int cs_bulk_read(dcast_consumer *c, dcast_wire_in *in, int *got, cs_bulk_dest_fn dest)
{
	dcast_bulkrx *r = &c->bulk.rx;
	int err = 0, moved = 1, open;

	memset(in, 0, sizeof(*in));
	zmq_msg_init(&in->payload);
	*got = 0;
	if ((err = dcast_bulkrx_open_step(r, &open)) || !open)
		return err;
	while (!err && moved && !dcast_bulkrx_whole(r))
		err = read_step(c, dest, &moved);
	if (err || !dcast_bulkrx_whole(r))
		return err;
	*got = 1;
	zmq_msg_close(&in->payload);
	dcast_bulkrx_finish(r, in);
	c->bulk.into = NULL;
	return 0;
}

const struct dcast_landing *cs_bulk_landed(const dcast_consumer *c, zmq_msg_t *payload)
{
	const cs_bulk *b = &c->bulk;

	if (!b->land_into || b->land_into != zmq_msg_data(payload) || !dcast_landing_done(b->land))
		return NULL;
	return b->land;
}
