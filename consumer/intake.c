/* The version state machine: the one place where a staged version is
 * begun, takes a CHUNK, is closed by its COMMIT, becomes READY, and is
 * dropped; the staged list (c->staged, in version order) and each
 * version's chunk table and duplicate set are its own.  Both of its
 * sources come through here: the broker's messages (session.c) and the
 * replay of the record log (the store's sink, cs_store_sink), the way
 * redis replays its append-only file through its command path; so does
 * the store's word that a chunk record was written (cs_intake_written).
 *
 * A version's life: begun STAGING in a free slot of the staged list
 * (open_version); each CHUNK checked whole (dcast_chunk_sound: its
 * checksum, its fit to the tensors), written behind to the version's
 * record file, then taken (take); its COMMIT closes it when it announces
 * exactly what was taken (close_version); READY once complete and
 * written (make_ready); then applied (api.c) and dropped
 * (cs_version_drop), or refused and dropped with what builds on it
 * (cs_refuse).  Each step asserts the state it starts from; with
 * DCAST_DEBUG (make test SAN=1) it also checks the state it leaves. */
#include <inttypes.h>
#include <string.h>
#include <zmq.h>
#include "consumer_impl.h"
#include "dcast_common.h"
#include "dcast_landing.h"
#include "store/store.h"

/* ---- a version's chunk table and duplicate set ----
 * Both grow by doubling, amortised, never per message, bounded by
 * DCAST_MAX_CHUNKS. */

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static int seen_insert(uint64_t *set, uint32_t cap, uint64_t key)
{
	for (uint32_t i = (uint32_t)mix(key) & (cap - 1), n = 0; n < cap; i = (i + 1) & (cap - 1), n++) {
		if (set[i] == key)
			return 1;
		if (set[i] == 0) {
			set[i] = key;
			return 0;
		}
	}
	DCAST_ASSERT(0 && "duplicate set full");
	return 0;
}

static int grow(cs_version *v)
{
	uint32_t cap = v->cap_chunks ? v->cap_chunks * 2 : 64;
	cs_chunk *ch;
	uint64_t *set;

	if (cap > DCAST_MAX_CHUNKS / 2)
		return dcast_fail(DCAST_ETOO_LARGE, "version %" PRIu64 ": more than %u chunks",
				  v->version, DCAST_MAX_CHUNKS / 2);
	ch = realloc(v->chunks, (size_t)cap * sizeof(*ch));
	if (!ch)
		return dcast_fail(DCAST_ENOMEM, "chunk table of version %" PRIu64, v->version);
	v->chunks = ch;
	set = calloc((size_t)cap * 2, sizeof(*set));
	if (!set)
		return dcast_fail(DCAST_ENOMEM, "chunk set of version %" PRIu64, v->version);
	for (uint32_t i = 0; i < v->n_chunks; i++)
		seen_insert(set, cap * 2, ((uint64_t)ch[i].part << 32 | ch[i].seq) + 1);
	free(v->seen);
	v->seen = set;
	v->seen_cap = cap * 2;
	v->cap_chunks = cap;
	return 0;
}

static int seen(const cs_version *v, uint32_t part, uint32_t seq)
{
	uint64_t key = ((uint64_t)part << 32 | seq) + 1;

	if (!v->seen_cap)
		return 0;
	for (uint32_t i = (uint32_t)mix(key) & (v->seen_cap - 1), n = 0; n < v->seen_cap;
	     i = (i + 1) & (v->seen_cap - 1), n++) {
		if (v->seen[i] == key)
			return 1;
		if (v->seen[i] == 0)
			return 0;
	}
	return 0;
}

static int add(cs_version *v, const cs_chunk *k)
{
	int err;

	if (v->n_chunks == v->cap_chunks && (err = grow(v)))
		return err;
	seen_insert(v->seen, v->seen_cap, ((uint64_t)k->part << 32 | k->seq) + 1);
	v->chunks[v->n_chunks++] = *k;
	v->bytes += k->info.payload_bytes;
	return 0;
}

/* ---- the staged list ---- */

cs_version *cs_version_find(dcast_consumer *c, uint64_t version)
{
	for (uint32_t i = 0; i < c->n_staged; i++)
		if (c->staged[i].version == version)
			return &c->staged[i];
	return NULL;
}

void cs_staged_open(dcast_consumer *c)
{
	for (uint32_t i = 0; i < CS_MAX_STAGED; i++)
		cs_version_init(&c->staged[i], DCAST_VERSION_NONE);
	c->n_staged = 0;
}

void cs_staged_close(dcast_consumer *c)
{
	for (uint32_t i = 0; i < CS_MAX_STAGED; i++)
		cs_version_free(&c->staged[i]);
	c->n_staged = 0;
}

/* The free slot after the staged versions, for `version`: every slot past
 * n_staged is fresh (open.c, cs_version_free). */
static cs_version *slot_take(dcast_consumer *c, uint64_t version)
{
	cs_version *v = &c->staged[c->n_staged];

	DCAST_ASSERT(c->n_staged < CS_MAX_STAGED);
	DCAST_ASSERT(v->version == DCAST_VERSION_NONE && !v->state && !v->n_chunks && v->fd < 0);
	v->version = version;
	return v;
}

static void release_resident(dcast_consumer *c, cs_version *v)
{
	for (uint32_t i = 0; i < v->n_chunks; i++)
		if (v->chunks[i].resident) {
			cs_pool_resident_put(&c->pool, v->chunks[i].info.payload_bytes);
			v->chunks[i].resident = NULL;
		}
}

/* Forget v (staged[] stays in order); its record file goes when unlink_file. */
void cs_version_drop(dcast_consumer *c, cs_version *v, int unlink_file)
{
	uint32_t i = (uint32_t)(v - c->staged);

	DCAST_ASSERT(i < c->n_staged);
	cs_store_version_drop(c, v, unlink_file); /* no write still reads its slots or file */
	release_resident(c, v);
	cs_version_free(v);
	memmove(&c->staged[i], &c->staged[i + 1], (c->n_staged - i - 1) * sizeof(*v));
	c->n_staged--;
	cs_version_init(&c->staged[c->n_staged], DCAST_VERSION_NONE);
}

void cs_drop_all(dcast_consumer *c)
{
	while (c->n_staged)
		cs_version_drop(c, &c->staged[c->n_staged - 1], 1);
}

void cs_drop_from(dcast_consumer *c, uint64_t version)
{
	while (c->n_staged && c->staged[c->n_staged - 1].version >= version)
		cs_version_drop(c, &c->staged[c->n_staged - 1], 1);
}

int cs_drop_in_place(dcast_consumer *c)
{
	if (cs_bulk_into_tensor(c)) { /* a frame read into the copy that moves now */
		cs_drop_from(c, 0); /* before the close: its bytes freed are the bulk's */
		cs_bulk_close(c);
		return 1;
	}
	if (!c->n_staged || !c->staged[0].in_place)
		return 0;
	cs_drop_from(c, c->staged[0].version);
	return 1;
}

/* Staged versions at the front that are READY and apply in a chain from
 * the live tensors: complete, committed to the record log and checked as
 * far as they can be before apply. */
uint32_t cs_ready_chain(const dcast_consumer *c)
{
	uint64_t have = dcast_consumer_version(c);
	uint32_t n = 0;

	for (; n < c->n_staged && c->staged[n].state == CS_V_READY; n++) {
		const cs_version *v = &c->staged[n];
		if (!v->anchor && v->base_version != have)
			break;
		have = v->version;
	}
	return n;
}

void cs_staged_check(const dcast_consumer *c)
{
	uint64_t prev = dcast_consumer_version(c);

	DCAST_ASSERT(c->n_staged <= CS_MAX_STAGED);
	for (uint32_t i = 0; i < c->n_staged; i++) {
		const cs_version *v = &c->staged[i];
		DCAST_ASSERT(v->state == CS_V_STAGING || v->state == CS_V_READY);
		DCAST_ASSERT(prev == DCAST_VERSION_NONE || v->version > prev);
		DCAST_ASSERT(v->anchor || v->base_version < v->version);
		prev = v->version;
	}
}

/* ---- refusals: a version dropped with what builds on it, and the re-join ---- */

/* Start over after what we hold: the broker resends what we need.  Versions
 * announced READY stay (a re-join is about the stream, not about them: the
 * caller may apply them at any time); what was still staging is dropped.
 * A refused version is dropped by the caller first (cs_drop_from). */
int cs_rejoin(dcast_consumer *c)
{
	uint32_t keep = cs_ready_chain(c);

	while (c->n_staged > keep)
		cs_version_drop(c, &c->staged[c->n_staged - 1], 1);
	return cs_stream_restart(c);
}

/* A refusal of `what`, with where a version's happened: the chunks of it
 * taken so far (cs_refusal_backoff tells damage on the way from damage
 * that repeats). */
static cs_refusal refusal(dcast_consumer *c, int what, uint64_t version, int code)
{
	cs_version *v = what == CS_REFUSED_VERSION ? cs_version_find(c, version) : NULL;

	return (cs_refusal){what, code, version, v ? v->n_chunks : 0};
}

int cs_rejoin_refused(dcast_consumer *c, int what, uint64_t version, int code)
{
	cs_refusal_backoff(c, refusal(c, what, version, code));
	return cs_rejoin(c);
}

static int refuse(dcast_consumer *c, uint64_t version, int code, int drop)
{
	cs_refusal now = refusal(c, CS_REFUSED_VERSION, version, code); /* before the drop */

	DCAST_LOG_W("consumer %s: version %" PRIu64 " refused: %s", c->model, version, dcast_last_error());
	cs_event_push(c, DCAST_EV_ERROR, version, code, dcast_last_error());
	if (drop)
		cs_drop_from(c, version);
	cs_refusal_backoff(c, now);
	return cs_rejoin(c);
}

int cs_refuse(dcast_consumer *c, uint64_t version, int code)
{
	return refuse(c, version, code, 1);
}

int cs_refuse_message(dcast_consumer *c, uint64_t version, int code)
{
	return refuse(c, version, code, 0);
}

int cs_intake_abort(dcast_consumer *c, uint64_t version, const char *why)
{
	cs_version *v = cs_version_find(c, version);

	if (!v || v->state == CS_V_READY)
		return 0;
	dcast_fail(DCAST_EABORTED, "version %" PRIu64 " aborted before its COMMIT (broker: %s)",
		   version, why);
	DCAST_LOG_W("consumer %s: %s; dropping what was staged of it", c->model, dcast_last_error());
	cs_event_push(c, DCAST_EV_ERROR, version, DCAST_EABORTED, dcast_last_error());
	c->stats.versions_aborted++;
	cs_drop_from(c, version);
	return cs_rejoin(c);
}

/* ---- the steps, for both sources ---- */

/* A fresh version (slot_take, or a record file's) begins STAGING, its
 * anchor flag and base those of its first CHUNK or COMMIT. */
static void open_version(cs_version *v, uint32_t anchor, uint64_t base)
{
	DCAST_ASSERT(v->state == 0 && v->n_chunks == 0);
	v->anchor = (int)anchor;
	v->base_version = base;
	v->state = CS_V_STAGING;
	DCAST_DEBUG_ASSERT(v->state == CS_V_STAGING && v->bytes == 0 && !v->commit.digests);
}

/* May CHUNK h (already checked whole, dcast_chunk_sound) join
 * v?  0: yes; 1: v has it already or is READY (a duplicate: harmless);
 * DCAST_EFIELD_RANGE: its anchor or base differ. */
static int fit(const cs_version *v, const dcast_chunk *h)
{
	if (v->state == CS_V_READY || seen(v, h->part, h->seq))
		return 1;
	if (h->anchor != (uint32_t)v->anchor || h->base_version != v->base_version)
		return dcast_fail(DCAST_EFIELD_RANGE, "CHUNK of version %" PRIu64 ": anchor/base_version "
				  "differ from its other chunks", h->version);
	return 0;
}

/* h joins v, its payload summing to sum (checked by the caller:
 * dcast_chunk_sound) at file_off of v's record file (resident: its
 * copy in the pool, or NULL).  Errors: DCAST_ENOMEM, DCAST_ETOO_LARGE. */
static int take(cs_version *v, const dcast_chunk *h, uint64_t sum, uint64_t file_off, unsigned char *resident)
{
	cs_chunk k = {h->part, h->seq, h->tensor, h->start,
		      {h->encoding, h->elem_size, h->count, h->changed, h->payload_bytes},
		      sum, file_off, resident, NULL};
	uint32_t n0 = v->n_chunks;
	uint64_t bytes0 = v->bytes;
	int err;

	DCAST_ASSERT(v->state == CS_V_STAGING);
	DCAST_DEBUG_ASSERT(!seen(v, h->part, h->seq));
	err = add(v, &k);
	DCAST_DEBUG_ASSERT(err ? v->n_chunks == n0 && v->bytes == bytes0
			       : v->n_chunks == n0 + 1 && v->bytes == bytes0 + h->payload_bytes &&
				 seen(v, h->part, h->seq));
	return err;
}

/* COMMIT m closes v when it announces exactly the chunks, bytes, anchor
 * and base taken; its digests then move into v (m's are NULL after).
 * Errors: DCAST_ECORRUPT naming both counts. */
static int close_version(cs_version *v, dcast_commit *m)
{
	DCAST_ASSERT(v->state == CS_V_STAGING && m->version == v->version);
	if (m->chunks != v->n_chunks || m->bytes != v->bytes || m->anchor != (uint32_t)v->anchor ||
	    m->base_version != v->base_version)
		return dcast_fail(DCAST_ECORRUPT, "COMMIT of version %" PRIu64 ": %u chunks / %" PRIu64
				  " bytes announced, %u / %" PRIu64 " staged", m->version, m->chunks,
				  m->bytes, v->n_chunks, v->bytes);
	free(v->commit.digests);
	v->commit = *m;
	m->digests = NULL;
	m->n_digests = 0;
	DCAST_DEBUG_ASSERT(v->commit.version == v->version && v->commit.chunks == v->n_chunks);
	return 0;
}

/* The bytes of v's chunks, counted afresh (the debug tier's check of
 * v->bytes). */
static uint64_t counted_bytes(const cs_version *v)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < v->n_chunks; i++)
		n += v->chunks[i].info.payload_bytes;
	return n;
}

/* STAGING -> READY: only once complete (closed by its COMMIT, every chunk
 * it announced taken) and written (no record write failed; its commit
 * record is in the file). */
static void make_ready(cs_version *v)
{
	DCAST_ASSERT(v->state == CS_V_STAGING && !v->write_failed);
	DCAST_ASSERT(v->commit.version == v->version && v->commit.chunks == v->n_chunks &&
		     v->commit.bytes == v->bytes);
	DCAST_DEBUG_ASSERT(counted_bytes(v) == v->bytes);
	v->state = CS_V_READY;
	DCAST_DEBUG_ASSERT(v->state == CS_V_READY && v->commit.version == v->version);
}

/* ---- the replay of a record file (the store's sink, open.c) ---- */

/* A record file's version, fresh from cs_version_init, begins at its
 * first CHUNK or COMMIT. */
static void replay_begin(cs_version *v, uint32_t anchor, uint64_t base)
{
	if (!v->state)
		open_version(v, anchor, base);
}

int cs_intake_replay_chunk(dcast_consumer *c, cs_version *v, const dcast_chunk *h, uint64_t sum,
			   uint64_t file_off)
{
	int err = dcast_chunk_sound(h, cs_tensor_descs(c), sum);

	replay_begin(v, h->anchor, h->base_version);
	if (err || (err = fit(v, h)))
		return err == 1 ? 0 : err;
	return take(v, h, sum, file_off, NULL);
}

int cs_intake_replay_commit(dcast_consumer *c, cs_version *v, dcast_commit *m)
{
	int err;

	(void)c;
	replay_begin(v, m->anchor, m->base_version);
	if (!(err = close_version(v, m)))
		make_ready(v); /* the COMMIT record closes a file read whole */
	return err;
}

void cs_intake_holds(dcast_consumer *c, uint64_t version)
{
	cs_set_applied(c, version);
}

/* ---- READY -> applied, for both sources ---- */

int cs_intake_apply(dcast_consumer *c, cs_version *v, int recover)
{
	int torn = 0, err;

	DCAST_ASSERT(v->state == CS_V_READY);
	if (!v->in_place)
		cs_ckpt_settle_direct(c); /* an anchor's file is still written from the tensors */
	err = cs_apply_version(c, v, c->opts.verify_digests, &torn);
	if (err && torn && recover)
		err = cs_ckpt_recover(c, v->version, err); /* the recovery policy: checkpoint, else NONE */
	if (!err)
		cs_set_applied(c, v->version);
	return err;
}

void cs_intake_written(dcast_consumer *c, uint64_t version, uint64_t credit, int failed)
{
	cs_version *v = cs_version_find(c, version);

	cs_credit_free(c, version, credit);
	if (failed && v)
		v->write_failed = 1; /* never READY: its COMMIT drops it */
}

/* ---- the wire ---- */

/* Version that a new delta must build on: the newest staged, else applied. */
static uint64_t tail_version(const dcast_consumer *c)
{
	return c->n_staged ? c->staged[c->n_staged - 1].version : dcast_consumer_version(c);
}

static int gap(dcast_consumer *c, uint64_t version, uint64_t base)
{
	dcast_event *e;

	dcast_fail(DCAST_EGAP, "gap: version %" PRIu64 " builds on %" PRIu64 ", we have %" PRIu64, version,
		   base, tail_version(c));
	DCAST_LOG_W("consumer %s: %s; re-joining", c->model, dcast_last_error());
	cs_event_push(c, DCAST_EV_GAP, version, DCAST_EGAP, "delta on a base we do not have");
	e = &c->events[(c->ev_head + c->ev_count - 1) % CS_EVENTS];
	e->have_version = dcast_consumer_version(c);
	return cs_rejoin_refused(c, CS_REFUSED_VERSION, version, DCAST_EGAP);
}

/* May an anchor go straight into the tensors as it arrives?  When they
 * hold no version, nothing else is staged and every one is the library's
 * own host copy (no caller's memory to tear, no view). */
static int in_place_ok(const dcast_consumer *c)
{
	if (dcast_consumer_version(c) != DCAST_VERSION_NONE || c->n_staged)
		return 0;
	for (uint32_t i = 0; i < c->n_tensors; i++)
		if (!c->tensors[i].owned || c->tensors[i].mem != DCAST_MEM_HOST || c->tensors[i].n_views)
			return 0;
	return 1;
}

static cs_version *version_begin(dcast_consumer *c, const dcast_chunk *h, int *err)
{
	cs_version *v;

	*err = 0;
	if (!h->anchor && h->base_version != tail_version(c)) {
		*err = gap(c, h->version, h->base_version);
		return NULL;
	}
	if (c->n_staged && h->version <= tail_version(c)) { /* the peer's error: staged stays */
		dcast_fail(DCAST_EVERSION, "version %" PRIu64 " is not above the newest staged, %" PRIu64,
			   h->version, tail_version(c));
		*err = cs_refuse_message(c, h->version, DCAST_EVERSION);
		return NULL;
	}
	if (c->n_staged == CS_MAX_STAGED) {
		*err = cs_refuse(c, h->version, dcast_fail(DCAST_EBUSY, "%u versions staged and not applied",
							CS_MAX_STAGED));
		return NULL;
	}
	v = slot_take(c, h->version);
	open_version(v, h->anchor, h->base_version);
	v->first_ns = dcast_now_ns();
	v->in_place = v->anchor && in_place_ok(c);
	v->direct = v->in_place && c->n_tensors && !cs_tensors_tiled(c);
	if ((*err = cs_store_version_create(c, v))) { /* its file (a full disk): joined again, backed off */
		cs_version_free(v);
		*err = cs_refuse_message(c, h->version, *err);
		return NULL;
	}
	c->n_staged++;
	cs_staged_check(c);
	if (v->anchor)
		cs_event_push(c, DCAST_EV_ANCHOR, v->version, 0, "");
	return v;
}

unsigned char *cs_intake_in_place_dest(dcast_consumer *c, const dcast_chunk *h)
{
	const cs_version *v = cs_version_find(c, h->version);
	uint64_t off;

	if (!h->anchor || !dcast_chunk_dense_at(h, cs_tensor_descs(c), &off))
		return NULL;
	if (v ? !v->in_place || v->state != CS_V_STAGING || seen(v, h->part, h->seq) : !in_place_ok(c))
		return NULL;
	return c->tensors[h->tensor].ptr + off;
}

/* An anchor received in place (in_place_ok): each chunk, checked, goes
 * straight to its range of the tensor (the one copy out of ZeroMQ's
 * buffer; none when a bulk connection read it there: its checksum is
 * taken there and a chunk that fails drops the version, which nothing
 * reads before its apply), and is written behind from there, to
 * model.safetensors.new at its final offset (store/anchor_new.c; a record file for a model with
 * tiled tensors): nothing writes that range again before a later
 * version's apply, and the COMMIT waits for every write.  Its credit goes
 * back at once (no staging memory holds it; the writes in flight are
 * bounded by the write-behind queue).  Apply has nothing left to write,
 * only to check. */
static int stage_in_place(dcast_consumer *c, cs_version *v, const dcast_chunk *h, zmq_msg_t *payload,
			  uint64_t sum, const struct dcast_landing *landed)
{
	unsigned char *dst = c->tensors[h->tensor].ptr + h->start * h->elem_size;
	uint64_t off;
	int err;

	if (zmq_msg_data(payload) != dst)
		memcpy(dst, zmq_msg_data(payload), h->payload_bytes);
	else /* read there (cs_intake_in_place_dest) */
		c->stats.bulk_in_place_bytes += h->payload_bytes;
	err = cs_ckpt_chunk_submit(c, v, h, NULL, dst, sum, &off);
	if (!err)
		cs_ckpt_chunk_landed(c, v, h, dst, landed);
	cs_credit_free(c, h->version, h->payload_bytes);
	if (err)
		return err == DCAST_EIO ? err : cs_refuse(c, h->version, err);
	c->total_received += h->payload_bytes;
	return take(v, h, sum, CS_IN_PLACE, NULL);
}

/* Payload (checked, summing to sum) -> pool slot when it stays resident
 * (the one copy out of ZeroMQ's buffer, kept until apply) -> record file,
 * written behind: a spilled payload is written from ZeroMQ's buffer, held
 * until the write is done, and its credit goes back then (store/ckpt.c). */
static int stage_payload(dcast_consumer *c, cs_version *v, const dcast_chunk *h, zmq_msg_t *payload,
			 uint64_t sum, const struct dcast_landing *landed)
{
	if (v->in_place)
		return stage_in_place(c, v, h, payload, sum, landed);
	unsigned char *slot, *resident;
	uint64_t off;
	int err;

	if (h->payload_bytes > c->pool.region_bytes)
		return cs_refuse(c, h->version, dcast_fail(DCAST_ETOO_LARGE, "CHUNK payload of %" PRIu64
			" bytes exceeds a quarter of the staging budget (%" PRIu64 " bytes)",
			h->payload_bytes, c->pool.region_bytes));
	slot = resident = cs_pool_resident_get(&c->pool, h->payload_bytes);
	if (slot)
		memcpy(slot, zmq_msg_data(payload), h->payload_bytes);
	else /* spilled: written straight from ZeroMQ's buffer */
		slot = zmq_msg_data(payload);
	if ((err = cs_ckpt_chunk_submit(c, v, h, resident ? NULL : payload, slot, sum, &off))) {
		if (resident)
			cs_pool_resident_put(&c->pool, h->payload_bytes);
		cs_credit_free(c, h->version, h->payload_bytes);
		return err == DCAST_EIO ? err : cs_refuse(c, h->version, err);
	}
	if (!resident)
		v->spilled++;
	c->total_received += h->payload_bytes;
	if ((err = take(v, h, sum, off, resident)) && resident) {
		cs_ckpt_settle_log(c); /* its record is written from the slot */
		cs_pool_resident_put(&c->pool, h->payload_bytes);
	}
	return err;
}

/* A CHUNK is checked whole (sound and fitting the tensors) on ZeroMQ's
 * buffer before anything of its version is begun; its payload's sum is
 * kept for the record and for apply's check of a payload read back.  One
 * that fails drops its version when staged, else nothing staged (its
 * version field may be the damaged one). */
int cs_intake_chunk(dcast_consumer *c, const dcast_chunk *h, zmq_msg_t *payload,
		    const struct dcast_landing *landed)
{
	uint64_t sum = landed ? dcast_landing_sum(landed) : dcast_checksum(zmq_msg_data(payload), h->payload_bytes);
	cs_version *v;
	int err;

	v = cs_version_find(c, h->version);
	err = dcast_chunk_sound(h, cs_tensor_descs(c), sum);
	if (err && !v) /* its version field may be the damaged one: nothing staged goes */
		return cs_refuse_message(c, h->version, err);
	if (err)
		return cs_refuse(c, h->version, err);
	if (!v && !(v = version_begin(c, h, &err)))
		return err;
	if ((err = fit(v, h)) == 1) {
		cs_credit_free(c, h->version, h->payload_bytes); /* duplicate: harmless */
		return 0;
	}
	return err ? cs_refuse(c, h->version, err) : stage_payload(c, v, h, payload, sum, landed);
}

/* READY v made known: its time, its event. */
static void announce(dcast_consumer *c, cs_version *v)
{
	DCAST_ASSERT(v->state == CS_V_READY && !v->held);
	v->ready_ns = dcast_now_ns();
	cs_event_push(c, DCAST_EV_VERSION_READY, v->version, 0, "");
	c->events[(c->ev_head + c->ev_count - 1) % CS_EVENTS].bytes = v->bytes;
}

/* v, closed by its COMMIT, once its commit record is written: READY, then
 * checked ahead where it can be.  A failed chunk record drops it (it is
 * fetched again). */
static int commit_written(dcast_consumer *c, cs_version *v, int *ready)
{
	int err;

	if (v->write_failed) {
		cs_version_drop(c, v, 1);
		return dcast_fail(DCAST_EIO, "version %" PRIu64 ": a chunk record could not be written "
				  "(reported before); it is fetched again", v->version);
	}
	if ((err = cs_store_version_commit(c, v))) {
		cs_version_drop(c, v, 1);
		return err;
	}
	make_ready(v);
	if ((err = cs_verify_ahead(c, v))) /* digests checked before apply where it can be */
		return cs_refuse(c, v->version, err);
	*ready = 1;
	v->held = !v->in_place && cs_ckpt_direct_pending(c->store); /* cs_intake_release */
	if (!v->held)
		announce(c, v);
	return 0;
}

void cs_intake_release(dcast_consumer *c)
{
	uint32_t i = 0;

	while (i < c->n_staged && !c->staged[i].held)
		i++;
	if (i == c->n_staged || cs_ckpt_direct_pending(c->store))
		return;
	for (; i < c->n_staged; i++)
		if (c->staged[i].held) {
			c->staged[i].held = 0;
			announce(c, &c->staged[i]);
		}
}

int cs_intake_commit(dcast_consumer *c, dcast_commit *m, int *ready)
{
	cs_version *v = cs_version_find(c, m->version);
	int err;

	*ready = 0;
	if (!v && m->chunks == 0) {
		dcast_chunk h = {.version = m->version, .base_version = m->base_version, .anchor = m->anchor};
		if (!(v = version_begin(c, &h, &err)))
			return err;
	}
	if (!v)
		return gap(c, m->version, m->base_version);
	if (v->state == CS_V_READY)
		return 0;
	if ((err = close_version(v, m)))
		return cs_refuse(c, m->version, err);
	return commit_written(c, v, ready);
}
