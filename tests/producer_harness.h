/* Test harness of the producer tests and bench: the real broker binary
 * started by tests/proc.h (on ports it picks and names), the
 * producer_reader tool, and every process stopped on exit.  Declarations;
 * the definitions are compiled once, in tests/support/producer_harness.c,
 * and linked into every test and tool. */
#ifndef DCAST_PRODUCER_HARNESS_H
#define DCAST_PRODUCER_HARNESS_H

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "proc.h"
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef tp_broker harness_broker;

/* Call once at start: processes are killed on exit and on fatal signals;
 * the test is ended (SIGALRM) after 55 s, even if stuck. */
void harness_init(void);

/* Start a broker on ports it picks (tests/proc.h), logging to DIR/broker.log;
 * `extra` arguments were set by the caller.  0 when running. */
int harness_broker_start(harness_broker *b, const char *dir);

/* Run producer_reader until it has applied `until`, writing the model to
 * `out`; 0 when it exits 0, else its exit status (-1: killed). */
int harness_read(const harness_broker *b, const char *model, uint64_t until, const char *out);

/* A producer of `model` on endpoint ep with options o (NULL: defaults),
 * one bf16 tensor "w" of n elements registered over w (host memory, the
 * caller's); the test fails when either step does. */
dcast_producer *harness_open_w(const char *ep, const char *model, const dcast_producer_opts *o, uint16_t *w,
			       uint64_t n);

/* publish(v), then wait up to 20 s for its ACK: 0 or the first error. */
int harness_publish(dcast_producer *p, uint64_t v);

/* xorshift64*: seeded, reproducible test data. */
uint64_t harness_rand(uint64_t *s);

/* 1 when tensor `name` of the safetensors file at `path` holds exactly
 * `bytes` bytes equal to `data`. */
int harness_same_as_file(const char *path, const char *name, const void *data, size_t bytes);

/* Change about `per_million` of n bf16 elements by one ulp (or more). */
void harness_perturb(uint16_t *x, uint64_t n, uint64_t per_million, uint64_t *seed);

/* n bf16 elements in [2^-7, ~2^-6] from seed. */
void harness_fill(uint16_t *x, uint64_t n, uint64_t *seed);

#endif
