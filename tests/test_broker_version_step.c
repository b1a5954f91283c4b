/* A version more than DCAST_MAX_VERSION_STEP (2^32) above the newest
 * committed one is refused (DCAST_EVERSION, naming both versions and the
 * limit).  The broker used to take version 2^64-2 after version 1, and then
 * every version a trainer could publish was below it and refused.  After
 * the refusal the model goes on: version 2 and 2 + 2^32 (at the limit) are
 * acknowledged and a consumer receives them bit-exact.  Real broker process
 * over loopback. */
#include "broker_harness.h"

/* Messages of one h_publish: its CHUNKs and the COMMIT. */
#define MSGS (H_TENSORS * (H_ELEMS / H_CHUNK_ELEMS) + 1)

static int errors_want;
static int all_refused(struct h_client *c)
{
	return c->errors >= errors_want;
}

/* Publish `version` (anchor or delta on prod->version) and wait for the
 * broker's answer: 0 for an ACK, else the code of the first ERROR, once
 * every message of the refused version has its ERROR (so none is left to
 * answer the next version). */
static int publish_answer(struct h_client *prod, uint64_t version, int anchor)
{
	uint64_t before = prod->version;
	int first;

	errors_want = prod->errors + MSGS;
	prod->last_error_code = 0;
	h_client_publish(prod, version, anchor, 0);
	h_want = version;
	for (int i = 0; i < 100 && !h_done_acked(prod) && !prod->last_error_code; i++)
		h_pump(prod, 0, h_done_error, 1);
	if (!(first = (int)prod->last_error_code))
		return h_done_acked(prod) ? 0 : -1;
	for (int i = 0; i < 100 && !all_refused(prod); i++)
		h_pump(prod, 0, all_refused, 1);
	CHECK(all_refused(prod));
	prod->version = before; /* the broker's newest is still `before` */
	return first;
}

int main(void)
{
	static struct h_client prod, cons;
	const uint64_t far = UINT64_MAX - 1, step = DCAST_MAX_VERSION_STEP;
	tp_broker br = {0};
	uint32_t rng = 7;
	char dir[] = "/tmp/dcast_test_version_step_XXXXXX", line[160];

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	REQUIRE(h_broker_start(&br) == 0);
	h_client_open(&prod, br.pport, "step");
	REQUIRE(h_producer_join(&prod) == 0);
	h_mutate(&prod, &rng, 1);
	CHECK_ERR(publish_answer(&prod, 1, 1), 0);

	h_mutate(&prod, &rng, 1);
	CHECK_ERR(publish_answer(&prod, far, 1), DCAST_EVERSION);
	snprintf(line, sizeof(line), "version %llu is more than 2^32 (DCAST_MAX_VERSION_STEP) above "
		 "the newest committed 1", (unsigned long long)far);
	CHECK(check_count_in_file(br.log, line) >= 1);

	h_mutate(&prod, &rng, 1);
	CHECK_ERR(publish_answer(&prod, 2, 1), 0);
	h_mutate(&prod, &rng, 50);
	CHECK_ERR(publish_answer(&prod, 2 + step, 0), 0); /* at the limit: taken */

	h_client_open(&cons, br.cport, "step");
	CHECK(h_consume_until(&cons, DCAST_VERSION_NONE, 2 + step, 100) == 0);
	printf("consumer: version %llu, %llu commits\n", (unsigned long long)cons.version,
	       (unsigned long long)cons.commits);
	CHECK(cons.version == 2 + step && cons.errors == 0 && cons.digest_mismatch == 0);
	CHECK(memcmp(cons.state, prod.state, sizeof(prod.state)) == 0);
	h_client_close(&cons);
	h_client_close(&prod);
	return h_finish(&br, dir, "test_broker_version_step");
}
