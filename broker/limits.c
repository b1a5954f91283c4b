/* Limits at scale (limits.h).  Why the accept failures are only watched:
 * libzmq 4.3's tcp_listener_t::in_event() answers a failed accept() with
 * event_accept_failed() and returns, leaving the listening fd in its
 * level-triggered poller ("TODO: Handle specific errors like ENFILE/EMFILE"
 * in src/tcp_listener.cpp), so while a connection waits in the backlog and
 * no descriptor is free its I/O thread spins (zeromq/pyzmq#1642: a ROUTER
 * at 1009 connections, 100% CPU, libzmq 4.3.4).  Unbinding would stop the
 * spin but also close every connection the listener accepted (it owns
 * their sessions), so the broker prevents it instead: the soft limit is
 * raised to the hard limit at start, a limit below what the flags allow is
 * a start-up warning, and a failure that happens anyway is logged with the
 * numbers that explain it. */
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "dcast_common.h"
#include "dcast_slab.h" /* dcast_huge_pages */
#include "limits.h"

#define NOFILE_MARGIN 64         /* ZeroMQ's own, io_uring, eventfds, signalfd, metrics */
#define ACCEPT_LOG_EVERY_MS 10000


static uint64_t nr_open(void)
{
	FILE *f = fopen("/proc/sys/fs/nr_open", "r");
	unsigned long long v = 0;

	if (!f || fscanf(f, "%llu", &v) != 1)
		v = 1048576;
	if (f)
		fclose(f);
	return v;
}

/* What the flags allow: one descriptor per connection, two segment files
 * per model, and a margin. */
static uint64_t nofile_need(const struct broker_config *c)
{
	return c->max_consumers + c->max_producers + 2 * c->max_models + NOFILE_MARGIN;
}

static uint64_t nofile_raise(void)
{
	struct rlimit rl;
	rlim_t want;

	if (getrlimit(RLIMIT_NOFILE, &rl)) {
		DCAST_LOG_W("open files: getrlimit: %s", strerror(errno));
		return 0;
	}
	want = rl.rlim_max == RLIM_INFINITY ? (rlim_t)nr_open() : rl.rlim_max;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= want) {
		DCAST_LOG_I("open files: soft limit %llu (the hard limit)",
			    (unsigned long long)rl.rlim_cur);
		return rl.rlim_cur;
	}
	rlim_t was = rl.rlim_cur;

	rl.rlim_cur = want;
	if (setrlimit(RLIMIT_NOFILE, &rl)) {
		DCAST_LOG_W("open files: raising the soft limit from %llu to %llu: %s",
			    (unsigned long long)was, (unsigned long long)want, strerror(errno));
		return was;
	}
	DCAST_LOG_I("open files: soft limit raised from %llu to %llu (the hard limit)",
		    (unsigned long long)was, (unsigned long long)want);
	return want;
}

void broker_limits_nofile(const struct broker_config *c)
{
	uint64_t have = nofile_raise(), need = nofile_need(c);

	if (!have || have >= need)
		return;
	DCAST_LOG_W("open files: the limit is %llu, below the %llu this broker may use "
		    "(--max-consumers %llu + --max-producers %llu + 2 x --max-models %llu + %d "
		    "for ZeroMQ, io_uring, metrics): past about %llu connections accept() fails "
		    "with EMFILE and libzmq retries it in a busy loop (new peers wait); raise the "
		    "hard limit (ulimit -Hn, systemd LimitNOFILE=) or lower --max-consumers / "
		    "--max-producers", (unsigned long long)have, (unsigned long long)need,
		    (unsigned long long)c->max_consumers, (unsigned long long)c->max_producers,
		    (unsigned long long)c->max_models, NOFILE_MARGIN,
		    (unsigned long long)(have > need - c->max_consumers - c->max_producers
					 ? have - (need - c->max_consumers - c->max_producers)
					 : 0));
}

/* Did the operator set this malloc parameter (the MALLOC_* variable or
 * the glibc.malloc tunable)?  Then the broker leaves it alone. */
static int malloc_chosen(const char *var, const char *tunable)
{
	const char *t = getenv("GLIBC_TUNABLES");

	return getenv(var) || (t && strstr(t, tunable));
}

static void malloc_set(int param, int value, const char *var, const char *tunable)
{
	if (!malloc_chosen(var, tunable) && !mallopt(param, value))
		DCAST_LOG_W("memory: mallopt(%s, %d) refused", tunable, value);
}

/* The broker's heap (docs/operations.md, "The broker's heap").  One
 * arena for its threads: ZeroMQ's I/O threads allocate each message they
 * receive in an arena of their own, and the loop frees it once the
 * payload is spilled or committed: with glibc's default, what a
 * producer's window held stays in that arena, where the loop's own
 * allocations (the log's headers, frames read from disk) cannot reuse it,
 * until a quiet turn trims it.  A peak of twice the window, not once.
 * And that heap kept for the next message: a CHUNK message (2 MiB of an
 * anchor) is freed once its payload is spilled or copied into the log's
 * huge pages (ingest.c), and with glibc's defaults each went back to the
 * kernel and the next was faulted in afresh, a fault per 4 KiB: messages
 * up to 32 MiB come from the heap, whose top is given back past 64 MiB
 * free. */
static void heap_setup(void)
{
	malloc_set(M_ARENA_MAX, 1, "MALLOC_ARENA_MAX", "glibc.malloc.arena_max");
	malloc_set(M_MMAP_THRESHOLD, 32 << 20, "MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold");
	malloc_set(M_TRIM_THRESHOLD, 64 << 20, "MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold");
}

void broker_limits_memory(struct broker_config *c)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;

	heap_setup();
	if (!dcast_huge_pages())
		DCAST_LOG_I("memory: huge pages off (DELTACAST_HUGE_PAGES=0): payloads kept as "
			    "received, the fold's state on 4 KiB pages");
	if (!c->max_pending_total_bytes)
		c->max_pending_total_bytes = phys ? phys / 4 : 4ull << 30;
	DCAST_LOG_I("memory: open versions hold at most %llu bytes of memory in all "
		    "(--max-pending-total-bytes; physical memory %llu), %llu per version "
		    "(--max-pending-bytes)", (unsigned long long)c->max_pending_total_bytes,
		    (unsigned long long)phys, (unsigned long long)c->max_pending_bytes);
}

static unsigned fds_open(void)
{
	DIR *d = opendir("/proc/self/fd");
	unsigned n = 0;

	while (d && readdir(d))
		n++;
	if (d)
		closedir(d);
	return n > 3 ? n - 3 : 0; /* ".", "..", and the DIR's own */
}

static void accept_failed(struct broker_watch *w, int err)
{
	uint64_t now = dcast_now_ms();
	struct rlimit rl = {0};

	w->failures++;
	if (w->logged_ms && now - w->logged_ms < ACCEPT_LOG_EVERY_MS) {
		w->unlogged++;
		return;
	}
	getrlimit(RLIMIT_NOFILE, &rl);
	DCAST_LOG_E("%s endpoint: accept failed: %s (%u descriptors open, limit %llu; %llu more "
		    "failures since the last line): new peers wait until a descriptor frees "
		    "(docs/operations.md, \"Limits at scale\")", w->which, strerror(err),
		    fds_open(), (unsigned long long)rl.rlim_cur, (unsigned long long)w->unlogged);
	w->logged_ms = now;
	w->unlogged = 0;
}

/* One monitor event: frame 1 is u16 event + u32 value, frame 2 the
 * endpoint. */
static int monitor_read(struct broker_watch *w)
{
	zmq_msg_t ev, ep;
	uint16_t event;
	uint32_t value;
	int rc;

	zmq_msg_init(&ev);
	zmq_msg_init(&ep);
	rc = zmq_msg_recv(&ev, w->mon, ZMQ_DONTWAIT);
	if (rc >= 0 && zmq_msg_more(&ev))
		zmq_msg_recv(&ep, w->mon, ZMQ_DONTWAIT);
	if (rc >= 6) {
		memcpy(&event, zmq_msg_data(&ev), 2);
		memcpy(&value, (uint8_t *)zmq_msg_data(&ev) + 2, 4);
		if (event == ZMQ_EVENT_ACCEPT_FAILED)
			accept_failed(w, (int)value);
	}
	zmq_msg_close(&ev);
	zmq_msg_close(&ep);
	return rc;
}

/* ZMQ_FD signals edges: read every queued event each time. */
static void on_monitor(struct broker *b, int fd, void *arg)
{
	(void)b;
	(void)fd;
	while (monitor_read(arg) >= 0)
		;
}

int broker_limits_watch(struct broker *b, void *sock, const char *which)
{
	struct broker_watch *w = &b->watch[b->n_watch];
	char ep[64];
	int fd;
	size_t len = sizeof(fd);

	if (b->n_watch == DCAST_ARRAY_LEN(b->watch))
		return dcast_fail(DCAST_EBUSY, "limits: more than 2 listeners watched");
	snprintf(ep, sizeof(ep), "inproc://deltacast-monitor-%s", which);
	if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_ACCEPT_FAILED) ||
	    !(w->mon = zmq_socket(b->ctx, ZMQ_PAIR)) || zmq_connect(w->mon, ep) ||
	    zmq_getsockopt(w->mon, ZMQ_FD, &fd, &len))
		return dcast_fail(DCAST_EZMQ, "%s socket: monitor: %s", which, zmq_strerror(errno));
	w->which = which;
	b->n_watch++;
	on_monitor(b, fd, w); /* a first read arms ZMQ_FD: until the pipe was found empty
				 once, no event would wake it */
	return broker_poll_add(b, fd, on_monitor, w);
}

void broker_limits_close(struct broker *b)
{
	int zero = 0;

	for (unsigned i = 0; i < b->n_watch; i++) {
		zmq_setsockopt(b->watch[i].mon, ZMQ_LINGER, &zero, sizeof(zero));
		zmq_close(b->watch[i].mon);
	}
	memset(b->watch, 0, sizeof(b->watch));
	b->n_watch = 0;
}
