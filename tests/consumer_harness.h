/* Shared by the consumer tests and bench: the real broker binary started
 * by tests/proc.h (on ports it picks and names), a small model a producer
 * publishes, and a poll/apply driver.  Every child dies with the test
 * (PR_SET_PDEATHSIG) and is killed at exit.  Declarations; the definitions
 * are compiled once, in tests/support/consumer_harness.c, and linked into
 * every test and tool. */
#ifndef DCAST_CONSUMER_HARNESS_H
#define DCAST_CONSUMER_HARNESS_H

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "proc.h"
#include "deltacast/producer.h"
#include "deltacast/consumer.h"
#include "deltacast/safetensors.h"

typedef tp_broker h_broker;

/* Does dir hold the record file of version v? */
int h_rec_exists(const char *dir, uint64_t v);

/* XOR the byte at off (fseek's whence) of the file at path with mask;
 * returns the byte it held. */
int h_flip_byte(const char *path, long off, int whence, int mask);

/* The version in dir/model.safetensors (its deltacast.version), or 0 when
 * there is none. */
uint64_t h_file_version(const char *dir);

/* SIGKILL the broker; its log goes to stderr when a CHECK has failed, then
 * is removed. */
void h_broker_stop(h_broker *b);

/* ---- a small model: bf16 and f32 tensors, ~1.3 MB ---- */
#define H_TENSORS 3
typedef struct h_model {
	const char *name[H_TENSORS];
	int dtype[H_TENSORS];
	uint32_t ndim[H_TENSORS];
	uint64_t shape[H_TENSORS][2];
	uint64_t bytes[H_TENSORS];
	unsigned char *cur[H_TENSORS];
	unsigned char *snap[32][H_TENSORS]; /* contents at version v (1..31) */
	uint64_t rng;
} h_model;

/* xorshift64: the next value of the sequence *s. */
uint64_t h_rand(uint64_t *s);

/* m's tensors (scale x 256 rows, random contents from seed), allocated;
 * h_model_free releases them. */
void h_model_init(h_model *m, uint64_t seed, uint64_t scale);

/* m's tensors named names[], bf16 rows[0] x cols[0], f32 rows[1] x
 * cols[1], bf16 rows[2] x cols[2], random contents from seed, allocated
 * (h_model_free releases them). */
void h_model_shaped(h_model *m, uint64_t seed, const char *const names[H_TENSORS],
		    const uint64_t rows[H_TENSORS], const uint64_t cols[H_TENSORS]);

/* The bytes of all of m's tensors. */
uint64_t h_model_bytes(const h_model *m);

/* Change about 1/density_inv of the elements (low bits: an optimizer step). */
void h_model_step(h_model *m, unsigned density_inv);

/* Keep a copy of m's tensors as the contents of version v (1..31). */
void h_model_snap(h_model *m, uint64_t v);

/* The producer's chunk size (range_elems) of h_producer_open: 32768. */
extern uint64_t h_range_elems;

/* Free m's tensors and snapshots; m cleared. */
void h_model_free(h_model *m);

/* A producer of model_name (part 0 of 1) on b, m's tensors registered
 * (host memory).  0 or the first error; *p is the caller's to close. */
int h_producer_open(const h_broker *b, const char *model_name, h_model *m, dcast_producer **p);

/* Publish version v (after a step for v > 1), wait for its ACK, snapshot. */
int h_publish(dcast_producer *p, h_model *m, uint64_t v, unsigned density_inv);

/* A model (seed, h_model_init's scale), its producer on `name`, and
 * versions 1..versions published at 1/density_inv density.  0 or the
 * first error. */
int h_model_start_sized(const h_broker *b, const char *name, uint64_t seed, uint64_t scale,
			uint64_t versions, unsigned density_inv, h_model *m, dcast_producer **p);

/* The same at scale 1. */
int h_model_start(const h_broker *b, const char *name, uint64_t seed, uint64_t versions,
		  unsigned density_inv, h_model *m, dcast_producer **p);

/* Do the consumer's tensors equal the snapshot of version v?  (0 for
 * tensors in CUDA memory: not comparable here.) */
int h_equal(dcast_consumer *c, const h_model *m, uint64_t v);

/* A thread blocked in wait_version(version) (30 s at most); rc its result. */
typedef struct h_waiter {
	dcast_consumer *c;
	uint64_t version;
	int rc;
} h_waiter;

/* The thread's body: arg is an h_waiter. */
void *h_wait_thread(void *arg);

/* What the driver saw on the way. */
typedef struct h_seen {
	int gaps, errors, anchors, apply_failures;
	int last_error, last_apply_error;
	int untouched_ok, untouched_bad; /* tensors checked at each refusal */
} h_seen;

/* Count event ev into s. */
void h_count(h_seen *s, const dcast_event *ev);

/* The consumer's thread runs ahead of the driver: count the events it
 * queued before the target was reached. */
void h_drain(dcast_consumer *c, h_seen *s);

/* Poll and apply every READY version until the consumer holds `target`
 * (bounded: about 40 s).  At every refusal, check that the tensors still
 * equal the applied version's snapshot.  0 when it got there. */
int h_drive(dcast_consumer *c, const h_model *m, uint64_t target, h_seen *s);

/* How a driver applies a READY version: dcast_consumer_apply's result. */
typedef int (*h_apply_fn)(dcast_consumer *c, uint64_t version, void *arg);

/* h_drive, each version applied by apply(c, version, arg). */
int h_drive_by(dcast_consumer *c, const h_model *m, uint64_t target, h_seen *s, h_apply_fn apply, void *arg);

#endif
