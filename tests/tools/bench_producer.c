/* bench_producer: publish time of a ~1%-density version of a gen-trace model
 * through a real broker, as a ratio to one memcpy of the model's bytes in
 * the same run (host path), and bytes on the wire as a ratio to the model's
 * bytes.  Writes a table between the bench-producer markers of
 * docs/benchmarks.md (other sections kept).
 *
 * usage: bench_producer --trace DIR [--rounds N] [--doc docs/benchmarks.md]
 *   DIR holds v0000.safetensors and v0001.safetensors from
 *   `deltacast gen-trace --density 0.01`. */
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include "dcast_common.h"
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"
#include "../producer_harness.h"

#define MAX_ROUNDS 32

typedef struct bench {
	dcast_st_file *f[2];
	unsigned char **w;      /* trainer weights, one buffer per tensor */
	size_t n;
	uint64_t model_bytes;
	unsigned char *copy;    /* memcpy destination, kept warm */
	double memcpy_s[MAX_ROUNDS], publish_s[MAX_ROUNDS], total_s[MAX_ROUNDS];
	double ratio_s[MAX_ROUNDS], total_ratio[MAX_ROUNDS];
	double memcpy_cpu[MAX_ROUNDS], publish_cpu[MAX_ROUNDS], cpu_ratio[MAX_ROUNDS];
	uint64_t wire[MAX_ROUNDS], changed[MAX_ROUNDS], elems;
	int rounds;
	double load_before;
} bench;

static double now_s(void)
{
	return (double)dcast_now_ns() * 1e-9;
}

static double cpu_s(clockid_t which)
{
	struct timespec ts;

	clock_gettime(which, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
	double s[MAX_ROUNDS];

	memcpy(s, v, (size_t)n * sizeof(*s));
	qsort(s, (size_t)n, sizeof(*s), cmp_d);
	return s[n / 2];
}

/* The optimizer step: copy checkpoint k into the trainer's weights. */
static void load(bench *b, int k)
{
	for (size_t i = 0; i < b->n; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(b->f[k], i);
		memcpy(b->w[i], t->data, t->nbytes);
	}
}

/* One memcpy of the model's bytes (from the weights into a warm buffer):
 * the best of three. */
static double time_memcpy(bench *b, double *cpu)
{
	double best = 1e9;

	*cpu = 1e9;
	for (int r = 0; r < 2; r++) {
		double t0 = now_s(), c0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
		uint64_t at = 0;

		for (size_t i = 0; i < b->n; i++) {
			uint64_t nb = dcast_st_tensor_at(b->f[0], i)->nbytes;
			memcpy(b->copy + at, b->w[i], nb);
			at += nb;
		}
		if (now_s() - t0 < best)
			best = now_s() - t0;
		if (cpu_s(CLOCK_THREAD_CPUTIME_ID) - c0 < *cpu)
			*cpu = cpu_s(CLOCK_THREAD_CPUTIME_ID) - c0;
	}
	return best;
}

static int setup(bench *b, const char *dir, dcast_producer *p)
{
	char path[2][600];

	for (int k = 0; k < 2; k++) {
		snprintf(path[k], sizeof(path[k]), "%s/v%04d.safetensors", dir, k);
		if (dcast_st_open(path[k], &b->f[k]))
			return -1;
	}
	b->n = dcast_st_count(b->f[0]);
	b->w = calloc(b->n, sizeof(*b->w));
	for (size_t i = 0; i < b->n; i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(b->f[0], i);
		int d = dcast_dtype_from_name(dcast_st_dtype_name(t->dtype));

		b->w[i] = malloc(t->nbytes + 1);
		b->model_bytes += t->nbytes;
		if (d < 0 || dcast_producer_register(p, t->name, d, t->ndim, t->shape, b->w[i],
						     DCAST_MEM_HOST, 0, t->count))
			return -1;
	}
	return 0;
}

static int run(bench *b, dcast_producer *p)
{
	dcast_producer_stats s;

	load(b, 0);
	if (dcast_producer_publish(p, 1) || dcast_producer_wait(p, 1, 60000))
		return -1;
	if (!(b->copy = malloc(b->model_bytes + 1)))
		return -1;
	memset(b->copy, 1, b->model_bytes);
	for (int r = 0; r < b->rounds; r++) {
		uint64_t v = 2 + (uint64_t)r;
		double t0, t1, c0;

		load(b, (r + 1) % 2); /* alternate: every version a ~1% delta */
		b->memcpy_s[r] = time_memcpy(b, &b->memcpy_cpu[r]); /* paired: same load */
		c0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
		t0 = now_s();
		if (dcast_producer_publish(p, v))
			return -1;
		t1 = now_s();
		b->publish_cpu[r] = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
		if (dcast_producer_wait(p, v, 60000))
			return -1;
		b->publish_s[r] = t1 - t0;
		b->total_s[r] = now_s() - t0;
		b->ratio_s[r] = b->publish_s[r] / b->memcpy_s[r];
		b->total_ratio[r] = b->total_s[r] / b->memcpy_s[r];
		b->cpu_ratio[r] = b->publish_cpu[r] / b->memcpy_cpu[r];
		dcast_producer_stats_get(p, &s);
		b->wire[r] = s.payload_bytes;
		b->changed[r] = s.changed_elems;
		b->elems = s.elems;
	}
	return 0;
}

static double max_of(const double *v, int n)
{
	double m = v[0];

	for (int i = 1; i < n; i++)
		m = v[i] > m ? v[i] : m;
	return m;
}

static void table(const bench *b, const dcast_producer_opts *po, FILE *o, const char *cmd)
{
	struct utsname u;
	double wire = 0, dens = 0, load[1] = {0};

	for (int r = 0; r < b->rounds; r++) {
		wire += (double)b->wire[r] / b->rounds;
		dens += (double)b->changed[r] / (double)b->elems / b->rounds;
	}
	uname(&u);
	getloadavg(load, 1);
	fprintf(o, "Command: `%s` (%s %s, %ld CPUs, load average %.1f before and %.1f after).\n"
		   "Each of %d delta versions is timed against one memcpy of the model (best of 2)\n"
		   "just before it; medians, and the worst ratio.  encode_threads %u (0: one per\n"
		   "CPU), %llu-element ranges.  CPU: the publishing process's, all threads.\n\n",
		cmd, u.sysname, u.machine, sysconf(_SC_NPROCESSORS_ONLN), b->load_before, load[0],
		b->rounds, po->encode_threads, (unsigned long long)po->range_elems);
	fprintf(o, "| model bytes | density | memcpy ms | publish ms | publish / memcpy | worst | "
		   "(publish+ACK) / memcpy | CPU ms | CPU / memcpy CPU | wire bytes | "
		   "wire / model |\n");
	fprintf(o, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
	fprintf(o, "| %" PRIu64 " | %.3f%% | %.2f | %.2f | **%.2fx** | %.2fx | %.2fx | %.1f | %.2fx | "
		   "%.0f | **%.4f** |\n",
		b->model_bytes, dens * 100, median(b->memcpy_s, b->rounds) * 1e3,
		median(b->publish_s, b->rounds) * 1e3, median(b->ratio_s, b->rounds),
		max_of(b->ratio_s, b->rounds), median(b->total_ratio, b->rounds),
		median(b->publish_cpu, b->rounds) * 1e3, median(b->cpu_ratio, b->rounds), wire,
		wire / (double)b->model_bytes);
}

/* Replace the text between the markers (or append the section). */
static int write_doc(const char *path, const char *body)
{
	static const char *beg = "<!-- bench-producer:begin -->", *end = "<!-- bench-producer:end -->";
	char *old = NULL, *a, *z;
	size_t len = 0;
	FILE *f = fopen(path, "r");

	if (f) {
		old = calloc(1, 1 << 20);
		len = fread(old, 1, (1 << 20) - 1, f);
		fclose(f);
	}
	if (!(f = fopen(path, "w")))
		return -1;
	a = old ? strstr(old, beg) : NULL;
	z = a ? strstr(a, end) : NULL;
	if (a && z) {
		fwrite(old, 1, (size_t)(a - old), f);
		fprintf(f, "%s\n%s%s", beg, body, z);
	} else {
		if (!old)
			fprintf(f, "# deltacast benchmarks\n");
		else
			fwrite(old, 1, len, f);
		fprintf(f, "\n## Producer: publish time and wire bytes (`make bench-producer`)\n\n"
			   "%s\n%s%s\n", beg, body, end);
	}
	fclose(f);
	free(old);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"trace", 1, 0, 't'}, {"rounds", 1, 0, 'r'},
					     {"doc", 1, 0, 'd'}, {"cmd", 1, 0, 'c'},
					     {"encode-threads", 1, 0, 'e'}, {"range-elems", 1, 0, 'g'},
					     {0, 0, 0, 0}};
	dcast_producer_opts po;
	const char *trace = NULL, *doc = NULL, *cmd = "make bench-producer";
	harness_broker hb = {0};
	dcast_producer *p = NULL;
	bench b = {.rounds = 5};
	char dir[] = "/tmp/dcast-bench-producer-XXXXXX", body[4096];
	int c;

	dcast_producer_opts_init(&po);
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 't') trace = optarg;
		else if (c == 'r') b.rounds = atoi(optarg);
		else if (c == 'd') doc = optarg;
		else if (c == 'c') cmd = optarg;
		else if (c == 'e') po.encode_threads = (uint32_t)atoi(optarg);
		else if (c == 'g') po.range_elems = strtoull(optarg, NULL, 0);
		else return 2;
	}
	if (!trace || b.rounds < 1 || b.rounds > MAX_ROUNDS) {
		fprintf(stderr, "usage: bench_producer --trace DIR [--rounds 1..%d] [--doc FILE]\n",
			MAX_ROUNDS);
		return 2;
	}
	atexit(tp_kill_all);
	getloadavg(&b.load_before, 1);
	if (!mkdtemp(dir) || harness_broker_start(&hb, dir) ||
	    dcast_producer_open(hb.producers, "bench", 0, 1, &po, &p) || setup(&b, trace, p) ||
	    run(&b, p)) {
		fprintf(stderr, "bench_producer: %s\n", dcast_last_error());
		return 1;
	}
	FILE *m = fmemopen(body, sizeof(body), "w");
	table(&b, &po, m, cmd);
	fclose(m);
	fputs(body, stdout);
	dcast_producer_close(&p);
	tp_broker_kill(&hb, SIGTERM);
	check_remove_dir(dir); /* its broker's log: kept only on a failure, above */
	if (doc && write_doc(doc, body))
		return 1;
	return 0;
}
