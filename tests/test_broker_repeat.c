/* A chunk the broker receives twice (a producer's resend after a
 * reconnect, or a duplicating network) is kept once: the version's COMMIT
 * to consumers announces the chunks and bytes they actually receive.  The
 * broker used to drop the repeat but count its bytes, so every consumer
 * refused the version (COMMIT bytes larger than received) and re-joined
 * into it forever (found by `FAULT_KINDS=proxy_producer make test-faults`). */
#include "broker_harness.h"

int main(void)
{
	static struct h_client prod, cons;
	tp_broker br = {0};
	uint32_t rng = 99;
	char dir[] = "/tmp/dcast_test_repeat_XXXXXX";

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	REQUIRE(h_broker_start(&br) == 0);
	h_client_open(&prod, br.pport, "repeat/model");
	REQUIRE(h_producer_join(&prod) == 0);
	for (uint64_t v = 1; v <= 3; v++) {
		h_dup_seq = v == 1 ? 0 : (int)v; /* the anchor's first chunk, then a delta's */
		h_mutate(&prod, &rng, v == 1 ? 1 : 50);
		CHECK(h_client_publish(&prod, v, v == 1, 100) == 0);
	}
	h_dup_seq = -1;

	h_client_open(&cons, br.cport, "repeat/model");
	CHECK(h_consume_until(&cons, DCAST_VERSION_NONE, 3, 100) == 0);
	printf("consumer: %llu commits, %llu with counts other than received, version %lld\n",
	       (unsigned long long)cons.commits, (unsigned long long)cons.commit_mismatch,
	       (long long)cons.version);
	CHECK(cons.commits == 3 && cons.version == 3);
	CHECK(cons.commit_mismatch == 0);
	CHECK(cons.errors == 0 && cons.digest_mismatch == 0);
	CHECK(memcmp(cons.state, prod.state, sizeof(prod.state)) == 0);
	h_client_close(&cons);
	h_client_close(&prod);
	return h_finish(&br, dir, "test_broker_repeat");
}
