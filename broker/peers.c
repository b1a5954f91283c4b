/* The broker's peer tables (struct broker_peers): a fixed array of slots,
 * found by routing id through an open-addressing index (linear probing,
 * backward-shift removal), so that each inbound message costs one hash and
 * not a scan of every slot; loops over peers stop at the high-water mark. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "broker.h"
#include "dcast_common.h"

static uint64_t rid_hash(const void *rid, size_t len)
{
	return XXH3_64bits(rid, len);
}

void broker_peer_reset(struct broker_peer *p)
{
	broker_version_put(p->cur);
	broker_manifest_put(p->manifest_sent);
	p->cur = NULL;
	p->manifest_sent = NULL;
	p->next_chunk = 0;
	p->bulk_token = 0; /* its bulk connection, if any, sees it and closes (bulk.c) */
	p->bulk_taken = 0;
}

int broker_peers_init(struct broker_peers *s, uint64_t cap)
{
	uint64_t n = 2;

	while (n < 2 * cap)
		n *= 2;
	memset(s, 0, sizeof(*s));
	s->arr = calloc(cap, sizeof(*s->arr));
	s->index = calloc(n, sizeof(*s->index));
	if (!s->arr || !s->index)
		return dcast_fail(DCAST_ENOMEM, "peer table of %llu slots", (unsigned long long)cap);
	s->cap = cap;
	s->mask = n - 1;
	return 0;
}

void broker_peers_free(struct broker_peers *s)
{
	for (uint64_t i = 0; s->arr && i < s->hi; i++)
		if (s->arr[i].used)
			broker_peer_reset(&s->arr[i]);
	free(s->arr);
	free(s->index);
	memset(s, 0, sizeof(*s));
}

/* The index position holding rid, or the empty one where it would go. */
static uint64_t index_probe(const struct broker_peers *s, const void *rid, size_t len)
{
	uint64_t i = rid_hash(rid, len) & s->mask;

	for (;; i = (i + 1) & s->mask) {
		uint32_t e = s->index[i];

		if (!e || (s->arr[e - 1].rid_len == len && !memcmp(s->arr[e - 1].rid, rid, len)))
			return i;
	}
}

/* The lowest free slot, or NULL when all cap are taken. */
static struct broker_peer *free_slot(struct broker_peers *s)
{
	for (uint64_t i = 0; i < s->cap; i++)
		if (!s->arr[i].used)
			return &s->arr[i];
	return NULL;
}

struct broker_peer *broker_peer_find(struct broker_peers *s, const zmq_msg_t *rid, int create)
{
	size_t len = zmq_msg_size((zmq_msg_t *)rid);
	const void *data = zmq_msg_data((zmq_msg_t *)rid);
	struct broker_peer *p;
	uint64_t at;

	if (len > BROKER_MAX_RID)
		return NULL;
	at = index_probe(s, data, len);
	if (s->index[at])
		return &s->arr[s->index[at] - 1];
	if (!create)
		return NULL;
	if (!(p = s->n < s->cap ? free_slot(s) : NULL)) {
		dcast_fail(DCAST_EBUSY, "all %llu peer slots in use", (unsigned long long)s->cap);
		return NULL;
	}
	memset(p, 0, sizeof(*p));
	p->used = 1;
	memcpy(p->rid, data, len);
	p->rid_len = len;
	s->index[at] = (uint32_t)(p - s->arr) + 1;
	s->n++;
	if ((uint64_t)(p - s->arr) >= s->hi)
		s->hi = (uint64_t)(p - s->arr) + 1;
	return p;
}

/* Empty index position i, moving later entries of its probe run back so
 * that every entry stays reachable from its home position. */
static void index_remove(struct broker_peers *s, uint64_t i)
{
	for (uint64_t j = (i + 1) & s->mask; s->index[j]; j = (j + 1) & s->mask) {
		const struct broker_peer *q = &s->arr[s->index[j] - 1];
		uint64_t home = rid_hash(q->rid, q->rid_len) & s->mask;

		if (((j - home) & s->mask) >= ((j - i) & s->mask)) {
			s->index[i] = s->index[j];
			i = j;
		}
	}
	s->index[i] = 0;
}

void broker_peer_forget(struct broker_peers *s, struct broker_peer *p)
{
	if (!p->used)
		return;
	broker_peer_reset(p);
	index_remove(s, index_probe(s, p->rid, p->rid_len));
	memset(p, 0, sizeof(*p));
	s->n--;
	while (s->hi && !s->arr[s->hi - 1].used)
		s->hi--;
}
