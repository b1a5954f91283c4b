/* Test harness for broker tests over real processes: the deltacast-broker
 * binary started by tests/proc.h (on ports it picks and names), and a
 * minimal producer and consumer speaking the wire protocol with the schema
 * and codec, keeping their tensors in memory so tests compare bytes.
 * Declarations; the definitions are compiled once, in
 * tests/support/broker_harness.c, and linked into every test and tool. */
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

/* The ZeroMQ context of every client, made by h_init. */
extern void *h_ctx;

/* Call once at start: children die with the test; a ZeroMQ context. */
void h_init(void);

/* The end of a test: stop the broker, end ZeroMQ, name the broker's log
 * on a failure (check_remove_dir keeps dir then), and the closing line
 * (check_done's exit status).  Clients must be closed first. */
int h_finish(tp_broker *br, const char *dir, const char *name);

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

/* h_client_publish sends the chunk of this seq twice (-1: none). */
extern int h_dup_seq;

/* The version h_done_acked and h_done_version wait for (set by
 * h_client_publish and h_consume_until). */
extern uint64_t h_want;

/* The COMMIT digest of count bf16 elements from `start` of tensor t. */
uint64_t h_ldigest(uint32_t t, uint64_t start, const uint16_t *data, uint64_t count);

/* A client's DEALER (c cleared first), not yet connected: options set
 * before h_client_connect() apply to its connection. */
void h_client_socket(struct h_client *c, const char *model);

/* Connect c's DEALER to tcp://127.0.0.1:port. */
void h_client_connect(struct h_client *c, int port);

/* Open a DEALER to port; with server_pub set it is a CURVE client using the
 * secret key file `secret_file`. */
void h_client_open_curve(struct h_client *c, int port, const char *model,
			 const char *server_pub, const char *secret_file);

/* h_client_open_curve without CURVE. */
void h_client_open(struct h_client *c, int port, const char *model);

/* Close c's socket at once (no linger); c->sock NULL after. */
void h_client_close(struct h_client *c);

/* Send header m (and payload, taken by ZeroMQ when not NULL): 0 or the
 * wire's error. */
int h_send(struct h_client *c, const dcast_msg *m, zmq_msg_t *payload);

/* HELLO as role (DCAST_ROLE_*) holding version `have`; a consumer's
 * window is 1 GiB. */
void h_hello(struct h_client *c, int role, uint64_t have);

/* A MANIFEST of H_TENSORS bf16 tensors of H_ELEMS elements ("layer0.weight",
 * ...) into m, its descriptors in t[H_TENSORS] (the caller's). */
void h_fill_manifest(const char *model, dcast_msg *m, dcast_tensor_desc *t);

/* Consumer side: take one message; apply chunks to state as they come,
 * check each COMMIT's counts and digests against them. */
void h_consumer_handle(struct h_client *c, dcast_wire_in *in);

/* Producer side: WELCOME, CREDIT, ACK, ERROR. */
void h_producer_handle(struct h_client *c, dcast_wire_in *in);

/* Receive until done(c) holds or `rounds` receive timeouts of 100 ms in a
 * row pass (a bound on silence, not on total time; messages are capped).
 * Returns done(c). */
int h_pump(struct h_client *c, int consumer, int (*done)(struct h_client *), int rounds);

/* h_pump's ends: welcomed; ACK of h_want or later; COMMIT of h_want or
 * later; an ERROR. */
int h_done_welcomed(struct h_client *c);
int h_done_acked(struct h_client *c);
int h_done_version(struct h_client *c);
int h_done_error(struct h_client *c);

/* Producer: HELLO, WELCOME, MANIFEST.  0, or -1 without a WELCOME. */
int h_producer_join(struct h_client *c);

/* Change about 1/frac of the elements (new random bit patterns). */
void h_mutate(struct h_client *c, uint32_t *rng, unsigned frac);

/* Publish c->state as `version` (anchor or delta on c->version), wait for
 * its ACK (rounds x 100 ms of silence at most).  Returns 0 when acked. */
int h_client_publish(struct h_client *c, uint64_t version, int anchor, int rounds);

/* Consumer: HELLO(have) and receive until version `want` is committed.
 * 0 when it was. */
int h_consume_until(struct h_client *c, uint64_t have, uint64_t want, int rounds);

#endif
