/* Test support shared by every C test that runs processes (declarations;
 * the definitions are compiled once, in tests/support/proc.c, and linked
 * into every test and tool):
 * children tracked and killed at exit or on a fatal signal, one wait_until,
 * and a real broker started on ports it picks itself (tcp://127.0.0.1:*,
 * --metrics 127.0.0.1:0), ready when its log names the endpoints it bound.
 * No port guessing, no collisions to retry, no fixed sleeps.  The harness
 * headers (broker_, consumer_, producer_harness.h) build on this one. */
#ifndef DCAST_TEST_PROC_H
#define DCAST_TEST_PROC_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TP_MAX_CHILDREN 32
#define TP_MAX_ARGS 40
#define TP_START_MS 20000 /* a broker that has not bound its ports by then failed */

/* The build folder: $DELTACAST_BUILD, else "build" (tests run from the root). */
const char *tp_build(void);

/* SIGKILL and reap every tracked child; at exit and on SIGTERM/SIGINT/SIGALRM. */
void tp_kill_all(void);

/* Install the exit and signal handlers (once; later calls do nothing). */
void tp_install(void);

/* Track a child so that it dies with the test; aborts when the table is full. */
void tp_track(pid_t pid);

/* Forget a child that was reaped elsewhere. */
void tp_untrack(pid_t pid);

/* Milliseconds on the monotonic clock. */
long tp_now_ms(void);

/* Sleep ms milliseconds, resumed after signals (for pacing, never to wait
 * for an event: tp_wait_until does that). */
void tp_sleep_ms(int ms);

/* Poll ready(arg) until it returns nonzero (returned) or timeout_ms pass (0).
 * The pause between polls grows from 1 ms to 50 ms: an event is seen soon
 * after it happens, a long wait costs little CPU. */
int tp_wait_until(int timeout_ms, int (*ready)(void *), void *arg);

/* Wait until the file at path holds `count` lines with needle (1), or
 * timeout_ms pass (0): how tests wait for what a process logs. */
int tp_wait_log(const char *path, const char *needle, int count, int timeout_ms);

/* fork + exec argv, stdout to out_fd and stderr to err_fd (-1: inherit); the
 * child is tracked, and dies with the test even when the test itself is
 * killed (PR_SET_PDEATHSIG) if spawned from the main thread: the signal
 * follows the thread that forked, and a helper thread ends before the test.
 * -1 on failure. */
pid_t tp_spawn(char *const argv[], int out_fd, int err_fd);

/* A broker process.  Set log (its stderr, truncated at each start), the
 * extra arguments and with_metrics; tp_broker_start fills the rest.  A
 * restart (pport set) binds the same ports again. */
typedef struct tp_broker {
	pid_t pid;
	int pport, cport, mport; /* bound ports; mport 0 without --metrics */
	char producers[64], consumers[64]; /* "tcp://127.0.0.1:PORT" */
	char metrics[32];         /* "127.0.0.1:PORT" with --metrics */
	char log[512];
	const char *extra[TP_MAX_ARGS];
	int n_extra;
	int with_metrics;
	int exit_status;          /* waitpid status when it exited while starting */
} tp_broker;

/* 1 when this process runs under valgrind (`make test-valgrind`): its
 * LD_PRELOAD names valgrind's preloads.  For the tests whose real path
 * needs the speed valgrind takes away (a broker's heartbeats kept by a
 * client 20-50x slower), which then skip, saying so. */
int tp_under_valgrind(void);

/* A line on stderr: fmt as printf's, then a newline. */
void tp_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A tool's option: when argv[*i] is `name` and a value follows, that
 * value (decimal) into *out, *i moved onto it, and 1; else 0. */
int tp_arg_u64(int argc, char **argv, int *i, const char *name, uint64_t *out);

/* The port after the last `needle` in the file at path, 0 if none. */
int tp_log_port(const char *path, const char *needle);

/* One start: 0 once the broker has bound every endpoint, -1 when it exited
 * (exit_status says how) or did not bind within TP_START_MS (killed). */
int tp_broker_try(tp_broker *b);

/* Start the broker.  Fresh ports are picked by the broker itself, so one try
 * is enough; a restart on ports still held by a dying process tries again
 * (tp_wait_until's growing pauses) for up to 3 s.  0 when running, -1 when
 * it would not start. */
int tp_broker_start(tp_broker *b);

/* 1 when the thread's /proc stat file at path says stopped (T). */
int tp_thread_stopped(const char *path);

/* Send sig; for SIGKILL and SIGTERM also reap; for SIGSTOP wait (5 s at
 * most) until every thread has stopped.  No-op when not running. */
void tp_broker_kill(tp_broker *b, int sig);

/* ---- the harnesses' broker (broker_, consumer_harness.h) ---- */

/* Start the broker as b is set (its log, extra arguments, with_metrics; a
 * restart keeps pport and cport), naming a log file of its own under
 * $TMPDIR (or /tmp) when b->log is empty.  0 once it has bound its ports
 * (tp_broker_start); -1, naming its log on stderr, when it would not start. */
int h_broker_start(tp_broker *b);

/* A fresh broker: b cleared, the extra arguments (NULL-terminated, may be
 * NULL) set, then h_broker_start. */
int h_broker_start_args(tp_broker *b, char *const *extra);

/* ---- a broker's /metrics page ---- */

extern char tp_page[1 << 16]; /* the last page read */

/* GET path from 127.0.0.1:port into tp_page (NUL-terminated, head
 * included); its length, or -1 when nothing answered. */
int tp_http_get(int port, const char *path);

/* The value of the sample `name` in tp_page (labels included as printed,
 * e.g. deltacast_model_version{model="m"}), UINT64_MAX if absent. */
uint64_t tp_metric(const char *name);

/* Sample `name` on the broker's /metrics (port) now, UINT64_MAX when the
 * page cannot be read or has no such sample. */
uint64_t tp_metric_now(int port, const char *name);

/* Wait until sample `name` on the broker's /metrics (port) is at least
 * at_least (1), or timeout_ms pass (0): how tests wait for a counter. */
int tp_wait_metric(int port, const char *name, uint64_t at_least, int timeout_ms);

/* ---- loopback TCP connections, as /proc/net/tcp shows them ----
 * What a stopped or silent process cannot log: the bytes waiting in its
 * sockets, and whether it has closed its end of a connection. */

#define TP_TCP_ESTABLISHED 0x01
#define TP_TCP_CLOSE_WAIT 0x08 /* the peer closed; this end not yet */
#define TP_TCP_LISTEN 0x0A

/* Bytes the server on `port` has received and not read yet (its
 * connections' receive queues): what a stopped broker holds. */
unsigned long tp_tcp_unread(int port);

/* Wait until the server on `port` holds at least at_least bytes received
 * and unread (1), or timeout_ms pass (0): how tests wait for what a stopped
 * broker has been sent. */
int tp_wait_unread(int port, unsigned long at_least, int timeout_ms);

/* The number after "key:" in a /proc file of "Key: value" lines
 * (/proc/self/status's VmLck, in kB; /proc/self/io's write_bytes), or
 * after "key " in one of columns (/proc/self/limits's "Max open files":
 * the soft limit), or 0 where the file or the key is missing. */
unsigned long long tp_proc_value(const char *path, const char *key);

/* Each thread of this process in turn: fn(name, tid, ns, arg) with its
 * name (/proc/self/task/TID/comm, "?" when unreadable), its id and its
 * nanoseconds on a CPU so far (schedstat, 0 when unreadable).  Returns
 * how many threads were seen (0 when /proc cannot be read). */
int tp_threads(void (*fn)(const char *name, const char *tid, unsigned long long ns, void *arg), void *arg);

/* The local ports of the established client connections to `port`, up to
 * max of them in ports[]; how many. */
int tp_tcp_clients(int port, int *ports, int max);

/* 1 while the server on `port` holds its end of the connection from the
 * client port `client` open (established, or the client closed and the
 * server has not yet). */
int tp_tcp_server_open(int port, int client);

#endif
