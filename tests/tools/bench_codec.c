/* bench_codec: sizes and CPU speed of the delta codec on RL-like bf16
 * updates, for `make bench-codec`.  It makes its own data: fp32 master
 * weights ~ N(0, 0.02), one AdamW-like step whose learning rate is searched
 * so the bf16 images change at the target density, both rounded to bf16.
 * Prints, per density: bits per changed element of every encoding, the
 * entropy bound (per chunk n*H(p) for positions, plus the empirical entropy
 * of the sortable-integer differences of all changed elements), chosen/bound,
 * and encode/apply throughput as ratios to one-thread memcpy of the same
 * bytes timed in the same run; then compact v2 against compact, both
 * forced: sizes, encode and apply (decode included) throughput.  --write
 * FILE puts the tables into FILE between the bench-codec markers, keeping
 * the rest of the file; --reps N times each thing N times (best kept);
 * --simd portable|avx2|avx512 forces that compare variant and the compact
 * v2 builds that go with it (the best the CPU has by default). */
#include <inttypes.h>
#include <stddef.h>
#include <pthread.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "codec_shared.h"
#include "deltacast/codec.h"
#include "rl_workload.h"

static int REPS = 9;

typedef struct result {
	double density, lr;
	uint64_t changed, sizes[DCAST_ENC_COUNT], chosen;
	double bound_bits, enc_ratio, apply_ratio, memcpy_gbps, enc_gbps, apply_gbps, enc_mt_ratio;
	double enc_in_ratio, enc_mt_in_ratio; /* against memcpy of the encoder's input, cur and base */
	double t_memcpy, t_enc, t_enc_hot; /* seconds, best of REPS */
	int exact;
	uint64_t v_bytes[2];          /* compact, compact2 forced: payload bytes */
	double v_enc_gbps[2], v_apply_gbps[2];
} result;

static double h2(double p)
{
	return p <= 0 || p >= 1 ? 0 : -(p * log2(p) + (1 - p) * log2(1 - p));
}

static double bound_bits(const workload *w, uint64_t chunk)
{
	static uint64_t hist[65536];
	double bits = 0, vals = 0;
	uint64_t total = 0;
	memset(hist, 0, sizeof(hist));
	for (uint64_t off = 0; off < w->n; off += chunk) {
		uint64_t n = w->n - off < chunk ? w->n - off : chunk, c = 0;
		for (uint64_t i = off; i < off + n; i++) {
			if (w->cur[i] == w->base[i])
				continue;
			uint16_t sb = w->base[i] & 0x8000 ? (uint16_t)~w->base[i] : w->base[i] | 0x8000;
			uint16_t sc = w->cur[i] & 0x8000 ? (uint16_t)~w->cur[i] : w->cur[i] | 0x8000;
			hist[(uint16_t)(sc - sb)]++;
			c++;
		}
		bits += (double)n * h2((double)c / (double)n);
		total += c;
	}
	for (unsigned v = 0; v < 65536; v++)
		if (hist[v])
			vals -= (double)hist[v] * log2((double)hist[v] / (double)total);
	return bits + vals;
}

/* The copies count as used: the compiler may not drop them. */
static void keep(void *dst)
{
	__asm__ volatile("" : : "r"(dst) : "memory");
}

static double time_memcpy(const workload *w, uint8_t *dst)
{
	double t = now_s();
	memcpy(dst, w->cur, w->n * 2);
	keep(dst);
	return now_s() - t;
}

/* memcpy of what encode reads: cur and base, 2 * n * 2 bytes. */
static double time_memcpy_input(const workload *w, uint8_t *dst)
{
	double t = now_s();
	memcpy(dst, w->cur, w->n * 2);
	memcpy(dst + w->n * 2, w->base, w->n * 2);
	keep(dst);
	return now_s() - t;
}

typedef struct chunks {
	uint64_t chunk, nchunks;
	size_t slot;
	uint8_t *payloads, *hot_out; /* hot_out: time_encode_hot's, one slot */
	dcast_chunk_info *info;
} chunks;

/* Elements in chunk k (the last may be short). */
static uint64_t chunk_elems(const workload *w, const chunks *c, uint64_t k)
{
	uint64_t off = k * c->chunk;
	return w->n - off < c->chunk ? w->n - off : c->chunk;
}

/* Chunk k into out (c->slot bytes) as encoding enc (-1: picked); exits on
 * an error. */
static void encode_as(const workload *w, const chunks *c, uint64_t k, int enc, uint8_t *out, dcast_chunk_info *info)
{
	uint64_t off = k * c->chunk;
	if (dcast_codec_encode(w->cur + off, w->base + off, chunk_elems(w, c, k), 2, enc, 0, out, c->slot, info)) {
		fprintf(stderr, "bench_codec: encode: %s\n", dcast_last_error());
		exit(1);
	}
}

static void encode_into(const workload *w, const chunks *c, uint64_t k, uint8_t *out, dcast_chunk_info *info)
{
	encode_as(w, c, k, -1, out, info);
}

/* Chunk k into its payload slot. */
static void encode_chunk(const workload *w, chunks *c, uint64_t k)
{
	encode_into(w, c, k, c->payloads + k * c->slot, &c->info[k]);
}

/* Every chunk forced to enc, into the payload slots. */
static double time_encode_forced(const workload *w, chunks *c, int enc)
{
	double t = now_s();
	for (uint64_t k = 0; k < c->nchunks; k++)
		encode_as(w, c, k, enc, c->payloads + k * c->slot, &c->info[k]);
	return now_s() - t;
}

static double time_encode(const workload *w, chunks *c)
{
	double t = now_s();
	for (uint64_t k = 0; k < c->nchunks; k++)
		encode_chunk(w, c, k);
	return now_s() - t;
}

/* Compute alone: one chunk, resident in L3 after the first pass, encoded
 * as many times as the model has chunks (the same bytes as time_encode). */
static double time_encode_hot(const workload *w, chunks *c)
{
	dcast_chunk_info info;
	double t = now_s();
	for (uint64_t k = 0; k < c->nchunks; k++)
		encode_into(w, c, c->nchunks / 2, c->hot_out, &info);
	return now_s() - t;
}

/* Chunk-parallel encode as a producer runs it: encoder threads that live
 * for the whole bench (their scratch arrays warm, as a producer's are), the
 * calling thread one of them, each claiming the next chunk until none is
 * left.  Workers sleep in a barrier between runs. */
typedef struct mt_pool {
	const workload *w;
	chunks *c;
	unsigned nthreads;
	_Atomic uint64_t next;
	int stop;
	pthread_barrier_t start, done;
	pthread_t th[16];
} mt_pool;

static void encode_claimed(mt_pool *m)
{
	for (uint64_t k; (k = m->next++) < m->c->nchunks;)
		encode_chunk(m->w, m->c, k);
}

static void *mt_worker(void *arg)
{
	mt_pool *m = arg;
	for (;;) {
		pthread_barrier_wait(&m->start);
		if (m->stop)
			return NULL;
		encode_claimed(m);
		pthread_barrier_wait(&m->done);
	}
}

static double time_encode_mt(mt_pool *m)
{
	double t = now_s();
	m->next = 0;
	pthread_barrier_wait(&m->start);
	encode_claimed(m);
	pthread_barrier_wait(&m->done);
	return now_s() - t;
}

static void mt_start(mt_pool *m, const workload *w, chunks *c, unsigned nthreads)
{
	m->w = w;
	m->c = c;
	m->nthreads = nthreads;
	m->stop = 0;
	pthread_barrier_init(&m->start, NULL, nthreads);
	pthread_barrier_init(&m->done, NULL, nthreads);
	for (unsigned i = 1; i < nthreads; i++)
		if (pthread_create(&m->th[i], NULL, mt_worker, m)) {
			perror("bench_codec: pthread_create");
			exit(1);
		}
}

static void mt_stop(mt_pool *m)
{
	m->stop = 1;
	pthread_barrier_wait(&m->start);
	for (unsigned i = 1; i < m->nthreads; i++)
		pthread_join(m->th[i], NULL);
	pthread_barrier_destroy(&m->start);
	pthread_barrier_destroy(&m->done);
}

static unsigned bench_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 16 ? 16 : (unsigned)n;
}

static double time_apply(const workload *w, const chunks *c, uint16_t *dst, int *exact)
{
	memcpy(dst, w->base, w->n * 2);
	double t = now_s();
	for (uint64_t k = 0; k < c->nchunks; k++)
		if (dcast_codec_apply(&c->info[k], c->payloads + k * c->slot, dst + k * c->chunk, NULL)) {
			fprintf(stderr, "bench_codec: apply: %s\n", dcast_last_error());
			exit(1);
		}
	t = now_s() - t;
	*exact = memcmp(dst, w->cur, w->n * 2) == 0;
	return t;
}

static void keep_min(double *best, double t)
{
	*best = t < *best ? t : *best;
}

/* Compact and compact v2, each forced, interleaved, best of V_REPS times
 * REPS (a ratio of two bests: more runs, so that a burst of load on a
 * shared host spoils neither side's best): bytes, encode and apply
 * (decode included) GB/s of the NEW bytes. */
#define V_REPS 3
static void run_v1_v2(const workload *w, chunks *c, uint16_t *scratch, result *res)
{
	static const int enc[2] = { DCAST_ENC_COMPACT, DCAST_ENC_COMPACT2 };
	double te[2] = { 1e30, 1e30 }, ta[2] = { 1e30, 1e30 }, bytes = (double)w->n * 2;
	for (int r = 0; r < V_REPS * REPS; r++)
		for (int v = 0; v < 2; v++) {
			int exact;
			keep_min(&te[v], time_encode_forced(w, c, enc[v]));
			keep_min(&ta[v], time_apply(w, c, scratch, &exact));
			res->exact &= exact;
		}
	for (int v = 0; v < 2; v++) {
		time_encode_forced(w, c, enc[v]);
		res->v_bytes[v] = 0;
		for (uint64_t k = 0; k < c->nchunks; k++)
			res->v_bytes[v] += c->info[k].payload_bytes;
		res->v_enc_gbps[v] = bytes / te[v] / 1e9;
		res->v_apply_gbps[v] = bytes / ta[v] / 1e9;
	}
}

static void sizes_of(const workload *w, const chunks *c, result *res)
{
	memset(res->sizes, 0, sizeof(res->sizes));
	res->changed = res->chosen = 0;
	for (uint64_t k = 0; k < c->nchunks; k++) {
		uint64_t off = k * c->chunk, s[DCAST_ENC_COUNT], ch;
		dcast_codec_sizes(w->cur + off, w->base + off, chunk_elems(w, c, k), 2, s, &ch);
		for (int e = 0; e < DCAST_ENC_COUNT; e++)
			res->sizes[e] += s[e];
		res->changed += ch;
		res->chosen += c->info[k].payload_bytes;
	}
}

static void run_density(workload *w, chunks *c, mt_pool *mt, double density, uint16_t *scratch,
			uint8_t *scratch_in, result *res)
{
	double bytes = (double)w->n * 2;
	res->density = density;
	res->lr = find_lr(w, density);
	workload_step(w, res->lr, w->n);
	double tm = 1e30, tmi = 1e30, te = 1e30, teh = 1e30, tmt = 1e30, ta = 1e30;
	res->exact = 1;
	for (int r = 0; r < REPS; r++) { /* interleaved: each sees the same machine load */
		int exact;
		keep_min(&tm, time_memcpy(w, (uint8_t *)scratch));
		keep_min(&tmi, time_memcpy_input(w, scratch_in));
		keep_min(&te, time_encode(w, c));
		keep_min(&tmt, time_encode_mt(mt));
		keep_min(&teh, time_encode_hot(w, c));
		keep_min(&ta, time_apply(w, c, scratch, &exact));
		res->exact &= exact;
	}
	sizes_of(w, c, res);
	run_v1_v2(w, c, scratch, res);
	res->bound_bits = bound_bits(w, c->chunk);
	res->memcpy_gbps = bytes / tm / 1e9;
	res->enc_gbps = bytes / te / 1e9;
	res->apply_gbps = bytes / ta / 1e9;
	res->enc_ratio = tm / te;
	res->enc_mt_ratio = tm / tmt;
	res->enc_in_ratio = tmi / te;
	res->enc_mt_in_ratio = tmi / tmt;
	res->t_memcpy = tm;
	res->t_enc = te;
	res->t_enc_hot = teh;
	res->apply_ratio = tm / ta;
}

static void print_v2_table(FILE *f, const result *r, int nr)
{
	fprintf(f, "\nCompact v2 (id 4: blocks of 4096 changes a warp decodes) against compact (id 3), each forced "
		   "on every chunk, one thread, interleaved, best of %d runs of each:\n\n", V_REPS * REPS);
	fprintf(f, "| density | compact bits | compact v2 bits | v2/v1 size | compact encode GB/s | v2 encode GB/s "
		   "| v2/v1 encode | compact apply GB/s | v2 apply GB/s | v2/v1 apply |\n");
	fprintf(f, "|---|---|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < nr; i++) {
		double ch = r[i].changed ? (double)r[i].changed : 1;
		fprintf(f, "| %.1f%% | %.2f | %.2f | %.4f | %.2f | %.2f | %.2fx | %.2f | %.2f | %.2fx |\n",
			100 * r[i].density, 8.0 * (double)r[i].v_bytes[0] / ch, 8.0 * (double)r[i].v_bytes[1] / ch,
			(double)r[i].v_bytes[1] / (double)(r[i].v_bytes[0] ? r[i].v_bytes[0] : 1), r[i].v_enc_gbps[0],
			r[i].v_enc_gbps[1], r[i].v_enc_gbps[1] / r[i].v_enc_gbps[0], r[i].v_apply_gbps[0],
			r[i].v_apply_gbps[1], r[i].v_apply_gbps[1] / r[i].v_apply_gbps[0]);
	}
}

static void print_table(FILE *f, const result *r, int nr, uint64_t n, uint64_t chunk)
{
	fprintf(f, "RL-like bf16, %" PRIu64 " elements in chunks of %" PRIu64 ".\n\n",
		n, chunk);
	fprintf(f, "| density | lr | changed |");
	for (int e = 0; e < DCAST_ENC_COUNT; e++)
		fprintf(f, " %s |", dcast_encoding_name(e));
	fprintf(f, " chosen | bound | chosen/bound "
		   "| encode GB/s | apply GB/s | memcpy GB/s | encode/memcpy | encode/memcpy of input | apply/memcpy | encode %u thr/memcpy | exact |\n",
		bench_threads());
	fprintf(f, "|---|---|---|");
	for (int e = 0; e < DCAST_ENC_COUNT; e++)
		fprintf(f, "---|");
	fprintf(f, "---|---|---|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < nr; i++) {
		double ch = r[i].changed ? (double)r[i].changed : 1;
		fprintf(f, "| %.1f%% | %.2g | %" PRIu64 " |", 100 * r[i].density, r[i].lr, r[i].changed);
		for (int e = 0; e < DCAST_ENC_COUNT; e++)
			fprintf(f, " %.2f |", 8.0 * (double)r[i].sizes[e] / ch);
		fprintf(f, " %.2f | %.2f | %.3f | %.2f | %.2f | %.2f | %.2fx | %.2fx | %.2fx | %.2fx | %s |\n",
			8.0 * (double)r[i].chosen / ch, r[i].bound_bits / ch,
			8.0 * (double)r[i].chosen / r[i].bound_bits, r[i].enc_gbps, r[i].apply_gbps,
			r[i].memcpy_gbps, r[i].enc_ratio, r[i].enc_in_ratio, r[i].apply_ratio, r[i].enc_mt_ratio,
			r[i].exact ? "yes" : "NO");
	}
}

/* The lowest of the ratios picked by `off` (a double in result) over the
 * densities up to 5%. */
static double worst_upto5(const result *r, int nr, size_t off)
{
	double worst = 1e30;
	for (int i = 0; i < nr; i++) {
		double v = *(const double *)((const char *)&r[i] + off);
		if (r[i].density <= 0.05 && v < worst)
			worst = v;
	}
	return worst;
}

static void target_row(FILE *f, const char *what, double v, const char *unit, double goal, int atmost)
{
	int ok = atmost ? v <= goal : v >= goal;
	fprintf(f, "| %s | %.2f%s | %s %.2f%s | %s |\n", what, v, unit, atmost ? "at most" : "at least",
		goal, unit, ok ? "met" : "**not met**");
}

/* The codec's CPU targets against this run: sizes at the density nearest 1%,
 * and encode over memcpy at every density up to 5% (the lowest shown). */
static void print_targets(FILE *f, const result *r, int nr)
{
	int one = 0;
	for (int i = 1; i < nr; i++)
		one = fabs(r[i].density - 0.01) < fabs(r[one].density - 0.01) ? i : one;
	double ch = r[one].changed ? (double)r[one].changed : 1;
	fprintf(f, "\nTargets, this run; encode rows give the lowest ratio over the densities up to 5%%:\n\n");
	fprintf(f, "| target | measured | goal | |\n|---|---|---|---|\n");
	target_row(f, "bits per changed element, ~1%", 8.0 * (double)r[one].chosen / ch, "", 12, 1);
	target_row(f, "chosen / entropy bound, ~1%", 8.0 * (double)r[one].chosen / r[one].bound_bits, "", 1.15, 1);
	char mt[96];
	snprintf(mt, sizeof(mt), "encode, %u threads / memcpy of input (NEW+BASE)", bench_threads());
	target_row(f, "encode, 1 thread / memcpy of input (NEW+BASE)",
		   worst_upto5(r, nr, offsetof(result, enc_in_ratio)), "x", 1.0, 0);
	target_row(f, mt, worst_upto5(r, nr, offsetof(result, enc_mt_in_ratio)), "x", 1.0, 0);
	target_row(f, "encode, 1 thread / memcpy of NEW alone (stricter reading)",
		   worst_upto5(r, nr, offsetof(result, enc_ratio)), "x", 1.0, 0);
}

/* Where encode's time goes: with the data in DRAM (as above) and with one
 * chunk resident in L3, which leaves the compute alone. */
static void print_cost_table(FILE *f, const result *r, int nr, uint64_t n)
{
	fprintf(f, "\nEncode's memory and compute (one thread, %" PRIu64 " elements; *in L3*: one chunk encoded "
		   "as often as the model has chunks):\n\n", n);
	fprintf(f, "| density | memcpy ms | encode ms | encode ms, in L3 | in L3 ns per changed element |\n");
	fprintf(f, "|---|---|---|---|---|\n");
	for (int i = 0; i < nr; i++)
		fprintf(f, "| %.1f%% | %.2f | %.2f | %.2f | %.2f |\n", 100 * r[i].density, 1e3 * r[i].t_memcpy,
			1e3 * r[i].t_enc, 1e3 * r[i].t_enc_hot,
			r[i].changed ? 1e9 * r[i].t_enc_hot / (double)r[i].changed : 0.0);
}

/* Replace the text between the markers in `path` (appending them if absent). */
static int write_section(const char *path, const char *body)
{
	static const char *begin = "<!-- bench-codec:begin -->", *end = "<!-- bench-codec:end -->";
	char *old = NULL;
	size_t len = 0;
	FILE *f = fopen(path, "r");
	if (f) {
		fseek(f, 0, SEEK_END);
		len = (size_t)ftell(f);
		fseek(f, 0, SEEK_SET);
		old = calloc(1, len + 1);
		if (!old || fread(old, 1, len, f) != len)
			len = 0;
		fclose(f);
	}
	const char *b = old ? strstr(old, begin) : NULL, *e = b ? strstr(b, end) : NULL;
	f = fopen(path, "w");
	if (!f)
		return -1;
	if (b && e) {
		fwrite(old, 1, (size_t)(b - old), f);
		fprintf(f, "%s\n%s%s", begin, body, e);
	} else {
		fprintf(f, "%s", old && len ? old : "# Benchmarks\n");
		fprintf(f, "\n## Delta codec (CPU)\n\n%s\n%s%s\n", begin, body, end);
	}
	free(old);
	return fclose(f);
}

/* The compare variant named s (DCAST_SIMD_*), 0 for none. */
static int simd_of(const char *s)
{
	static const char *names[] = { "portable", "avx2", "avx512" };
	for (int i = 0; i < 3; i++)
		if (!strcmp(s, names[i]))
			return DCAST_SIMD_PORTABLE + i;
	return 0;
}

/* Forces the variant, or exits when this CPU lacks it. */
static void force_simd(int simd)
{
	if (dcast_simd_force(simd) != simd) {
		fprintf(stderr, "bench_codec: --simd: this CPU lacks that variant\n");
		exit(2);
	}
}

int main(int argc, char **argv)
{
	static const double dens[] = { 0.001, 0.01, 0.05, 0.30 };
	uint64_t n = 1u << 25, chunk = 1u << 20;
	const char *out = NULL, *simd = NULL;
	double only = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--elems") && i + 1 < argc)
			n = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
			chunk = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--write") && i + 1 < argc)
			out = argv[++i];
		else if (!strcmp(argv[i], "--density") && i + 1 < argc)
			only = strtod(argv[++i], NULL);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc && atoi(argv[i + 1]) > 0)
			REPS = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--simd") && i + 1 < argc && simd_of(argv[i + 1]))
			force_simd(simd_of(simd = argv[++i]));
		else {
			fprintf(stderr, "usage: bench_codec [--elems N] [--chunk N] [--density P] [--reps N] "
					"[--simd portable|avx2|avx512] [--write FILE]\n");
			return 2;
		}
	}
	workload w;
	workload_init(&w, n);
	chunks c = { chunk, (n + chunk - 1) / chunk, dcast_codec_bound(chunk, 2), NULL, NULL, NULL };
	c.payloads = malloc(c.nchunks * c.slot);
	c.hot_out = malloc(c.slot);
	c.info = calloc(c.nchunks, sizeof(*c.info));
	uint16_t *scratch = malloc(n * 2);
	uint8_t *scratch_in = malloc(n * 4);
	result res[4];
	int nr = only > 0 ? 1 : 4;
	if (!c.payloads || !c.hot_out || !c.info || !scratch || !scratch_in)
		return 1;
	static mt_pool mt;
	mt_start(&mt, &w, &c, bench_threads());
	for (int i = 0; i < nr; i++)
		run_density(&w, &c, &mt, only > 0 ? only : dens[i], scratch, scratch_in, &res[i]);
	mt_stop(&mt);
	char *body = NULL;
	size_t blen = 0;
	FILE *mem = open_memstream(&body, &blen);
	double load[1] = { 0 };
	getloadavg(load, 1);
	fprintf(mem, "Command: `make bench-codec%s` (build/tools/bench_codec --elems %" PRIu64 " --chunk %" PRIu64
		     " --reps %d%s%s); %ld CPUs, load average %.1f at the end (a shared machine: timings are noisy), best of %d runs of each, interleaved.\n\n"
		     "Bits per changed element; *bound*: n*H(p) per chunk for the positions plus the empirical "
		     "entropy of the sortable-integer differences.  GB/s of the NEW bytes, one thread unless *N thr* "
		     "(encoder threads claiming chunks, as a producer's); *memcpy*: one thread copying the NEW bytes, "
		     "*memcpy of input*: NEW and BASE, what encode reads.\n\n",
		n == 1u << 25 && REPS == 9 ? "" : " BENCH_CODEC_QUICK=1", n, chunk, REPS, simd ? " --simd " : "",
		simd ? simd : "", sysconf(_SC_NPROCESSORS_ONLN),
		load[0], REPS);
	print_table(mem, res, nr, n, chunk);
	print_targets(mem, res, nr);
	print_cost_table(mem, res, nr, n);
	print_v2_table(mem, res, nr);
	fclose(mem);
	fputs(body, stdout);
	if (out && write_section(out, body)) {
		perror(out);
		return 1;
	}
	for (int i = 0; i < nr; i++)
		if (!res[i].exact)
			return 1;
	return 0;
}
