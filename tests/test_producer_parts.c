/* Two producer parts (two trainer ranks) publish shards of the same model
 * through the real broker: each sends only its own ranges, the version
 * commits when both have committed, and the reader gets the whole model
 * bit-exact, first as an anchor and then as deltas.  A part whose ranges
 * did not change sends only its COMMIT (0 chunks), which opens the version
 * at the broker when it comes first; a version where no part changed has no
 * chunks at all.  A version one part never sends is dropped by the broker
 * (part timeout): the other part's wait() says so, its baseline goes back,
 * and the next version is again a delta from both. */
#include <stdint.h>
#include "check.h"
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"
#include "producer_harness.h"

#define N_W ((2u << 20) + 777) /* split unevenly between the parts */
#define SPLIT ((1u << 20) + 123)
#define N_S 4096               /* owned by part 0 only */

static void reg(dcast_producer *p, uint16_t *w, uint16_t *s, uint32_t part)
{
	uint64_t shape_w[2] = {N_W, 1}, shape_s[1] = {N_S};
	uint64_t off = part ? SPLIT : 0, n = part ? N_W - SPLIT : SPLIT;

	REQUIRE(dcast_producer_register(p, "w", DCAST_DTYPE_BF16, 2, shape_w, w + off,
					DCAST_MEM_HOST, off, n) == 0);
	REQUIRE(dcast_producer_register(p, "s", DCAST_DTYPE_BF16, 1, shape_s, part ? NULL : s,
					DCAST_MEM_HOST, 0, part ? 0 : N_S) == 0);
}

static void publish_both(dcast_producer **pp, uint64_t v)
{
	CHECK_ERR(dcast_producer_publish(pp[0], v), 0);
	CHECK_ERR(dcast_producer_publish(pp[1], v), 0);
	CHECK_ERR(dcast_producer_wait(pp[0], v, 20000), 0);
	CHECK_ERR(dcast_producer_wait(pp[1], v, 20000), 0);
}

int main(void)
{
	harness_broker b = {0};
	dcast_producer *pp[2] = {NULL, NULL};
	dcast_producer_stats s0, s1;
	uint64_t seed = 7;
	char dir[] = "/tmp/dcast-test-producer-parts-XXXXXX", out[256];
	uint16_t *w = calloc(N_W, 2), *s = calloc(N_S, 2);

	harness_init();
	REQUIRE(mkdtemp(dir) && w && s);
	b.extra[b.n_extra++] = "--part-timeout-ms";
	b.extra[b.n_extra++] = "1000";
	REQUIRE(harness_broker_start(&b, dir) == 0);
	for (uint32_t i = 0; i < 2; i++)
		REQUIRE(dcast_producer_open(b.producers, "parts", i, 2, NULL, &pp[i]) == 0);
	harness_fill(w, N_W, &seed);
	harness_fill(s, N_S, &seed);
	reg(pp[0], w, s, 0);
	reg(pp[1], w, s, 1);
	publish_both(pp, 10);
	snprintf(out, sizeof(out), "%s/v10.safetensors", dir);
	CHECK(harness_read(&b, "parts", 10, out) == 0);
	CHECK(harness_same_as_file(out, "w", w, N_W * 2));
	CHECK(harness_same_as_file(out, "s", s, N_S * 2));
	/* a delta where only part 1's range of w changed, then one in both */
	harness_perturb(w + SPLIT, N_W - SPLIT, 5000, &seed);
	publish_both(pp, 11);
	dcast_producer_stats_get(pp[0], &s0);
	dcast_producer_stats_get(pp[1], &s1);
	CHECK(!s0.anchor && !s1.anchor);
	CHECK(s0.changed_elems == 0 && s1.changed_elems > 0);
	CHECK(s0.chunks_sent == 0 && s1.chunks_sent > 0); /* part 0: a COMMIT of 0 chunks */
	CHECK(s0.elems == SPLIT + N_S && s1.elems == N_W - SPLIT);
	snprintf(out, sizeof(out), "%s/v11.safetensors", dir);
	CHECK(harness_read(&b, "parts", 11, out) == 0);
	CHECK(harness_same_as_file(out, "w", w, N_W * 2));
	harness_perturb(w, N_W, 10000, &seed);
	harness_perturb(s, N_S, 10000, &seed);
	publish_both(pp, 12);
	/* nothing changed anywhere: a version of 0 chunks, opened by a COMMIT;
	 * then a delta on top of it */
	publish_both(pp, 13);
	dcast_producer_stats_get(pp[0], &s0);
	dcast_producer_stats_get(pp[1], &s1);
	CHECK(s0.chunks_sent == 0 && s1.chunks_sent == 0 && s0.acked_version == 13);
	harness_perturb(w, N_W, 10000, &seed);
	publish_both(pp, 14);
	snprintf(out, sizeof(out), "%s/v14.safetensors", dir);
	CHECK(harness_read(&b, "parts", 14, out) == 0);
	CHECK(harness_same_as_file(out, "w", w, N_W * 2));
	CHECK(harness_same_as_file(out, "s", s, N_S * 2));
	/* part 1 never sends version 15: dropped; part 0 rolls its baseline back */
	harness_perturb(w, N_W, 10000, &seed);
	CHECK_ERR(dcast_producer_publish(pp[0], 15), 0);
	CHECK_ERR(dcast_producer_wait(pp[0], 15, 10000), DCAST_EABORTED);
	CHECK(strstr(dcast_last_error(), "15") != NULL);
	harness_perturb(w, N_W, 10000, &seed);
	harness_perturb(s, N_S, 10000, &seed);
	publish_both(pp, 16);
	dcast_producer_stats_get(pp[0], &s0);
	CHECK(!s0.anchor && s0.changed_elems < (SPLIT + N_S) / 20);
	snprintf(out, sizeof(out), "%s/v16.safetensors", dir);
	CHECK(harness_read(&b, "parts", 16, out) == 0);
	CHECK(harness_same_as_file(out, "w", w, N_W * 2));
	CHECK(harness_same_as_file(out, "s", s, N_S * 2));
	dcast_producer_close(&pp[0]);
	dcast_producer_close(&pp[1]);
	tp_broker_kill(&b, SIGTERM);
	free(w);
	free(s);
	return check_done("test_producer_parts");
}
