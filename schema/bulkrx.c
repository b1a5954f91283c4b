/* The receiving side of a bulk connection (dcast_bulkrx.h): connect,
 * opening, frame prefix and header, payload buffers. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dcast_bulkrx.h"
#include "dcast_bytes.h"
#include "dcast_common.h"
#include "dcast_endpoint.h"
#include "dcast_slab.h"
#include "dcast_wire.h"

#define POOL_KEEP 8                 /* payload buffers kept for the next frames */
#define POOL_MAX_BYTES (4u << 20)   /* larger payloads get a buffer of their own */
#define POOL_MIN_BYTES (64u << 10)  /* smaller ones a plain message: the heap keeps those */
#define POOL_HEAD 64                /* the buffer's capacity, before its bytes */

/* Payload buffers, recycled process-wide.  A frame's payload is handed on
 * as a zmq_msg_t its taker may keep (a record written from it, a relay's
 * log), and the message's last close, on whichever thread, gives the
 * buffer back here.  Buffers from malloc would be returned to the kernel
 * and faulted in afresh, 4 KiB at a time, for every chunk
 * (docs/architecture.md, "An anchor's bytes"); kept, they stay warm.
 * Each buffer is its first payload's size (an equal-sized chunk reuses
 * it, a tensor's tail too); payloads under POOL_MIN_BYTES are plain
 * messages.  At most POOL_KEEP of at most POOL_MAX_BYTES each (32 MiB)
 * stay allocated once an anchor came this way; the buffers are never
 * freed back (the process's exit frees them). */
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

int dcast_bulkrx_payload_buffer(dcast_bulkrx *r)
{
	size_t n = (size_t)r->payload_len;
	unsigned char *base;

	DCAST_ASSERT(dcast_bulkrx_head_done(r) && !r->has_payload);
	if (n < POOL_MIN_BYTES) {
		if (zmq_msg_init_size(&r->payload, n))
			return dcast_fail(DCAST_ENOMEM, "bulk frame payload of %zu bytes", n);
	} else if (!(base = buf_get(n)) || zmq_msg_init_data(&r->payload, base + POOL_HEAD, n, buf_put, base)) {
		free(base);
		return dcast_fail(DCAST_ENOMEM, "bulk frame payload of %zu bytes", n);
	}
	r->has_payload = 1;
	return 0;
}

int dcast_bulkrx_payload_kept(dcast_bulkrx *r, struct dcast_slab_pool *pool)
{
	size_t n = (size_t)r->payload_len;

	if (n < POOL_MIN_BYTES)
		return dcast_bulkrx_payload_buffer(r);
	DCAST_ASSERT(dcast_bulkrx_head_done(r) && !r->has_payload);
	if (dcast_slab_msg(pool, &r->payload, n))
		return dcast_fail(DCAST_ENOMEM, "bulk frame payload of %zu bytes", n);
	r->has_payload = 1;
	return 0;
}

void dcast_bulkrx_payload_at(dcast_bulkrx *r, void *into)
{
	DCAST_ASSERT(dcast_bulkrx_head_done(r) && !r->has_payload);
	zmq_msg_init_data(&r->payload, into, (size_t)r->payload_len, NULL, NULL); /* never fails */
	r->has_payload = 1;
}

void dcast_bulkrx_init(dcast_bulkrx *r)
{
	memset(r, 0, sizeof(*r));
	r->fd = r->file_fd = -1;
	r->version = DCAST_VERSION_NONE;
}

/* The endpoint's host (brackets of an IPv6 address taken off), resolved.
 * Errors: DCAST_EINVAL, DCAST_ENOTFOUND. */
static int resolve(const char *ep, const char *h, size_t n, struct addrinfo **ai)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	char host[256];
	int rc;

	if (n >= 2 && h[0] == '[' && h[n - 1] == ']')
		h++, n -= 2;
	if (!n || n >= sizeof(host))
		return dcast_fail(DCAST_EINVAL, "bulk: no host of at most %zu bytes in the endpoint %s",
				  sizeof(host) - 1, ep);
	memcpy(host, h, n);
	host[n] = '\0';
	if ((rc = getaddrinfo(host, "0", &hints, ai)))
		return dcast_fail(DCAST_ENOTFOUND, "bulk: host %s (endpoint %s): %s", host, ep,
				  gai_strerror(rc));
	return 0;
}

int dcast_bulkrx_resolve(const char *ep, struct sockaddr_storage *a, socklen_t *len)
{
	const struct addrinfo *it;
	struct addrinfo *ai = NULL;
	const char *h = NULL;
	size_t n = dcast_tcp_host(ep, &h);
	int err;

	*len = 0;
	if (!n)
		return 0;
	if ((err = resolve(ep, h, n, &ai)))
		return err;
	for (it = ai; it->ai_next && it->ai_family != AF_INET; it = it->ai_next)
		; /* the broker's --bulk listens on IPv4: its address first */
	if (it->ai_addrlen <= sizeof(*a)) {
		memcpy(a, it->ai_addr, it->ai_addrlen);
		*len = it->ai_addrlen;
	}
	freeaddrinfo(ai);
	return 0;
}

/* 1 when a (with its port) is an address of this host: a loopback one,
 * or one a socket can bind. */
static int addr_here(const struct sockaddr_storage *a, socklen_t len)
{
	struct sockaddr_storage b = *a;
	int fd, ok;

	if (a->ss_family == AF_INET) {
		((struct sockaddr_in *)&b)->sin_port = 0;
		if ((ntohl(((struct sockaddr_in *)&b)->sin_addr.s_addr) >> 24) == 127)
			return 1;
	} else if (a->ss_family == AF_INET6) {
		((struct sockaddr_in6 *)&b)->sin6_port = 0;
	} else {
		return 0;
	}
	if ((fd = socket(a->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return 0;
	ok = !bind(fd, (const struct sockaddr *)&b, len);
	close(fd);
	return ok;
}

/* The broker's local listener at `port`, when it is on this host and
 * takes the connection at once: its fd, else -1 (TCP then). */
static int local_connect(const struct sockaddr_storage *a, socklen_t len, unsigned port)
{
	struct sockaddr_un u;
	socklen_t ul = dcast_bulk_local_addr(&u, port);
	int fd;

	if (!addr_here(a, len) || (fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
		return -1;
	if (!connect(fd, (const struct sockaddr *)&u, ul))
		return fd;
	close(fd);
	return -1;
}

/* A TCP connect (non-blocking) to a at port: its fd, or -1 (logged as
 * the last error, naming the port). */
static int tcp_connect(const struct sockaddr_storage *addr, socklen_t len, unsigned port, const char *ep)
{
	struct sockaddr_storage a = *addr;
	int fd = socket(a.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (a.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&a)->sin6_port = htons((uint16_t)port);
	else
		((struct sockaddr_in *)&a)->sin_port = htons((uint16_t)port);
	if (fd < 0) {
		dcast_fail(DCAST_EIO, "bulk: socket: %s", strerror(errno));
		return -1;
	}
	if (connect(fd, (const struct sockaddr *)&a, len) && errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		dcast_fail(DCAST_EIO, "bulk: connect to port %u of the host of %s: %s", port, ep, strerror(e));
		return -1;
	}
	return fd;
}

int dcast_bulkrx_start(dcast_bulkrx *r, const struct sockaddr_storage *addr, socklen_t len,
		       const dcast_bulk *b, const char *ep)
{
	int fd;

	DCAST_ASSERT(!dcast_bulkrx_active(r) && len && b->port <= 65535); /* schema: 1..65535 */
	r->addr = *addr;
	r->addr_len = len;
	r->local = (fd = local_connect(addr, len, b->port)) >= 0;
	if (fd < 0 && (fd = tcp_connect(addr, len, b->port, ep)) < 0)
		return DCAST_EIO;
	r->fd = fd;
	r->endpoint = ep;
	r->version = b->version;
	r->port = b->port;
	r->connected = 0;
	r->frames = 0;
	memcpy(r->opening, "DCB1\0\0\0\0", 8);
	dcast_put_le64(r->opening + 8, b->token);
	r->opening_sent = 0;
	return 0;
}

/* The connect done (1 in *done), still under way (0), or failed. */
static int finish_connect(dcast_bulkrx *r, int *done)
{
	struct pollfd p = {r->fd, POLLOUT, 0};
	int e = 0;
	socklen_t len = sizeof(e);

	*done = 0;
	if (poll(&p, 1, 0) <= 0)
		return 0;
	if (getsockopt(r->fd, SOL_SOCKET, SO_ERROR, &e, &len) || e)
		return dcast_fail(DCAST_EIO, "bulk: connect to port %u of the host of %s: %s", r->port,
				  r->endpoint, strerror(e ? e : errno));
	r->connected = *done = 1;
	return 0;
}

static int send_opening(dcast_bulkrx *r)
{
	ssize_t n = send(r->fd, r->opening + r->opening_sent, DCAST_BULK_OPENING - r->opening_sent,
			 MSG_NOSIGNAL);

	if (n < 0 && errno != EAGAIN && errno != EINTR)
		return dcast_fail(DCAST_EIO, "bulk: sending the opening: %s", strerror(errno));
	r->opening_sent += n > 0 ? (uint32_t)n : 0;
	return 0;
}

int dcast_bulkrx_open_step(dcast_bulkrx *r, int *open)
{
	int err = 0, done = 1;

	*open = 0;
	if (!r->connected && ((err = finish_connect(r, &done)) || !done))
		return err;
	if (r->opening_sent < DCAST_BULK_OPENING && (err = send_opening(r)))
		return err;
	*open = r->opening_sent == DCAST_BULK_OPENING;
	return 0;
}

int dcast_bulkrx_quiet_fail(const dcast_bulkrx *r, uint64_t ms)
{
	if (!r->connected)
		return dcast_fail(DCAST_ETIMEDOUT, "bulk: the connect to port %u of the host of %s is "
				  "unanswered after %" PRIu64 " ms: is that port open to this host?", r->port,
				  r->endpoint, ms);
	return dcast_fail(DCAST_ETIMEDOUT, "bulk: nothing came over the connection for %" PRIu64 " ms",
			  ms);
}

/* Local: a file the broker passed with these bytes becomes the one its
 * references read (the one before closed); any more are closed. */
static void files_taken(dcast_bulkrx *r, struct msghdr *mh)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		size_t n = cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS
			   ? (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int) : 0;
		for (size_t i = 0; i < n; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (r->file_fd >= 0)
				close(r->file_fd);
			r->file_fd = fd;
		}
	}
}

/* recv, or on a local connection recvmsg taking the files passed. */
static ssize_t take_some(dcast_bulkrx *r, void *p, uint64_t n)
{
	union { char buf[CMSG_SPACE(4 * sizeof(int))]; struct cmsghdr align; } u;
	struct iovec iov = {p, (size_t)n};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf)};
	ssize_t k;

	if (!r->local)
		return recv(r->fd, p, n, 0);
	if ((k = recvmsg(r->fd, &mh, MSG_CMSG_CLOEXEC)) >= 0)
		files_taken(r, &mh);
	return k;
}

/* A local connection closed before a byte of its first frame: the
 * socket of that name is another broker's (two brokers in one network
 * namespace on the same --bulk port), which refused the token.  The
 * same opening goes to the broker's TCP port instead, once, on the same
 * descriptor number (dup3), so that a poll set holding it stays right:
 * the caller polls for ZMQ_POLLOUT again while !r->connected. */
static int local_refused(const dcast_bulkrx *r)
{
	return r->local && !r->frames && !r->prefix_got;
}

static int tcp_instead(dcast_bulkrx *r)
{
	int fd = tcp_connect(&r->addr, r->addr_len, r->port, r->endpoint);

	DCAST_LOG_W("bulk: the unix socket of port %u closed before the first frame of version %" PRIu64
		    " (another broker's socket of that name?): over TCP instead", r->port, r->version);
	if (fd < 0)
		return DCAST_EIO;
	if (dup3(fd, r->fd, O_CLOEXEC) < 0) {
		int e = errno;
		close(fd);
		return dcast_fail(DCAST_EIO, "bulk: dup3: %s", strerror(e));
	}
	close(fd);
	r->local = 0;
	r->connected = 0;
	r->opening_sent = 0;
	return 0;
}

int dcast_bulkrx_take(dcast_bulkrx *r, void *p, uint64_t n, uint64_t *got)
{
	ssize_t k = take_some(r, p, n);

	*got = 0;
	if (k == 0 && local_refused(r))
		return tcp_instead(r);
	if (k == 0)
		return dcast_fail(DCAST_EIO, "bulk: the broker closed the connection before the COMMIT "
				  "of version %" PRIu64 " (after %" PRIu64 " frames)", r->version, r->frames);
	if (k < 0)
		return errno == EAGAIN || errno == EINTR ? 0
		       : dcast_fail(DCAST_EIO, "bulk: recv: %s", strerror(errno));
	*got = (uint64_t)k;
	return 0;
}

int dcast_bulkrx_take_payload(dcast_bulkrx *r, void *p, uint64_t n, uint64_t *got)
{
	ssize_t k;

	if (!r->by_ref)
		return dcast_bulkrx_take(r, p, n, got);
	*got = 0;
	if ((k = pread(r->file_fd, p, (size_t)n, (off_t)(r->ref_off + r->payload_got))) > 0)
		*got = (uint64_t)k;
	else if (k == 0)
		return dcast_fail(DCAST_EIO, "bulk frame %" PRIu64 ": the broker's file ends at %" PRIu64
				  " bytes, inside the payload its reference names (%" PRIu64 " bytes at %"
				  PRIu64 ")", r->frames, r->ref_off + r->payload_got, r->payload_len, r->ref_off);
	else if (errno != EINTR)
		return dcast_fail(DCAST_EIO, "bulk frame %" PRIu64 ": reading the broker's file: %s",
				  r->frames, strerror(errno));
	return 0;
}

/* The prefix read: its header length and payload length checked against
 * the schema's limits, room made for the header. */
static int prefix_parse(dcast_bulkrx *r)
{
	uint32_t h = dcast_get_le32(r->prefix);
	uint64_t p = dcast_get_le64(r->prefix + 4);

	if (h < 1 || h > DCAST_MAX_HEADER_BYTES)
		return dcast_fail(DCAST_EMALFORMED, "bulk frame %" PRIu64 ": header length %u outside "
				  "1..%u", r->frames, h, DCAST_MAX_HEADER_BYTES);
	if (p > DCAST_MAX_CHUNK_BYTES)
		return dcast_fail(DCAST_EMALFORMED, "bulk frame %" PRIu64 ": payload length %" PRIu64
				  " over the CHUNK limit of %u bytes", r->frames, p, DCAST_MAX_CHUNK_BYTES);
	if (h > r->head_cap) {
		unsigned char *n = realloc(r->head, h);
		if (!n)
			return dcast_fail(DCAST_ENOMEM, "bulk frame header of %u bytes", h);
		r->head = n;
		r->head_cap = h;
	}
	r->head_len = h;
	r->payload_len = p;
	return 0;
}

/* What a bulk connection may carry: the version's CHUNKs, then its COMMIT. */
static int frame_fits(const dcast_bulkrx *r, const dcast_msg *m)
{
	uint64_t v = m->type == DCAST_MSG_CHUNK ? m->u.chunk.version
		     : m->type == DCAST_MSG_COMMIT ? m->u.commit.version : DCAST_VERSION_NONE;

	if (m->type != DCAST_MSG_CHUNK && m->type != DCAST_MSG_COMMIT)
		return dcast_fail(DCAST_EMALFORMED, "bulk frame %" PRIu64 ": a %s, not a CHUNK or COMMIT",
				  r->frames, dcast_msg_type_name((int)m->type));
	if (v != r->version)
		return dcast_fail(DCAST_EMALFORMED, "bulk frame %" PRIu64 ": a %s of version %" PRIu64
				  ", not of version %" PRIu64, r->frames, dcast_msg_type_name((int)m->type),
				  v, r->version);
	return 0;
}

/* The header read whole: decoded once, checked against the frame's
 * payload length and the version, so that a frame that cannot be taken
 * fails before its payload is read. */
static int head_decode(dcast_bulkrx *r)
{
	char why[512];
	int err = dcast_msg_decode(r->head, r->head_len, &r->msg);

	if (!err && (err = dcast_msg_check_payload(&r->msg, r->payload_len)))
		dcast_msg_free(&r->msg);
	if (err) {
		snprintf(why, sizeof(why), "%s", dcast_last_error());
		return dcast_fail(err, "bulk frame %" PRIu64 ": %s", r->frames, why);
	}
	if ((err = frame_fits(r, &r->msg)))
		dcast_msg_free(&r->msg);
	r->has_msg = !err;
	return err;
}

/* Local: the reference read whole: inline bytes follow, or the payload
 * is read from the file passed last. */
static int ref_parse(dcast_bulkrx *r)
{
	uint64_t off = dcast_get_le64(r->ref);

	if (off == DCAST_BULK_REF_INLINE)
		return 0;
	if (r->file_fd < 0)
		return dcast_fail(DCAST_EMALFORMED, "bulk frame %" PRIu64 ": a payload by reference, "
				  "and no file passed", r->frames);
	if (off > INT64_MAX - r->payload_len)
		return dcast_fail(DCAST_EMALFORMED, "bulk frame %" PRIu64 ": a reference at offset %"
				  PRIu64 ", past any file", r->frames, off);
	r->by_ref = 1;
	r->ref_off = off;
	return 0;
}

int dcast_bulkrx_head_step(dcast_bulkrx *r, uint64_t *got)
{
	int err;

	DCAST_ASSERT(!dcast_bulkrx_head_done(r));
	if (r->prefix_got < DCAST_BULK_PREFIX) {
		err = dcast_bulkrx_take(r, r->prefix + r->prefix_got, DCAST_BULK_PREFIX - r->prefix_got, got);
		r->prefix_got += (uint32_t)*got;
		return !err && r->prefix_got == DCAST_BULK_PREFIX ? prefix_parse(r) : err;
	}
	if (r->head_got < r->head_len) {
		err = dcast_bulkrx_take(r, r->head + r->head_got, r->head_len - r->head_got, got);
		r->head_got += (uint32_t)*got;
		return !err && r->head_got == r->head_len ? head_decode(r) : err;
	}
	err = dcast_bulkrx_take(r, r->ref + r->ref_got, DCAST_BULK_REF - r->ref_got, got);
	r->ref_got += (uint32_t)*got;
	return !err && r->ref_got == DCAST_BULK_REF ? ref_parse(r) : err;
}

static void frame_reset(dcast_bulkrx *r)
{
	if (r->has_payload)
		zmq_msg_close(&r->payload);
	if (r->has_msg)
		dcast_msg_free(&r->msg);
	r->has_payload = r->has_msg = 0;
	r->prefix_got = r->head_len = r->head_got = r->ref_got = 0;
	r->payload_len = r->payload_got = 0;
	r->by_ref = 0;
}

void dcast_bulkrx_finish(dcast_bulkrx *r, dcast_wire_in *in)
{
	DCAST_ASSERT(dcast_bulkrx_whole(r));
	memset(in, 0, sizeof(*in));
	in->msg = r->msg;
	r->has_msg = 0;
	zmq_msg_init(&in->payload);
	zmq_msg_move(&in->payload, &r->payload);
	in->has_payload = r->payload_len > 0;
	frame_reset(r);
	r->frames++;
}

void dcast_bulkrx_close(dcast_bulkrx *r)
{
	if (!dcast_bulkrx_active(r))
		return;
	close(r->fd);
	if (r->file_fd >= 0)
		close(r->file_fd);
	r->fd = r->file_fd = -1;
	r->local = 0;
	r->version = DCAST_VERSION_NONE;
	frame_reset(r);
	free(r->head);
	r->head = NULL;
	r->head_cap = 0;
}
