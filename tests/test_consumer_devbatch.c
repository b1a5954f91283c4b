/* The consumer's device path for deltas (consumer/devbatch.c) on machines
 * without a GPU: DELTACAST_DEVICE_TWIN=1 sends host tensors through it,
 * run by the batch's CPU twin.  A delta checked ahead is decoded into one
 * batch, its digests moved from the old values the batch gathered, and
 * applied as one scatter: versions bit-exact (bf16, f32, and an f64 tensor
 * of 8-byte values); a wrong COMMIT digest refused before READY with the
 * live weights untouched; an apply cut off halfway (fault aheadfail)
 * rolled back from the batch's undo buffer, bit-exact.
 * tests/test_consumer_gpu.c runs the same on a device where one is lent. */
#include <stdlib.h>
#include "check.h"
#include "consumer_harness.h"

#define BUDGET (8u << 20)

static char root[] = "/tmp/dcast-consumer-devbatch-XXXXXX";

static const char *dir_for(const char *name)
{
	static char path[256];
	snprintf(path, sizeof(path), "%s/%s", root, name);
	return path;
}

/* A consumer of `model`, with `fault` (DELTACAST_CONSUMER_FAULT) armed
 * unless NULL. */
static dcast_consumer *open_faulted(const h_broker *b, const char *model, const char *fault)
{
	dcast_consumer *c = NULL;

	if (fault)
		setenv("DELTACAST_CONSUMER_FAULT", fault, 1);
	CHECK(dcast_consumer_open(b->consumers, model, dir_for(model), BUDGET, NULL, &c) == 0);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	return c;
}

/* The f32 tensor of m as f64 (two 4-byte wire elements a value, low word
 * first): same bytes, half the values. */
static void make_f64(h_model *m)
{
	m->dtype[1] = DCAST_DTYPE_F64;
	m->shape[1][1] /= 2;
}

/* Versions 1-2 applied, then 3 and 4 published while 2 is live, so that 3
 * is checked ahead with `fault` armed for it; the consumer must end
 * bit-exact at 4. */
static void run_ahead(const h_broker *b, const char *model, uint64_t seed, int f64, const char *fault, h_seen *s)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c;

	h_model_init(&m, seed, 1);
	if (f64)
		make_f64(&m);
	REQUIRE(h_producer_open(b, model, &m, &p) == 0);
	REQUIRE(h_publish(p, &m, 1, 100) == 0 && h_publish(p, &m, 2, 100) == 0);
	c = open_faulted(b, model, fault);
	REQUIRE(c);
	CHECK(h_drive(c, &m, 2, s) == 0 && h_equal(c, &m, 2));
	REQUIRE(h_publish(p, &m, 3, 100) == 0 && h_publish(p, &m, 4, 100) == 0);
	CHECK(h_drive(c, &m, 4, s) == 0);
	CHECK(h_equal(c, &m, 4));
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
}

static void test_versions(const h_broker *b)
{
	h_seen s = {0};

	run_ahead(b, "m_batch", 101, 0, NULL, &s);
	CHECK(s.errors == 0 && s.apply_failures == 0);
}

static void test_f64(const h_broker *b)
{
	h_seen s = {0};

	run_ahead(b, "m_batch64", 103, 1, NULL, &s);
	CHECK(s.errors == 0 && s.apply_failures == 0);
}

/* Version 3's COMMIT digest is wrong: refused when checked ahead, before
 * READY, the live tensors still version 2; fetched again and healed. */
static void test_digest_refused(const h_broker *b)
{
	h_seen s = {0};

	run_ahead(b, "m_batchdigest", 107, 0, "predigest:3", &s);
	CHECK(s.errors >= 1 && s.last_error == DCAST_EDIGEST);
	CHECK(s.apply_failures == 0 && s.untouched_bad == 0);
}

/* Version 3's apply is cut off at a chunk in its second half: the batch's
 * segments written are undone from its undo buffer, the tensors are
 * version 2 again bit for bit, and the consumer heals. */
static void test_cut_rolled_back(const h_broker *b)
{
	h_seen s = {0};

	run_ahead(b, "m_batchcut", 109, 1, "aheadfail:3", &s);
	CHECK(s.apply_failures >= 1 && s.last_apply_error == DCAST_ECORRUPT);
	CHECK(s.untouched_ok >= 1 && s.untouched_bad == 0);
}

int main(void)
{
	h_broker b;

	setenv("DELTACAST_DEVICE_TWIN", "1", 1); /* before the library first asks */
	REQUIRE(mkdtemp(root));
	REQUIRE(h_broker_start(&b) == 0);
	test_versions(&b);
	test_f64(&b);
	test_digest_refused(&b);
	test_cut_rolled_back(&b);
	h_broker_stop(&b);
	check_remove_dir(root);
	return check_done("test_consumer_devbatch");
}
