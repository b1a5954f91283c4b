/* Buffers carved from huge-page regions (common/slab.c, dcast_slab.h):
 * - buffers of an anchor's chunk size are 64-byte aligned, disjoint and
 *   writable, carved one after another until a region is full, then from
 *   a new one;
 * - a region is unmapped once a newer one is current and every buffer of
 *   it was freed (mincore on its address then fails with ENOMEM), and not
 *   before: one buffer still held keeps it mapped;
 * - a buffer larger than a region gets one of its own;
 * - buffers freed from two threads at once (the way ZeroMQ messages are
 *   closed) are all given back: every full region is unmapped;
 * - two pools carve from regions of their own, taken in turns: a buffer
 *   one pool's log keeps holds none of the other's regions; a closed pool's
 *   last region goes with its last buffer, and the pool carves again. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "dcast_slab.h"

#define CHUNK ((size_t)1216 * 1024) /* 1.19 MiB: 26 to a region */
#define MANY 256

static struct dcast_slab_pool pool = DCAST_SLAB_POOL_INIT; /* test_carve's, test_large's, test_threads' */

struct held {
	unsigned char *p;
	void *region;
};

static int mapped(const void *p)
{
	unsigned char vec;
	void *page = (void *)((uintptr_t)p & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1));

	if (!mincore(page, 1, &vec))
		return 1;
	return errno == ENOMEM ? 0 : -1;
}

static void take(struct held *h, size_t n, size_t size)
{
	for (size_t i = 0; i < n; i++) {
		h[i].p = dcast_slab_get(&pool, size, &h[i].region);
		REQUIRE(h[i].p != NULL);
		CHECK(((uintptr_t)h[i].p & 63) == 0);
		memset(h[i].p, (int)(i & 0xff), size);
	}
}

static void give(struct held *h, size_t from, size_t to)
{
	for (size_t i = from; i < to; i++)
		dcast_slab_free(h[i].p, h[i].region);
}

/* Carved in order, disjoint, regions of DCAST_SLAB_BYTES. */
static void test_carve(void)
{
	static struct held h[MANY];
	size_t regions = 1;

	take(h, 64, CHUNK);
	for (size_t i = 1; i < 64; i++) {
		if (h[i].region != h[i - 1].region) {
			regions++;
			continue;
		}
		CHECK(h[i].p >= h[i - 1].p + CHUNK); /* disjoint, in order */
		CHECK(h[i].p + CHUNK <= (unsigned char *)h[i].region + DCAST_SLAB_BYTES);
	}
	CHECK(regions >= 64 * CHUNK / DCAST_SLAB_BYTES && regions <= 64 * CHUNK / DCAST_SLAB_BYTES + 2);
	for (size_t i = 0; i < 64; i++)
		CHECK(h[i].p[0] == (unsigned char)(i & 0xff) && h[i].p[CHUNK - 1] == (unsigned char)(i & 0xff));
	/* The first region, one buffer of it held: mapped; freed: gone. */
	size_t last_of_first = 0;
	while (h[last_of_first + 1].region == h[0].region)
		last_of_first++;
	give(h, 1, last_of_first + 1);
	CHECK(mapped(h[0].region) == 1);
	give(h, 0, 1);
	CHECK(mapped(h[0].region) == 0);
	give(h, last_of_first + 1, 64);
}

/* A buffer larger than a region: a region of its own, gone once freed and
 * replaced as the current one. */
static void test_large(void)
{
	struct held big, small[30];

	big.p = dcast_slab_get(&pool, (size_t)DCAST_SLAB_BYTES * 2, &big.region);
	REQUIRE(big.p != NULL);
	memset(big.p, 7, (size_t)DCAST_SLAB_BYTES * 2);
	dcast_slab_free(big.p, big.region);
	CHECK(mapped(big.region) == 1); /* still the current region */
	take(small, 30, CHUNK);         /* more than what is left of it */
	give(small, 0, 30);
	CHECK(mapped(big.region) == 0);
}

static void *free_half(void *arg)
{
	struct held *h = arg;

	give(h, 0, MANY / 2);
	return NULL;
}

/* Freed from two threads at once: every full region unmapped. */
static void test_threads(void)
{
	static struct held h[MANY];
	pthread_t t;

	take(h, MANY, CHUNK);
	REQUIRE(!pthread_create(&t, NULL, free_half, h));
	give(h, MANY / 2, MANY);
	REQUIRE(!pthread_join(t, NULL));
	for (size_t i = 0; i < MANY; i++)
		if (h[i].region != h[MANY - 1].region && (!i || h[i].region != h[i - 1].region))
			CHECK(mapped(h[i].region) == 0); /* each full region once */
}

/* Pools a and b take buffers in turns (two models' versions arriving
 * interleaved); a keeps its last one, b frees all: b's regions are gone,
 * and so is a's full region once its buffers but the last went. */
static void test_pools(void)
{
	struct dcast_slab_pool a = DCAST_SLAB_POOL_INIT, b = DCAST_SLAB_POOL_INIT;
	struct held ha[30], hb[30];

	for (size_t i = 0; i < 30; i++) {
		ha[i].p = dcast_slab_get(&a, CHUNK, &ha[i].region);
		hb[i].p = dcast_slab_get(&b, CHUNK, &hb[i].region);
		REQUIRE(ha[i].p && hb[i].p);
		CHECK(ha[i].region != hb[i].region);
	}
	CHECK(ha[0].region != ha[29].region); /* 30 buffers fill more than one */
	give(hb, 0, 30);
	dcast_slab_pool_close(&b);
	CHECK(mapped(hb[0].region) == 0 && mapped(hb[29].region) == 0);
	give(ha, 0, 29);
	CHECK(mapped(ha[0].region) == 0);  /* full, every buffer of it freed */
	CHECK(mapped(ha[29].region) == 1); /* current, its buffer held */
	dcast_slab_pool_close(&a);
	CHECK(mapped(ha[29].region) == 1); /* closed, the buffer still held */
	give(ha, 29, 30);
	CHECK(mapped(ha[29].region) == 0);
	ha[0].p = dcast_slab_get(&a, CHUNK, &ha[0].region); /* a closed pool carves again */
	REQUIRE(ha[0].p != NULL);
	give(ha, 0, 1);
	dcast_slab_pool_close(&a);
	CHECK(mapped(ha[0].region) == 0);
}

int main(void)
{
	test_carve();
	test_large();
	test_threads();
	test_pools();
	if (check_failures)
		return 1;
	printf("test_slab: ok\n");
	return 0;
}
