/* broker/peers.c: the peer table's index against a brute-force model.
 * 20000 random finds, creates and forgets over 40 routing ids (1 to 255
 * bytes) on tables of 1, 3 and 8 slots, whose small indexes make probe runs
 * collide and wrap; after every step each id is found exactly when the
 * model has it, in the slot it was given, the lowest free slot is the one
 * taken, and n and the high-water mark match the slots in use.  A full
 * table refuses with DCAST_EBUSY; an id over BROKER_MAX_RID is refused. */
#include "../broker/peers.c"
#include "check.h"

#define IDS 40

/* The table holds no versions or manifests here: reset must see none. */
void broker_version_put(struct broker_version *v)
{
	CHECK(v == NULL);
}

void broker_manifest_put(struct broker_manifest *mf)
{
	CHECK(mf == NULL);
}

static uint8_t ids[IDS][BROKER_MAX_RID + 1];
static size_t id_len[IDS];
static int64_t model_slot[IDS]; /* -1: not in the table */
static uint32_t rng = 777;

static uint32_t next(void)
{
	return rng = rng * 1664525u + 1013904223u;
}

static struct broker_peer *find(struct broker_peers *s, unsigned id, int create)
{
	zmq_msg_t m;
	struct broker_peer *p;

	REQUIRE(zmq_msg_init_size(&m, id_len[id]) == 0);
	memcpy(zmq_msg_data(&m), ids[id], id_len[id]);
	p = broker_peer_find(s, &m, create);
	zmq_msg_close(&m);
	return p;
}

static int64_t lowest_free(const struct broker_peers *s)
{
	for (uint64_t i = 0; i < s->cap; i++)
		if (!s->arr[i].used)
			return (int64_t)i;
	return -1;
}

/* Every id found exactly where the model says; counts and hi agree. */
static void check_table(struct broker_peers *s)
{
	uint64_t used = 0, hi = 0;

	for (unsigned id = 0; id < IDS; id++) {
		struct broker_peer *p = find(s, id, 0);

		CHECK(model_slot[id] < 0 ? p == NULL : p == &s->arr[model_slot[id]]);
		if (p)
			CHECK(p->used && p->rid_len == id_len[id] && !memcmp(p->rid, ids[id], id_len[id]));
	}
	for (uint64_t i = 0; i < s->cap; i++)
		if (s->arr[i].used) {
			used++;
			hi = i + 1;
		}
	CHECK(s->n == used && s->hi == hi);
}

static void step(struct broker_peers *s)
{
	unsigned id = next() % IDS;

	if (model_slot[id] >= 0 && next() % 2) {
		broker_peer_forget(s, &s->arr[model_slot[id]]);
		model_slot[id] = -1;
	} else if (model_slot[id] < 0) {
		int64_t want = lowest_free(s);
		struct broker_peer *p = find(s, id, 1);

		if (want < 0) {
			CHECK(p == NULL && strstr(dcast_last_error(), "peer slots in use"));
		} else {
			CHECK(p == &s->arr[want]);
			model_slot[id] = want;
		}
	}
	check_table(s);
}

static void run(uint64_t cap)
{
	struct broker_peers s;

	REQUIRE(broker_peers_init(&s, cap) == 0);
	for (unsigned id = 0; id < IDS; id++)
		model_slot[id] = -1;
	for (int i = 0; i < 20000 / 3; i++)
		step(&s);
	if (lowest_free(&s) >= 0) { /* forgetting a free slot changes nothing */
		broker_peer_forget(&s, &s.arr[lowest_free(&s)]);
		check_table(&s);
	}
	broker_peers_free(&s);
	CHECK(s.arr == NULL && s.hi == 0);
}

int main(void)
{
	zmq_msg_t big;
	struct broker_peers s;

	for (unsigned id = 0; id < IDS; id++) {
		id_len[id] = id < 4 ? BROKER_MAX_RID - id : 1 + next() % 8; /* short ids share bytes */
		for (size_t j = 0; j < id_len[id]; j++)
			ids[id][j] = (uint8_t)(next() % 3);
		ids[id][0] = (uint8_t)id; /* all distinct */
	}
	run(1);
	run(3);
	run(8);
	REQUIRE(broker_peers_init(&s, 4) == 0);
	REQUIRE(zmq_msg_init_size(&big, BROKER_MAX_RID + 1) == 0);
	memset(zmq_msg_data(&big), 7, BROKER_MAX_RID + 1);
	CHECK(broker_peer_find(&s, &big, 1) == NULL && s.n == 0);
	zmq_msg_close(&big);
	broker_peers_free(&s);
	return check_done("test_peers");
}
