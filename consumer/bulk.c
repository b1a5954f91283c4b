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
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
#include <zmq.h>
#include "consumer_impl.h"
#include "dcast_bytes.h"
#include "dcast_common.h"
#include "dcast_endpoint.h"
#include "dcast_landing.h"
#include "dcast_wire.h"

#define BULK_PREFIX 12
#define BULK_OPENING 16
#define POOL_KEEP 8                 /* payload buffers kept for the next frames */
#define POOL_MAX_BYTES (4u << 20)   /* larger payloads get a buffer of their own */
#define POOL_MIN_BYTES (64u << 10)  /* smaller ones a plain message: the heap keeps those */
#define POOL_HEAD 64                /* the buffer's capacity, before its bytes */
#define LAND_PIECE_BYTES (512u << 10) /* a recv() into a tensor: hashed while in L2 */

/* Payload buffers, recycled process-wide.  A frame's payload is handed on
 * as a zmq_msg_t the intake may keep (a record written from it), and the
 * message's last close, on whichever thread, gives the buffer back here.
 * Buffers from malloc would be returned to the kernel and faulted in
 * afresh, 4 KiB at a time, for every chunk (docs/architecture.md, "An
 * anchor's bytes"); kept, they stay warm.  Each buffer is its first
 * payload's size (an equal-sized chunk reuses it, a tensor's tail too);
 * payloads under POOL_MIN_BYTES are plain messages.  At most POOL_KEEP
 * of at most POOL_MAX_BYTES each (32 MiB) stay allocated once an anchor
 * came this way; the buffers are never freed back (the process's exit
 * frees them). */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *pool[POOL_KEEP];
static unsigned pool_n;

static size_t buf_cap(const unsigned char *base)
{
	size_t cap;

	memcpy(&cap, base, sizeof(cap));
	return cap;
}

static void buf_put(void *data, void *base)
{
	(void)data;
	pthread_mutex_lock(&pool_mu);
	if (base && pool_n < POOL_KEEP && buf_cap(base) <= POOL_MAX_BYTES) {
		pool[pool_n++] = base;
		base = NULL;
	}
	pthread_mutex_unlock(&pool_mu);
	free(base);
}

/* A buffer of at least n bytes: a kept one, else a new one. */
static unsigned char *buf_get(size_t n)
{
	unsigned char *base = NULL;
	size_t cap = n;

	pthread_mutex_lock(&pool_mu);
	for (unsigned i = 0; i < pool_n && !base; i++)
		if (buf_cap(pool[i]) >= n) {
			base = pool[i];
			pool[i] = pool[--pool_n];
		}
	pthread_mutex_unlock(&pool_mu);
	if (!base && (base = malloc(POOL_HEAD + cap)))
		memcpy(base, &cap, sizeof(cap));
	return base;
}

/* msg of n payload bytes in a recycled buffer.  Errors: DCAST_ENOMEM. */
static int payload_init(zmq_msg_t *msg, size_t n)
{
	unsigned char *base;

	if (n < POOL_MIN_BYTES)
		return zmq_msg_init_size(msg, n) ? dcast_fail(DCAST_ENOMEM, "bulk frame payload of %zu bytes", n) : 0;
	base = buf_get(n);
	if (!base || zmq_msg_init_data(msg, base + POOL_HEAD, n, buf_put, base)) {
		free(base);
		return dcast_fail(DCAST_ENOMEM, "bulk frame payload of %zu bytes", n);
	}
	return 0;
}

void cs_bulk_init(dcast_consumer *c)
{
	memset(&c->bulk, 0, sizeof(c->bulk));
	c->bulk.fd = -1;
	c->bulk.version = DCAST_VERSION_NONE;
}

int cs_bulk_wanted(const dcast_consumer *c)
{
	return c->bulk.addr_len && !c->bulk.off; /* an address: cs_bulk_resolve's conditions held */
}

/* The endpoint's host (brackets of an IPv6 address taken off), resolved.
 * Errors: DCAST_EINVAL, DCAST_ENOTFOUND. */
static int resolve(const dcast_consumer *c, struct addrinfo **ai)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	const char *h = NULL;
	size_t n = dcast_tcp_host(c->endpoint, &h);
	char host[256];
	int rc;

	if (n >= 2 && h[0] == '[' && h[n - 1] == ']')
		h++, n -= 2;
	if (!n || n >= sizeof(host))
		return dcast_fail(DCAST_EINVAL, "bulk: no host of at most %zu bytes in the endpoint %s",
				  sizeof(host) - 1, c->endpoint);
	memcpy(host, h, n);
	host[n] = '\0';
	if ((rc = getaddrinfo(host, "0", &hints, ai)))
		return dcast_fail(DCAST_ENOTFOUND, "bulk: host %s (endpoint %s): %s", host, c->endpoint,
				  gai_strerror(rc));
	return 0;
}

void cs_bulk_resolve(dcast_consumer *c)
{
	const struct addrinfo *a;
	struct addrinfo *ai = NULL;
	const char *h;

	c->bulk.addr_len = 0;
	if (!c->opts.bulk || c->opts.curve_server_key || !dcast_tcp_host(c->endpoint, &h))
		return;
	if (resolve(c, &ai)) {
		DCAST_LOG_W("consumer %s: %s; anchors come over ZeroMQ", c->model, dcast_last_error());
		return;
	}
	for (a = ai; a->ai_next && a->ai_family != AF_INET; a = a->ai_next)
		; /* the broker's --bulk listens on IPv4: its address first */
	if (a->ai_addrlen <= sizeof(c->bulk.addr)) {
		memcpy(&c->bulk.addr, a->ai_addr, a->ai_addrlen);
		c->bulk.addr_len = a->ai_addrlen;
	}
	freeaddrinfo(ai);
}

static int connect_to(dcast_consumer *c, uint32_t port)
{
	struct sockaddr_storage a = c->bulk.addr;
	int fd = socket(a.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (a.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&a)->sin6_port = htons((uint16_t)port);
	else
		((struct sockaddr_in *)&a)->sin_port = htons((uint16_t)port);
	if (fd < 0)
		return dcast_fail(DCAST_EIO, "bulk: socket: %s", strerror(errno));
	if (connect(fd, (const struct sockaddr *)&a, c->bulk.addr_len) && errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		return dcast_fail(DCAST_EIO, "bulk: connect to port %u of the host of %s: %s", port,
				  c->endpoint, strerror(e));
	}
	c->bulk.fd = fd;
	return 0;
}

int cs_bulk_start(dcast_consumer *c, const dcast_bulk *b)
{
	int err;

	DCAST_ASSERT(!cs_bulk_active(c) && c->bulk.addr_len && b->port <= 65535); /* schema: 1..65535 */
	if ((err = connect_to(c, b->port)))
		return err;
	c->bulk.version = b->version;
	c->bulk.port = b->port;
	c->bulk.connected = 0;
	c->bulk.received = c->bulk.freed = c->bulk.frames = 0;
	c->bulk.last_ms = dcast_now_ms();
	memcpy(c->bulk.opening, "DCB1\0\0\0\0", 8);
	dcast_put_le64(c->bulk.opening + 8, b->token);
	c->bulk.opening_sent = 0;
	return 0;
}

static void frame_reset(cs_bulk *b)
{
	if (b->has_payload)
		zmq_msg_close(&b->payload);
	if (b->has_msg)
		dcast_msg_free(&b->msg);
	b->has_payload = b->has_msg = 0;
	b->into = NULL;
	b->prefix_got = b->head_len = b->head_got = 0;
	b->payload_len = b->payload_got = 0;
}

void cs_bulk_close(dcast_consumer *c)
{
	if (!c)
		return;
	dcast_landing_free(c->bulk.land);
	c->bulk.land = NULL;
	c->bulk.land_into = NULL;
	if (!cs_bulk_active(c))
		return;
	close(c->bulk.fd);
	c->bulk.fd = -1;
	c->bulk.version = DCAST_VERSION_NONE;
	frame_reset(&c->bulk);
	free(c->bulk.head);
	c->bulk.head = NULL;
	c->bulk.head_cap = 0;
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
	return held == b->payload_got ? b->payload_len - b->payload_got : 0;
}

static int reading_payload(const cs_bulk *b)
{
	return b->prefix_got == BULK_PREFIX && b->head_got == b->head_len && b->payload_got < b->payload_len;
}

short cs_bulk_events(const dcast_consumer *c)
{
	if (!cs_bulk_active(c))
		return 0;
	if (!c->bulk.connected || c->bulk.opening_sent < BULK_OPENING)
		return ZMQ_POLLOUT;
	return reading_payload(&c->bulk) && !window_room(c) ? 0 : ZMQ_POLLIN;
}

/* The connect done (1 in *done), still under way (0), or failed. */
static int finish_connect(dcast_consumer *c, int *done)
{
	struct pollfd p = {c->bulk.fd, POLLOUT, 0};
	int e = 0;
	socklen_t len = sizeof(e);

	*done = 0;
	if (poll(&p, 1, 0) <= 0)
		return 0;
	if (getsockopt(c->bulk.fd, SOL_SOCKET, SO_ERROR, &e, &len) || e)
		return dcast_fail(DCAST_EIO, "bulk: connect to port %u of the host of %s: %s",
				  c->bulk.port, c->endpoint, strerror(e ? e : errno));
	c->bulk.connected = *done = 1;
	return 0;
}

static int send_opening(dcast_consumer *c)
{
	cs_bulk *b = &c->bulk;
	ssize_t n = send(b->fd, b->opening + b->opening_sent, BULK_OPENING - b->opening_sent, MSG_NOSIGNAL);

	if (n < 0 && errno != EAGAIN && errno != EINTR)
		return dcast_fail(DCAST_EIO, "bulk: sending the opening: %s", strerror(errno));
	b->opening_sent += n > 0 ? (uint32_t)n : 0;
	return 0;
}

/* Up to n (> 0) bytes into p: *got of them, 0 when none is there now.
 * The stream moved: the session's stall and silence timers hear of it. */
static int take(dcast_consumer *c, void *p, uint64_t n, uint64_t *got)
{
	ssize_t r = recv(c->bulk.fd, p, n, 0);

	*got = 0;
	if (r == 0)
		return dcast_fail(DCAST_EIO, "bulk: the broker closed the connection before the COMMIT "
				  "of version %" PRIu64 " (after %" PRIu64 " frames)", c->bulk.version,
				  c->bulk.frames);
	if (r < 0)
		return errno == EAGAIN || errno == EINTR ? 0
		       : dcast_fail(DCAST_EIO, "bulk: recv: %s", strerror(errno));
	*got = (uint64_t)r;
	c->bulk.last_ms = c->ss.progress_ms = c->ss.chunk_ms = c->ss.last_recv_ms = dcast_now_ms();
	return 0;
}

/* The prefix read: its header length and payload length checked against
 * the schema's limits, room made for the header. */
static int prefix_parse(dcast_consumer *c)
{
	cs_bulk *b = &c->bulk;
	uint32_t h = dcast_get_le32(b->prefix);
	uint64_t p = dcast_get_le64(b->prefix + 4);

	if (h < 1 || h > DCAST_MAX_HEADER_BYTES)
		return dcast_fail(DCAST_EMALFORMED, "bulk frame %" PRIu64 ": header length %u outside "
				  "1..%u", b->frames, h, DCAST_MAX_HEADER_BYTES);
	if (p > DCAST_MAX_CHUNK_BYTES)
		return dcast_fail(DCAST_EMALFORMED, "bulk frame %" PRIu64 ": payload length %" PRIu64
				  " over the CHUNK limit of %u bytes", b->frames, p, DCAST_MAX_CHUNK_BYTES);
	if (h > b->head_cap) {
		unsigned char *n = realloc(b->head, h);
		if (!n)
			return dcast_fail(DCAST_ENOMEM, "bulk frame header of %u bytes", h);
		b->head = n;
		b->head_cap = h;
	}
	b->head_len = h;
	b->payload_len = p;
	return 0;
}

/* What a bulk connection may carry: the version's CHUNKs, then its COMMIT. */
static int frame_fits(const cs_bulk *b, const dcast_msg *m)
{
	uint64_t v = m->type == DCAST_MSG_CHUNK ? m->u.chunk.version
		     : m->type == DCAST_MSG_COMMIT ? m->u.commit.version : DCAST_VERSION_NONE;

	if (m->type != DCAST_MSG_CHUNK && m->type != DCAST_MSG_COMMIT)
		return dcast_fail(DCAST_EMALFORMED, "bulk frame %" PRIu64 ": a %s, not a CHUNK or COMMIT",
				  b->frames, dcast_msg_type_name((int)m->type));
	if (v != b->version)
		return dcast_fail(DCAST_EMALFORMED, "bulk frame %" PRIu64 ": a %s of version %" PRIu64
				  ", not of version %" PRIu64, b->frames, dcast_msg_type_name((int)m->type),
				  v, b->version);
	return 0;
}

/* The header read whole: decoded once, checked against the frame's
 * payload length and the version, so that a frame that cannot be taken
 * fails before its payload is read. */
static int head_decode(cs_bulk *b)
{
	char why[512];
	int err = dcast_msg_decode(b->head, b->head_len, &b->msg);

	b->has_msg = !err;
	if (!err)
		err = dcast_msg_check_payload(&b->msg, b->payload_len);
	if (err) {
		snprintf(why, sizeof(why), "%s", dcast_last_error());
		return dcast_fail(err, "bulk frame %" PRIu64 ": %s", b->frames, why);
	}
	return frame_fits(b, &b->msg);
}

/* A payload read into its tensor is hashed as it lands, when the hasher
 * can be had (else the intake hashes it after). */
static void land_start(cs_bulk *b, const dcast_chunk *h, uint64_t tensor_bytes)
{
	if (!b->land && !(b->land = dcast_landing_new()))
		return;
	if (!dcast_landing_start(b->land, h->start * h->elem_size, b->payload_len, tensor_bytes))
		b->land_into = b->into;
}

/* The header read: the payload goes straight into its tensor's range when
 * the anchor is taken in place (no copy out of a buffer after), else into
 * a buffer of its own. */
static int payload_place(dcast_consumer *c, cs_bulk_dest_fn dest)
{
	cs_bulk *b = &c->bulk;

	b->land_into = NULL;
	b->into = b->payload_len && b->msg.type == DCAST_MSG_CHUNK ? dest(c, &b->msg.u.chunk) : NULL;
	if (b->into) {
		b->into_chunk = b->msg.u.chunk;
		zmq_msg_init_data(&b->payload, b->into, b->payload_len, NULL, NULL); /* never fails */
		land_start(b, &b->into_chunk, c->tensors[b->into_chunk.tensor].bytes);
	} else if (payload_init(&b->payload, (size_t)b->payload_len)) {
		return DCAST_ENOMEM;
	}
	b->has_payload = 1;
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
			  "was read into them", b->frames);
}

/* One recv of the payload, at most room bytes (a piece at a time into a
 * tensor, each hashed as it lands); *n: bytes came. */
static int payload_take(dcast_consumer *c, uint64_t room, uint64_t *n)
{
	cs_bulk *b = &c->bulk;
	unsigned char *at = (unsigned char *)zmq_msg_data(&b->payload) + b->payload_got;
	uint64_t left = b->payload_len - b->payload_got, want = left < room ? left : room;
	int err;

	if (b->land_into && want > LAND_PIECE_BYTES)
		want = LAND_PIECE_BYTES;
	err = take(c, at, want, n);
	if (b->land_into && *n)
		dcast_landing_add(b->land, at, (size_t)*n);
	b->payload_got += *n;
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

	if (b->prefix_got < BULK_PREFIX) {
		err = take(c, b->prefix + b->prefix_got, BULK_PREFIX - b->prefix_got, &n);
		b->prefix_got += (uint32_t)n;
		if (!err && b->prefix_got == BULK_PREFIX)
			err = prefix_parse(c);
	} else if (b->head_got < b->head_len) {
		err = take(c, b->head + b->head_got, b->head_len - b->head_got, &n);
		b->head_got += (uint32_t)n;
		if (!err && b->head_got == b->head_len && !(err = head_decode(b)))
			err = payload_place(c, dest);
	} else if ((room = window_room(c)) && !(err = into_still(c, dest))) {
		err = payload_take(c, room, &n);
	} else if (!err) {
		b->last_ms = dcast_now_ms(); /* held back by our own window, not silent */
	}
	*moved = n > 0;
	return err;
}

static int frame_whole(const cs_bulk *b)
{
	return b->prefix_got == BULK_PREFIX && b->head_got == b->head_len && b->payload_got == b->payload_len;
}

/* The frame read whole (its header decoded and checked, head_decode)
 * into in: its message and payload move there; the next frame starts
 * afresh. */
static void frame_finish(dcast_consumer *c, dcast_wire_in *in)
{
	cs_bulk *b = &c->bulk;

	DCAST_ASSERT(b->has_msg);
	in->msg = b->msg;
	b->has_msg = 0;
	zmq_msg_move(&in->payload, &b->payload);
	in->has_payload = b->payload_len > 0;
	frame_reset(b);
	b->frames++;
}

int cs_bulk_read(dcast_consumer *c, dcast_wire_in *in, int *got, cs_bulk_dest_fn dest)
{
	int err = 0, moved = 1;

	memset(in, 0, sizeof(*in));
	zmq_msg_init(&in->payload);
	*got = 0;
	if (!c->bulk.connected && ((err = finish_connect(c, &moved)) || !moved))
		return err;
	if (c->bulk.opening_sent < BULK_OPENING && ((err = send_opening(c)) || c->bulk.opening_sent < BULK_OPENING))
		return err;
	while (!err && moved && !frame_whole(&c->bulk))
		err = read_step(c, dest, &moved);
	if (err || !frame_whole(&c->bulk))
		return err;
	*got = 1;
	frame_finish(c, in);
	return 0;
}

const struct dcast_landing *cs_bulk_landed(const dcast_consumer *c, zmq_msg_t *payload)
{
	const cs_bulk *b = &c->bulk;

	if (!b->land_into || b->land_into != zmq_msg_data(payload) || !dcast_landing_done(b->land))
		return NULL;
	return b->land;
}
