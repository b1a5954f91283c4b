/* bench-consumer: the consumer against the real broker and producer on
 * loopback, on this machine's disk:
 *   1. staging throughput (anchor bytes / first chunk..READY, the broker
 *      already holding the version) vs plain memcpy of the same chunks into
 *      a pinned pool of the same size, in the same run;
 *   2. apply time of a 1%-density version as a fraction of its end-to-end
 *      receive time (publish() called .. READY at the consumer), digest
 *      verification on and off;
 *   3. record-log write throughput (chunk-sized writes through dcast_io +
 *      one fdatasync per version) vs dd with the same block size and
 *      conv=fdatasync into the same directory.
 * Prints a markdown table; `make bench-consumer` writes it into
 * docs/benchmarks.md.  Usage: bench_consumer [MODEL_MB] [DIR] */
#include <pthread.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include "../consumer_harness.h"
#include "deltacast/codec.h"
#include "dcast_common.h"

#define BUDGET (64ull << 20)

typedef struct run {
	dcast_consumer *c;
	const h_model *m;
	_Atomic uint64_t target, ready_ns, done;
	int failed;
} run;

static void *consumer_thread(void *arg)
{
	run *r = arg;
	dcast_event ev;

	for (int i = 0; i < 3000 && !atomic_load(&r->done); i++) {
		if (dcast_consumer_poll(r->c, 20, &ev)) {
			r->failed = 1;
			break;
		}
		if (ev.type != DCAST_EV_VERSION_READY || ev.version != atomic_load(&r->target))
			continue;
		atomic_store(&r->ready_ns, dcast_now_ns());
		if (dcast_consumer_apply(r->c, ev.version))
			r->failed = 1;
		atomic_store(&r->done, 1);
	}
	return NULL;
}

/* Open a consumer (verify on/off) and receive `target` in a thread. */
static int receive(const h_broker *b, const char *dir, int verify, h_model *m, dcast_producer *p,
		   uint64_t target, unsigned density_inv, uint64_t *e2e_ns, dcast_consumer_stats *st)
{
	dcast_consumer_opts o;
	run r = {0};
	pthread_t th;
	uint64_t t0;

	dcast_consumer_opts_init(&o);
	o.verify_digests = verify;
	o.fold_every = 1000;
	if (dcast_consumer_open(b->consumers, "bench", dir, BUDGET, &o, &r.c))
		return -1;
	r.m = m;
	atomic_store(&r.target, target);
	/* catch up to target-1 first when a delta is measured */
	if (p && target > 1) {
		h_seen s = {0};
		if (h_drive(r.c, m, target - 1, &s))
			return -1;
	}
	pthread_create(&th, NULL, consumer_thread, &r);
	t0 = dcast_now_ns();
	if (p && h_publish(p, m, target, density_inv))
		r.failed = 1;
	pthread_join(th, NULL);
	*e2e_ns = atomic_load(&r.ready_ns) - t0;
	dcast_consumer_stats_get(r.c, st);
	int ok = !r.failed && atomic_load(&r.done) && h_equal(r.c, m, target);
	dcast_consumer_close(&r.c);
	return ok ? 0 : -1;
}

/* memcpy of the model's bytes, chunk by chunk, into a pinned pool. */
static double memcpy_gbps(const h_model *m, uint64_t chunk)
{
	unsigned char *pool = mmap(NULL, BUDGET, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint64_t bytes = 0, t0, off = 0;

	mlock(pool, BUDGET);
	memset(pool, 1, BUDGET);
	t0 = dcast_now_ns();
	for (int t = 0; t < H_TENSORS; t++)
		for (uint64_t i = 0; i < m->bytes[t]; i += chunk) {
			uint64_t n = m->bytes[t] - i < chunk ? m->bytes[t] - i : chunk;
			if (off + n > BUDGET)
				off = 0;
			memcpy(pool + off, m->cur[t] + i, n);
			off += n, bytes += n;
		}
	double gbps = bytes / (double)(dcast_now_ns() - t0);
	munmap(pool, BUDGET);
	return gbps;
}

static double dd_gbps(const char *dir, uint64_t bs, uint64_t bytes)
{
	char cmd[2048];
	uint64_t t0 = dcast_now_ns();
	snprintf(cmd, sizeof(cmd), "dd if=/dev/zero of=%s/dd.bin bs=%" PRIu64 " count=%" PRIu64
		 " conv=fdatasync status=none && rm -f %s/dd.bin", dir, bs, bytes / bs, dir);
	if (system(cmd) != 0)
		return 0;
	return (bytes / bs * bs) / (double)(dcast_now_ns() - t0);
}

int main(int argc, char **argv)
{
	uint64_t model_mb = argc > 1 ? strtoull(argv[1], NULL, 10) : 128;
	char root[512], dir[600];
	h_broker b;
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer_stats st, st_v, st_nv;
	uint64_t e2e, e2e_v, e2e_nv;

	snprintf(root, sizeof(root), "%s/dcast-bench-XXXXXX", argc > 2 ? argv[2] : "/tmp");
	if (!mkdtemp(root) || h_broker_start(&b))
		return 1;
	h_range_elems = 1u << 20;
	h_model_init(&m, 3, (model_mb << 20) / 1343488 + 1);
	if (h_producer_open(&b, "bench", &m, &p) || h_publish(p, &m, 1, 100))
		return 1;
	/* 1. staging of the anchor the broker already holds */
	snprintf(dir, sizeof(dir), "%s/anchor", root);
	if (receive(&b, dir, 1, &m, NULL, 1, 100, &e2e, &st))
		return fprintf(stderr, "bench: anchor run failed: %s\n", dcast_last_error()), 1;
	double stage_gbps = st.bytes / (double)st.stage_ns, copy_gbps = memcpy_gbps(&m, 2u << 20);
	double log_gbps = st.log_write_bytes / (double)st.log_write_ns;
	double dd = dd_gbps(root, 2u << 20, st.log_write_bytes);
	/* 2. a 1% delta, end to end, verify on then off */
	snprintf(dir, sizeof(dir), "%s/v", root);
	if (receive(&b, dir, 1, &m, p, 2, 100, &e2e_v, &st_v))
		return fprintf(stderr, "bench: delta run failed: %s\n", dcast_last_error()), 1;
	snprintf(dir, sizeof(dir), "%s/nv", root);
	if (receive(&b, dir, 0, &m, p, 3, 100, &e2e_nv, &st_nv))
		return fprintf(stderr, "bench: delta run failed: %s\n", dcast_last_error()), 1;

	printf("model %.1f MiB (bf16 + f32), chunks of 2^20 elements, staging budget %llu MiB, io_uring %s\n\n",
	       h_model_bytes(&m) / 1048576.0, (unsigned long long)(BUDGET >> 20),
	       getenv("DELTACAST_IO_URING") && !strcmp(getenv("DELTACAST_IO_URING"), "0") ? "off" : "on (when the kernel allows)");
	printf("| measure | value | reference | ratio |\n| --- | --- | --- | --- |\n");
	printf("| staging throughput, anchor from the broker's log (GB/s) | %.2f | memcpy into pinned pool %.2f | %.3f |\n",
	       stage_gbps, copy_gbps, stage_gbps / copy_gbps);
	printf("| 1%% delta (%.2f MB): apply ms / end-to-end receive ms, verify on | %.2f / %.2f | goal < 5%% | %.1f%% |\n",
	       st_v.bytes / 1e6, st_v.apply_ns / 1e6, e2e_v / 1e6, 100.0 * st_v.apply_ns / e2e_v);
	printf("| 1%% delta: apply ms / end-to-end receive ms, verify off | %.2f / %.2f | goal < 5%% | %.1f%% |\n",
	       st_nv.apply_ns / 1e6, e2e_nv / 1e6, 100.0 * st_nv.apply_ns / e2e_nv);
	printf("| record-log write throughput, 2 MiB records + fdatasync (GB/s) | %.2f | dd bs=2M conv=fdatasync %.2f | %.3f |\n",
	       log_gbps, dd, log_gbps / dd);
	printf("| anchor chunks spilled to the log and read back at apply | %" PRIu64 " of %" PRIu64 " | | |\n",
	       st.spilled_chunks, st.chunks);
	dcast_producer_close(&p);
	h_model_free(&m);
	h_broker_stop(&b);
	snprintf(dir, sizeof(dir), "rm -rf %s", root);
	return system(dir) == 0 ? 0 : 1;
}
