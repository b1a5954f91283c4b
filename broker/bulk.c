/* Bulk anchors (--bulk HOST:PORT; docs/protocol.md, "Bulk anchors"): a
 * committed anchor goes to a consumer that asked (HELLO x-bulk) over a
 * plain TCP connection instead of ZeroMQ, its payloads with sendfile(2)
 * from the segment and spill files that hold them, or with send() from
 * those files' pages mapped (--bulk-send; written from memory when the log
 * keeps them there).  The fan-out (fanout.c) offers it with
 * a BULK message and a token and holds that consumer's ZeroMQ stream;
 * the consumer connects and sends the token; this file writes every
 * chunk's frame, then the COMMIT's, and hands the stream back.  The
 * connections are clients of the listener (clients.c), each with a
 * deadline that every write that makes progress moves on. */
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include "bulk.h"
#include "dcast_bytes.h"
#include "dcast_common.h"

#define BULK_HELLO_BYTES 16
#define BULK_PREFIX_BYTES 12

struct bulk_client {
	struct broker_client base;  /* first: the slot of b->bulk_clients */
	uint8_t hello[BULK_HELLO_BYTES];
	uint32_t hello_len;
	struct broker_version *v;   /* reference, once the token named an offer */
	uint64_t token;
	uint64_t peer;              /* the consumer's slot in b->cons */
	uint32_t next;              /* chunk whose frame goes next; n_chunks: the COMMIT's */
	uint64_t off;               /* bytes of that frame already sent */
	int copy;                   /* payloads in files: send() from their mapping, not sendfile */
	int have_payload;           /* copy: payload holds frame next's bytes */
	zmq_msg_t payload;          /* from broker_chunk_serve: mapped, or read when not mappable */
};

/* The consumer c serves, if it still waits for this transfer. */
static struct broker_peer *client_peer(struct broker *b, const struct bulk_client *c)
{
	struct broker_peer *p = c->peer < b->cons.hi ? &b->cons.arr[c->peer] : NULL;

	return p && p->used && p->bulk_token == c->token && p->cur == c->v ? p : NULL;
}

static void client_close(struct broker *b, struct bulk_client *c)
{
	broker_clients_close(b, &b->bulk_clients, &c->base);
}

/* Frame c->next's payload, if one is held, is let go. */
static void payload_drop(struct bulk_client *c)
{
	if (c->have_payload)
		zmq_msg_close(&c->payload);
	c->have_payload = 0;
}

static void client_free(struct broker_client *base)
{
	struct bulk_client *c = (struct bulk_client *)base;

	payload_drop(c);
	broker_version_put(c->v);
	c->v = NULL;
}

/* The consumer that was offered this token, or NULL. */
static struct broker_peer *offered(struct broker *b, uint64_t token, uint64_t *slot)
{
	for (uint64_t i = 0; token && i < b->cons.hi; i++)
		if (b->cons.arr[i].used && b->cons.arr[i].bulk_token == token) {
			*slot = i;
			return &b->cons.arr[i];
		}
	return NULL;
}

/* 1 when the connection's peer is on this host: a loopback address, or
 * the address it reached the broker at (the kernel loops it back too). */
static int peer_on_host(int fd)
{
	struct sockaddr_in me, peer;
	socklen_t ml = sizeof(me), pl = sizeof(peer);

	if (getsockname(fd, (struct sockaddr *)&me, &ml) || getpeername(fd, (struct sockaddr *)&peer, &pl) ||
	    peer.sin_family != AF_INET)
		return 0;
	return (ntohl(peer.sin_addr.s_addr) >> 24) == 127 || peer.sin_addr.s_addr == me.sin_addr.s_addr;
}

/* --bulk-send for this connection: copy (send() from the mapped pages)
 * or sendfile.  Over loopback sendfile hands the receiver the page
 * cache's pages themselves, which it copies out of memory no cache holds:
 * a receiver on this host pays more than the copy saves the broker
 * (docs/architecture.md, "The broker's side"). */
static int copy_wanted(const struct broker *b, int fd)
{
	if (!strcmp(b->cfg.bulk_send, "auto"))
		return peer_on_host(fd);
	return !strcmp(b->cfg.bulk_send, "copy");
}

/* The 16 bytes "DCB1", 0 0 0 0, token: the transfer they name starts, or
 * the connection closes (a token never offered, or one taken already). */
static int client_hello(struct broker *b, struct bulk_client *c)
{
	struct broker_peer *p;

	if (memcmp(c->hello, "DCB1\0\0\0\0", 8)) {
		DCAST_LOG_W("bulk: a connection that does not start with \"DCB1\": closed");
		return -1;
	}
	c->token = dcast_get_le64(c->hello + 8);
	p = offered(b, c->token, &c->peer);
	if (!p || p->bulk_taken) {
		DCAST_LOG_W("bulk: token %016llx %s: connection closed", (unsigned long long)c->token,
			    p ? "already taken" : "was never offered or is withdrawn");
		return -1;
	}
	p->bulk_taken = 1;
	c->v = p->cur;
	c->v->refs++;
	c->copy = copy_wanted(b, c->base.fd);
	broker_poll_events(b, c->base.fd, ZMQ_POLLOUT);
	DCAST_LOG_I("bulk: consumer %s of %s takes version %llu (%u chunks, %llu bytes, %s)", p->client,
		    p->want, (unsigned long long)c->v->version, c->v->n_chunks,
		    (unsigned long long)c->v->payload_bytes, c->copy ? "copy" : "sendfile");
	return 0;
}

static int client_read_hello(struct broker *b, struct bulk_client *c)
{
	ssize_t r = recv(c->base.fd, c->hello + c->hello_len, BULK_HELLO_BYTES - c->hello_len,
			 MSG_DONTWAIT);

	if (r < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
	if (r == 0)
		return -1;
	c->hello_len += (uint32_t)r;
	return c->hello_len == BULK_HELLO_BYTES ? client_hello(b, c) : 0;
}

/* Frame i's header (a CHUNK's, or the COMMIT's at n_chunks) and payload. */
static zmq_msg_t *frame_hdr(struct broker_version *v, uint32_t i)
{
	return i < v->n_chunks ? &v->chunks[i].hdr : &v->commit_hdr;
}

static uint64_t frame_payload(const struct broker_version *v, uint32_t i)
{
	return i < v->n_chunks ? v->chunks[i].payload_len : 0;
}

/* Send what is left of the prefix and header of frame c->next; the bytes
 * sent, 0 when the socket is full, -1 on an error. */
static ssize_t send_head(struct bulk_client *c, size_t head)
{
	zmq_msg_t *h = frame_hdr(c->v, c->next);
	uint8_t prefix[BULK_PREFIX_BYTES];
	struct iovec iov[2];
	size_t skip = (size_t)c->off;
	int n = 0;

	dcast_put_le32(prefix, (uint32_t)zmq_msg_size(h));
	dcast_put_le64(prefix + 4, frame_payload(c->v, c->next));
	if (skip < BULK_PREFIX_BYTES)
		iov[n++] = (struct iovec){prefix + skip, BULK_PREFIX_BYTES - skip};
	skip = skip > BULK_PREFIX_BYTES ? skip - BULK_PREFIX_BYTES : 0;
	iov[n++] = (struct iovec){(char *)zmq_msg_data(h) + skip, head - BULK_PREFIX_BYTES - skip};
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
	ssize_t r = sendmsg(c->base.fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL | MSG_MORE);

	if (r < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
	return r;
}

/* Frame c->next's payload in memory: the log's frame, or with copy on
 * the first write of a payload in a file, the served frame (its pages
 * mapped, shared through the read cache with the other transfers at the
 * same chunk).  NULL: sendfile it, or with *err set, it cannot be served
 * (no memory, a failed read: logged here). */
static const char *payload_mem(struct bulk_client *c, struct broker_chunk *ch, int *err)
{
	*err = 0;
	if (!ch->file)
		return zmq_msg_data(&ch->payload);
	if (!c->copy)
		return NULL;
	if (!c->have_payload && (*err = broker_chunk_serve(ch, 0, &c->payload))) {
		DCAST_LOG_W("bulk: version %llu, chunk %u: %s", (unsigned long long)c->v->version,
			    c->next, dcast_last_error());
		return NULL;
	}
	c->have_payload = 1;
	return zmq_msg_data(&c->payload);
}

/* Send what is left of frame c->next's payload: from memory (payload_mem),
 * else sendfile from its file.  The bytes sent, 0 when the socket is
 * full, -1 on an error. */
static ssize_t send_payload(struct broker *b, struct bulk_client *c, uint64_t done)
{
	struct broker_chunk *ch = &c->v->chunks[c->next];
	size_t left = (size_t)(ch->payload_len - done);
	int err;
	const char *mem = payload_mem(c, ch, &err);
	ssize_t r;

	if (err) {
		errno = EIO;
		return -1;
	}
	if (mem)
		r = send(c->base.fd, mem + done, left, MSG_DONTWAIT | MSG_NOSIGNAL);
	else {
		off_t at = (off_t)(ch->file_off + done);
		if ((r = sendfile(c->base.fd, ch->file->fd, &at, left)) > 0)
			b->stats.bulk_sendfile_bytes += (uint64_t)r;
	}
	if (r < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
	return r == 0 ? -1 : r; /* 0: the file is shorter than its chunk says */
}

/* One write of frame c->next: its head or its payload.  1 on progress,
 * 0 when the socket is full, -1 on an error. */
static int send_step(struct broker *b, struct bulk_client *c)
{
	size_t head = BULK_PREFIX_BYTES + zmq_msg_size(frame_hdr(c->v, c->next));
	uint64_t len = head + frame_payload(c->v, c->next);
	ssize_t r = c->off < head ? send_head(c, head) : send_payload(b, c, c->off - head);

	if (r <= 0)
		return (int)r;
	c->off += (uint64_t)r;
	DCAST_ASSERT(c->off <= len);
	if (c->off == len) {
		payload_drop(c);
		c->next++;
		c->off = 0;
	}
	b->stats.bulk_bytes += (uint64_t)r;
	c->base.deadline_ms = dcast_now_ms() + dcast_bulk_quiet_ms(b->cfg.heartbeat_ms);
	return 1;
}

/* Every frame is out: the consumer's stream goes on over ZeroMQ after the
 * version, as after a COMMIT sent there. */
static void client_done(struct broker *b, struct bulk_client *c, struct broker_peer *p)
{
	p->have_version = c->v->version;
	p->cur = NULL;
	p->bulk_token = 0;
	p->bulk_taken = 0;
	broker_version_put(c->v);
	b->stats.bulk_versions++;
	b->fanout_more = 1;
	DCAST_LOG_I("bulk: consumer %s of %s has version %llu", p->client, p->want,
		    (unsigned long long)p->have_version);
	shutdown(c->base.fd, SHUT_WR);
	client_close(b, c);
}

static void client_send(struct broker *b, struct bulk_client *c)
{
	struct broker_peer *p = client_peer(b, c);
	int rc = 1;

	if (!p) {
		DCAST_LOG_I("bulk: version %llu: its consumer re-joined or left: connection closed",
			    (unsigned long long)c->v->version);
		client_close(b, c);
		return;
	}
	for (int i = 0; i < BROKER_BURST_MSGS && rc > 0 && c->next <= c->v->n_chunks; i++)
		rc = send_step(b, c);
	if (c->next > c->v->n_chunks)
		client_done(b, c, p);
	else if (rc < 0) {
		DCAST_LOG_W("bulk: consumer %s of %s, version %llu, frame %u: %s: connection closed",
			    p->client, p->want, (unsigned long long)c->v->version, c->next,
			    strerror(errno));
		client_close(b, c);
	}
}

static void on_client(struct broker *b, int fd, void *arg)
{
	struct bulk_client *c = arg;

	(void)fd;
	if (dcast_now_ms() >= c->base.deadline_ms)
		client_close(b, c);
	else if (c->v)
		client_send(b, c);
	else if (client_read_hello(b, c) < 0)
		client_close(b, c);
}

/* The largest payload among v's chunks. */
static uint64_t largest_chunk(const struct broker_version *v)
{
	uint64_t m = 0;

	for (uint32_t i = 0; i < v->n_chunks; i++)
		m = v->chunks[i].payload_len > m ? v->chunks[i].payload_len : m;
	return m;
}

/* Consumers with a transfer offered or under way: at most the client slots. */
static uint32_t offers_out(const struct broker *b)
{
	uint32_t n = 0;

	for (uint64_t i = 0; i < b->cons.hi; i++)
		n += b->cons.arr[i].used && b->cons.arr[i].bulk_token;
	return n;
}

int broker_bulk_wanted(const struct broker *b, const struct broker_peer *p,
		       const struct broker_version *v)
{
	return b->bulk_port && p->bulk_ok && v->anchor && !v->open && !p->next_chunk &&
	       v->n_chunks && largest_chunk(v) <= p->window_bytes &&
	       offers_out(b) < BROKER_BULK_CLIENTS;
}

int broker_bulk_offer(struct broker *b, struct broker_peer *p)
{
	struct broker_version *v = p->cur;
	uint64_t token = 0;
	dcast_msg m;

	while (!token)
		if (getrandom(&token, sizeof(token), 0) != sizeof(token))
			return dcast_fail(DCAST_EIO, "bulk: getrandom: %s", strerror(errno));
	dcast_msg_init(&m, DCAST_MSG_BULK);
	snprintf(m.u.bulk.model, sizeof(m.u.bulk.model), "%s", p->want);
	m.u.bulk.version = v->version;
	m.u.bulk.port = b->bulk_port;
	m.u.bulk.token = token;
	m.u.bulk.chunks = v->n_chunks;
	m.u.bulk.bytes = v->payload_bytes;
	if (broker_send_msg(b, b->consumers, p, &m))
		return DCAST_EBUSY;
	p->bulk_token = token;
	p->bulk_taken = 0;
	return 0;
}

int broker_bulk_open(struct broker *b)
{
	int fd, rc;

	b->bulk_clients = (struct broker_clients){
		.what = "bulk", .listen_fd = -1, .cap = BROKER_BULK_CLIENTS, .burst = 16,
		.slot_bytes = sizeof(struct bulk_client), .client_ms = 3 * b->cfg.heartbeat_ms,
		.on_client = on_client, .on_free = client_free};
	if (!b->cfg.bulk)
		return 0;
	if (b->cfg.curve_secret)
		return dcast_fail(DCAST_EINVAL, "--bulk with --curve-secret: bulk anchors travel "
				  "outside CURVE, in the clear; use one or the other");
	if ((fd = broker_tcp_listen("--bulk", b->cfg.bulk, &b->bulk_port)) < 0)
		return -fd;
	if ((rc = broker_clients_start(b, &b->bulk_clients, fd)))
		return rc;
	DCAST_LOG_I("bulk anchors on %s", broker_tcp_bound(fd).text);
	return 0;
}

void broker_bulk_close(struct broker *b)
{
	broker_clients_stop(b, &b->bulk_clients);
	b->bulk_port = 0;
}
