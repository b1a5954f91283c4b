/* Bulk anchors (--bulk HOST:PORT; docs/protocol.md, "Bulk anchors"): a
 * committed anchor goes to a consumer that asked (HELLO x-bulk) over a
 * plain TCP connection instead of ZeroMQ, its payloads with sendfile(2)
 * from the segment and spill files that hold them, or read from those
 * files a MiB at a time and written with send() (--bulk-send; written
 * from memory when the log keeps them there).  A consumer on this host
 * connects to the unix socket @deltacast-bulk-PORT instead (unless --bulk-no-local), where a payload
 * in a file goes as a reference to it, the file passed read-only, and the
 * consumer reads it itself.  The fan-out (fanout.c) offers it with
 * a BULK message and a token and holds that consumer's ZeroMQ stream;
 * the consumer connects and sends the token; this file writes every
 * chunk's frame, then the COMMIT's, and hands the stream back.  The
 * connections are clients of the listeners (clients.c).  Once its token
 * names an offer, the loop plans the transfer (the frames' headers, and
 * each payload's message or file, held for it: the log may move a
 * payload to disk meanwhile) and a bulk thread (bulkpump.c) writes it,
 * ended when no write makes progress for the quiet limit; the loop
 * takes it back when it is done or failed. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include "bulk.h"
#include "bulkpump.h"
#include "dcast_bulkrx.h"
#include "dcast_bytes.h"
#include "dcast_common.h"

#define BULK_HELLO_BYTES 16
#define BULK_PREFIX_BYTES 12
/* copy: a payload in a file goes out through a buffer of this size,
 * read with pread (which stays in cache between the read and the send) */
#define BULK_PIECE_BYTES (1u << 20)

_Static_assert(BULK_PUMPS_MAX == BROKER_BULK_THREADS_MAX, "one limit for --bulk-threads");
_Static_assert(2 * BROKER_BULK_CLIENTS <= BULK_PUMP_JOBS_MAX,
	       "every transfer of both listeners fits on one bulk thread");

/* One frame of the transfer as planned when it starts: what the bulk
 * thread reads, none of it the log's to change meanwhile. */
struct bulk_frame {
	const void *hdr;             /* the CHUNK's (or the COMMIT's) header, the version's */
	size_t hdr_len;
	uint64_t len;                /* payload bytes */
	zmq_msg_t held;              /* in memory: a copy of the log's payload message */
	const char *mem;             /* its bytes; NULL: in file */
	struct broker_segfile *file; /* else the file (a reference of this transfer's) */
	uint64_t off;                /* and where in it */
};

struct bulk_client {
	struct broker_client base;  /* first: the slot of b->bulk_clients */
	struct bulk_pump_job job;   /* the writing, on a bulk thread (base.busy meanwhile) */
	uint8_t hello[BULK_HELLO_BYTES];
	uint32_t hello_len;
	struct broker_version *v;   /* reference, once the token named an offer */
	struct bulk_frame *fr;      /* v's chunks' frames, then the COMMIT's: n_fr */
	uint32_t n_fr;
	int noproc;                 /* the test fault bulk_noproc */
	char who[DCAST_MAX_CLIENT + DCAST_MAX_NAME + 16]; /* "consumer C of M", for the log */
	_Atomic uint64_t sent, sent_sendfile, sent_local; /* bytes, counted by the bulk thread */
	uint64_t told, told_sendfile, told_local;         /* of those, in b->stats */
	uint64_t token;
	uint64_t peer;              /* the consumer's slot in b->cons */
	uint32_t next;              /* frame that goes next; n_fr - 1: the COMMIT's */
	uint64_t off;               /* bytes of that frame already sent */
	int copy;                   /* payloads in files: read, then send(), not sendfile */
	unsigned char *piece;       /* copy: BULK_PIECE_BYTES of frame next's payload, read */
	uint64_t piece_at;          /* the payload offset of piece[0] */
	uint64_t piece_len;         /* bytes of piece read; 0: none */
	int local;                  /* on the unix socket: payloads in files go as references */
	const struct broker_segfile *ro_of; /* local: the file ro_fd reads (the version holds it) */
	int ro_fd;                  /* local: a read-only descriptor of ro_of, -1: none */
	int ro_sent;                /* local: ro_fd passed to the consumer */
	uint64_t ref_skew;          /* local: added to each offset (test fault bulk_ref_off) */
	int no_refs;                /* local: a file could not be reopened: payloads inline */
};

/* The consumer c serves, if it still waits for this transfer. */
static struct broker_peer *client_peer(struct broker *b, const struct bulk_client *c)
{
	struct broker_peer *p = c->peer < b->cons.hi ? &b->cons.arr[c->peer] : NULL;

	return p && p->used && p->bulk_token == c->token && p->cur == c->v ? p : NULL;
}

static void client_close(struct broker *b, struct bulk_client *c)
{
	broker_clients_close(b, c->local ? &b->bulk_local_clients : &b->bulk_clients, &c->base);
}

/* The plan's references back: each payload message and file. */
static void plan_free(struct bulk_client *c)
{
	for (uint32_t i = 0; c->fr && i < c->n_fr; i++) {
		if (c->fr[i].file)
			broker_segfile_put(c->fr[i].file);
		else
			zmq_msg_close(&c->fr[i].held);
	}
	free(c->fr);
	c->fr = NULL;
	c->n_fr = 0;
}

static void client_free(struct broker_client *base)
{
	struct bulk_client *c = (struct bulk_client *)base;

	plan_free(c);
	free(c->piece);
	c->piece = NULL;
	c->piece_len = 0;
	if (c->ro_fd >= 0)
		close(c->ro_fd);
	c->ro_fd = -1;
	broker_version_put(c->v);
	c->v = NULL;
}

static void on_accept(struct broker *b, struct broker_client *base)
{
	(void)b;
	((struct bulk_client *)base)->ro_fd = -1;
}

static void on_accept_local(struct broker *b, struct broker_client *base)
{
	on_accept(b, base);
	((struct bulk_client *)base)->local = 1;
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

/* --bulk-send for this connection: copy (read, then send()) or
 * sendfile.  Over loopback sendfile hands the receiver the page cache's
 * pages themselves, which it copies out of memory no cache holds:
 * a receiver on this host pays more than the copy saves the broker
 * (docs/architecture.md, "The broker's side"). */
static int copy_wanted(const struct broker *b, int fd)
{
	if (!strcmp(b->cfg.bulk_send, "auto"))
		return peer_on_host(fd);
	return !strcmp(b->cfg.bulk_send, "copy");
}

/* c->fr: v's frames, each payload's message copied or its file's
 * reference taken, so that the bulk thread reads what stays put while the
 * log moves a payload from memory to a segment file (ondisk.c).  Errors:
 * DCAST_ENOMEM. */
static int plan(struct bulk_client *c)
{
	const struct broker_version *v = c->v;

	if (!(c->fr = calloc((size_t)v->n_chunks + 1, sizeof(*c->fr))))
		return dcast_fail(DCAST_ENOMEM, "bulk: version %llu: the plan of %u chunks",
				  (unsigned long long)v->version, v->n_chunks);
	c->n_fr = v->n_chunks + 1;
	for (uint32_t i = 0; i < c->n_fr; i++) {
		struct bulk_frame *f = &c->fr[i];
		const struct broker_chunk *ch = i < v->n_chunks ? &v->chunks[i] : NULL;
		zmq_msg_t *h = ch ? (zmq_msg_t *)&ch->hdr : (zmq_msg_t *)&v->commit_hdr;

		f->hdr = zmq_msg_data(h);
		f->hdr_len = zmq_msg_size(h);
		zmq_msg_init(&f->held);
		if (!ch)
			continue;
		f->len = ch->payload_len;
		if ((f->file = ch->file)) {
			f->file->refs++;
			f->off = ch->file_off;
		} else {
			zmq_msg_copy(&f->held, (zmq_msg_t *)&ch->payload);
			f->mem = zmq_msg_data(&f->held);
		}
	}
	return 0;
}

/* The transfer goes to a bulk thread: out of the loop's poll set until
 * it comes back (on_pumped). */
static void client_pump(struct broker *b, struct bulk_client *c)
{
	c->job.fd = c->base.fd;
	c->job.quiet_ms = dcast_bulk_quiet_ms(b->cfg.heartbeat_ms);
	broker_poll_del(b, c->base.fd);
	c->base.busy = 1;
	bulk_pumps_give(b->bulk_pumps, &c->job);
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
	c->v = p->cur;
	c->v->refs++;
	if (plan(c)) {
		DCAST_LOG_W("%s: connection closed", dcast_last_error());
		return -1;
	}
	p->bulk_taken = 1;
	snprintf(c->who, sizeof(c->who), "consumer %s of %s", p->client, p->want);
	c->copy = c->local || copy_wanted(b, c->base.fd);
	c->noproc = b->cfg.fault_bulk_noproc;
	if (c->local && b->cfg.fault_bulk_ref_off) { /* the first local transfer only */
		c->ref_skew = b->cfg.fault_bulk_ref_off;
		b->cfg.fault_bulk_ref_off = 0;
	}
	DCAST_LOG_I("bulk: %s takes version %llu (%u chunks, %llu bytes, %s)", c->who,
		    (unsigned long long)c->v->version, c->v->n_chunks,
		    (unsigned long long)c->v->payload_bytes,
		    c->local ? "local" : c->copy ? "copy" : "sendfile");
	client_pump(b, c);
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

/* ---- the bulk thread's side: c's plan, its buffers, its socket ---- */

/* Local: frame i's payload goes as a reference, 8 bytes after its
 * header: the offset in a file, or DCAST_BULK_REF_INLINE. */
static int frame_has_ref(const struct bulk_client *c, uint32_t i)
{
	return c->local && c->fr[i].len;
}

/* Local: frame i's payload lies in a file and goes by reference only. */
static int frame_by_ref(const struct bulk_client *c, uint32_t i)
{
	return frame_has_ref(c, i) && c->fr[i].file && !c->no_refs;
}

/* Local: ro_fd reads f, a descriptor opened read-only through /proc
 * (the segment's own is read-write), to be passed with the next frame
 * that names it.  -1 when it cannot be opened (logged): the payloads
 * then go inline. */
static int ref_open(struct bulk_client *c, const struct broker_segfile *f)
{
	char path[64];
	int fd;

	if (c->ro_of == f)
		return 0;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", f->fd);
	fd = c->noproc ? -1 : open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (c->noproc) /* the test fault: as without /proc */
			errno = ENOENT;
		DCAST_LOG_W("bulk: version %llu: %s, read-only: %s; its payloads go inline",
			    (unsigned long long)c->v->version, path, strerror(errno));
		return -1;
	}
	if (c->ro_fd >= 0)
		close(c->ro_fd);
	c->ro_fd = fd;
	c->ro_of = f;
	c->ro_sent = 0;
	return 0;
}

/* Local: 1 when frame c->next goes by reference, its file's read-only
 * descriptor opened as the frame starts (where that fails, every payload
 * goes inline from then on). */
static int frame_ref_ready(struct bulk_client *c)
{
	if (!c->off && frame_by_ref(c, c->next) && ref_open(c, c->fr[c->next].file))
		c->no_refs = 1;
	return frame_by_ref(c, c->next);
}

/* iov: what is left of the n parts of `all` after `skip` bytes; the
 * parts left. */
static int iov_after(const struct iovec *all, int n, size_t skip, struct iovec *iov)
{
	int k = 0;

	for (int i = 0; i < n; i++) {
		size_t cut = skip < all[i].iov_len ? skip : all[i].iov_len;
		skip -= cut;
		if (cut < all[i].iov_len)
			iov[k++] = (struct iovec){(char *)all[i].iov_base + cut, all[i].iov_len - cut};
	}
	return k;
}

/* Send what is left of the prefix and header of frame c->next (and on a
 * local connection its reference, the file's descriptor passed with it
 * when new to the consumer; by_ref: frame_ref_ready's answer); the bytes
 * sent, 0 when the socket is full, -1 on an error. */
static ssize_t send_head(struct bulk_client *c, int by_ref)
{
	const struct bulk_frame *f = &c->fr[c->next];
	uint8_t prefix[BULK_PREFIX_BYTES], ref[DCAST_BULK_REF];
	struct iovec all[3] = {{prefix, sizeof(prefix)}, {(void *)f->hdr, f->hdr_len}, {ref, sizeof(ref)}};
	struct iovec iov[3];
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
	struct msghdr mh = {.msg_iov = iov};

	dcast_put_le32(prefix, (uint32_t)f->hdr_len);
	dcast_put_le64(prefix + 4, f->len);
	dcast_put_le64(ref, by_ref ? f->off + c->ref_skew : DCAST_BULK_REF_INLINE);
	mh.msg_iovlen = (size_t)iov_after(all, frame_has_ref(c, c->next) ? 3 : 2, (size_t)c->off, iov);
	if (by_ref && !c->ro_sent) {
		struct cmsghdr *cm;
		memset(&u, 0, sizeof(u)); /* CMSG_SPACE's padding too */
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		cm = CMSG_FIRSTHDR(&mh);
		*cm = (struct cmsghdr){.cmsg_len = CMSG_LEN(sizeof(int)), .cmsg_level = SOL_SOCKET,
				       .cmsg_type = SCM_RIGHTS};
		memcpy(CMSG_DATA(cm), &c->ro_fd, sizeof(int));
	}
	ssize_t r = sendmsg(c->base.fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL | MSG_MORE);

	if (r < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
	c->ro_sent |= by_ref;
	return r;
}

/* copy: the piece of frame c->next's payload that holds offset `done`,
 * read into c->piece unless it is there.  Errors: no memory, a failed or
 * short read (logged here). */
static int piece_read(struct bulk_client *c, const struct bulk_frame *f, uint64_t done)
{
	uint64_t left = f->len - done, n = left < BULK_PIECE_BYTES ? left : BULK_PIECE_BYTES;
	int err;

	if (c->piece_len && done >= c->piece_at && done < c->piece_at + c->piece_len)
		return 0;
	c->piece_len = 0;
	if (!c->piece && !(c->piece = malloc(BULK_PIECE_BYTES)))
		err = dcast_fail(DCAST_ENOMEM, "a read buffer of %u bytes", BULK_PIECE_BYTES);
	else
		err = broker_file_pread(f->file, f->off + done, c->piece, (size_t)n);
	if (err) {
		DCAST_LOG_W("bulk: version %llu, chunk %u: %s", (unsigned long long)c->v->version,
			    c->next, dcast_last_error());
		return err;
	}
	c->piece_at = done;
	c->piece_len = n;
	return 0;
}

/* Frame c->next's payload from offset `done` on, in memory: the log's
 * message, or with copy a piece of its file read (*n: the bytes there).
 * NULL: sendfile it, or with *err set, it cannot be served. */
static const char *payload_mem(struct bulk_client *c, const struct bulk_frame *f, uint64_t done,
			       size_t *n, int *err)
{
	*err = 0;
	*n = (size_t)(f->len - done);
	if (f->mem)
		return f->mem + done;
	if (!c->copy || (*err = piece_read(c, f, done)))
		return NULL;
	*n = (size_t)(c->piece_at + c->piece_len - done);
	return (const char *)c->piece + (done - c->piece_at);
}

/* Send what is left of frame c->next's payload: from memory (payload_mem),
 * else sendfile from its file.  The bytes sent, 0 when the socket is
 * full, -1 on an error. */
static ssize_t send_payload(struct bulk_client *c, uint64_t done)
{
	const struct bulk_frame *f = &c->fr[c->next];
	size_t left;
	int err;
	const char *mem = payload_mem(c, f, done, &left, &err);
	ssize_t r;

	if (err) {
		errno = EIO;
		return -1;
	}
	if (mem)
		r = send(c->base.fd, mem, left, MSG_DONTWAIT | MSG_NOSIGNAL);
	else {
		off_t at = (off_t)(f->off + done);
		if ((r = sendfile(c->base.fd, f->file->fd, &at, left)) > 0)
			atomic_fetch_add_explicit(&c->sent_sendfile, (uint64_t)r, memory_order_relaxed);
	}
	if (r < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
	if (r == 0) /* the file is shorter than its chunk says */
		errno = EIO;
	return r == 0 ? -1 : r;
}

/* One write of frame c->next: its head or its payload.  1 on progress,
 * 0 when the socket is full, -1 on an error. */
static int send_step(struct bulk_client *c)
{
	int by_ref = frame_ref_ready(c);
	const struct bulk_frame *f = &c->fr[c->next];
	size_t head = BULK_PREFIX_BYTES + f->hdr_len + (frame_has_ref(c, c->next) ? DCAST_BULK_REF : 0);
	uint64_t len = head + (by_ref ? 0 : f->len);
	ssize_t r = c->off < head ? send_head(c, by_ref) : send_payload(c, c->off - head);

	if (r <= 0)
		return (int)r;
	c->off += (uint64_t)r;
	DCAST_ASSERT(c->off <= len);
	if (c->off == len) {
		c->piece_len = 0;
		if (by_ref)
			atomic_fetch_add_explicit(&c->sent_local, f->len, memory_order_relaxed);
		c->next++;
		c->off = 0;
	}
	atomic_fetch_add_explicit(&c->sent, (uint64_t)r, memory_order_relaxed);
	return 1;
}

/* The transfer whose job this is. */
static struct bulk_client *job_client(struct bulk_pump_job *job)
{
	return (struct bulk_client *)((char *)job - offsetof(struct bulk_client, job));
}

/* bulkpump.h's step. */
static int pump_step(struct bulk_pump_job *job)
{
	struct bulk_client *c = job_client(job);
	int r;

	if (c->next >= c->n_fr)
		return BULK_STEP_DONE;
	r = send_step(c);
	if (r > 0)
		return c->next >= c->n_fr ? BULK_STEP_DONE : BULK_STEP_MORE;
	return r < 0 ? BULK_STEP_ERR : BULK_STEP_FULL;
}

/* ---- the loop's side again ---- */

/* The bytes the bulk thread counted since the last call, into b->stats. */
static void client_tell(struct broker *b, struct bulk_client *c)
{
	uint64_t sent = atomic_load_explicit(&c->sent, memory_order_relaxed);
	uint64_t sf = atomic_load_explicit(&c->sent_sendfile, memory_order_relaxed);
	uint64_t lo = atomic_load_explicit(&c->sent_local, memory_order_relaxed);

	b->stats.bulk_bytes += sent - c->told;
	b->stats.bulk_thread_bytes[c->job.pump] += sent - c->told;
	b->stats.bulk_sendfile_bytes += sf - c->told_sendfile;
	b->stats.bulk_local_bytes += lo - c->told_local;
	c->told = sent;
	c->told_sendfile = sf;
	c->told_local = lo;
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
	b->fanout_more = 1;
	DCAST_LOG_I("bulk: %s has version %llu", c->who, (unsigned long long)p->have_version);
	shutdown(c->base.fd, SHUT_WR);
	client_close(b, c);
}

/* A transfer back from its bulk thread (job.rc: how it ended).  A
 * consumer that took every frame may have said BYE (or re-joined) before
 * the loop takes the transfer back: the version counts as sent. */
static void client_back(struct broker *b, struct bulk_client *c)
{
	struct broker_peer *p = client_peer(b, c);
	int rc = c->job.rc;

	c->base.busy = 0;
	client_tell(b, c);
	b->stats.bulk_versions += !rc;
	if (p && !rc) {
		client_done(b, c, p);
		return;
	}
	if (!rc) /* it took every frame, and said BYE before the thread handed it back */
		DCAST_LOG_I("bulk: %s has version %llu (it re-joined or left since)", c->who,
			    (unsigned long long)c->v->version);
	else if (!p)
		DCAST_LOG_I("bulk: version %llu: its consumer re-joined or left: connection closed",
			    (unsigned long long)c->v->version);
	else if (rc == ETIMEDOUT)
		DCAST_LOG_W("bulk: %s, version %llu, frame %u: nothing taken for %llu ms: connection "
			    "closed", c->who, (unsigned long long)c->v->version, c->next,
			    (unsigned long long)c->job.quiet_ms);
	else
		DCAST_LOG_W("bulk: %s, version %llu, frame %u: %s: connection closed", c->who,
			    (unsigned long long)c->v->version, c->next, strerror(rc));
	client_close(b, c);
}

static void on_pumped(struct broker *b, int fd, void *arg)
{
	struct bulk_pump_job *job;

	(void)fd;
	(void)arg;
	while ((job = bulk_pumps_take(b->bulk_pumps)))
		client_back(b, job_client(job));
}

static void on_client(struct broker *b, int fd, void *arg)
{
	struct bulk_client *c = arg;

	(void)fd;
	if (dcast_now_ms() >= c->base.deadline_ms || client_read_hello(b, c) < 0)
		client_close(b, c);
}

/* Each transfer on a bulk thread: its bytes counted, and cancelled once
 * its consumer re-joined or left. */
static void busy_timers(struct broker *b, struct broker_clients *t)
{
	for (uint32_t i = 0; t->slots && i < t->cap; i++) {
		struct bulk_client *c = (struct bulk_client *)broker_clients_slot(t, i);
		if (!c->base.used || !c->base.busy)
			continue;
		client_tell(b, c);
		if (!client_peer(b, c))
			bulk_pumps_cancel(b->bulk_pumps, &c->job);
	}
}

void broker_bulk_timers(struct broker *b)
{
	busy_timers(b, &b->bulk_clients);
	busy_timers(b, &b->bulk_local_clients);
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

/* The local listener, "@deltacast-bulk-PORT" (dcast_bulk_local_addr):
 * consumers on this host take payloads in files as references there.
 * One that cannot bind is logged and left out: consumers then connect
 * over TCP, as to another host. */
static int local_open(struct broker *b)
{
	struct sockaddr_un a;
	socklen_t len = dcast_bulk_local_addr(&a, b->bulk_port);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0 || bind(fd, (const struct sockaddr *)&a, len) || listen(fd, 64)) {
		DCAST_LOG_W("bulk: local listener @%s: %s; consumers on this host connect over TCP",
			    a.sun_path + 1, strerror(errno));
		if (fd >= 0)
			close(fd);
		return 0;
	}
	DCAST_LOG_I("bulk anchors to consumers on this host on @%s", a.sun_path + 1);
	return broker_clients_start(b, &b->bulk_local_clients, fd);
}

/* The bulk threads (--bulk-threads; 0: half the CPUs, 2 to 8) and their
 * eventfd in the loop's poll set. */
static int pumps_open(struct broker *b)
{
	uint64_t n = broker_threads_auto(b->cfg.bulk_threads);
	int rc;

	if ((rc = bulk_pumps_start(&b->bulk_pumps, (uint32_t)n, pump_step)))
		return rc;
	b->bulk_threads = (uint32_t)n;
	DCAST_LOG_I("bulk: %u threads write the transfers%s", b->bulk_threads,
		    b->cfg.bulk_threads ? "" : " (--bulk-threads 0: half the CPUs, 2 to 8)");
	return broker_poll_add(b, bulk_pumps_fd(b->bulk_pumps), on_pumped, NULL);
}

int broker_bulk_open(struct broker *b)
{
	int fd, rc;

	b->bulk_clients = (struct broker_clients){
		.what = "bulk", .listen_fd = -1, .cap = BROKER_BULK_CLIENTS, .burst = 16,
		.slot_bytes = sizeof(struct bulk_client), .client_ms = 3 * b->cfg.heartbeat_ms,
		.on_client = on_client, .on_accept = on_accept, .on_free = client_free};
	b->bulk_local_clients = b->bulk_clients; /* not started: no slots, no listener */
	b->bulk_local_clients.what = "bulk-local";
	b->bulk_local_clients.on_accept = on_accept_local;
	if (!b->cfg.bulk)
		return 0;
	if (b->cfg.curve_secret)
		return dcast_fail(DCAST_EINVAL, "--bulk with --curve-secret: bulk anchors travel "
				  "outside CURVE, in the clear; use one or the other");
	if ((rc = pumps_open(b)))
		return rc;
	if ((fd = broker_tcp_listen("--bulk", b->cfg.bulk, &b->bulk_port)) < 0)
		return -fd;
	if ((rc = broker_clients_start(b, &b->bulk_clients, fd)))
		return rc;
	DCAST_LOG_I("bulk anchors on %s", broker_tcp_bound(fd).text);
	return b->cfg.bulk_no_local ? 0 : local_open(b);
}

void broker_bulk_close(struct broker *b)
{
	struct bulk_pump_job *job;

	bulk_pumps_stop(b->bulk_pumps); /* every transfer back, cancelled */
	while (b->bulk_pumps && (job = bulk_pumps_take(b->bulk_pumps))) {
		struct bulk_client *c = job_client(job);

		c->base.busy = 0;
		client_tell(b, c); /* its last bytes in the stats too */
	}
	if (b->bulk_pumps)
		broker_poll_del(b, bulk_pumps_fd(b->bulk_pumps));
	bulk_pumps_free(&b->bulk_pumps);
	broker_clients_stop(b, &b->bulk_clients);
	broker_clients_stop(b, &b->bulk_local_clients);
	b->bulk_port = 0;
}
