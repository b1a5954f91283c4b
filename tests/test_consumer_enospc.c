/* A disk too full for the checkpoint, for real: the consumer's directory
 * is a 256 KiB tmpfs (mounted here; exit 77 where mounting is not
 * allowed), too small for the anchor's file (~1.3 MB).  A consumer holding
 * no version takes the anchor in place, into model.safetensors.new, whose
 * writes run behind its COMMIT (READY does not wait for them): the file's
 * blocks are reserved when it is made (consumer/store/anchor.c), so the
 * full disk refuses the anchor there.  The consumer must say so (an error
 * naming the cause), never announce the anchor READY, and keep no version.
 * Then the tmpfs grows (remount, size=64m) and the same consumer heals by
 * itself: anchor and delta applied bit-exact; closed cleanly. */
#include <sys/mount.h>
#include <sys/stat.h>
#include "check.h"
#include "consumer_harness.h"

#define BUDGET (16u << 20)

static char root[] = "/tmp/dcast-consumer-enospc-XXXXXX";
static char dir[300];

static void unmount_dir(void) /* also when a REQUIRE ends the test early */
{
	umount2(dir, MNT_DETACH);
}

/* Poll until an error naming the record write's cause (1), or 15 s (0): poll()
 * returns the session's failure; no version may become READY meanwhile. */
static int wait_write_error(dcast_consumer *c, int *ready_seen)
{
	dcast_event ev;

	for (int i = 0; i < 150; i++) {
		int err = dcast_consumer_poll(c, 100, &ev);
		const char *why = err ? dcast_last_error() : ev.type == DCAST_EV_ERROR ? ev.text : "";

		*ready_seen |= !err && ev.type == DCAST_EV_VERSION_READY;
		if (strstr(why, "No space left")) {
			printf("reported: %s\n", why);
			return 1;
		}
	}
	return 0;
}

/* Poll (errors included: the consumer retries on its own) and apply what
 * is READY until version v is live; 1 when it is, within 20 s. */
static int reach(dcast_consumer *c, uint64_t v)
{
	dcast_event ev;

	for (int i = 0; i < 200; i++) {
		uint64_t have = dcast_consumer_version(c);

		if (have != DCAST_VERSION_NONE && have >= v)
			return 1;
		if (dcast_consumer_poll(c, 100, &ev) == 0 && ev.type == DCAST_EV_VERSION_READY)
			dcast_consumer_apply(c, ev.version);
	}
	return 0;
}

int main(void)
{
	h_model m;
	dcast_producer *p = NULL;
	dcast_consumer *c = NULL;
	h_broker b;
	int ready_seen = 0;

	REQUIRE(mkdtemp(root));
	snprintf(dir, sizeof(dir), "%s/worker", root);
	REQUIRE(mkdir(dir, 0700) == 0);
	if (mount("tmpfs", dir, "tmpfs", 0, "size=256k") != 0) {
		check_remove_dir(root);
		return check_skip("test_consumer_enospc", "cannot mount a tmpfs (not root, or no "
				  "mount namespace rights): the failing record write did not run");
	}
	atexit(unmount_dir);
	REQUIRE(h_broker_start_args(&b, NULL) == 0);
	REQUIRE(h_model_start(&b, "m_full", 7, 1, 100, &m, &p) == 0);

	dcast_consumer_opts o;
	dcast_consumer_opts_init(&o);
	o.fold_fraction = 0; /* the delta's record stays in the log: no fold writes the disk */
	CHECK(dcast_consumer_open(b.consumers, "m_full", dir, BUDGET, &o, &c) == 0);
	REQUIRE(c);
	CHECK(wait_write_error(c, &ready_seen));
	CHECK(!ready_seen);
	CHECK(dcast_consumer_version(c) == DCAST_VERSION_NONE);

	/* Room again: the same consumer takes the anchor, then a delta. */
	REQUIRE(mount("tmpfs", dir, "tmpfs", MS_REMOUNT, "size=64m") == 0);
	CHECK(reach(c, 1));
	CHECK(h_equal(c, &m, 1));
	REQUIRE(h_publish(p, &m, 2, 100) == 0);
	CHECK(reach(c, 2));
	CHECK(h_equal(c, &m, 2));

	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(&m);
	h_broker_stop(&b);
	unmount_dir();
	check_remove_dir(root);
	return check_done("test_consumer_enospc");
}
