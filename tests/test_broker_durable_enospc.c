/* A durable write that fails, for real: the data dir is a 1 MiB tmpfs
 * (mounted here; exit 77 when mounting is not allowed), filled by dense
 * versions of 256 KiB until a write meets ENOSPC.  That version gets ERROR
 * DCAST_EIO instead of an ACK, the broker logs it, and the model then
 * refuses deltas (only an anchor starts a whole segment again). */
#include <sys/mount.h>
#include <sys/stat.h>
#include "broker_harness.h"

static uint64_t want;
static char data[300];

static void unmount_data(void) /* also when a REQUIRE ends the test early */
{
	umount2(data, MNT_DETACH);
}

static int acked_or_refused(struct h_client *c)
{
	return c->last_error_code || (c->last_ack != DCAST_VERSION_NONE && c->last_ack >= want);
}

/* Publish and wait for its ACK or an ERROR (a producer silent for 3
 * heartbeats would be dropped).  Returns 0 when ACKed. */
static int publish(struct h_client *c, uint64_t v, int anchor)
{
	h_client_publish(c, v, anchor, 0);
	want = v;
	return h_pump(c, 0, acked_or_refused, 20) && !c->last_error_code ? 0 : -1;
}

int main(void)
{
	static struct h_client prod;
	static char dir[] = "/tmp/dcast_test_enospc_XXXXXX";
	tp_broker br = {0};
	uint32_t rng = 5;
	uint64_t v, failed = 0, fails;

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	snprintf(data, sizeof(data), "%s/data", dir);
	REQUIRE(mkdir(data, 0755) == 0);
	if (mount("tmpfs", data, "tmpfs", 0, "size=1m")) {
		fprintf(stderr, "skip: cannot mount a tmpfs on %s (not root?)\n", data);
		check_remove_dir(dir);
		return 77;
	}
	atexit(unmount_data);
	br.extra[br.n_extra++] = "--data-dir";
	br.extra[br.n_extra++] = data;
	br.extra[br.n_extra++] = "--anchor-fraction";
	br.extra[br.n_extra++] = "0";
	br.with_metrics = 1;
	REQUIRE(h_broker_start(&br) == 0);
	h_client_open(&prod, br.pport, "full/model");
	REQUIRE(h_producer_join(&prod) == 0);
	for (v = 1; v <= 8 && !failed; v++) {
		h_mutate(&prod, &rng, 1); /* every element: dense chunks */
		if (publish(&prod, v, v == 1))
			failed = v;
	}
	CHECK(failed > 1);
	CHECK(prod.last_error_code == DCAST_EIO && prod.last_ack == failed - 1);
	fails = tp_metric_now(br.mport, "deltacast_durable_failures_total"); /* "not durable" */
	CHECK(fails != UINT64_MAX && fails >= 1);
	prod.last_error_code = 0;
	h_mutate(&prod, &rng, 50);
	CHECK(publish(&prod, failed + 1, 0) != 0); /* a delta past the hole */
	CHECK(prod.last_error_code == DCAST_EVERSION);
	h_client_close(&prod);
	tp_broker_kill(&br, SIGKILL);
	CHECK(umount2(data, MNT_DETACH) == 0);
	return h_finish(&br, dir, "test_broker_durable_enospc");
}
