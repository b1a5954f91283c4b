/* The broker's I/O primitives, under everything that sends or waits: the
 * poll set of extra fds (eventfds, local listeners and clients, a
 * signalfd) with their callbacks, sending a message to a peer, refusing a
 * message (ERROR back, counted, rate-limited log), and the options every
 * broker socket gets before bind or connect.  loop.c runs the poll set. */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include "auth.h"
#include "broker.h"
#include "dcast_common.h"
#include "dcast_wire.h"

/* Close the refusal log's window once a second has passed, saying how
 * many refusals it did not log. */
void broker_refuse_log_roll(struct broker *b, uint64_t now)
{
	if (now - b->refuse_window_ms < 1000)
		return;
	if (b->refuse_quiet)
		DCAST_LOG_W("%u more refused messages not logged in the last %llu ms "
			    "(deltacast_errors_total counts every one)", b->refuse_quiet,
			    (unsigned long long)(now - b->refuse_window_ms));
	b->refuse_window_ms = now;
	b->refuse_logged = b->refuse_quiet = 0;
}

static int refuse_log_ok(struct broker *b)
{
	broker_refuse_log_roll(b, dcast_now_ms());
	if (b->refuse_logged < BROKER_REFUSE_LOG_MAX)
		return ++b->refuse_logged;
	b->refuse_quiet++;
	return 0;
}

void broker_refuse(struct broker *b, void *sock, const zmq_msg_t *rid, int code,
		   const char *model, uint64_t version)
{
	char text[DCAST_MAX_TEXT + 1];

	snprintf(text, sizeof(text), "%s", dcast_last_error());
	if (code > 0 && code < DCAST_ERR_COUNT)
		b->stats.errors[code]++;
	if (refuse_log_ok(b))
		DCAST_LOG_W("refused a message (%s): %s", dcast_errname(code), text);
	if (rid)
		dcast_wire_send_error(sock, zmq_msg_data((zmq_msg_t *)rid),
				      zmq_msg_size((zmq_msg_t *)rid), code, model, version, text);
}

void broker_refuse_unjoined(struct broker *b, void *sock, const dcast_wire_in *in)
{
	if (in->msg.type == DCAST_MSG_BYE)
		return;
	dcast_fail(DCAST_ESTATE, "%s before HELLO", dcast_msg_type_name((int)in->msg.type));
	broker_refuse(b, sock, &in->rid, DCAST_ESTATE, "", DCAST_VERSION_NONE);
}

int broker_send_msg(struct broker *b, void *sock, struct broker_peer *p, const dcast_msg *m)
{
	(void)b;
	p->last_send_ms = dcast_now_ms();
	return dcast_wire_send(sock, p->rid, p->rid_len, m, NULL, ZMQ_DONTWAIT);
}

/* --consumer-sndbuf-bytes on the consumer socket: ZMQ_SNDBUF, the
 * SO_SNDBUF of its listeners (listen.c's too), which the connections they
 * accept inherit.  The kernel autotunes a TCP send buffer
 * up to megabytes (net.ipv4.tcp_wmem), so on a slow uplink one consumer's
 * connection can hold half a model in flight while a sibling's starves,
 * whatever the pump's round robin; a fixed small buffer keeps each
 * connection's share of the link near its share of the pump's turns. */
static int consumer_sndbuf(struct broker *b, void *sock)
{
	int bytes = (int)b->cfg.consumer_sndbuf_bytes;

	if (!bytes)
		return 0;
	if (zmq_setsockopt(sock, ZMQ_SNDBUF, &bytes, sizeof(bytes)))
		return dcast_fail(DCAST_EZMQ, "--consumer-sndbuf-bytes %d: ZMQ_SNDBUF: %s", bytes,
				  zmq_strerror(errno));
	return 0;
}

/* Hook: CURVE and other socket options go here, before bind/connect. */
int broker_socket_setup(struct broker *b, void *sock, const char *which)
{
	int one = 1;

	if (!strcmp(which, "consumers") && consumer_sndbuf(b, sock))
		return DCAST_EZMQ;
	if (dcast_wire_socket_opts(sock))
		return dcast_fail(DCAST_EZMQ, "%s socket: %s", which, dcast_last_error());
	if (strcmp(which, "upstream") &&
	    zmq_setsockopt(sock, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)))
		return dcast_fail(DCAST_EZMQ, "%s socket: ZMQ_ROUTER_MANDATORY: %s", which,
				  zmq_strerror(errno));
	return broker_auth_socket(b, sock, which); /* --curve-secret (broker/auth.c) */
}

int broker_poll_add(struct broker *b, int fd, broker_fd_fn fn, void *arg)
{
	if (b->n_extra >= BROKER_MAX_EXTRA_FDS)
		return dcast_fail(DCAST_EBUSY, "poll set: more than %d extra fds", BROKER_MAX_EXTRA_FDS);
	b->extra[b->n_extra].fd = fd;
	b->extra[b->n_extra].events = ZMQ_POLLIN;
	b->extra[b->n_extra].fn = fn;
	b->extra[b->n_extra].arg = arg;
	b->n_extra++;
	return 0;
}

static int extra_find(const struct broker *b, int fd)
{
	for (uint32_t i = 0; i < b->n_extra; i++)
		if (b->extra[i].fd == fd)
			return (int)i;
	return -1;
}

void broker_poll_events(struct broker *b, int fd, short events)
{
	int i = extra_find(b, fd);

	if (i >= 0)
		b->extra[i].events = events;
}

void broker_poll_del(struct broker *b, int fd)
{
	int i = extra_find(b, fd);

	if (i >= 0)
		b->extra[i] = b->extra[--b->n_extra];
}

/* Run the callback of each extra fd that is ready.  A callback may add or
 * remove fds (the metrics listener accepts, a client closes), so each is
 * looked up by fd rather than by its place in the poll set. */
void broker_poll_dispatch(struct broker *b, const zmq_pollitem_t *it, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		int k = it[i].revents ? extra_find(b, it[i].fd) : -1;

		if (k >= 0)
			b->extra[k].fn(b, it[i].fd, b->extra[k].arg);
	}
}

/* ZeroMQ's I/O threads do the sockets' TCP reads and writes: one moves
 * every consumer's bytes alone.  --io-threads 0 (the default) takes half
 * the CPUs, at least 2 and at most 8: a 201 MB anchor to 4 consumers was
 * ~10% faster with 2 than 1 on 2 cores, and to 16 receive-only consumers
 * 256 ms with 8 against 383-394 ms with 2 on 16 cores (docs/operations.md).
 * The bulk threads (--bulk-threads) take the same number. */
uint64_t broker_threads_auto(uint64_t n)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	if (n)
		return n;
	return cpus / 2 < 2 ? 2 : cpus / 2 > 8 ? 8 : (uint64_t)(cpus / 2);
}

/* The encoder's buffer starts at 256 bytes and doubles (schema/encode.c),
 * so it may be up to twice the header: the log keeps an exact copy.  (When
 * it was msgpack's 8 KiB sbuffer, a delta of 3072 chunks, 1.5 MB of
 * payload, took 15 MB of VmRSS.) */
int broker_frame_encode(const dcast_msg *m, zmq_msg_t *out)
{
	void *buf;
	size_t len;
	int rc = dcast_msg_encode(m, &buf, &len);

	if (rc)
		return rc;
	if (zmq_msg_init_size(out, len)) {
		free(buf);
		return dcast_fail(DCAST_EZMQ, "zmq_msg_init_size: %s", zmq_strerror(zmq_errno()));
	}
	memcpy(zmq_msg_data(out), buf, len);
	free(buf);
	return 0;
}

int broker_commit_frame(struct broker_version *v, const char *model)
{
	dcast_msg cm;
	int rc;

	dcast_msg_init(&cm, DCAST_MSG_COMMIT);
	snprintf(cm.u.commit.model, sizeof(cm.u.commit.model), "%s", model);
	cm.u.commit.version = v->version;
	cm.u.commit.base_version = v->base_version;
	cm.u.commit.anchor = (uint32_t)v->anchor;
	cm.u.commit.chunks = v->n_chunks;
	cm.u.commit.bytes = v->payload_bytes;
	cm.u.commit.n_digests = v->n_digests;
	cm.u.commit.digests = v->digests;
	zmq_msg_close(&v->commit_hdr);
	if ((rc = broker_frame_encode(&cm, &v->commit_hdr)))
		zmq_msg_init(&v->commit_hdr);
	return rc;
}
