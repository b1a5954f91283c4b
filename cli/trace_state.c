/* gen-trace training simulation: fp32 master weights, AdamW moments and the
 * bf16 copy, updated with counter-based (splitmix64) pseudo-random
 * gradients so that any element's gradient at any step can be recomputed,
 * by any thread or by the learning-rate calibration, identically.  The
 * gradient of an element is a persistent part plus fresh noise each step;
 * the bf16 copy is rounded to nearest even from the fp32 bit pattern, so
 * which elements change, and by how many ulps, comes out of the arithmetic. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trace.h"

#define BETA1 0.9f
#define BETA2 0.999f
#define ADAM_EPS 1e-8f
#define WEIGHT_DECAY 0.01f
#define PERSISTENT_GRAD 0.5f      /* share of the gradient that repeats each step */
#define SAMPLE_ELEMS (1u << 20)   /* elements the lr calibration looks at */
#define MAX_THREADS 64

static inline uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Approximately standard normal: Irwin-Hall sum of four 16-bit uniforms. */
static inline float normal_of(uint64_t h)
{
	uint32_t s = (uint32_t)(h & 0xffff) + (uint32_t)(h >> 16 & 0xffff) +
		     (uint32_t)(h >> 32 & 0xffff) + (uint32_t)(h >> 48);
	return ((float)s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

static inline uint16_t bf16_rne(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7fffu + (u >> 16 & 1u);
	return (uint16_t)(u >> 16);
}

/* Per-step constants of the AdamW update. */
typedef struct adam_step {
	uint64_t noise_key, persistent_key;
	float c1, c2; /* bias corrections 1/(1-beta^t) */
} adam_step;

static adam_step adam_constants(const trace_state *s, unsigned t)
{
	adam_step a;
	a.noise_key = mix64(s->seed ^ mix64(t));
	a.persistent_key = mix64(s->seed ^ 0x7065727369737400ull);
	a.c1 = (float)(1.0 / (1.0 - pow(BETA1, t)));
	a.c2 = (float)(1.0 / (1.0 - pow(BETA2, t)));
	return a;
}

/* New moments of element i and its update direction (before lr). */
static inline float adam_direction(const trace_state *s, const adam_step *a, uint64_t i,
				   float *m_out, float *v_out)
{
	float g = PERSISTENT_GRAD * normal_of(mix64(a->persistent_key + i)) +
		  normal_of(mix64(a->noise_key + i));
	float m = BETA1 * s->m[i] + (1.0f - BETA1) * g;
	float v = BETA2 * s->v[i] + (1.0f - BETA2) * g * g;
	*m_out = m;
	*v_out = v;
	return m * a->c1 / (sqrtf(v * a->c2) + ADAM_EPS) + WEIGHT_DECAY * s->w[i];
}

/* ---- running a range function on the worker threads ---- */

typedef uint64_t (*range_fn)(trace_state *s, const void *arg, uint64_t lo, uint64_t hi);

typedef struct range_job {
	trace_state *s;
	const void *arg;
	range_fn fn;
	uint64_t lo, hi, result;
} range_job;

static void *range_thread(void *p)
{
	range_job *j = p;
	j->result = j->fn(j->s, j->arg, j->lo, j->hi);
	return NULL;
}

/* Split [0, total) over the threads; returns the sum of the results. */
static uint64_t run_parallel(trace_state *s, range_fn fn, const void *arg)
{
	range_job jobs[MAX_THREADS] = {0};
	pthread_t tid[MAX_THREADS];
	unsigned n = s->threads, started = 0;
	uint64_t total = s->model->total, sum = 0;
	for (unsigned t = 0; t < n; t++)
		jobs[t] = (range_job){s, arg, fn, total * t / n, total * (t + 1) / n, 0};
	for (unsigned t = 1; t < n; t++, started++)
		if (pthread_create(&tid[t], NULL, range_thread, &jobs[t]) != 0)
			break;
	for (unsigned t = started + 1; t < n; t++) /* threads that did not start */
		range_thread(&jobs[t]);
	range_thread(&jobs[0]);
	for (unsigned t = 1; t <= started; t++)
		pthread_join(tid[t], NULL);
	for (unsigned t = 0; t < n; t++)
		sum += jobs[t].result;
	return sum;
}

/* ---- initialisation ---- */

static void init_tensor_part(trace_state *s, const trace_tensor *t, uint64_t lo, uint64_t hi)
{
	uint64_t key = mix64(s->seed ^ 0x696e697400000000ull);
	for (uint64_t i = lo; i < hi; i++) {
		float w = t->init_mean + t->init_std * normal_of(mix64(key + i));
		s->w[i] = w;
		s->m[i] = 0.0f;
		s->v[i] = 0.0f;
		s->bf[i] = bf16_rne(w);
	}
}

static uint64_t init_range(trace_state *s, const void *arg, uint64_t lo, uint64_t hi)
{
	(void)arg;
	for (size_t k = 0; k < s->model->count; k++) {
		const trace_tensor *t = &s->model->tensors[k];
		uint64_t a = t->offset > lo ? t->offset : lo;
		uint64_t b = t->offset + t->count < hi ? t->offset + t->count : hi;
		if (a < b)
			init_tensor_part(s, t, a, b);
	}
	return 0;
}

int trace_state_init(trace_state *s, const trace_model *m, uint64_t seed, unsigned threads)
{
	memset(s, 0, sizeof(*s));
	s->model = m;
	s->seed = seed;
	s->threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
	size_t n = (size_t)m->total;
	s->w = malloc(n * sizeof(float));
	s->m = malloc(n * sizeof(float));
	s->v = malloc(n * sizeof(float));
	s->bf = malloc(n * sizeof(uint16_t));
	if (!s->w || !s->m || !s->v || !s->bf) {
		trace_state_free(s);
		return cli_fail(DCAST_ENOMEM, "out of memory for %zu parameters (14 bytes each)", n);
	}
	run_parallel(s, init_range, NULL);
	return 0;
}

void trace_state_free(trace_state *s)
{
	free(s->w);
	free(s->m);
	free(s->v);
	free(s->bf);
	s->w = s->m = s->v = NULL;
	s->bf = NULL;
}

/* ---- one step ---- */

typedef struct step_arg {
	adam_step a;
	float lr;
} step_arg;

static uint64_t step_range(trace_state *s, const void *arg, uint64_t lo, uint64_t hi)
{
	const step_arg *p = arg;
	uint64_t changed = 0;
	for (uint64_t i = lo; i < hi; i++) {
		float m, v;
		float u = adam_direction(s, &p->a, i, &m, &v);
		float w = s->w[i] - p->lr * u;
		uint16_t b = bf16_rne(w);
		changed += b != s->bf[i];
		s->m[i] = m;
		s->v[i] = v;
		s->w[i] = w;
		s->bf[i] = b;
	}
	return changed;
}

uint64_t trace_step(trace_state *s, double lr)
{
	step_arg p = {adam_constants(s, s->step + 1), (float)lr};
	uint64_t changed = run_parallel(s, step_range, &p);
	s->step++;
	return changed;
}

/* ---- learning-rate calibration ---- */

typedef struct lr_sample {
	size_t n;
	float *w, *u;
	uint16_t *bf;
} lr_sample;

static uint64_t sample_changed(const lr_sample *k, float lr)
{
	uint64_t changed = 0;
	for (size_t j = 0; j < k->n; j++)
		changed += bf16_rne(k->w[j] - lr * k->u[j]) != k->bf[j];
	return changed;
}

static void sample_fill(const trace_state *s, lr_sample *k)
{
	adam_step a = adam_constants(s, s->step + 1);
	uint64_t key = mix64(s->seed ^ 0x73616d706c650000ull ^ s->step);
	for (size_t j = 0; j < k->n; j++) {
		uint64_t i = mix64(key + j) % s->model->total;
		float m, v;
		k->u[j] = adam_direction(s, &a, i, &m, &v);
		k->w[j] = s->w[i];
		k->bf[j] = s->bf[i];
	}
}

/* Geometric bisection of lr in [1e-12, 1] on the sample's changed fraction. */
static double bisect_lr(const lr_sample *k, double density)
{
	double lo = 1e-12, hi = 1.0;
	uint64_t want = (uint64_t)llround(density * (double)k->n);
	for (int it = 0; it < 60; it++) {
		double mid = sqrt(lo * hi);
		if (sample_changed(k, (float)mid) < want)
			lo = mid;
		else
			hi = mid;
	}
	return sqrt(lo * hi);
}

double trace_calibrate_lr(const trace_state *s, double density)
{
	lr_sample k;
	k.n = s->model->total < SAMPLE_ELEMS ? (size_t)s->model->total : SAMPLE_ELEMS;
	k.w = malloc(k.n * sizeof(float));
	k.u = malloc(k.n * sizeof(float));
	k.bf = malloc(k.n * sizeof(uint16_t));
	double lr = 1e-6; /* a typical RL learning rate if memory is short */
	if (k.w && k.u && k.bf) {
		sample_fill(s, &k);
		lr = bisect_lr(&k, density);
	}
	free(k.w);
	free(k.u);
	free(k.bf);
	return lr;
}
