/* bench_sync_consumer: the library consumer of scripts/bench_sync.sh, as a
 * rollout worker embeds it: default options (digests checked, the library's
 * fold policy), the consumer's own host copy of the tensors, and every READY
 * version applied at once.  When a version is READY it prints
 *   ready V t_ns T cpu_ns C direct_write_bytes D open_ns O open_cpu_ns P
 * (T: CLOCK_REALTIME nanoseconds when poll() returned the event; O: the
 * same clock just before dcast_consumer_open() was called, after this
 * process's exec and its libraries' loading; P: the process's CPU time
 * then, what its exec and loading cost, which C includes;
 * scripts/bench_fanout.sh times anchors to it; C, D as below: D then says
 * how much of an anchor taken in place its file had, whose writes run
 * behind its COMMIT; 0 on a delta's line, which reads no stats), and after
 * each apply:
 *   applied V anchor|delta t_ns T stage_ns S apply_ns A bytes B
 *     verify_bytes H log_write_bytes L direct_write_bytes D io_write_bytes W
 *     cpu_ns C log_write_ns N
 * T: CLOCK_REALTIME nanoseconds right after dcast_consumer_apply() returned;
 * S, A, B, H, L, D, N: dcast_consumer_stats (L, D, N cumulative since open;
 * N: the time its threads spent in checkpoint writes, submitting them
 * and waiting for them); W: this
 * process's write_bytes from /proc/self/io (cumulative; every byte it sent
 * towards the disk, checkpoint folds included); and cpu_ns C: this
 * process's CPU time so far, every thread (CLOCK_PROCESS_CPUTIME_ID).
 * Staging budget 64 MiB, `deltacast subscribe`'s default.
 * usage: bench_sync_consumer ENDPOINT MODEL DIR UNTIL
 * Exit 0 once UNTIL is applied; 1 on an error (named on stderr), among
 * them the broker's DCAST_ETOO_LARGE (a chunk larger than this budget's
 * window can never come: the library would keep re-joining for it, backing
 * off, with an error event each time).
 * BENCH_SYNC_CONSUMER_THREADS=1: each thread's CPU at READY, on stderr
 * (thread_times).
 * BENCH_SYNC_CONSUMER_CLOSE_AT_READY=1: the first version READY is not
 * applied: the consumer closes at once, then prints
 *   closed V io_write_bytes W
 * (W as above, after the close: what an anchor taken in place had written
 * of its file by then; tests/test_consumer_trailing.sh), and exits 0.
 * BENCH_SYNC_CONSUMER_DEVICE=1: every tensor (tiled ones excepted) bound
 * to cudaMalloc'd memory as soon as the manifest is known, as a rollout
 * worker's weights are (scripts/device_run.sh, step sync-gpu-cons;
 * docs/benchmarks.md, "Sync", 16-core H200 host). */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "deltacast/consumer.h"
#include "../proc.h" /* tp_proc_value: the tools link tests/support */
#ifdef DCAST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static volatile sig_atomic_t stop;
static uint64_t open_ns; /* CLOCK_REALTIME just before dcast_consumer_open() */
static uint64_t open_cpu_ns; /* cpu_ns() then */

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static uint64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU time of this process so far, every thread (ended ones too). */
static uint64_t cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void report(const dcast_consumer *c, uint64_t t_ns)
{
	dcast_consumer_stats st;

	dcast_consumer_stats_get(c, &st);
	printf("applied %" PRIu64 " %s t_ns %" PRIu64 " stage_ns %" PRIu64 " apply_ns %" PRIu64
	       " bytes %" PRIu64 " verify_bytes %" PRIu64 " log_write_bytes %" PRIu64
	       " direct_write_bytes %" PRIu64 " io_write_bytes %" PRIu64 " cpu_ns %" PRIu64
	       " log_write_ns %" PRIu64 "\n",
	       st.version, st.anchor ? "anchor" : "delta", t_ns, st.stage_ns, st.apply_ns, st.bytes,
	       st.verify_bytes, st.log_write_bytes, st.direct_write_bytes,
	       (uint64_t)tp_proc_value("/proc/self/io", "write_bytes"), cpu_ns(), st.log_write_ns);
	fflush(stdout);
}

/* BENCH_SYNC_CONSUMER_DEVICE: bind every untiled tensor to device memory
 * once the manifest is known (*bound: done).  -1: failed, said why. */
static int bind_device(dcast_consumer *c, int *bound)
{
	uint32_t n = dcast_consumer_tensor_count(c);
	int err = 0;

	if (*bound || !n || !getenv("BENCH_SYNC_CONSUMER_DEVICE") || !atoi(getenv("BENCH_SYNC_CONSUMER_DEVICE")))
		return 0;
	*bound = 1;
#ifdef DCAST_HAVE_CUDA
	for (uint32_t i = 0; i < n && !err; i++) {
		dcast_tensor_desc d;
		uint64_t bytes;
		void *dev = NULL;

		if ((err = dcast_consumer_tensor_at(c, i, &d)) || dcast_tensor_tiled(&d))
			continue;
		bytes = dcast_tensor_elems(&d) * dcast_dtype_size((int)d.dtype);
		if (cudaMalloc(&dev, bytes ? bytes : 1) != cudaSuccess)
			return fprintf(stderr, "bench_sync_consumer: cudaMalloc of %s failed\n", d.name), -1;
		err = dcast_consumer_bind(c, d.name, dev, DCAST_MEM_CUDA, bytes); /* freed at exit */
	}
#else
	fprintf(stderr, "bench_sync_consumer: BENCH_SYNC_CONSUMER_DEVICE, but this build has no CUDA\n");
	err = -1;
#endif
	return err;
}

/* BENCH_SYNC_CONSUMER_BIND_HOST=1: once the first version is applied,
 * every tensor (tiled ones excepted) bound whole to host memory of this
 * process's (host_mem, freed after the close), as a worker that moves
 * its weights after the first load: the library's own copy is given back
 * then, while an anchor's file may still be written from it. */
static void *host_mem[4096];
static uint32_t host_n;

static int bind_host(dcast_consumer *c, int *bound)
{
	uint32_t n = dcast_consumer_tensor_count(c);
	int err = 0;

	if (*bound || !getenv("BENCH_SYNC_CONSUMER_BIND_HOST"))
		return 0;
	*bound = 1;
	for (uint32_t i = 0; i < n && !err; i++) {
		dcast_tensor_desc d;
		uint64_t bytes;

		if ((err = dcast_consumer_tensor_at(c, i, &d)) || dcast_tensor_tiled(&d))
			continue;
		bytes = dcast_tensor_elems(&d) * dcast_dtype_size((int)d.dtype);
		if (host_n == sizeof(host_mem) / sizeof(host_mem[0]) || !(host_mem[host_n] = malloc(bytes ? bytes : 1)))
			return fprintf(stderr, "bench_sync_consumer: no host memory for %s\n", d.name), -1;
		err = dcast_consumer_bind(c, d.name, host_mem[host_n++], DCAST_MEM_HOST, bytes);
	}
	if (!err)
		fprintf(stderr, "bench_sync_consumer: %u tensors bound to host memory\n", n);
	return err;
}

/* Bytes of an anchor's own file written with O_DIRECT so far (stats). */
static uint64_t direct_written(const dcast_consumer *c)
{
	dcast_consumer_stats st;

	dcast_consumer_stats_get(c, &st);
	return st.direct_write_bytes;
}

static void thread_print(const char *name, const char *tid, unsigned long long ns, void *arg)
{
	(void)arg;
	fprintf(stderr, " %s %s %.1f", name, tid, ns / 1e6);
}

/* BENCH_SYNC_CONSUMER_THREADS=1: at each READY, every thread's CPU time
 * so far on stderr, "threads: NAME TID MS ...", from its schedstat (ns
 * on a CPU): which thread a slow join's time went to. */
static void thread_times(void)
{
	if (!getenv("BENCH_SYNC_CONSUMER_THREADS"))
		return;
	fprintf(stderr, "threads:");
	tp_threads(thread_print, NULL);
	fprintf(stderr, "\n");
}

static uint64_t closed_at = DCAST_VERSION_NONE; /* BENCH_SYNC_CONSUMER_CLOSE_AT_READY: its READY */

static int follow(dcast_consumer *c, uint64_t until)
{
	dcast_event ev;
	int err = 0, bound = 0, host_bound = 0;
	uint64_t anchor = DCAST_VERSION_NONE; /* the last anchor begun (its READY line gives D) */

	while (!stop && !err) {
		if ((err = bind_device(c, &bound)))
			break;
		uint64_t v = dcast_consumer_version(c);
		if (v != DCAST_VERSION_NONE && v >= until)
			break;
		if ((err = dcast_consumer_poll(c, 200, &ev)))
			break;
		if (ev.type == DCAST_EV_ERROR || ev.type == DCAST_EV_GAP)
			fprintf(stderr, "bench_sync_consumer: %s at version %" PRIu64 ": %s\n",
				ev.type == DCAST_EV_GAP ? "gap" : dcast_errname(ev.code), ev.version, ev.text);
		if (ev.type == DCAST_EV_ERROR && ev.code == DCAST_ETOO_LARGE)
			err = ev.code; /* named on the line above */
		if (ev.type == DCAST_EV_ANCHOR)
			anchor = ev.version;
		if (ev.type != DCAST_EV_VERSION_READY)
			continue;
		/* the time first: the stats take the consumer's lock, and a
		 * delta's READY line does without them, so that its apply starts
		 * as soon */
		uint64_t t_ns = realtime_ns(), c_ns = cpu_ns();
		printf("ready %" PRIu64 " t_ns %" PRIu64 " cpu_ns %" PRIu64 " direct_write_bytes %" PRIu64
		       " open_ns %" PRIu64 " open_cpu_ns %" PRIu64 "\n", ev.version, t_ns, c_ns,
		       ev.version == anchor ? direct_written(c) : 0, open_ns, open_cpu_ns);
		fflush(stdout);
		thread_times();
		if (getenv("BENCH_SYNC_CONSUMER_CLOSE_AT_READY")) {
			closed_at = ev.version;
			break;
		}
		if ((err = dcast_consumer_apply(c, ev.version)))
			break;
		report(c, realtime_ns());
		err = bind_host(c, &host_bound);
	}
	return err;
}

/* BENCH_SYNC_CONSUMER_SETTLE=1: once UNTIL is applied, wait for the
 * background folds (no fold running for 500 ms in a row, 120 s at most:
 * the policy starts one a loop turn after the apply that asks for it),
 * then print
 *   settled folds F folds_from_tensors L cpu_ns C
 * (tests/tools/fold_cpu.sh: a fold's cost, which a close would cut short). */
static void settle(dcast_consumer *c)
{
	dcast_consumer_stats st;
	dcast_event ev;
	int quiet = 0;

	if (!getenv("BENCH_SYNC_CONSUMER_SETTLE") || !atoi(getenv("BENCH_SYNC_CONSUMER_SETTLE")))
		return;
	for (int i = 0; i < 1200 && quiet < 5 && !stop; i++) {
		(void)dcast_consumer_poll(c, 100, &ev);
		dcast_consumer_stats_get(c, &st);
		quiet = st.folding ? 0 : quiet + 1;
	}
	dcast_consumer_stats_get(c, &st);
	printf("settled folds %" PRIu64 " folds_from_tensors %" PRIu64 " cpu_ns %" PRIu64 "\n", st.folds,
	       st.folds_from_tensors, cpu_ns());
}

int main(int argc, char **argv)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;
	int err;

	if (argc != 5) {
		fprintf(stderr, "usage: bench_sync_consumer ENDPOINT MODEL DIR UNTIL\n");
		return 2;
	}
	dcast_consumer_opts_init(&o);
	o.client = "bench_sync_consumer";
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	open_ns = realtime_ns();
	open_cpu_ns = cpu_ns();
	if (!(err = dcast_consumer_open(argv[1], argv[2], argv[3], 64u << 20, &o, &c)))
		err = follow(c, strtoull(argv[4], NULL, 10));
	if (!err)
		settle(c);
	if (err > 0 && err != DCAST_ETOO_LARGE) /* that one named by its event, -1 by bind_device */
		fprintf(stderr, "bench_sync_consumer: %s: %s\n", dcast_errname(err), dcast_last_error());
	dcast_consumer_close(&c);
	if (closed_at != DCAST_VERSION_NONE)
		printf("closed %" PRIu64 " io_write_bytes %" PRIu64 "\n", closed_at,
		       (uint64_t)tp_proc_value("/proc/self/io", "write_bytes"));
	while (host_n)
		free(host_mem[--host_n]);
	return err || stop ? 1 : 0;
}
