/* Test harness of the producer tests and bench: the real broker binary
 * started by tests/proc.h (on ports it picks and names), the
 * producer_reader tool, and every process stopped on exit. */
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

/* Call once at start: processes are killed on exit and on fatal signals. */
static inline void harness_init(void)
{
	tp_install();
	alarm(55); /* every test finishes in < 60 s, even if stuck */
}

/* Start a broker on ports it picks (tests/proc.h), logging to DIR/broker.log;
 * `extra` arguments were set by the caller.  0 when running. */
static inline int harness_broker_start(harness_broker *b, const char *dir)
{
	b->pport = b->cport = 0;
	snprintf(b->log, sizeof(b->log), "%s/broker.log", dir);
	return tp_broker_start(b);
}

/* Run producer_reader until it has applied `until`; 0 when it exits 0. */
static inline int harness_read(const harness_broker *b, const char *model, uint64_t until,
			const char *out)
{
	char exe[512], v[32];
	pid_t pid;
	int st = 0;

	snprintf(exe, sizeof(exe), "%s/tools/producer_reader", tp_build());
	snprintf(v, sizeof(v), "%llu", (unsigned long long)until);
	if ((pid = fork()) == 0) {
		execl(exe, exe, "--endpoint", b->consumers, "--model", model, "--until", v, "--out",
		      out, "--timeout-ms", "20000", (char *)NULL);
		_exit(127);
	}
	tp_track(pid);
	waitpid(pid, &st, 0);
	tp_untrack(pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* publish(v), then wait up to 20 s for its ACK: 0 or the first error. */
static inline int harness_publish(dcast_producer *p, uint64_t v)
{
	int rc = dcast_producer_publish(p, v);

	return rc ? rc : dcast_producer_wait(p, v, 20000);
}

/* xorshift64*: seeded, reproducible test data. */
static inline uint64_t harness_rand(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

/* Change about `per_million` of n bf16 elements by one ulp (or more). */
/* 1 when tensor `name` of the safetensors file at `path` holds exactly
 * `bytes` bytes equal to `data`. */
static inline int harness_same_as_file(const char *path, const char *name, const void *data,
				       size_t bytes)
{
	dcast_st_file *f = NULL;
	const dcast_st_tensor *t;
	int ok;

	if (dcast_st_open(path, &f))
		return 0;
	t = dcast_st_find(f, name);
	ok = t && t->nbytes == bytes && !memcmp(t->data, data, bytes);
	dcast_st_close(&f);
	return ok;
}

static inline void harness_perturb(uint16_t *x, uint64_t n, uint64_t per_million, uint64_t *seed)
{
	for (uint64_t i = 0; i < n; i++)
		if (harness_rand(seed) % 1000000 < per_million)
			x[i] = (uint16_t)(x[i] + 1 + (harness_rand(seed) & 3));
}

static inline void harness_fill(uint16_t *x, uint64_t n, uint64_t *seed)
{
	for (uint64_t i = 0; i < n; i++)
		x[i] = (uint16_t)(0x3c00 + (harness_rand(seed) & 0x3ff)); /* bf16 in [2^-7, ~2^-6] */
}

#endif
