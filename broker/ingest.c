/* Producer ingest: HELLO/MANIFEST/CHUNK/COMMIT from producer parts, the one
 * open version per model (struct broker_pending) and its commit into the
 * log.  The relay (relay.c) feeds upstream versions through the same
 * pending functions as a single part.  Rules: docs/protocol.md,
 * "Producer part and broker". */
#include <string.h>
#include "broker.h"
#include "auth.h" /* producer keys tied to models */
#include "dcast_common.h"
#include "dcast_slab.h"
#include "dcast_fit.h" /* CHUNK and COMMIT against the manifest */
#include "dcast_ranges.h" /* COMMIT digests in range order */
#include "deltacast/codec.h" /* dcast_checksum */
#include "durable.h" /* --data-dir: ACK on the durable completion */

#define MAX_PART_CHUNKS (1u << 24) /* chunks of one part's version held at once */
#define PAYLOAD_COPY_BELOW (64u << 10)


/* Free an open version and take its memory off the broker's total (the
 * sum of every open version's, asserted). */
static void pending_free(struct broker *b, struct broker_pending *pd)
{
	if (!pd)
		return;
	DCAST_ASSERT(b->pending_total_bytes >= pd->mem_bytes);
	b->pending_total_bytes -= pd->mem_bytes;
	for (uint32_t i = 0; i < pd->parts; i++) {
		struct broker_part *pt = &pd->part[i];

		for (uint32_t j = 0; j < pt->n; j++) {
			zmq_msg_close(&pt->chunks[j].payload);
			broker_segfile_put(pt->chunks[j].file);
		}
		free(pt->chunks);
		free(pt->digests);
		free(pt->seq_seen);
	}
	free(pd->part);
	broker_version_put(pd->cut); /* consumers streaming it keep theirs */
	broker_manifest_put(pd->manifest);
	broker_segfile_put(pd->spill); /* a dropped version's spilled bytes go with it */
	free(pd);
}

/* ---- the debug tier (DCAST_DEBUG_ASSERT): each step of an open version
 * and of a producer's credit checked at both its ends; O(parts) a step,
 * O(chunks) once, at a part's COMMIT ---- */

/* The broker's total of open versions' memory is the sum of theirs.
 * O(models). */
static int check_pending_total(const struct broker *b)
{
	uint64_t sum = 0;

	for (uint32_t i = 0; i < b->n_models; i++)
		if (b->models[i]->pending)
			sum += b->models[i]->pending->mem_bytes;
	DCAST_ASSERT(sum == b->pending_total_bytes);
	return 1;
}

/* m's open version: above the newest committed (a delta on it), its parts'
 * committed flags counted, its memory at least its parts' payloads. */
static int check_pending(const struct broker_model *m)
{
	const struct broker_pending *pd = m->pending;
	uint64_t newest = broker_model_newest(m), bytes = 0;
	uint32_t committed = 0;

	DCAST_ASSERT(pd && pd->parts >= 1 && pd->manifest);
	DCAST_ASSERT(newest == DCAST_VERSION_NONE || pd->version > newest);
	DCAST_ASSERT(pd->anchor ? pd->base_version == DCAST_VERSION_NONE : pd->base_version == newest);
	for (uint32_t i = 0; i < pd->parts; i++) {
		const struct broker_part *pt = &pd->part[i];
		DCAST_ASSERT(pt->n <= pt->cap && (!pt->committed || pt->seen));
		committed += (uint32_t)pt->committed;
		bytes += pt->bytes;
	}
	DCAST_ASSERT(committed == pd->n_committed && committed <= pd->parts);
	DCAST_ASSERT(bytes <= pd->mem_bytes);
	return 1;
}

/* A committed part: its chunks numbered 0..n-1 in order, their payloads
 * summing to its bytes.  O(chunks). */
static int check_part(const struct broker_part *pt)
{
	uint64_t bytes = 0;

	for (uint32_t i = 0; i < pt->n; i++) {
		DCAST_ASSERT(pt->chunks[i].c.seq == i);
		bytes += pt->chunks[i].c.payload_bytes;
	}
	DCAST_ASSERT(pt->committed && bytes == pt->bytes);
	return 1;
}

/* A producer's credit: what it sent since its HELLO never above what was
 * granted, and the grant never below the window it started with. */
static int check_producer_credit(const struct broker *b, const struct broker_peer *p)
{
	DCAST_ASSERT(p->sent_bytes <= p->credit_bytes);
	DCAST_ASSERT(p->credit_bytes >= b->cfg.producer_window_bytes);
	return 1;
}

/* ERROR to every producer of m.  The caller may still report the reason
 * it holds in dcast_last_error(): a send that fails (a producer gone, not
 * yet timed out) must not replace it (found by tests/tools/fuzz_broker). */
static void producers_error(struct broker *b, struct broker_model *m, int code,
			    uint64_t version, const char *text)
{
	char reason[DCAST_MAX_TEXT + 1];

	snprintf(reason, sizeof(reason), "%s", dcast_last_error());
	for (uint64_t i = 0; i < b->prod.hi; i++) {
		struct broker_peer *p = &b->prod.arr[i];

		if (p->used && p->model == m) {
			dcast_wire_send_error(b->producers, p->rid, p->rid_len, code, m->name,
					      version, text);
			p->last_send_ms = dcast_now_ms();
		}
	}
	dcast_fail(code, "%s", reason);
}

void broker_pending_abort(struct broker *b, struct broker_model *m, const char *why)
{
	struct broker_pending *pd = m->pending;
	char text[DCAST_MAX_TEXT + 1];

	if (!pd)
		return;
	DCAST_DEBUG_ASSERT(check_pending(m) && check_pending_total(b));
	m->pending = NULL;
	if (pd->cut)
		broker_cut_abort(b, m, pd->cut);
	if (why) {
		snprintf(text, sizeof(text), "model %s version %llu dropped: %s", m->name,
			 (unsigned long long)pd->version, why);
		DCAST_LOG_W("%s", text);
		if (!m->relayed)
			producers_error(b, m, DCAST_EABORTED, pd->version, text);
		m->versions_aborted++;
		b->stats.versions_aborted++;
	}
	pending_free(b, pd);
	DCAST_DEBUG_ASSERT(!m->pending && check_pending_total(b));
}

static int version_rules(const struct broker_model *m, const dcast_chunk *c)
{
	uint64_t newest = broker_model_newest(m);

	if (newest != DCAST_VERSION_NONE && c->version <= newest)
		return dcast_fail(DCAST_EVERSION, "model %s: version %llu is not above the newest committed %llu",
				  m->name, (unsigned long long)c->version, (unsigned long long)newest);
	/* A version near 2^64 would leave a trainer no numbers above it: only a
	 * new run (no committed version) starts where it likes. */
	if (newest != DCAST_VERSION_NONE && c->version - newest > DCAST_MAX_VERSION_STEP)
		return dcast_fail(DCAST_EVERSION, "model %s: version %llu is more than 2^32 "
				  "(DCAST_MAX_VERSION_STEP) above the newest committed %llu",
				  m->name, (unsigned long long)c->version, (unsigned long long)newest);
	if (m->lost_version != DCAST_VERSION_NONE && c->version <= m->lost_version)
		return dcast_fail(DCAST_EVERSION, "model %s: version %llu is not above %llu, the newest "
				  "version lost from a damaged segment (its number is spent)",
				  m->name, (unsigned long long)c->version,
				  (unsigned long long)m->lost_version);
	if (c->anchor)
		return 0;
	if (newest == DCAST_VERSION_NONE || m->need_anchor)
		return dcast_fail(DCAST_EVERSION, "model %s: delta %llu refused, the next version must be an anchor",
				  m->name, (unsigned long long)c->version);
	if (c->base_version != newest)
		return dcast_fail(DCAST_EVERSION, "model %s: delta %llu has base_version %llu, newest committed is %llu",
				  m->name, (unsigned long long)c->version,
				  (unsigned long long)c->base_version, (unsigned long long)newest);
	return 0;
}

/* An empty version for consumers, of pd's number, kind and manifest (one
 * reference), or NULL (DCAST_ENOMEM set). */
static struct broker_version *version_new(const struct broker_model *m,
					  const struct broker_pending *pd)
{
	struct broker_version *v = calloc(1, sizeof(*v));

	if (!v) {
		dcast_fail(DCAST_ENOMEM, "model %s: version %llu", m->name,
			   (unsigned long long)pd->version);
		return NULL;
	}
	v->refs = 1;
	v->version = pd->version;
	v->base_version = pd->base_version;
	v->anchor = pd->anchor;
	v->manifest = pd->manifest;
	pd->manifest->refs++;
	zmq_msg_init(&v->commit_hdr);
	return v;
}

/* --cut-through: the version consumers stream while pd is open, empty. */
static int cut_open(struct broker_model *m, struct broker_pending *pd)
{
	if (!(pd->cut = version_new(m, pd)))
		return DCAST_ENOMEM;
	pd->cut->open = 1;
	return 0;
}

int broker_pending_open(struct broker *b, struct broker_model *m, const dcast_chunk *c,
			uint32_t parts)
{
	struct broker_pending *pd;
	int rc;

	if (!m->manifest)
		return dcast_fail(DCAST_ESTATE, "model %s: CHUNK before any MANIFEST", m->name);
	if ((rc = version_rules(m, c)))
		return rc;
	DCAST_DEBUG_ASSERT(!m->pending && check_pending_total(b));
	if (!(pd = calloc(1, sizeof(*pd))) || !(pd->part = calloc(parts, sizeof(*pd->part)))) {
		free(pd);
		return dcast_fail(DCAST_ENOMEM, "model %s: open version %llu", m->name,
				  (unsigned long long)c->version);
	}
	pd->version = c->version;
	pd->base_version = c->anchor ? DCAST_VERSION_NONE : c->base_version;
	pd->anchor = c->anchor;
	pd->parts = parts;
	pd->created_ms = dcast_now_ms();
	pd->manifest = m->manifest;
	m->manifest->refs++;
	if (b->cfg.cut_through && (rc = cut_open(m, pd))) {
		pending_free(b, pd);
		return rc;
	}
	m->pending = pd;
	DCAST_DEBUG_ASSERT(check_pending(m) && check_pending_total(b) && !pd->mem_bytes);
	return 0;
}

/* Parts of one version disagree on anchor or base: their baselines went
 * apart (one part failed a version the others had taken), and each would
 * send the same again: a delta from the part that holds the newest
 * version, an anchor from the one that does not, for ever.  The version is
 * dropped, and every part is asked for an anchor (WELCOME need_anchor),
 * which needs no baseline.  The refusal stays in dcast_last_error(). */
static int parts_disagree(struct broker *b, struct broker_model *m, uint64_t version)
{
	char text[DCAST_MAX_TEXT + 1];

	snprintf(text, sizeof(text), "model %s version %llu: parts disagree on anchor/base_version; "
		 "every part sends an anchor next", m->name, (unsigned long long)version);
	if (!m->relayed) {
		broker_pending_abort(b, m, "parts disagree on anchor/base_version; every part sends "
				     "an anchor next");
		if (!m->need_anchor)
			broker_log_need_anchor(b, m);
	}
	return dcast_fail(DCAST_EVERSION, "%s", text);
}

/* The version's open state may be dropped here (parts_disagree): callers
 * read m->pending again after an error. */
static int pending_match(struct broker *b, struct broker_model *m, const struct broker_pending *pd,
			 uint64_t version, int anchor, uint64_t base, uint32_t part)
{
	if (version != pd->version)
		return dcast_fail(DCAST_EVERSION, "model %s: version %llu while version %llu is open",
				  m->name, (unsigned long long)version,
				  (unsigned long long)pd->version);
	if (!anchor != !pd->anchor || (!anchor && base != pd->base_version))
		return parts_disagree(b, m, version);
	if (part >= pd->parts)
		return dcast_fail(DCAST_EFIELD_RANGE, "model %s version %llu: part %u, version has %u parts",
				  m->name, (unsigned long long)version, part, pd->parts);
	if (pd->part[part].committed)
		return dcast_fail(DCAST_ESTATE, "model %s version %llu: part %u already committed",
				  m->name, (unsigned long long)version, part);
	return 0;
}

/* What one CHUNK of an open version holds beyond its payload bytes: its
 * slot in the part's array (grown by doubling: up to two slots a chunk) and
 * the payload's allocation.  Measured: 4,000,000 one-byte chunks held
 * 1.5 GiB while counted as 4 MB. */
#define PENDING_CHUNK_BYTES (2 * sizeof(struct broker_pending_chunk) + BROKER_ALLOC_BYTES)

/* Count `bytes` more memory against --max-pending-bytes (this open version)
 * and --max-pending-total-bytes (those of all models), or refuse them
 * (DCAST_ETOO_LARGE, naming the cap, what was held and what came). */
static int pending_charge(struct broker *b, struct broker_model *m, uint64_t bytes,
			  const char *what)
{
	struct broker_pending *pd = m->pending;

	if (bytes > b->cfg.max_pending_bytes || pd->mem_bytes > b->cfg.max_pending_bytes - bytes)
		return dcast_fail(DCAST_ETOO_LARGE, "model %s version %llu: %s costing %llu bytes of memory "
				  "would take the open version past --max-pending-bytes %llu (it holds %llu: "
				  "payloads, %zu bytes a chunk, 32 a digest)", m->name,
				  (unsigned long long)pd->version, what, (unsigned long long)bytes,
				  (unsigned long long)b->cfg.max_pending_bytes,
				  (unsigned long long)pd->mem_bytes, (size_t)PENDING_CHUNK_BYTES);
	if (b->pending_total_bytes + bytes > b->cfg.max_pending_total_bytes)
		return dcast_fail(DCAST_ETOO_LARGE, "model %s version %llu: %s would take the open "
				  "versions of all models past --max-pending-total-bytes %llu", m->name,
				  (unsigned long long)pd->version, what,
				  (unsigned long long)b->cfg.max_pending_total_bytes);
	pd->mem_bytes += bytes;
	b->pending_total_bytes += bytes;
	return 0;
}

/* Room for one more of n elements of `size` bytes in *arr (cap slots,
 * doubled from 64, at most max).  Errors: DCAST_ETOO_LARGE naming what
 * (`what`) and the limit, DCAST_ENOMEM. */
static int array_reserve(void **arr, uint32_t n, uint32_t *cap, size_t size, uint32_t max,
			 const char *what)
{
	uint32_t c;
	void *a;

	if (n < *cap)
		return 0;
	if (*cap >= max)
		return dcast_fail(DCAST_ETOO_LARGE, "more than %u chunks in one %s", max, what);
	c = *cap ? *cap * 2 : 64;
	if (!(a = realloc(*arr, (size_t)c * size)))
		return dcast_fail(DCAST_ENOMEM, "%s's chunk list of %u", what, c);
	*arr = a;
	*cap = c;
	return 0;
}

static int part_reserve(struct broker_part *pt)
{
	return array_reserve((void **)&pt->chunks, pt->n, &pt->cap, sizeof(*pt->chunks),
			     MAX_PART_CHUNKS, "part");
}

/* Keep a payload for the log: a copy, and ZeroMQ's message goes back to
 * the heap for the next.  ZeroMQ receives small messages into a shared
 * decoder buffer (ZMQ_ZERO_COPY_RECV), which one kept message can pin
 * whole: those get their own exact allocation.  Larger ones (an anchor's
 * 2 MiB) go to huge-page slabs: kept as received, each was fresh heap
 * faulted in 4 KiB at a time, most of the broker's CPU to take
 * an anchor (docs/operations.md, "The broker's heap").  Where no
 * memory is had for the copy, or huge pages are off
 * (DELTACAST_HUGE_PAGES=0: a copy onto 4 KiB pages saves no fault), the
 * message itself is kept. */
static void payload_keep(struct dcast_slab_pool *pool, zmq_msg_t *dst, dcast_wire_in *in)
{
	size_t len = in->has_payload ? zmq_msg_size(&in->payload) : 0;

	if (len && (len < PAYLOAD_COPY_BELOW ? !zmq_msg_init_size(dst, len)
					     : dcast_huge_pages() && !dcast_slab_msg(pool, dst, len))) {
		memcpy(zmq_msg_data(dst), zmq_msg_data(&in->payload), len);
		return;
	}
	zmq_msg_init(dst);
	if (len)
		zmq_msg_move(dst, &in->payload);
}

/* --data-dir: the payload goes to the open version's spill file, not the
 * heap (ondisk.c).  1 when it did; 0 without a data dir, or when the write
 * failed (logged once per version: the payload is kept in memory). */
static int payload_spill(struct broker *b, struct broker_pending *pd,
			 struct broker_pending_chunk *pc, dcast_wire_in *in)
{
	size_t len = in->has_payload ? zmq_msg_size(&in->payload) : 0;
	int had = pd->spill != NULL;

	if (!broker_durable_on(b) || pd->spill_end == UINT64_MAX)
		return 0;
	if (!broker_spill_write(b->cfg.data_dir, &pd->spill, &pd->spill_end,
				len ? zmq_msg_data(&in->payload) : "", len, &pc->file, &pc->file_off)) {
		zmq_msg_init(&pc->payload);
		return 1;
	}
	DCAST_LOG_W("version %llu: %s; its payloads stay in memory",
		    (unsigned long long)pd->version, dcast_last_error());
	if (!had) {
		broker_segfile_put(pd->spill);
		pd->spill = NULL;
	}
	pd->spill_end = UINT64_MAX; /* no more tries for this version */
	return 0;
}

/* CHUNK in (checked, its payload summing to sum) joins part pt of m's open
 * version, its memory charged (with `extra` bytes held beside it);
 * nothing changes on an error. */
static int part_take(struct broker *b, struct broker_model *m, struct broker_part *pt,
		     dcast_wire_in *in, uint64_t sum, uint64_t extra)
{
	const dcast_chunk *c = &in->msg.u.chunk;
	struct broker_pending_chunk *pc;
	uint64_t bytes0 = pt->bytes;
	uint32_t n0 = pt->n;
	int rc;

	if ((rc = part_reserve(pt)) ||
	    (rc = pending_charge(b, m, PENDING_CHUNK_BYTES + extra + c->payload_bytes, "a CHUNK")))
		return rc;
	pc = &pt->chunks[pt->n++];
	pc->c = *c;
	pc->payload_sum = sum;
	pc->file = NULL;
	if (!payload_spill(b, m->pending, pc, in))
		payload_keep(&m->slab, &pc->payload, in);
	pt->seen = 1;
	pt->last_ms = dcast_now_ms();
	pt->bytes += c->payload_bytes;
	b->stats.chunks_in++;
	b->stats.bytes_in += c->payload_bytes;
	DCAST_DEBUG_ASSERT(pt->n == n0 + 1 && pt->bytes == bytes0 + c->payload_bytes);
	return 0;
}

/* ch's payload fields from pc's (where it lies, its length and sum), its
 * payload message empty: the caller moves or shares pc's. */
static void chunk_payload_from(struct broker_chunk *ch, const struct broker_pending_chunk *pc)
{
	zmq_msg_init(&ch->payload);
	ch->payload_sum = pc->payload_sum;
	ch->payload_len = pc->c.payload_bytes;
	ch->file = pc->file;
	ch->file_off = pc->file_off;
}

/* ---- --cut-through: the open version numbered for consumers as it is
 * accepted (pd->cut) ---- */

/* What a chunk of an open version holds with --cut-through beyond
 * PENDING_CHUNK_BYTES and its header frame: its slot in the cut version
 * (grown by doubling) and the frame's allocation.  Its payload is shared
 * with the part's chunk (a copy of the message, or the same spill file). */
#define CUT_CHUNK_BYTES (2 * sizeof(struct broker_chunk) + BROKER_ALLOC_BYTES)

/* The header frame of a chunk as consumers get it: part 0, seq its index
 * in the version. */
static int chunk_header(const dcast_chunk *c, uint32_t seq, zmq_msg_t *out)
{
	dcast_msg hm;

	dcast_msg_init(&hm, DCAST_MSG_CHUNK);
	hm.u.chunk = *c;
	hm.u.chunk.part = 0;
	hm.u.chunk.seq = seq;
	return broker_frame_encode(&hm, out);
}

static int seq_repeat(const struct broker_part *pt, uint32_t seq)
{
	return seq < pt->seq_bits && (pt->seq_seen[seq / 64] >> (seq % 64) & 1);
}

/* Room in pt's bitmap of accepted seqs for seq (at most MAX_PART_CHUNKS
 * bits, 2 MiB).  Errors: DCAST_ETOO_LARGE naming the limit, DCAST_ENOMEM. */
static int seq_reserve(struct broker_part *pt, uint32_t seq)
{
	uint32_t bits = pt->seq_bits ? pt->seq_bits : 4096;
	uint64_t *n;

	if (seq >= MAX_PART_CHUNKS)
		return dcast_fail(DCAST_ETOO_LARGE, "CHUNK.seq %u: a part has at most %u chunks",
				  seq, MAX_PART_CHUNKS);
	while (bits <= seq)
		bits *= 2;
	if (bits == pt->seq_bits)
		return 0;
	if (!(n = realloc(pt->seq_seen, bits / 8)))
		return dcast_fail(DCAST_ENOMEM, "seq bitmap of %u bits", bits);
	memset((char *)n + pt->seq_bits / 8, 0, (bits - pt->seq_bits) / 8);
	pt->seq_seen = n;
	pt->seq_bits = bits;
	return 0;
}

static int cut_reserve(struct broker_version *v)
{
	return array_reserve((void **)&v->chunks, v->n_chunks, &v->cap_chunks, sizeof(*v->chunks),
			     UINT32_MAX / 2, "version");
}

/* pc, just accepted, is numbered next in v: its header frame hdr (taken),
 * its payload shared. */
static void cut_append(struct broker_version *v, struct broker_pending_chunk *pc, zmq_msg_t *hdr)
{
	struct broker_chunk *ch = &v->chunks[v->n_chunks];

	memset(ch, 0, sizeof(*ch));
	zmq_msg_init(&ch->hdr);
	zmq_msg_move(&ch->hdr, hdr);
	chunk_payload_from(ch, pc);
	if (!pc->file)
		zmq_msg_copy(&ch->payload, &pc->payload);
	else
		pc->file->refs++;
	v->payload_bytes += ch->payload_len;
	v->n_chunks++;
	DCAST_ASSERT(v->open && v->n_chunks <= v->cap_chunks);
}

/* --cut-through: CHUNK in joins part pt as part_take does and, numbered
 * next, the cut version that consumers stream.  A repeat of a seq the part
 * has is dropped (0: nothing changes).  Nothing changes on an error. */
static int cut_take(struct broker *b, struct broker_model *m, struct broker_part *pt,
		    dcast_wire_in *in, uint64_t sum)
{
	struct broker_version *v = m->pending->cut;
	const dcast_chunk *c = &in->msg.u.chunk;
	zmq_msg_t hdr;
	int rc;

	if (seq_repeat(pt, c->seq))
		return 0;
	if ((rc = seq_reserve(pt, c->seq)) || (rc = cut_reserve(v)) ||
	    (rc = chunk_header(c, v->n_chunks, &hdr)))
		return rc;
	if ((rc = part_take(b, m, pt, in, sum, CUT_CHUNK_BYTES + zmq_msg_size(&hdr)))) {
		zmq_msg_close(&hdr);
		return rc;
	}
	cut_append(v, &pt->chunks[pt->n - 1], &hdr);
	pt->seq_seen[c->seq / 64] |= 1ull << (c->seq % 64);
	return 0;
}

int broker_pending_chunk(struct broker *b, struct broker_model *m, uint32_t part,
			 dcast_wire_in *in)
{
	struct broker_pending *pd = m->pending;
	const dcast_chunk *c = &in->msg.u.chunk;
	uint64_t sum, mem0 = pd->mem_bytes;
	int rc;

	DCAST_DEBUG_ASSERT(check_pending(m) && check_pending_total(b));
	if ((rc = pending_match(b, m, pd, c->version, c->anchor, c->base_version, part)))
		return rc;
	sum = dcast_checksum(zmq_msg_data(&in->payload), c->payload_bytes);
	if ((rc = dcast_chunk_sound(c, dcast_manifest_descs(&pd->manifest->m), sum))) /* header too */
		return rc;
	if (pd->cut)
		rc = cut_take(b, m, &pd->part[part], in, sum);
	else
		rc = part_take(b, m, &pd->part[part], in, sum, 0);
	DCAST_DEBUG_ASSERT(check_pending(m) && check_pending_total(b) &&
			   (pd->cut || pd->mem_bytes == mem0 + (rc ? 0 : PENDING_CHUNK_BYTES +
								  c->payload_bytes)));
	return rc;
}

static int seq_cmp(const void *a, const void *b)
{
	uint32_t x = ((const struct broker_pending_chunk *)a)->c.seq;
	uint32_t y = ((const struct broker_pending_chunk *)b)->c.seq;

	return (x > y) - (x < y);
}

/* Sort a part's chunks by seq and drop repeats (a chunk seen twice is ignored). */
static void part_dedupe(struct broker_part *pt)
{
	uint32_t w = 0;

	if (!pt->n)
		return; /* a part of no chunks: chunks may be NULL */
	qsort(pt->chunks, pt->n, sizeof(*pt->chunks), seq_cmp);
	for (uint32_t r = 0; r < pt->n; r++) {
		if (w && pt->chunks[w - 1].c.seq == pt->chunks[r].c.seq) {
			pt->bytes -= pt->chunks[r].c.payload_bytes;
			zmq_msg_close(&pt->chunks[r].payload);
			broker_segfile_put(pt->chunks[r].file);
			continue;
		}
		pt->chunks[w++] = pt->chunks[r];
	}
	pt->n = w;
}

static int part_matches_commit(const struct broker_model *m, struct broker_part *pt,
			       const dcast_commit *c)
{
	part_dedupe(pt);
	if (pt->n != c->chunks || pt->bytes != c->bytes)
		return dcast_fail(DCAST_ECORRUPT, "model %s version %llu part %u: COMMIT says %u chunks / %llu bytes, received %u / %llu",
				  m->name, (unsigned long long)c->version, c->part, c->chunks,
				  (unsigned long long)c->bytes, pt->n, (unsigned long long)pt->bytes);
	for (uint32_t i = 0; i < pt->n; i++)
		if (pt->chunks[i].c.seq != i)
			return dcast_fail(DCAST_ECORRUPT, "model %s version %llu part %u: chunk seq %u missing",
					  m->name, (unsigned long long)c->version, c->part, i);
	return 0;
}

static int digests_check(const struct broker_manifest *mf, const dcast_commit *c)
{
	int rc = 0;

	for (uint32_t i = 0; !rc && i < c->n_digests; i++)
		rc = dcast_digest_fits(&c->digests[i], i, dcast_manifest_descs(&mf->m));
	return rc;
}

struct span {
	uint64_t tensor, start, count;
};

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	return x->start < y->start ? -1 : x->start > y->start;
}

/* Walk spans sorted by (tensor, start): each tensor covered from 0 to its
 * last element, without gap or overlap. */
static int spans_cover(const struct broker_manifest *mf, const struct span *s, uint64_t n)
{
	uint64_t k = 0;

	for (uint32_t t = 0; t < mf->m.n_tensors; t++) {
		uint64_t next = 0, elems = dcast_tensor_elems(&mf->m.tensors[t]);
		for (; k < n && s[k].tensor == t; k++) {
			if (s[k].start != next)
				return dcast_fail(DCAST_ECORRUPT, "anchor: tensor %s elements [%llu, %llu) %s",
						  mf->m.tensors[t].name, (unsigned long long)next,
						  (unsigned long long)s[k].start,
						  s[k].start > next ? "missing" : "sent twice");
			next += s[k].count;
		}
		if (next != elems)
			return dcast_fail(DCAST_ECORRUPT, "anchor: tensor %s has %llu of its %llu elements",
					  mf->m.tensors[t].name, (unsigned long long)next,
					  (unsigned long long)elems);
	}
	return 0;
}

/* Chunks over all parts (repeats dropped). */
static uint64_t pending_chunks(const struct broker_pending *pd)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < pd->parts; i++)
		n += pd->part[i].n;
	return n;
}

/* An anchor carries every element of every tensor of its manifest, once;
 * anything less would replace the log with a version no consumer can take
 * (an empty anchor poisoned a model for good). */
static int anchor_complete(const struct broker_pending *pd)
{
	uint64_t n = pending_chunks(pd), k = 0;
	struct span *s;
	int rc;

	if (!(s = malloc((n ? n : 1) * sizeof(*s))))
		return dcast_fail(DCAST_ENOMEM, "anchor of %llu chunks", (unsigned long long)n);
	for (uint32_t i = 0; i < pd->parts; i++)
		for (uint32_t j = 0; j < pd->part[i].n; j++, k++) {
			const dcast_chunk *c = &pd->part[i].chunks[j].c;
			s[k] = (struct span){c->tensor, c->start, c->count};
		}
	qsort(s, n, sizeof(*s), span_cmp);
	rc = spans_cover(pd->manifest, s, n);
	free(s);
	return rc;
}

static int range_cmp(const void *a, const void *b)
{
	return dcast_range_key_cmp(a, b);
}

/* Every element part pt's chunks write lies in a range of its COMMIT c's
 * digests: a range left out would be checked by no consumer, and each
 * that verifies would refuse the version for it. */
static int part_digests_hold(const struct broker_manifest *mf, const struct broker_part *pt,
			     const dcast_commit *c)
{
	struct span *s = malloc((pt->n ? pt->n : 1) * sizeof(*s));
	dcast_range_digest *d = malloc((c->n_digests ? c->n_digests : 1) * sizeof(*d));
	dcast_digest_cover cv = {d, sizeof(*d), c->n_digests, 0};
	uint32_t n = 0;
	int rc = 0;

	if (!s || !d) {
		free(s), free(d);
		return dcast_fail(DCAST_ENOMEM, "COMMIT of %u chunks, %u digests", pt->n, c->n_digests);
	}
	memcpy(d, c->digests, c->n_digests * sizeof(*d));
	qsort(d, c->n_digests, sizeof(*d), range_cmp);
	for (uint32_t j = 0; j < pt->n; j++) {
		const dcast_chunk *k = &pt->chunks[j].c;
		if (k->encoding == DCAST_ENC_DENSE || k->changed)
			s[n++] = (struct span){k->tensor, k->start, k->count};
	}
	qsort(s, n, sizeof(*s), span_cmp);
	for (uint32_t j = 0; !rc && j < n; j++)
		rc = dcast_digests_hold(&cv, dcast_manifest_descs(&mf->m), (uint32_t)s[j].tensor, s[j].start,
					s[j].count);
	free(s);
	free(d);
	return rc;
}

/* The committed chunk takes the open one's payload, in memory or spilled. */
static void chunk_take(struct broker_chunk *ch, struct broker_pending_chunk *pc)
{
	chunk_payload_from(ch, pc);
	zmq_msg_move(&ch->payload, &pc->payload);
	pc->file = NULL;
}

static int version_chunks(struct broker_version *v, struct broker_pending *pd)
{
	uint32_t k = 0;
	int rc;

	for (uint32_t i = 0; i < pd->parts; i++) { /* parts deduplicated, repeats dropped */
		v->n_chunks += pd->part[i].n;
		v->payload_bytes += pd->part[i].bytes;
	}
	if (!(v->chunks = calloc(v->n_chunks ? v->n_chunks : 1, sizeof(*v->chunks))))
		return dcast_fail(DCAST_ENOMEM, "version of %u chunks", v->n_chunks);
	for (uint32_t i = 0; i < pd->parts; i++)
		for (uint32_t j = 0; j < pd->part[i].n; j++, k++) {
			if ((rc = chunk_header(&pd->part[i].chunks[j].c, k, &v->chunks[k].hdr))) {
				v->n_chunks = k; /* what is initialised, for the put */
				return rc;
			}
			chunk_take(&v->chunks[k], &pd->part[i].chunks[j]);
		}
	return 0;
}

static int version_digests(struct broker_version *v, const struct broker_pending *pd)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < pd->parts; i++)
		n += pd->part[i].n_digests;
	if (n > DCAST_MAX_DIGESTS)
		return dcast_fail(DCAST_ETOO_LARGE, "version %llu: %llu digests over all parts, limit %d",
				  (unsigned long long)v->version, (unsigned long long)n,
				  DCAST_MAX_DIGESTS);
	if (n && !(v->digests = malloc(n * sizeof(*v->digests))))
		return dcast_fail(DCAST_ENOMEM, "version %llu: %llu digests",
				  (unsigned long long)v->version, (unsigned long long)n);
	for (uint32_t i = 0; i < pd->parts; i++) {
		if (!pd->part[i].n_digests)
			continue;
		memcpy(v->digests + v->n_digests, pd->part[i].digests,
		       pd->part[i].n_digests * sizeof(*v->digests));
		v->n_digests += pd->part[i].n_digests;
	}
	return 0;
}

/* --cut-through: the cut version, which consumers may be streaming already,
 * closed with the parts' digests and its COMMIT frame: a new reference in
 * *out (its open flag is cleared once it is in the log).  Its chunks are
 * the parts' in acceptance order, so a consumer that took a prefix goes
 * on at the same index.  On an error it stays as it was. */
static int cut_close(struct broker_model *m, struct broker_pending *pd,
		     struct broker_version **out)
{
	struct broker_version *v = pd->cut;
	int rc;

	DCAST_ASSERT(v->open && !v->n_digests && v->n_chunks == pending_chunks(pd));
	if ((rc = version_digests(v, pd)) || (rc = broker_commit_frame(v, m->name))) {
		free(v->digests);
		v->digests = NULL;
		v->n_digests = 0;
		return rc;
	}
	v->refs++;
	*out = v;
	return 0;
}

/* Build the version consumers will see from a fully committed pending one. */
static int version_build(struct broker_model *m, struct broker_pending *pd,
			 struct broker_version **out)
{
	struct broker_version *v;
	int rc;

	if (pd->cut)
		return cut_close(m, pd, out);
	if (!(v = version_new(m, pd)))
		return DCAST_ENOMEM;
	if ((rc = version_chunks(v, pd)) || (rc = version_digests(v, pd)) ||
	    (rc = broker_commit_frame(v, m->name))) {
		broker_version_put(v);
		return rc;
	}
	*out = v;
	return 0;
}

static void producers_ack(struct broker *b, struct broker_model *m, uint64_t version)
{
	dcast_msg a;

	dcast_msg_init(&a, DCAST_MSG_ACK);
	snprintf(a.u.ack.model, sizeof(a.u.ack.model), "%s", m->name);
	a.u.ack.version = version;
	for (uint64_t i = 0; i < b->prod.hi; i++) {
		struct broker_peer *p = &b->prod.arr[i];

		if (p->used && p->model == m) {
			a.u.ack.part = p->part;
			broker_send_msg(b, b->producers, p, &a);
		}
	}
}

/* The outcome of a version the producers committed (b->outcome[0]). */
static void producers_acked(struct broker *b, struct broker_model *m, uint64_t version)
{
	/* only what is durable is acknowledged (durable.c sets it first) */
	DCAST_ASSERT(!broker_durable_on(b) || m->durable_version == version);
	producers_ack(b, m, version);
}

static void producers_lost(struct broker *b, struct broker_model *m, uint64_t version,
			   const char *why)
{
	char text[DCAST_MAX_TEXT + 1];

	snprintf(text, sizeof(text), "model %s version %llu is not durable (%s); publish an "
		 "anchor", m->name, (unsigned long long)version, why);
	producers_error(b, m, DCAST_EIO, version, text);
	if (!m->need_anchor)
		broker_log_need_anchor(b, m);
}

/* The fold found an acknowledged version bad: say so, naming it, and take
 * only an anchor from now on. */
static void producers_poisoned(struct broker *b, struct broker_model *m, uint64_t version,
			       const char *text)
{
	producers_error(b, m, DCAST_EPOISONED, version, text);
	if (!m->need_anchor)
		broker_log_need_anchor(b, m);
}

/* Into the log (consumers get it this turn), then the hooks; the ACK goes
 * out now without a data dir, else on the write's completion. */
static int pending_finish(struct broker *b, struct broker_model *m)
{
	struct broker_pending *pd = m->pending;
	struct broker_version *v = NULL;
	int rc;

	DCAST_DEBUG_ASSERT(check_pending(m) && pd->n_committed == pd->parts);
	if ((pd->anchor && (rc = anchor_complete(pd))) || (rc = version_build(m, pd, &v)))
		return rc;
	broker_version_entering(b, m, v); /* consumers on the log may get a delta of an anchor */
	if ((rc = broker_log_append(b, m, v))) {
		broker_version_put(v);
		return rc;
	}
	v->open = 0; /* committed: its COMMIT may go out */
	m->pending = NULL;
	pending_free(b, pd);
	DCAST_DEBUG_ASSERT(check_pending_total(b) && broker_model_newest(m) == v->version);
	m->versions_committed++;
	b->stats.versions_committed++;
	if (broker_version_committed(b, m, v))
		broker_version_lost(b, m, v->version, dcast_last_error());
	else if (!broker_durable_on(b))
		broker_version_ack(b, m, v->version);
	return 0;
}

/* A COMMIT with no open version: one with chunks lost them (an error); a
 * part with nothing to send (chunks 0) opens the version itself. */
static int pending_open_by_commit(struct broker *b, struct broker_model *m,
				  const dcast_commit *c)
{
	dcast_chunk first;

	if (c->chunks)
		return dcast_fail(DCAST_ESTATE, "model %s: COMMIT %llu of %u chunks, none received",
				  m->name, (unsigned long long)c->version, c->chunks);
	memset(&first, 0, sizeof(first));
	first.version = c->version;
	first.base_version = c->base_version;
	first.anchor = c->anchor;
	return broker_pending_open(b, m, &first, c->parts);
}

/* Every part committed, but the version cannot be (pending_finish failed
 * with rc): no COMMIT is left to come for it, so it is dropped at once,
 * whatever rc is (the producers hear why), and rc is returned. */
static int pending_unfinished(struct broker *b, struct broker_model *m, int rc)
{
	char why[DCAST_MAX_TEXT + 1];

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	broker_pending_abort(b, m, why);
	DCAST_ASSERT(!m->pending);
	return dcast_fail(rc, "%s", why);
}

static int pending_commit_part(struct broker *b, struct broker_model *m, uint32_t part,
			       dcast_commit *c, int *committed)
{
	struct broker_pending *pd = m->pending;
	struct broker_part *pt;
	int rc;

	DCAST_DEBUG_ASSERT(check_pending(m) && check_pending_total(b));
	if ((rc = pending_match(b, m, pd, c->version, c->anchor, c->base_version, part)))
		return rc;
	if (c->parts != pd->parts)
		return dcast_fail(DCAST_EFIELD_RANGE, "COMMIT.parts: %u, version %llu has %u",
				  c->parts, (unsigned long long)c->version, pd->parts);
	pt = &pd->part[part];
	if ((rc = part_matches_commit(m, pt, c)) || (rc = digests_check(pd->manifest, c)) ||
	    (rc = part_digests_hold(pd->manifest, pt, c)) ||
	    (rc = pending_charge(b, m, (uint64_t)c->n_digests * sizeof(*c->digests), "COMMIT's digests")))
		return rc;
	pt->digests = c->digests; /* taken from the message */
	pt->n_digests = c->n_digests;
	c->digests = NULL;
	c->n_digests = 0;
	pt->committed = pt->seen = 1;
	pt->last_ms = dcast_now_ms();
	DCAST_DEBUG_ASSERT(check_part(pt) && pt->n == c->chunks && pt->bytes == c->bytes);
	if (++pd->n_committed < pd->parts)
		return 0;
	if ((rc = pending_finish(b, m)))
		return pending_unfinished(b, m, rc);
	*committed = 1;
	return 0;
}

int broker_pending_commit(struct broker *b, struct broker_model *m, uint32_t part,
			  dcast_commit *c, int *committed)
{
	int opened = !m->pending, rc;

	*committed = 0;
	if (opened && (rc = pending_open_by_commit(b, m, c)))
		return rc;
	rc = pending_commit_part(b, m, part, c, committed);
	if (rc && opened && m->pending && m->pending->version == c->version &&
	    !m->pending->n_committed)
		broker_pending_abort(b, m, NULL); /* this COMMIT opened it: nothing was accepted */
	return rc;
}

/* ---- producer peers ---- */

static void producer_drop(struct broker *b, struct broker_peer *p, const char *why)
{
	struct broker_model *m = p->model;

	if (m && m->pending && p->part < m->pending->parts &&
	    m->pending->part[p->part].seen && !m->pending->part[p->part].committed) {
		char text[128];

		snprintf(text, sizeof(text), "part %u %s mid-version", p->part, why);
		broker_pending_abort(b, m, text);
	}
	DCAST_LOG_I("producer %s part %u/%u of %s: %s", p->client, p->part, p->parts,
		    m ? m->name : "?", why);
	broker_peer_forget(&b->prod, p);
	b->stats.producers_connected--;
}

static void producer_welcome(struct broker *b, struct broker_peer *p)
{
	struct broker_model *m = p->model;
	dcast_msg w;

	broker_welcome_producer_init(b, m, &w);
	w.u.welcome.version = broker_model_newest(m); /* poisoned ones too: numbers are spent */
	w.u.welcome.need_anchor = m->need_anchor || !m->n_log;
	broker_send_msg(b, b->producers, p, &w);
}

/* The window, granted afresh: only after a HELLO.  (A WELCOME again after
 * a manifest change leaves the credit as it was: the producer's count of
 * it runs on, and chunks still on their way count against it.) */
static void producer_window(struct broker *b, struct broker_peer *p)
{
	dcast_msg cr;

	dcast_msg_init(&cr, DCAST_MSG_CREDIT);
	cr.u.credit.bytes = b->cfg.producer_window_bytes;
	p->credit_bytes = cr.u.credit.bytes; /* granted since this HELLO */
	p->sent_bytes = 0;                   /* CHUNK payload bytes received since */
	DCAST_DEBUG_ASSERT(check_producer_credit(b, p));
	broker_send_msg(b, b->producers, p, &cr);
}

/* The window is the broker's memory bound, not the producer's good
 * manners: a chunk beyond the credit granted is refused and spoils the
 * open version. */
static int producer_credit_take(struct broker *b, struct broker_peer *p, const dcast_chunk *c)
{
	struct broker_model *m = p->model;

	DCAST_DEBUG_ASSERT(check_producer_credit(b, p));
	if (p->sent_bytes + c->payload_bytes <= p->credit_bytes) {
		p->sent_bytes += c->payload_bytes;
		DCAST_DEBUG_ASSERT(check_producer_credit(b, p));
		return 0;
	}
	dcast_fail(DCAST_EBUSY, "model %s part %u: CHUNK of %llu payload bytes beyond the credit "
		   "granted (%llu received of %llu granted)", m->name, p->part,
		   (unsigned long long)c->payload_bytes, (unsigned long long)p->sent_bytes,
		   (unsigned long long)p->credit_bytes);
	if (m->pending)
		broker_pending_abort(b, m, dcast_last_error());
	return DCAST_EBUSY;
}

/* A second connection for the same model and part replaces the first. */
static void producer_replace_part(struct broker *b, struct broker_peer *p)
{
	for (uint64_t i = 0; i < b->prod.hi; i++) {
		struct broker_peer *o = &b->prod.arr[i];

		if (o != p && o->used && o->model == p->model && o->part == p->part)
			producer_drop(b, o, "replaced by a new connection");
	}
}

/* The model a producer's HELLO names, created (with a new run, kept in
 * the data dir) if it does not exist. */
static struct broker_model *producer_model(struct broker *b, const char *name)
{
	struct broker_model *m = broker_model_get(b, name, 0);

	if (!m && (m = broker_model_get(b, name, 1))) {
		DCAST_LOG_I("model %s: created, run %016llx", name, (unsigned long long)m->run);
		broker_run_save(b, m);
		broker_model_announce(b, m);
	}
	return m;
}

static void producer_hello(struct broker *b, struct broker_peer *p, dcast_wire_in *in)
{
	const dcast_hello *h = &in->msg.u.hello;
	struct broker_model *m = NULL;
	int rc = DCAST_EBUSY;

	if (h->role != DCAST_ROLE_PRODUCER)
		rc = dcast_fail(DCAST_EFIELD_RANGE, "HELLO.role: consumer on the producer endpoint");
	else if ((rc = broker_auth_producer_model(b, in->user_id, h->model))) /* broker/auth.c */
		;
	else if (!(m = producer_model(b, h->model))) /* dcast_last_error() names why */
		rc = b->n_models >= b->cfg.max_models ? DCAST_EBUSY : DCAST_ENOMEM;
	else if (m->relayed)
		rc = dcast_fail(DCAST_ESTATE, "model %s is relayed from --upstream; producers refused",
				m->name);
	else
		rc = 0;
	if (!rc && p && p->used)
		producer_drop(b, p, "sent HELLO again");
	if (!rc && !(p = broker_peer_find(&b->prod, &in->rid, 1)))
		rc = DCAST_EBUSY;
	if (rc) {
		broker_refuse(b, b->producers, &in->rid, rc, h->model, DCAST_VERSION_NONE);
		return;
	}
	b->stats.producers_connected++;
	p->role = DCAST_ROLE_PRODUCER;
	p->model = m;
	p->part = h->part;
	p->parts = h->parts;
	p->last_recv_ms = dcast_now_ms();
	snprintf(p->client, sizeof(p->client), "%s", h->client);
	producer_replace_part(b, p);
	DCAST_LOG_I("producer %s part %u/%u of %s joined", p->client, p->part, p->parts, m->name);
	producer_welcome(b, p);
	producer_window(b, p);
}

static int producer_manifest(struct broker *b, struct broker_peer *p, dcast_msg *msg)
{
	struct broker_model *m = p->model;
	struct broker_manifest *mf;

	if (strcmp(msg->u.manifest.model, m->name))
		return dcast_fail(DCAST_EFIELD_RANGE, "MANIFEST.model: \"%s\", HELLO said \"%s\"",
				  msg->u.manifest.model, m->name);
	if (!(mf = broker_manifest_new(&msg->u.manifest)))
		return dcast_fail(DCAST_ENOMEM, "model %s: manifest", m->name);
	p->manifest_ok = 1;
	if (m->manifest && m->manifest->enc_len == mf->enc_len &&
	    !memcmp(m->manifest->enc, mf->enc, mf->enc_len)) {
		broker_manifest_put(mf);
		return 0;
	}
	if (m->manifest) {
		DCAST_LOG_I("model %s: manifest changed; next version must be an anchor", m->name);
		broker_pending_abort(b, m, "manifest changed");
		m->need_anchor = 1;
		broker_manifest_put(m->manifest);
		m->manifest = mf;
		for (uint64_t i = 0; i < b->prod.hi; i++)
			if (b->prod.arr[i].used && b->prod.arr[i].model == m)
				producer_welcome(b, &b->prod.arr[i]);
		return 0;
	}
	m->manifest = mf;
	return 0;
}

static int producer_chunk(struct broker *b, struct broker_peer *p, dcast_wire_in *in)
{
	struct broker_model *m = p->model;
	const dcast_chunk *c = &in->msg.u.chunk;
	uint64_t owed0 = p->credit_owed;
	int opened, rc;

	if (strcmp(c->model, m->name))
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK.model: \"%s\", HELLO said \"%s\"", c->model, m->name);
	if (c->part != p->part)
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK.part: %u, HELLO said %u", c->part, p->part);
	if (!p->manifest_ok)
		return dcast_fail(DCAST_ESTATE, "model %s: CHUNK before MANIFEST on this connection", m->name);
	if ((rc = producer_credit_take(b, p, c)))
		return rc;
	/* Stored or refused, its bytes take no room here any more: granted
	 * back once, at the next flush (a refused one's too, or each refusal
	 * would shrink the producer's window for good). */
	p->credit_owed += c->payload_bytes;
	DCAST_DEBUG_ASSERT(p->credit_owed == owed0 + c->payload_bytes && check_producer_credit(b, p));
	opened = !m->pending;
	if (opened && (rc = broker_pending_open(b, m, c, p->parts)))
		return rc;
	if ((rc = broker_pending_chunk(b, m, p->part, in))) {
		/* A bad chunk of an open version spoils it; a stray one does not,
		 * and a version that the bad chunk itself opened goes quietly. */
		if (opened)
			broker_pending_abort(b, m, NULL);
		else if (rc != DCAST_EVERSION && rc != DCAST_ESTATE && rc != DCAST_EFIELD_RANGE)
			broker_pending_abort(b, m, dcast_last_error());
		return rc;
	}
	return 0;
}

static int producer_commit(struct broker *b, struct broker_peer *p, dcast_commit *c)
{
	struct broker_model *m = p->model;
	int committed, rc;

	if (strcmp(c->model, m->name))
		return dcast_fail(DCAST_EFIELD_RANGE, "COMMIT.model: \"%s\", HELLO said \"%s\"", c->model, m->name);
	if (c->part != p->part || c->parts != p->parts)
		return dcast_fail(DCAST_EFIELD_RANGE, "COMMIT part %u of %u, HELLO said %u of %u",
				  c->part, c->parts, p->part, p->parts);
	if (!p->manifest_ok)
		return dcast_fail(DCAST_ESTATE, "model %s: COMMIT before MANIFEST on this connection", m->name);
	rc = broker_pending_commit(b, m, p->part, c, &committed);
	if (rc && rc != DCAST_EVERSION && rc != DCAST_ESTATE && m->pending &&
	    m->pending->version == c->version)
		broker_pending_abort(b, m, dcast_last_error());
	return rc;
}

static int producer_dispatch(struct broker *b, struct broker_peer *p, dcast_wire_in *in)
{
	switch (in->msg.type) {
	case DCAST_MSG_MANIFEST:
		return producer_manifest(b, p, &in->msg);
	case DCAST_MSG_CHUNK:
		return producer_chunk(b, p, in);
	case DCAST_MSG_COMMIT:
		return producer_commit(b, p, &in->msg.u.commit);
	case DCAST_MSG_HEARTBEAT:
		return 0;
	case DCAST_MSG_ERROR:
		DCAST_LOG_W("producer %s: ERROR %s: %s", p->client,
			    dcast_errname((int)in->msg.u.error.code), in->msg.u.error.text);
		return 0;
	default:
		return dcast_fail(DCAST_EMSG_TYPE, "%s: not expected from a producer",
				  dcast_msg_type_name((int)in->msg.type));
	}
}

void broker_producer_msg(struct broker *b, dcast_wire_in *in)
{
	struct broker_peer *p = broker_peer_find(&b->prod, &in->rid, 0);
	int rc;

	if (in->msg.type == DCAST_MSG_HELLO) {
		producer_hello(b, p, in);
		return;
	}
	if (!p) {
		broker_refuse_unjoined(b, b->producers, in);
		return;
	}
	p->last_recv_ms = dcast_now_ms();
	if (in->msg.type == DCAST_MSG_BYE) {
		producer_drop(b, p, "said BYE");
		return;
	}
	if ((rc = producer_dispatch(b, p, in)))
		broker_refuse(b, b->producers, &in->rid, rc, p->model->name,
			      in->msg.type == DCAST_MSG_CHUNK ? in->msg.u.chunk.version :
			      in->msg.type == DCAST_MSG_COMMIT ? in->msg.u.commit.version :
			      DCAST_VERSION_NONE);
}

static void pending_timeouts(struct broker *b, struct broker_model *m, uint64_t now_ms)
{
	struct broker_pending *pd = m->pending;

	if (!pd || m->relayed)
		return;
	for (uint32_t i = 0; i < pd->parts; i++) {
		uint64_t last = pd->part[i].seen ? pd->part[i].last_ms : pd->created_ms;
		char why[128];

		if (pd->part[i].committed || !broker_silent(b, now_ms, last, b->cfg.part_timeout_ms))
			continue;
		snprintf(why, sizeof(why), "part %u made no progress for %llu ms (--part-timeout-ms)",
			 i, (unsigned long long)(now_ms - last));
		broker_pending_abort(b, m, why);
		return;
	}
}

void broker_producer_timers(struct broker *b, uint64_t now_ms)
{
	uint64_t hb = b->cfg.heartbeat_ms;
	dcast_msg h;

	dcast_msg_init(&h, DCAST_MSG_HEARTBEAT);
	h.u.heartbeat.time_ms = now_ms;
	for (uint32_t i = 0; i < b->n_models; i++)
		pending_timeouts(b, b->models[i], now_ms);
	for (uint64_t i = 0; i < b->prod.hi; i++) {
		struct broker_peer *p = &b->prod.arr[i];

		if (!p->used)
			continue;
		if (broker_silent(b, now_ms, p->last_recv_ms, 3 * hb)) {
			b->stats.peers_timed_out++;
			producer_drop(b, p, "silent for 3 heartbeats");
			continue;
		}
		if (now_ms - p->last_send_ms >= hb) {
			h.u.heartbeat.version = broker_model_newest(p->model);
			broker_send_msg(b, b->producers, p, &h);
		}
	}
}

/* Grant p back what it stored since the last grant (at most one CREDIT's
 * worth a turn): each stored byte moves from owed to granted once. */
static void producer_grant(struct broker *b, struct broker_peer *p, dcast_msg *cr)
{
	uint64_t total0 = p->credit_bytes + p->credit_owed;

	DCAST_DEBUG_ASSERT(check_producer_credit(b, p));
	cr->u.credit.bytes = p->credit_owed;
	if (cr->u.credit.bytes > DCAST_MAX_CREDIT_BYTES)
		cr->u.credit.bytes = DCAST_MAX_CREDIT_BYTES;
	p->credit_owed -= cr->u.credit.bytes;
	p->credit_bytes += cr->u.credit.bytes;
	DCAST_DEBUG_ASSERT(check_producer_credit(b, p) &&
			   p->credit_bytes + p->credit_owed == total0);
	broker_send_msg(b, b->producers, p, cr);
}

void broker_producer_flush_credit(struct broker *b)
{
	dcast_msg cr;

	dcast_msg_init(&cr, DCAST_MSG_CREDIT);
	for (uint64_t i = 0; i < b->prod.hi; i++)
		if (b->prod.arr[i].used && b->prod.arr[i].credit_owed)
			producer_grant(b, &b->prod.arr[i], &cr);
}

void broker_ingest_init(struct broker *b)
{
	b->outcome[0] = (struct broker_outcome){producers_acked, producers_lost,
						 producers_poisoned};
}
