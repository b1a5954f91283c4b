/* The staging pool is pinned at its first use, not at open (consumer/
 * staging.c): a fresh consumer that takes its anchor in place never
 * touches the pool, so joining costs no page faults, mlock or io_uring
 * registration of it.  With the real broker binary and the producer
 * library over loopback TCP: the process's locked memory (VmLck in
 * /proc/self/status) is unchanged by opening a consumer and applying an
 * anchor in place, then grows by exactly the pool's size while the next
 * version, a delta staged in the pool, is taken; both versions apply
 * bit-exact, and so does a third after a restart (the load reads the
 * checkpoint through the pool).  Exits 77 where an mlock of a pool's size
 * does not show in VmLck (RLIMIT_MEMLOCK without CAP_IPC_LOCK, or under
 * AddressSanitizer, whose mlock does nothing): nothing would show the
 * pinning. */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "consumer_harness.h"

#define BUDGET (8u << 20)

/* The process's locked memory, kB (VmLck). */
static long locked_kb(void)
{
	return (long)tp_proc_value("/proc/self/status", "VmLck");
}

/* Does an mlock of `bytes` by this process show in VmLck?  Not where
 * RLIMIT_MEMLOCK refuses it, nor under AddressSanitizer, whose mlock does
 * nothing. */
static int can_lock(size_t bytes)
{
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	long before = locked_kb();
	int ok = m != MAP_FAILED && mlock(m, bytes) == 0 && (locked_kb() - before) * 1024 >= (long)bytes;

	if (m != MAP_FAILED)
		munmap(m, bytes);
	return ok;
}

int main(void)
{
	char dir[] = "/tmp/dcast-pool-XXXXXX";
	dcast_producer *p = NULL;
	dcast_consumer *c = NULL;
	dcast_consumer_stats st;
	h_seen s = {0};
	h_broker b;
	h_model m;
	long l0, l1, l2, l3;

	if (!can_lock(BUDGET)) {
		printf("test_consumer_pool: SKIP: an mlock of %u bytes does not show in VmLck here "
		       "(RLIMIT_MEMLOCK, or AddressSanitizer's mlock)\n", BUDGET);
		return 77;
	}
	REQUIRE(mkdtemp(dir));
	REQUIRE(h_broker_start_args(&b, NULL) == 0);
	h_model_init(&m, 31, 2);
	REQUIRE(h_producer_open(&b, "pool", &m, &p) == 0);
	REQUIRE(h_publish(p, &m, 1, 100) == 0);

	l0 = locked_kb();
	REQUIRE(dcast_consumer_open(b.consumers, "pool", dir, BUDGET, NULL, &c) == 0);
	CHECK(h_drive(c, &m, 1, &s) == 0 && h_equal(c, &m, 1));
	dcast_consumer_stats_get(c, &st);
	CHECK(st.anchor == 1 && st.spilled_chunks == 0 && st.peak_pool_bytes == 0); /* in place */
	l1 = locked_kb();
	CHECK(l1 == l0);

	l2 = locked_kb(); /* before the publish: the session thread stages it at once */
	REQUIRE(h_publish(p, &m, 2, 100) == 0);
	CHECK(h_drive(c, &m, 2, &s) == 0 && h_equal(c, &m, 2));
	dcast_consumer_stats_get(c, &st);
	l3 = locked_kb();
	CHECK(st.peak_pool_bytes > 0 && (uint64_t)(l3 - l2) * 1024 == st.pool_bytes);
	fprintf(stderr, "VmLck %ld kB, after open and anchor %ld, before the delta %ld, after %ld (pool %llu bytes)\n",
		l0, l1, l2, l3, (unsigned long long)st.pool_bytes);
	dcast_consumer_close(&c);

	REQUIRE(h_publish(p, &m, 3, 100) == 0);
	REQUIRE(dcast_consumer_open(b.consumers, "pool", dir, BUDGET, NULL, &c) == 0);
	CHECK(dcast_consumer_version(c) == 2 && h_equal(c, &m, 2)); /* loaded through the pool */
	CHECK(h_drive(c, &m, 3, &s) == 0 && h_equal(c, &m, 3));
	CHECK(s.errors == 0 && s.apply_failures == 0);
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
	h_broker_stop(&b);
	check_remove_dir(dir);
	return check_done("test_consumer_pool");
}
