/* bench-consumer: the consumer against the real broker and producer on
 * loopback, on this machine's disk:
 *   1. staging throughput (anchor bytes / first chunk..READY, the broker
 *      already holding the version) vs plain memcpy of the same chunks into
 *      a pinned pool of the same size, in the same run; and the same without
 *      the time spent writing the record log (the local checkpoint);
 *   2. apply time of a 1%-density version as a fraction of its end-to-end
 *      receive time (publish() called .. READY at the consumer), medians of
 *      REPEATS versions, digest verification on (checked ahead of apply),
 *      off, and every block after apply;
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

#define REPEATS 5

/* One version received: apply and end-to-end times, what it hashed. */
typedef struct sample {
	double apply_ms, e2e_ms;
	uint64_t bytes, verify_bytes;
} sample;

static dcast_consumer *open_consumer(const h_broker *b, const char *dir, int verify)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;

	dcast_consumer_opts_init(&o);
	o.verify_digests = verify;
	o.fold_every = 1000;
	return dcast_consumer_open(b->consumers, "bench", dir, BUDGET, &o, &c) ? NULL : c;
}

/* Receive `target` in a thread while it is published (p NULL: the broker
 * already holds it), apply it, check it bit-exact. */
/* Version v changes about 1% of the elements of the first tenth of each
 * tensor only (layers that did not move, as when some are frozen). */
static int publish_clustered(dcast_producer *p, h_model *m, uint64_t v)
{
	for (int t = 0; t < H_TENSORS; t++) {
		unsigned es = t == 1 ? 4 : 2;
		uint64_t n = m->bytes[t] / es / 10 + 1;
		for (uint64_t j = 0; j < n / 100 + 1; j++)
			m->cur[t][(h_rand(&m->rng) % n) * es] ^= (unsigned char)(1 + h_rand(&m->rng) % 7);
	}
	h_model_snap(m, v);
	return dcast_producer_publish(p, v) ? -1 : dcast_producer_wait(p, v, 20000);
}

static int receive(dcast_consumer *c, h_model *m, dcast_producer *p, uint64_t target, int clustered,
		   sample *out)
{
	run r = {.c = c, .m = m};
	dcast_consumer_stats st;
	pthread_t th;
	uint64_t t0;

	atomic_store(&r.target, target);
	pthread_create(&th, NULL, consumer_thread, &r);
	t0 = dcast_now_ns();
	if (p && (clustered ? publish_clustered(p, m, target) : h_publish(p, m, target, 100)))
		r.failed = 1;
	pthread_join(th, NULL);
	dcast_consumer_stats_get(c, &st);
	*out = (sample){st.apply_ns / 1e6, (atomic_load(&r.ready_ns) - t0) / 1e6, st.bytes, st.verify_bytes};
	return !r.failed && atomic_load(&r.done) && h_equal(c, m, target) ? 0 : -1;
}

/* A fresh consumer caught up to first-1 (and folded, so that no fold runs
 * inside a measurement), then REPEATS 1% deltas from first on (confined to
 * a tenth of the model when clustered). */
static int receive_deltas(const h_broker *b, const char *dir, int verify, h_model *m, dcast_producer *p,
			  uint64_t first, int clustered, sample *out)
{
	dcast_consumer *c = open_consumer(b, dir, verify);
	h_seen seen = {0};
	int err = !c || h_drive(c, m, first - 1, &seen) || dcast_consumer_checkpoint(c);

	for (int i = 0; !err && i < REPEATS; i++) {
		err = receive(c, m, p, first + i, clustered, &out[i]);
		for (int t = 0; t < H_TENSORS; t++) /* bounded memory: the older snapshot is done */
			free(m->snap[first + i - 1][t]), m->snap[first + i - 1][t] = NULL;
	}
	dcast_consumer_close(&c);
	return err ? -1 : 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* "| label ... | apply / e2e medians | ratio median (min..max) |" */
static void print_deltas(const char *label, const sample *s)
{
	double apply[REPEATS], e2e[REPEATS], ratio[REPEATS];

	for (int i = 0; i < REPEATS; i++)
		apply[i] = s[i].apply_ms, e2e[i] = s[i].e2e_ms, ratio[i] = 100 * s[i].apply_ms / s[i].e2e_ms;
	double a = median(apply, REPEATS), e = median(e2e, REPEATS), r = median(ratio, REPEATS);
	printf("| %s (%.2f MB): apply ms / end-to-end receive ms, median of %d | %.2f / %.1f | "
	       "goal < 5%% | %.1f%% (%.1f..%.1f) |\n", label, s[0].bytes / 1e6, REPEATS, a, e, r, ratio[0],
	       ratio[REPEATS - 1]);
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
	dcast_consumer *c;
	sample anchor, on[REPEATS], off[REPEATS], full[REPEATS], part[REPEATS];

	snprintf(root, sizeof(root), "%s/dcast-bench-XXXXXX", argc > 2 ? argv[2] : "/tmp");
	if (!mkdtemp(root) || h_broker_start_args(&b, NULL))
		return 1;
	h_range_elems = 1u << 20;
	h_model_init(&m, 3, (model_mb << 20) / 1343488 + 1);
	if (h_producer_open(&b, "bench", &m, &p) || h_publish(p, &m, 1, 100))
		return 1;
	/* 1. staging of the anchor the broker already holds */
	snprintf(dir, sizeof(dir), "%s/anchor", root);
	dcast_consumer_stats st;
	if (!(c = open_consumer(&b, dir, 1)) || receive(c, &m, NULL, 1, 0, &anchor))
		return fprintf(stderr, "bench: anchor run failed: %s\n", dcast_last_error()), 1;
	dcast_consumer_stats_get(c, &st);
	dcast_consumer_close(&c);
	double stage_gbps = st.bytes / (double)st.stage_ns, copy_gbps = memcpy_gbps(&m, 2u << 20);
	double log_gbps = st.log_write_bytes / (double)st.log_write_ns;
	double dd = dd_gbps(root, 2u << 20, st.log_write_bytes);
	/* 2. 1% deltas, end to end: verify on (blocks written), off, every block */
	snprintf(dir, sizeof(dir), "%s/v", root);
	int err = receive_deltas(&b, dir, 1, &m, p, 2, 0, on);
	snprintf(dir, sizeof(dir), "%s/nv", root);
	err = err ? err : receive_deltas(&b, dir, 0, &m, p, 2 + REPEATS, 0, off);
	snprintf(dir, sizeof(dir), "%s/full", root);
	err = err ? err : receive_deltas(&b, dir, 2, &m, p, 2 + 2 * REPEATS, 0, full);
	snprintf(dir, sizeof(dir), "%s/part", root);
	err = err ? err : receive_deltas(&b, dir, 1, &m, p, 2 + 3 * REPEATS, 1, part);
	if (err)
		return fprintf(stderr, "bench: delta run failed: %s\n", dcast_last_error()), 1;

	printf("model %.1f MiB (bf16 + f32), chunks of 2^20 elements, staging budget %llu MiB, io_uring %s\n\n",
	       h_model_bytes(&m) / 1048576.0, (unsigned long long)(BUDGET >> 20),
	       getenv("DELTACAST_IO_URING") && !strcmp(getenv("DELTACAST_IO_URING"), "0") ? "off" : "on (when the kernel allows)");
	printf("| measure | value | reference | ratio |\n| --- | --- | --- | --- |\n");
	printf("| staging throughput, anchor from the broker's log (GB/s) | %.2f | memcpy into pinned pool %.2f | %.3f |\n",
	       stage_gbps, copy_gbps, stage_gbps / copy_gbps);
	double net_gbps = st.bytes / (double)(st.stage_ns - st.log_write_ns);
	printf("| staging throughput without the time in record-log writes and their fdatasync (GB/s) | %.2f | "
	       "memcpy into pinned pool %.2f | %.3f |\n", net_gbps, copy_gbps, net_gbps / copy_gbps);
	print_deltas("1% delta, verify on", on);
	print_deltas("1% delta, verify off", off);
	print_deltas("1% delta, verify every block", full);
	printf("| bytes hashed per delta, verify on / every block | %.1f MB / %.1f MB | model %.1f MB | %.3f |\n",
	       on[REPEATS - 1].verify_bytes / 1e6, full[REPEATS - 1].verify_bytes / 1e6, h_model_bytes(&m) / 1e6,
	       on[REPEATS - 1].verify_bytes / (double)h_model_bytes(&m));
	print_deltas("1% of a tenth of the model, verify on", part);
	printf("| bytes hashed per delta in a tenth of the model, verify on | %.1f MB | model %.1f MB | %.3f |\n",
	       part[REPEATS - 1].verify_bytes / 1e6, h_model_bytes(&m) / 1e6,
	       part[REPEATS - 1].verify_bytes / (double)h_model_bytes(&m));
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
