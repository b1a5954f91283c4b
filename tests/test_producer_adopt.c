/* A new producer takes the broker's newest version as its baseline more
 * than once before its first publish, through the real broker:
 *  (1) a first producer publishes an anchor (1) and a delta (2), and closes;
 *  (2) a second one adopts its copy of version 2 (adopt_baseline), adopts
 *      it again, then fetches it (fetch_baseline): each later call copies
 *      into a baseline dropped first, and succeeds;
 *  (3) a call with a copy that is not version 2 fails (DCAST_EDIGEST,
 *      naming the tensor and elements) before anything is copied: the
 *      baseline adopted before stays, and version 3 goes out as a delta
 *      that a consumer reads bit-exact;
 *  (4) a new producer whose only adopt failed publishes an anchor.
 * The debug tier (DCAST_DEBUG) asserts that every adopt's copies go into a
 * baseline marked invalid, so that one failing half-way leaves no baseline. */
#include <stdint.h>
#include "check.h"
#include "deltacast/producer.h"
#include "producer_harness.h"

#define N (1u << 20)         /* 2 MiB of bf16 */
#define RANGE (1u << 16)     /* 128 KiB ranges */
#define WRONG_AT (RANGE + 7) /* an element of the second range */

static harness_broker b;
static uint16_t *w, *want, *wrong;
static char dir[] = "/tmp/dcast-test-producer-adopt-XXXXXX";

static dcast_producer *open_producer(void)
{
	dcast_producer_opts o;

	dcast_producer_opts_init(&o);
	o.connect_timeout_ms = 2000;
	o.ack_timeout_ms = 10000;
	o.range_elems = RANGE;
	return harness_open_w(b.producers, "adopt", &o, w, N);
}

static int adopt(dcast_producer *p, const uint16_t *copy)
{
	const void *bases[1] = {copy};

	return dcast_producer_adopt_baseline(p, b.consumers, bases, 1, 20000);
}

static uint64_t baseline_version(dcast_producer *p)
{
	dcast_producer_stats s;

	dcast_producer_stats_get(p, &s);
	return s.baseline_version;
}

/* publish(v) of w, acknowledged; 1 when it was an anchor. */
static int publish_anchor(dcast_producer *p, uint64_t v)
{
	dcast_producer_stats s;

	memcpy(want, w, N * 2ull);
	CHECK_ERR(harness_publish(p, v), 0);
	dcast_producer_stats_get(p, &s);
	CHECK(s.version == v && s.acked_version == v);
	return s.anchor;
}

static int read_back(uint64_t v)
{
	char out[256];

	snprintf(out, sizeof(out), "%s/v%llu.safetensors", dir, (unsigned long long)v);
	return !harness_read(&b, "adopt", v, out) && harness_same_as_file(out, "w", want, N * 2ull);
}

int main(void)
{
	dcast_producer *p;
	uint64_t seed = 11;

	harness_init();
	REQUIRE(mkdtemp(dir) && (w = calloc(N, 2)) && (want = calloc(N, 2)) &&
		(wrong = calloc(N, 2)));
	REQUIRE(harness_broker_start(&b, dir) == 0);

	/* (1) */
	p = open_producer();
	harness_fill(w, N, &seed);
	CHECK(publish_anchor(p, 1));
	harness_perturb(w, N, 1000, &seed);
	CHECK(!publish_anchor(p, 2));
	dcast_producer_close(&p);

	/* (2): w holds version 2, the trainer's checkpoint */
	p = open_producer();
	CHECK_ERR(adopt(p, w), 0);
	CHECK(baseline_version(p) == 2);
	CHECK_ERR(adopt(p, w), 0);
	CHECK(baseline_version(p) == 2);
	CHECK_ERR(dcast_producer_fetch_baseline(p, b.consumers, NULL, 20000), 0);
	CHECK(baseline_version(p) == 2);

	/* (3) */
	memcpy(wrong, w, N * 2ull);
	wrong[WRONG_AT] ^= 1;
	CHECK_ERR(adopt(p, wrong), DCAST_EDIGEST);
	CHECK(strstr(dcast_last_error(), "tensor w elements [65536, +65536)") != NULL);
	fprintf(stderr, "a wrong copy: %s\n", dcast_last_error());
	CHECK(baseline_version(p) == 2);
	harness_perturb(w, N, 1000, &seed);
	CHECK(!publish_anchor(p, 3));
	CHECK(read_back(3));
	dcast_producer_close(&p);

	/* (4) */
	p = open_producer();
	CHECK_ERR(adopt(p, wrong), DCAST_EDIGEST);
	CHECK(baseline_version(p) == DCAST_VERSION_NONE);
	CHECK(publish_anchor(p, 4));
	CHECK(read_back(4));
	dcast_producer_close(&p);

	tp_broker_kill(&b, SIGTERM);
	free(w);
	free(want);
	free(wrong);
	check_remove_dir(dir);
	return check_done("test_producer_adopt");
}
