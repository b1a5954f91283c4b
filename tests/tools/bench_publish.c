/* bench_publish: how long publish() of a host anchor keeps the trainer,
 * against one memcpy of the same bytes in the same run, through a real
 * broker on loopback: MB MiB of bf16 in 8 tensors.  Three anchors: a
 * producer's first publish (which maps its baseline: fresh pages the kernel
 * zeroes), a second producer's first publish after dcast_producer_prepare()
 * (as a trainer calls it at start-up; its time printed apart), and one
 * after the broker was killed and started again empty (the baseline's
 * pages already there; the publish re-joins first).  Each
 * memcpy copies the tensors into a buffer already written once, best of 3,
 * just before its publish; the first publish is also set against one
 * memcpy into a fresh mapping (its pages zeroed by the kernel as the copy
 * touches them, as the baseline's are).  Prints `publish_over_memcpy R`
 * for each, the anchor's bytes the broker had taken when publish()
 * returned, and the time to the broker's ACK (dcast_producer_flush()).
 *
 * usage: bench_publish [--mb N] (default 256) */
#include <getopt.h>
#include <sys/mman.h>
#include "dcast_common.h"
#include "deltacast/producer.h"
#include "../producer_harness.h"

#define N_TENSORS 8

static double now_ms(void)
{
	return (double)dcast_now_ns() * 1e-6;
}

static double time_memcpy(unsigned char *dst, uint16_t *const *w, uint64_t elems)
{
	double best = 1e12;

	for (int r = 0; r < 3; r++) {
		double t0 = now_ms();

		for (int i = 0; i < N_TENSORS; i++)
			memcpy(dst + (size_t)i * elems * 2, w[i], elems * 2);
		best = now_ms() - t0 < best ? now_ms() - t0 : best;
	}
	return best;
}

/* One memcpy of the tensors into fresh pages (huge pages where the kernel
 * has them, as the baseline asks for). */
static double time_fresh_memcpy(uint16_t *const *w, uint64_t elems)
{
	size_t bytes = elems * 2 * N_TENSORS;
	unsigned char *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
				-1, 0);
	double t0;

	if (m == MAP_FAILED)
		return -1;
	madvise(m, bytes, MADV_HUGEPAGE);
	t0 = now_ms();
	for (int i = 0; i < N_TENSORS; i++)
		memcpy(m + (size_t)i * elems * 2, w[i], elems * 2);
	t0 = now_ms() - t0;
	munmap(m, bytes);
	return t0;
}

/* Register tensors w[0..N_TENSORS) as "t0".. with p.  0 or the error. */
static int register_all(dcast_producer *p, uint16_t *const *w, uint64_t elems)
{
	uint64_t shape[1] = {elems};
	char name[16];
	int rc = 0;

	for (int i = 0; !rc && i < N_TENSORS; i++) {
		snprintf(name, sizeof(name), "t%d", i);
		rc = dcast_producer_register(p, name, DCAST_DTYPE_BF16, 1, shape, w[i], DCAST_MEM_HOST, 0,
					     elems);
	}
	return rc;
}

static int setup(dcast_producer *p, uint16_t **w, uint64_t elems)
{
	uint64_t seed = 1;

	for (int i = 0; i < N_TENSORS; i++) {
		if (!(w[i] = malloc(elems * 2)))
			return -1;
		harness_fill(w[i], elems, &seed);
	}
	return register_all(p, w, elems) ? -1 : 0;
}

/* Time publish(v) of an anchor against a memcpy of its bytes; print. */
static int time_anchor(dcast_producer *p, uint16_t *const *w, uint64_t elems, uint64_t v,
		       unsigned char *dst, const char *what, double *pub_ms)
{
	dcast_producer_progress pr;
	dcast_producer_stats s;
	double mc = time_memcpy(dst, w, elems), t0 = now_ms(), pub, ack;

	if (dcast_producer_publish(p, v))
		return -1;
	pub = now_ms() - t0;
	dcast_producer_progress_get(p, &pr);
	dcast_producer_stats_get(p, &s);
	if (!s.anchor || dcast_producer_flush(p, 600000))
		return dcast_fail(DCAST_ESTATE, "version %llu: not an anchor, or not acknowledged: %s",
				  (unsigned long long)v, dcast_last_error());
	ack = now_ms() - t0;
	printf("%s: anchor_bytes %llu memcpy_ms %.2f publish_ms %.2f taken_at_return %llu "
	       "publish_to_ack_ms %.1f\npublish_over_memcpy %.2f (%s)\n",
	       what, (unsigned long long)(elems * 2 * N_TENSORS), mc, pub,
	       (unsigned long long)pr.bytes_taken, ack, pub / mc, what);
	*pub_ms = pub;
	return 0;
}

/* A second producer of the same tensors: prepare(), then its first anchor. */
static int prepared_anchor(const harness_broker *hb, const dcast_producer_opts *o, uint16_t *const *w,
			   uint64_t elems, unsigned char *dst)
{
	dcast_producer *q = NULL;
	double t0, pub;
	int rc = dcast_producer_open(hb->producers, "bench-publish-prepared", 0, 1, o, &q);

	if (!rc)
		rc = register_all(q, w, elems);
	t0 = now_ms();
	if (!rc && !(rc = dcast_producer_prepare(q)))
		printf("prepare_ms %.2f (at start-up, before the first publish)\n", now_ms() - t0);
	if (!rc)
		rc = time_anchor(q, w, elems, 1, dst, "first publish after prepare()", &pub);
	dcast_producer_close(&q);
	return rc;
}

static int run(dcast_producer *p, harness_broker *hb, const dcast_producer_opts *o, uint16_t *const *w,
	       uint64_t elems)
{
	unsigned char *dst = malloc(elems * 2 * N_TENSORS);
	double fresh, pub;
	int rc;

	if (!dst)
		return -1;
	memset(dst, 1, elems * 2 * N_TENSORS);
	fresh = time_fresh_memcpy(w, elems);
	rc = time_anchor(p, w, elems, 1, dst, "first publish", &pub);
	if (!rc) {
		printf("fresh_memcpy_ms %.2f\npublish_over_fresh_memcpy %.2f (first publish)\n",
		       fresh, pub / fresh);
		rc = prepared_anchor(hb, o, w, elems, dst);
	}
	if (!rc) {
		tp_broker_kill(hb, SIGKILL);
		rc = tp_broker_start(hb) ||
		     time_anchor(p, w, elems, 2, dst, "after a broker restart", &pub);
	}
	free(dst);
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"mb", 1, 0, 'm'}, {0, 0, 0, 0}};
	char dir[] = "/tmp/dcast-bench-publish-XXXXXX";
	harness_broker hb = {0};
	dcast_producer *p = NULL;
	dcast_producer_opts o;
	uint16_t *w[N_TENSORS] = {0};
	uint64_t mb = 256, elems;
	int c;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c != 'm')
			return 2;
		mb = strtoull(optarg, NULL, 10);
	}
	if (mb < 1 || mb > (1u << 20)) {
		fprintf(stderr, "usage: bench_publish [--mb 1..1048576]\n");
		return 2;
	}
	elems = (mb << 20) / 2 / N_TENSORS;
	dcast_producer_opts_init(&o);
	o.reconnect_backoff_ms = 0; /* the re-join after the restart at once */
	atexit(tp_kill_all);
	if (!mkdtemp(dir) || harness_broker_start(&hb, dir) ||
	    dcast_producer_open(hb.producers, "bench-publish", 0, 1, &o, &p) ||
	    setup(p, w, elems) || run(p, &hb, &o, w, elems)) {
		fprintf(stderr, "bench_publish: %s\n", dcast_last_error());
		return 1;
	}
	dcast_producer_close(&p);
	tp_broker_kill(&hb, SIGTERM);
	check_remove_dir(dir); /* its broker's log: kept only on a failure, above */
	for (int i = 0; i < N_TENSORS; i++)
		free(w[i]);
	return 0;
}
