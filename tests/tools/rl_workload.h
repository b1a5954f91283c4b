/* RL-like bf16 workload for the codec benchmarks (bench_codec,
 * bench_gpu_codec): fp32 master weights ~ N(0, 0.02), Adam-normalised
 * update directions, and one AdamW step whose learning rate is searched so
 * that the bf16 images change at a target density. */
#ifndef DCAST_RL_WORKLOAD_H
#define DCAST_RL_WORKLOAD_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct rng {
	uint64_t s;
} rng;

static inline uint64_t rng_next(rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline double rng_normal(rng *r)
{
	double u1 = ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
	double u2 = (double)(rng_next(r) >> 11) / 9007199254740992.0;
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static inline uint16_t bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The workload: master weights, Adam-normalised update directions (unit
 * scale, heavier tails than a Gaussian) and the weight-decay rate. */
typedef struct workload {
	uint64_t n;
	float *master, *dir;
	uint16_t *base, *cur;
} workload;

static inline void workload_init(workload *w, uint64_t n)
{
	rng r = { 42 };
	w->n = n;
	w->master = malloc(n * 4);
	w->dir = malloc(n * 4);
	w->base = malloc(n * 2);
	w->cur = malloc(n * 2);
	if (!w->master || !w->dir || !w->base || !w->cur) {
		fprintf(stderr, "bench_codec: out of memory\n");
		exit(1);
	}
	for (uint64_t i = 0; i < n; i++) {
		double g = rng_normal(&r);
		w->master[i] = (float)(0.02 * rng_normal(&r));
		w->dir[i] = (float)(g / sqrt(0.5 + 0.5 * g * g)); /* like m / sqrt(v) */
		w->base[i] = bf16(w->master[i]);
	}
}

/* One AdamW step at learning rate lr (weight decay 0.01); returns density. */
static inline double workload_step(workload *w, double lr, uint64_t limit)
{
	uint64_t changed = 0;
	for (uint64_t i = 0; i < limit; i++) {
		float m = w->master[i];
		float nm = (float)(m - lr * (w->dir[i] + 0.01 * m));
		w->cur[i] = bf16(nm);
		changed += w->cur[i] != w->base[i];
	}
	return (double)changed / (double)limit;
}

/* Learning rate for a target density, searched on a prefix. */
static inline double find_lr(workload *w, double density)
{
	double lo = 1e-9, hi = 1e-1;
	uint64_t sample = w->n < (1u << 22) ? w->n : (1u << 22);
	for (int it = 0; it < 40; it++) {
		double mid = sqrt(lo * hi);
		if (workload_step(w, mid, sample) < density)
			lo = mid;
		else
			hi = mid;
	}
	return sqrt(lo * hi);
}

#endif
