/* Shared by the consumer tests and bench: the real broker binary started
 * by tests/proc.h (on ports it picks and names), a small model a producer
 * publishes, and a poll/apply driver.  Every child dies with the test
 * (PR_SET_PDEATHSIG) and is killed at exit. */
#ifndef DCAST_CONSUMER_HARNESS_H
#define DCAST_CONSUMER_HARNESS_H

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "proc.h"
#include "deltacast/producer.h"
#include "deltacast/consumer.h"
#include "deltacast/safetensors.h"

#pragma GCC diagnostic ignored "-Wunused-function"

typedef tp_broker h_broker;

/* The version in dir/model.safetensors (its deltacast.version), or 0 when
 * there is none. */
/* Does dir hold the record file of version v? */
static int h_rec_exists(const char *dir, uint64_t v)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/model.dlog/%020" PRIu64 ".rec", dir, v);
	return access(path, F_OK) == 0;
}

/* XOR the byte at off (fseek's whence) of the file at path with mask;
 * returns the byte it held. */
static int h_flip_byte(const char *path, long off, int whence, int mask)
{
	FILE *f = fopen(path, "r+b");
	int ch;

	REQUIRE(f);
	REQUIRE(fseek(f, off, whence) == 0 && (ch = fgetc(f)) != EOF);
	REQUIRE(fseek(f, off, whence) == 0 && fputc(ch ^ mask, f) != EOF);
	REQUIRE(fclose(f) == 0);
	return ch;
}

static uint64_t h_file_version(const char *dir)
{
	char path[512];
	dcast_st_file *f = NULL;
	uint64_t v = 0;

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	if (dcast_st_open(path, &f) == 0) {
		const char *s = dcast_st_metadata_get(f, "deltacast.version");
		v = s ? strtoull(s, NULL, 10) : 0;
	}
	dcast_st_close(&f);
	return v;
}

/* Start the broker with extra flags (NULL-terminated, may be NULL); 0 once it
 * has bound its ports (tests/proc.h), -1 if it would not start.  Its log is
 * a file of its own, shown by h_broker_stop when the test has failed. */
static int h_broker_start_args(h_broker *b, char *const *extra)
{
	static int started;

	memset(b, 0, sizeof(*b));
	snprintf(b->log, sizeof(b->log), "%s/dcast-broker-%d-%d.log",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), started++);
	for (int i = 0; extra && extra[i] && b->n_extra < TP_MAX_ARGS; i++)
		b->extra[b->n_extra++] = extra[i];
	return tp_broker_start(b);
}

static int h_broker_start(h_broker *b)
{
	return h_broker_start_args(b, NULL);
}

/* SIGKILL the broker; its log goes to stderr when a CHECK has failed, then is removed. */
static void h_broker_stop(h_broker *b)
{
	char cmd[600];

	tp_broker_kill(b, SIGKILL);
	if (check_failures) {
		snprintf(cmd, sizeof(cmd), "tail -n 40 '%s' >&2", b->log);
		if (system(cmd) != 0)
			fprintf(stderr, "broker log %s unreadable\n", b->log);
	}
	unlink(b->log);
}

/* ---- a small model: bf16 and f32 tensors, ~1.3 MB ---- */
#define H_TENSORS 3
typedef struct h_model {
	const char *name[H_TENSORS];
	int dtype[H_TENSORS];
	uint32_t ndim[H_TENSORS];
	uint64_t shape[H_TENSORS][2];
	uint64_t bytes[H_TENSORS];
	unsigned char *cur[H_TENSORS];
	unsigned char *snap[32][H_TENSORS]; /* contents at version v (1..31) */
	uint64_t rng;
} h_model;

static uint64_t h_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void h_model_init(h_model *m, uint64_t seed, uint64_t scale)
{
	static const char *names[H_TENSORS] = {"layers.0.w", "layers.0.f32", "head.b"};
	memset(m, 0, sizeof(*m));
	m->rng = seed | 1;
	for (int t = 0; t < H_TENSORS; t++) {
		m->name[t] = names[t];
		m->dtype[t] = t == 1 ? DCAST_DTYPE_F32 : DCAST_DTYPE_BF16;
		m->ndim[t] = 2;
		m->shape[t][0] = t == 2 ? 1 : 256 * scale;
		m->shape[t][1] = t == 0 ? 1024 : t == 1 ? 800 : 1000;
		m->bytes[t] = m->shape[t][0] * m->shape[t][1] * (t == 1 ? 4 : 2);
		m->cur[t] = malloc(m->bytes[t]);
		for (uint64_t i = 0; i < m->bytes[t]; i++)
			m->cur[t][i] = (unsigned char)h_rand(&m->rng);
	}
}

static uint64_t h_model_bytes(const h_model *m)
{
	uint64_t n = 0;
	for (int t = 0; t < H_TENSORS; t++)
		n += m->bytes[t];
	return n;
}

/* Change about 1/density_inv of the elements (low bits: an optimizer step). */
static void h_model_step(h_model *m, unsigned density_inv)
{
	for (int t = 0; t < H_TENSORS; t++) {
		unsigned es = t == 1 ? 4 : 2;
		uint64_t n = m->bytes[t] / es, k = n / density_inv + 1;
		for (uint64_t j = 0; j < k; j++)
			m->cur[t][(h_rand(&m->rng) % n) * es] ^= (unsigned char)(1 + h_rand(&m->rng) % 7);
	}
}

static void h_model_snap(h_model *m, uint64_t v)
{
	for (int t = 0; t < H_TENSORS; t++) {
		m->snap[v][t] = malloc(m->bytes[t]);
		memcpy(m->snap[v][t], m->cur[t], m->bytes[t]);
	}
}

static uint64_t h_range_elems = 32768; /* producer chunk size */

static void h_model_free(h_model *m)
{
	for (int t = 0; t < H_TENSORS; t++) {
		free(m->cur[t]);
		for (int v = 0; v < 32; v++)
			free(m->snap[v][t]);
	}
	memset(m, 0, sizeof(*m));
}

static int h_producer_open(const h_broker *b, const char *model_name, h_model *m, dcast_producer **p)
{
	dcast_producer_opts o;
	int err;

	dcast_producer_opts_init(&o);
	o.range_elems = h_range_elems;
	if ((err = dcast_producer_open(b->producers, model_name, 0, 1, &o, p)))
		return err;
	for (int t = 0; t < H_TENSORS && !err; t++)
		err = dcast_producer_register(*p, m->name[t], m->dtype[t], m->ndim[t], m->shape[t], m->cur[t],
					      DCAST_MEM_HOST, 0,
					      m->bytes[t] / (dcast_dtype_size(m->dtype[t]) * dcast_dtype_lanes(m->dtype[t])));
	return err;
}

/* Publish version v (after a step for v > 1), wait for its ACK, snapshot. */
static int h_publish(dcast_producer *p, h_model *m, uint64_t v, unsigned density_inv)
{
	int err;

	if (v > 1)
		h_model_step(m, density_inv);
	h_model_snap(m, v);
	if ((err = dcast_producer_publish(p, v)))
		return err;
	return dcast_producer_wait(p, v, 20000);
}

/* A model (seed, h_model_init's scale), its producer on `name`, and
 * versions 1..versions published at 1/density_inv density.  0 or the
 * first error. */
static int h_model_start_sized(const h_broker *b, const char *name, uint64_t seed, uint64_t scale,
			       uint64_t versions, unsigned density_inv, h_model *m, dcast_producer **p)
{
	int err;

	h_model_init(m, seed, scale);
	if ((err = h_producer_open(b, name, m, p)))
		return err;
	for (uint64_t v = 1; v <= versions && !err; v++)
		err = h_publish(*p, m, v, density_inv);
	return err;
}

/* The same at scale 1. */
static int h_model_start(const h_broker *b, const char *name, uint64_t seed, uint64_t versions,
			 unsigned density_inv, h_model *m, dcast_producer **p)
{
	return h_model_start_sized(b, name, seed, 1, versions, density_inv, m, p);
}

/* Do the consumer's tensors equal the snapshot of version v?  (0 for
 * tensors in CUDA memory: not comparable here.) */
static int h_equal(dcast_consumer *c, const h_model *m, uint64_t v)
{
	for (int t = 0; t < H_TENSORS; t++) {
		void *ptr;
		dcast_mem mem = DCAST_MEM_HOST;
		if (!m->snap[v][t] || dcast_consumer_tensor(c, m->name[t], &ptr, NULL, &mem) || mem != DCAST_MEM_HOST ||
		    memcmp(ptr, m->snap[v][t], m->bytes[t]))
			return 0;
	}
	return 1;
}

/* A thread blocked in wait_version(version) (30 s at most); rc its result. */
typedef struct h_waiter {
	dcast_consumer *c;
	uint64_t version;
	int rc;
} h_waiter;

static void *h_wait_thread(void *arg)
{
	h_waiter *w = arg;

	w->rc = dcast_consumer_wait_version(w->c, w->version, 30000);
	return NULL;
}

/* What the driver saw on the way. */
typedef struct h_seen {
	int gaps, errors, anchors, apply_failures;
	int last_error, last_apply_error;
	int untouched_ok, untouched_bad; /* tensors checked at each refusal */
} h_seen;

static void h_count(h_seen *s, const dcast_event *ev)
{
	if (ev->type == DCAST_EV_GAP)
		s->gaps++;
	if (ev->type == DCAST_EV_ANCHOR)
		s->anchors++;
	if (ev->type == DCAST_EV_ERROR)
		s->errors++, s->last_error = ev->code;
}

/* The consumer's thread runs ahead of the driver: count the events it
 * queued before the target was reached. */
static void h_drain(dcast_consumer *c, h_seen *s)
{
	dcast_event ev;

	while (dcast_consumer_poll(c, 0, &ev) == 0 && ev.type != DCAST_EV_NONE)
		h_count(s, &ev);
}

/* Poll and apply every READY version until the consumer holds `target`
 * (bounded: about 40 s).  At every refusal, check that the tensors still
 * equal the applied version's snapshot. */
static int h_drive(dcast_consumer *c, const h_model *m, uint64_t target, h_seen *s)
{
	dcast_event ev;

	for (int i = 0; i < 400; i++) {
		uint64_t have = dcast_consumer_version(c);
		if (have != DCAST_VERSION_NONE && have >= target) {
			h_drain(c, s);
			return 0;
		}
		if (dcast_consumer_poll(c, 100, &ev))
			return -1;
		h_count(s, &ev);
		if (ev.type == DCAST_EV_VERSION_READY && dcast_consumer_ready_version(c) != DCAST_VERSION_NONE) {
			int err = dcast_consumer_apply(c, dcast_consumer_ready_version(c));
			if (err)
				s->apply_failures++, s->last_apply_error = err;
			if (!err)
				continue;
		}
		if (ev.type == DCAST_EV_ERROR || ev.type == DCAST_EV_VERSION_READY) {
			have = dcast_consumer_version(c);
			if (have != DCAST_VERSION_NONE)
				h_equal(c, m, have) ? s->untouched_ok++ : s->untouched_bad++;
		}
	}
	return -1;
}

#endif
