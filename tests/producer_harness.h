/* Test harness of the producer tests and bench: start the real broker
 * binary on free loopback ports (picked from the test's PID, retried on a
 * clash), run the producer_reader tool, and stop every process on exit. */
#ifndef DCAST_PRODUCER_HARNESS_H
#define DCAST_PRODUCER_HARNESS_H

#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct harness_broker {
	pid_t pid;
	int prod_port, cons_port;
	char prod_ep[64], cons_ep[64], log[512];
	char extra[8][64];
	int n_extra;
} harness_broker;

static pid_t harness_pids[16];

static inline void harness_kill_all(void)
{
	for (size_t i = 0; i < sizeof(harness_pids) / sizeof(harness_pids[0]); i++)
		if (harness_pids[i] > 0) {
			kill(harness_pids[i], SIGKILL);
			waitpid(harness_pids[i], NULL, 0);
			harness_pids[i] = 0;
		}
}

static inline void harness_track(pid_t pid, int add)
{
	for (size_t i = 0; i < sizeof(harness_pids) / sizeof(harness_pids[0]); i++)
		if (add ? harness_pids[i] == 0 : harness_pids[i] == pid) {
			harness_pids[i] = add ? pid : 0;
			return;
		}
}

static inline void harness_on_signal(int sig)
{
	harness_kill_all();
	_exit(128 + sig);
}

/* Call once at start: processes are killed on exit and on fatal signals. */
static inline void harness_init(void)
{
	atexit(harness_kill_all);
	signal(SIGTERM, harness_on_signal);
	signal(SIGINT, harness_on_signal);
	signal(SIGALRM, harness_on_signal);
	alarm(55); /* every test finishes in < 60 s, even if stuck */
}

static inline void harness_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static inline const char *harness_build(void)
{
	const char *b = getenv("DELTACAST_BUILD");
	return b ? b : "build";
}

static inline pid_t harness_spawn_broker(harness_broker *b)
{
	char exe[512];
	char *argv[32];
	int a = 0;
	pid_t pid;

	snprintf(exe, sizeof(exe), "%s/deltacast-broker", harness_build());
	argv[a++] = exe;
	argv[a++] = "--producers";
	argv[a++] = b->prod_ep;
	argv[a++] = "--consumers";
	argv[a++] = b->cons_ep;
	for (int i = 0; i < b->n_extra; i++)
		argv[a++] = b->extra[i];
	argv[a] = NULL;
	if ((pid = fork()) == 0) {
		int fd = open(b->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 2);
		dup2(fd, 1);
		execv(exe, argv);
		_exit(127);
	}
	return pid;
}

/* Start the broker on the ports already in b (same ports: a restart). */
static inline int harness_broker_restart(harness_broker *b)
{
	for (int waited = 0; waited < 5000; waited += 20) {
		int st;

		if (!b->pid) {
			b->pid = harness_spawn_broker(b);
			harness_track(b->pid, 1);
		}
		if (check_file_has(b->log, "consumers on"))
			return 0;
		if (waitpid(b->pid, &st, WNOHANG) == b->pid) {
			harness_track(b->pid, 0);
			b->pid = 0;
			harness_sleep_ms(100); /* port still held: try again */
		}
		harness_sleep_ms(20);
	}
	return -1;
}

/* Start a broker on fresh ports; `extra` arguments were set by the caller. */
static inline int harness_broker_start(harness_broker *b, const char *dir)
{
	for (int attempt = 0; attempt < 20; attempt++) {
		int base = 20000 + (int)((getpid() * 131 + attempt * 977) % 30000);

		b->prod_port = base;
		b->cons_port = base + 1;
		snprintf(b->prod_ep, sizeof(b->prod_ep), "tcp://127.0.0.1:%d", b->prod_port);
		snprintf(b->cons_ep, sizeof(b->cons_ep), "tcp://127.0.0.1:%d", b->cons_port);
		snprintf(b->log, sizeof(b->log), "%s/broker-%d.log", dir, attempt);
		b->pid = harness_spawn_broker(b);
		harness_track(b->pid, 1);
		for (int waited = 0; waited < 5000; waited += 20) {
			int st;

			if (check_file_has(b->log, "consumers on"))
				return 0;
			if (waitpid(b->pid, &st, WNOHANG) == b->pid) {
				harness_track(b->pid, 0);
				b->pid = 0;
				break;
			}
			harness_sleep_ms(20);
		}
		if (b->pid) {
			kill(b->pid, SIGKILL);
			waitpid(b->pid, NULL, 0);
			harness_track(b->pid, 0);
			b->pid = 0;
		}
	}
	return -1;
}

static inline void harness_broker_kill(harness_broker *b, int sig)
{
	if (!b->pid)
		return;
	kill(b->pid, sig);
	if (sig == SIGKILL || sig == SIGTERM) {
		waitpid(b->pid, NULL, 0);
		harness_track(b->pid, 0);
		b->pid = 0;
	}
}

/* Run producer_reader until it has applied `until`; 0 when it exits 0. */
static inline int harness_read(const harness_broker *b, const char *model, uint64_t until,
			const char *out)
{
	char exe[512], v[32];
	pid_t pid;
	int st = 0;

	snprintf(exe, sizeof(exe), "%s/tools/producer_reader", harness_build());
	snprintf(v, sizeof(v), "%llu", (unsigned long long)until);
	if ((pid = fork()) == 0) {
		execl(exe, exe, "--endpoint", b->cons_ep, "--model", model, "--until", v, "--out",
		      out, "--timeout-ms", "20000", (char *)NULL);
		_exit(127);
	}
	harness_track(pid, 1);
	waitpid(pid, &st, 0);
	harness_track(pid, 0);
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
