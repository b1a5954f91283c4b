/* Limits at scale over a real broker: started with a
 * low open-file soft limit, the broker raises it to the hard limit and says
 * so, and warns, naming the numbers, when the limit is below what its
 * --max-consumers allows; with its limit then cut to 60 descriptors (prlimit
 * on the running process) 80 connections make accept() fail with EMFILE,
 * which is logged with the descriptors open and the limit, and once they
 * leave a new consumer is welcomed again.  Last, --max-pending-total-bytes
 * (default logged) takes two 256 KiB anchors in turn under a 300000-byte
 * cap (each commit frees its share) and refuses one under 200000. */
#include <sys/resource.h>
#include "broker_harness.h"

#define CONNS 80

static char dir[] = "/tmp/dcast_test_limits_XXXXXX";

/* Two anchors of 256 KiB payload each, in turn: both ACKed when `fits`,
 * else the first is refused naming the cap. */
static void pending_cap(tp_broker *br, int fits)
{
	static struct h_client prod;
	uint32_t rng = 5;

	h_client_open(&prod, br->pport, "limits/pending");
	REQUIRE(h_producer_join(&prod) == 0);
	h_mutate(&prod, &rng, 1);
	CHECK((h_client_publish(&prod, 1, 1, fits ? 100 : 5) == 0) == fits);
	if (fits) {
		h_mutate(&prod, &rng, 1);
		CHECK(h_client_publish(&prod, 2, 1, 100) == 0);
	} else {
		CHECK(check_file_has(br->log, "past --max-pending-total-bytes 200000"));
	}
	h_client_close(&prod);
}

int main(void)
{
	static struct h_client conns[CONNS], cons;
	tp_broker br = {0};
	struct rlimit mine, low, cut = {60, 60};
	char want[128];

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	br.extra[br.n_extra++] = "--max-consumers";
	br.extra[br.n_extra++] = "1000000";

	/* The broker inherits a soft limit of 100 and raises it. */
	REQUIRE(getrlimit(RLIMIT_NOFILE, &mine) == 0);
	if (mine.rlim_max < 200 || mine.rlim_max >= 1000000)
		TEST_SKIP("needs a hard open-file limit in [200, 1000000)");
	low = (struct rlimit){100, mine.rlim_max};
	REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
	/* under valgrind, getrlimit answers what setrlimit asked for, and the
	 * kernel's limit, which the broker inherits, stays as it was */
	if (tp_proc_value("/proc/self/limits", "Max open files") != 100)
		TEST_SKIP("setrlimit does not reach the kernel here (valgrind keeps the limit to itself)");
	REQUIRE(h_broker_start(&br) == 0);
	REQUIRE(setrlimit(RLIMIT_NOFILE, &mine) == 0);
	snprintf(want, sizeof(want), "soft limit raised from 100 to %llu",
		 (unsigned long long)mine.rlim_max);
	CHECK(check_file_has(br.log, want));
	snprintf(want, sizeof(want), "open files: the limit is %llu, below the 100",
		 (unsigned long long)mine.rlim_max);
	CHECK(check_file_has(br.log, want));
	CHECK(check_file_has(br.log, "--max-consumers 1000000"));

	/* Cut to 60: more connections than descriptors. */
	REQUIRE(prlimit(br.pid, RLIMIT_NOFILE, &cut, NULL) == 0);
	for (int i = 0; i < CONNS; i++)
		h_client_open(&conns[i], br.cport, "limits/model");
	CHECK(tp_wait_log(br.log, "consumers endpoint: accept failed: Too many open files", 1, 10000));
	CHECK(check_file_has(br.log, "limit 60"));
	for (int i = 0; i < CONNS; i++)
		h_client_close(&conns[i]);

	h_client_open(&cons, br.cport, "limits/model");
	h_hello(&cons, DCAST_ROLE_CONSUMER, DCAST_VERSION_NONE);
	CHECK(h_pump(&cons, 1, h_done_welcomed, 100));
	CHECK(cons.welcome_version == DCAST_VERSION_NONE);
	h_client_close(&cons);
	CHECK(check_file_has(br.log, "memory: open versions hold at most"));

	/* The cap over all open versions. */
	tp_broker_kill(&br, SIGKILL);
	br.n_extra = 0;
	br.extra[br.n_extra++] = "--max-pending-total-bytes";
	br.extra[br.n_extra++] = "300000";
	REQUIRE(h_broker_start(&br) == 0);
	pending_cap(&br, 1);
	tp_broker_kill(&br, SIGKILL);
	br.extra[1] = "200000";
	REQUIRE(h_broker_start(&br) == 0);
	pending_cap(&br, 0);
	return h_finish(&br, dir, "test_broker_limits");
}
