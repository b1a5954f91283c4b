/* Test harness for broker tests over real processes: the deltacast-broker
 * binary started by tests/proc.h (on ports it picks and names), and a
 * minimal producer and consumer speaking the wire protocol with the schema
 * and codec, keeping their tensors in memory so tests compare bytes. */
#ifndef DCAST_TEST_BROKER_HARNESS_H
#define DCAST_TEST_BROKER_HARNESS_H

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>
#include "check.h"
#include "proc.h"
#include "dcast_curve.h"
#include "dcast_wire.h"
#include "deltacast/codec.h"
#include "deltacast/schema.h"

#define H_TENSORS 2
#define H_ELEMS 65536 /* per tensor, bf16 */
#define H_CHUNK_ELEMS 16384

static void *h_ctx;

/* Call once at start: children die with the test; a ZeroMQ context. */
static inline void h_init(void)
{
	tp_install();
	h_ctx = zmq_ctx_new();
	REQUIRE(h_ctx);
}

/* Start the broker (tests/proc.h: it picks its ports, or a restart binds
 * br->pport and br->cport again); the test fails when it does not start. */
static inline void h_broker_start(tp_broker *br)
{
	if (tp_broker_start(br) == 0)
		return;
	fprintf(stderr, "broker did not start; log %s\n", br->log);
	REQUIRE(0);
}

/* The end of a test: stop the broker, end ZeroMQ, name the broker's log
 * on a failure (check_remove_dir keeps dir then), and the closing line.
 * Clients must be closed first. */
static inline int h_finish(tp_broker *br, const char *dir, const char *name)
{
	tp_broker_kill(br, SIGTERM);
	zmq_ctx_term(h_ctx);
	if (check_failures)
		fprintf(stderr, "broker log: %s\n", br->log);
	check_remove_dir(dir);
	return check_done(name);
}

/* ---- a client (producer or consumer) on a DEALER --------------------- */

struct h_client {
	void *sock;
	const char *model;
	uint16_t state[H_TENSORS][H_ELEMS]; /* current tensors */
	uint16_t base[H_TENSORS][H_ELEMS];  /* producer: last published */
	uint64_t version;                   /* producer: last published; consumer: last commit */
	uint64_t welcome_version;
	int welcomed, manifest_seen, errors, digest_mismatch;
	uint64_t commits;                   /* consumer: COMMITs received */
	uint64_t anchors;                   /* consumer: anchor COMMITs received */
	uint64_t last_ack;
	uint32_t last_error_code;
	uint64_t open_chunks, open_bytes;   /* consumer: received since the last COMMIT */
	uint64_t commit_mismatch;           /* consumer: COMMITs whose counts differ from them */
};

static int h_dup_seq = -1; /* h_publish sends the chunk of this seq twice */

/* The COMMIT digest of count bf16 elements from `start` of tensor t. */
static uint64_t h_ldigest(uint32_t t, uint64_t start, const uint16_t *data, uint64_t count)
{
	uint64_t d = 0;
	REQUIRE(dcast_ldigest(t, start, data, count, 2, &d) == DCAST_OK);
	return d;
}

/* A client's DEALER, not yet connected: options set before
 * h_client_connect() apply to its connection. */
static inline void h_client_socket(struct h_client *c, const char *model)
{
	int ms = 100;

	memset(c, 0, sizeof(*c));
	c->model = model;
	c->version = c->last_ack = DCAST_VERSION_NONE;
	c->sock = zmq_socket(h_ctx, ZMQ_DEALER);
	REQUIRE(c->sock);
	dcast_wire_socket_opts(c->sock);
	zmq_setsockopt(c->sock, ZMQ_RCVTIMEO, &ms, sizeof(ms));
}

static inline void h_client_connect(struct h_client *c, int port)
{
	char ep[64];

	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
	REQUIRE(zmq_connect(c->sock, ep) == 0);
}

/* Open a DEALER to port; with server_pub set it is a CURVE client using the
 * secret key file `secret_file`. */
static inline void h_client_open_curve(struct h_client *c, int port, const char *model,
				       const char *server_pub, const char *secret_file)
{
	h_client_socket(c, model);
	if (server_pub)
		REQUIRE(dcast_curve_client_setup(c->sock, server_pub, secret_file) == 0);
	h_client_connect(c, port);
}

static inline void h_client_open(struct h_client *c, int port, const char *model)
{
	h_client_open_curve(c, port, model, NULL, NULL);
}

static inline void h_client_close(struct h_client *c)
{
	int zero = 0;

	if (c->sock) {
		zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof(zero));
		zmq_close(c->sock);
	}
	c->sock = NULL;
}

static inline int h_send(struct h_client *c, const dcast_msg *m, zmq_msg_t *payload)
{
	return dcast_wire_send(c->sock, NULL, 0, m, payload, 0);
}

static inline void h_hello(struct h_client *c, int role, uint64_t have)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HELLO);
	m.u.hello.role = (uint32_t)role;
	snprintf(m.u.hello.model, sizeof(m.u.hello.model), "%s", c->model);
	m.u.hello.have_version = have;
	m.u.hello.window_bytes = role == DCAST_ROLE_CONSUMER ? (1ull << 30) : 0;
	snprintf(m.u.hello.client, sizeof(m.u.hello.client), "test-%d", (int)getpid());
	REQUIRE(h_send(c, &m, NULL) == 0);
}

static inline void h_fill_manifest(const char *model, dcast_msg *m, dcast_tensor_desc *t)
{
	dcast_msg_init(m, DCAST_MSG_MANIFEST);
	snprintf(m->u.manifest.model, sizeof(m->u.manifest.model), "%s", model);
	for (int i = 0; i < H_TENSORS; i++) {
		memset(&t[i], 0, sizeof(t[i]));
		snprintf(t[i].name, sizeof(t[i].name), "layer%d.weight", i);
		t[i].dtype = DCAST_DTYPE_BF16;
		t[i].ndim = 2;
		t[i].shape[0] = 256;
		t[i].shape[1] = H_ELEMS / 256;
	}
	m->u.manifest.n_tensors = H_TENSORS;
	m->u.manifest.tensors = t;
}

/* Consumer side: take one message; apply chunks to state as they come. */
static inline void h_consumer_handle(struct h_client *c, dcast_wire_in *in)
{
	dcast_msg *m = &in->msg;

	if (m->type == DCAST_MSG_WELCOME) {
		c->welcomed = 1;
		c->welcome_version = m->u.welcome.version;
		c->open_chunks = c->open_bytes = 0; /* a new stream */
	} else if (m->type == DCAST_MSG_MANIFEST) {
		c->manifest_seen = 1;
	} else if (m->type == DCAST_MSG_CHUNK) {
		dcast_chunk *ch = &m->u.chunk;
		dcast_chunk_info info = {ch->encoding, ch->elem_size, ch->count, ch->changed,
					 ch->payload_bytes};
		void *p = zmq_msg_data(&in->payload);

		if (ch->tensor >= H_TENSORS || ch->start + ch->count > H_ELEMS ||
		    dcast_chunk_verify(ch, p) || dcast_codec_apply(&info, p, &c->state[ch->tensor][ch->start], NULL))
			c->errors++;
		c->open_chunks++;
		c->open_bytes += ch->payload_bytes;
	} else if (m->type == DCAST_MSG_COMMIT) {
		dcast_commit *cm = &m->u.commit;

		c->commit_mismatch += cm->chunks != c->open_chunks || cm->bytes != c->open_bytes;
		c->open_chunks = c->open_bytes = 0;

		for (uint32_t i = 0; i < cm->n_digests; i++) {
			dcast_range_digest *d = &cm->digests[i];

			if (d->tensor >= H_TENSORS || d->start + d->count > H_ELEMS ||
			    h_ldigest(d->tensor, d->start, &c->state[d->tensor][d->start], d->count) != d->digest)
				c->digest_mismatch++;
		}
		c->version = cm->version;
		c->commits++;
		c->anchors += cm->anchor;
	} else if (m->type == DCAST_MSG_ERROR) {
		c->last_error_code = m->u.error.code;
	}
}

/* Producer side: WELCOME, CREDIT, ACK, ERROR. */
static inline void h_producer_handle(struct h_client *c, dcast_wire_in *in)
{
	dcast_msg *m = &in->msg;

	if (m->type == DCAST_MSG_WELCOME) {
		c->welcomed = 1;
		c->welcome_version = m->u.welcome.version;
	} else if (m->type == DCAST_MSG_ACK) {
		c->last_ack = m->u.ack.version;
	} else if (m->type == DCAST_MSG_ERROR) {
		c->last_error_code = m->u.error.code;
		c->errors++;
	}
}

/* Receive until done(c) holds or `rounds` receive timeouts of 100 ms in a
 * row pass (a bound on silence, not on total time; messages are capped). */
static inline int h_pump(struct h_client *c, int consumer, int (*done)(struct h_client *), int rounds)
{
	int idle = 0;

	for (long total = 0; !done(c) && idle < rounds && total < 1000000; total++) {
		dcast_wire_in in;

		if (dcast_wire_recv(c->sock, 0, &in, 0) == 0) {
			if (consumer)
				h_consumer_handle(c, &in);
			else
				h_producer_handle(c, &in);
			idle = 0;
		} else {
			idle++;
		}
		dcast_wire_in_close(&in);
	}
	return done(c);
}

static inline int h_done_welcomed(struct h_client *c)
{
	return c->welcomed;
}

static uint64_t h_want;
static inline int h_done_acked(struct h_client *c)
{
	return c->last_ack != DCAST_VERSION_NONE && c->last_ack >= h_want;
}

static inline int h_done_version(struct h_client *c)
{
	return c->version != DCAST_VERSION_NONE && c->version >= h_want;
}

static inline int h_done_error(struct h_client *c)
{
	return c->last_error_code != 0;
}

/* Producer: HELLO, WELCOME, MANIFEST. */
static inline int h_producer_join(struct h_client *c)
{
	dcast_tensor_desc t[H_TENSORS];
	dcast_msg m;

	h_hello(c, DCAST_ROLE_PRODUCER, DCAST_VERSION_NONE);
	if (!h_pump(c, 0, h_done_welcomed, 50))
		return -1;
	h_fill_manifest(c->model, &m, t);
	return h_send(c, &m, NULL);
}

/* Change about 1/frac of the elements (new random bit patterns). */
static inline void h_mutate(struct h_client *c, uint32_t *rng, unsigned frac)
{
	for (int t = 0; t < H_TENSORS; t++)
		for (int i = 0; i < H_ELEMS; i++) {
			*rng = *rng * 1664525u + 1013904223u;
			if ((*rng >> 8) % frac == 0)
				c->state[t][i] = (uint16_t)(*rng >> 16);
		}
}

/* Publish c->state as `version` (anchor or delta on c->version), wait for
 * its ACK (rounds x 100 ms of silence at most).  Returns 0 when acked. */
static inline int h_publish(struct h_client *c, uint64_t version, int anchor, int rounds)
{
	static uint8_t out[H_CHUNK_ELEMS * 8 + 4096];
	dcast_range_digest dg[H_TENSORS];
	uint32_t seq = 0;
	uint64_t bytes = 0;
	dcast_msg m;

	for (int t = 0; t < H_TENSORS; t++)
		for (uint32_t s = 0; s < H_ELEMS; s += H_CHUNK_ELEMS) {
			dcast_chunk_info info;
			zmq_msg_t pl;

			REQUIRE(dcast_codec_encode(&c->state[t][s], anchor ? NULL : &c->base[t][s],
						   H_CHUNK_ELEMS, 2, -1, DCAST_ENCODE_UPDATE_BASE,
						   out, sizeof(out), &info) == 0);
			dcast_msg_init(&m, DCAST_MSG_CHUNK);
			dcast_chunk *ch = &m.u.chunk;
			snprintf(ch->model, sizeof(ch->model), "%s", c->model);
			ch->version = version;
			ch->base_version = anchor ? DCAST_VERSION_NONE : c->version;
			ch->anchor = (uint32_t)anchor;
			ch->seq = seq++;
			ch->tensor = (uint32_t)t;
			ch->start = s;
			ch->count = H_CHUNK_ELEMS;
			ch->elem_size = 2;
			ch->encoding = info.encoding;
			ch->changed = info.changed;
			ch->payload_bytes = info.payload_bytes;
			dcast_chunk_seal(ch, out);
			REQUIRE(zmq_msg_init_size(&pl, info.payload_bytes) == 0);
			memcpy(zmq_msg_data(&pl), out, info.payload_bytes);
			if (ch->seq == (uint32_t)h_dup_seq) { /* a repeat, as after a resend */
				zmq_msg_t again;
				REQUIRE(zmq_msg_init(&again) == 0 && zmq_msg_copy(&again, &pl) == 0);
				REQUIRE(h_send(c, &m, &again) == 0);
			}
			REQUIRE(h_send(c, &m, &pl) == 0);
			bytes += info.payload_bytes;
		}
	if (anchor)
		memcpy(c->base, c->state, sizeof(c->state));
	dcast_msg_init(&m, DCAST_MSG_COMMIT);
	snprintf(m.u.commit.model, sizeof(m.u.commit.model), "%s", c->model);
	m.u.commit.version = version;
	m.u.commit.base_version = anchor ? DCAST_VERSION_NONE : c->version;
	m.u.commit.anchor = (uint32_t)anchor;
	m.u.commit.chunks = seq;
	m.u.commit.bytes = bytes;
	for (int t = 0; t < H_TENSORS; t++)
		dg[t] = (dcast_range_digest){(uint32_t)t, 0, H_ELEMS,
					     h_ldigest((uint32_t)t, 0, c->state[t], H_ELEMS)};
	m.u.commit.n_digests = H_TENSORS;
	m.u.commit.digests = dg;
	REQUIRE(h_send(c, &m, NULL) == 0);
	c->version = version;
	h_want = version;
	return h_pump(c, 0, h_done_acked, rounds) ? 0 : -1;
}

/* Consumer: HELLO(have) and receive until version `want` is committed. */
static inline int h_consume_until(struct h_client *c, uint64_t have, uint64_t want, int rounds)
{
	h_hello(c, DCAST_ROLE_CONSUMER, have);
	h_want = want;
	return h_pump(c, 1, h_done_version, rounds) ? 0 : -1;
}

#endif
