/* The local checkpoint: DIR/model.safetensors (the newest folded anchor,
 * metadata "deltacast.version") and DIR/model.dlog/<version>.rec, one record
 * file per version staged after it.  A record file is in the durable record
 * format the broker's segments use too (common/dcast_reclog.h): a FILE
 * record (the model's name), for an anchor a MANIFEST record, one CHUNK
 * record per distinct chunk (the CHUNK header and its payload, as the wire
 * had them), then one COMMIT record (the COMMIT header, digests included).
 * A file without its COMMIT record, with a torn or
 * corrupt record, or whose version does not follow the one before, is cut:
 * it and every later file are removed, so the checkpoint always ends at the
 * last whole version.  Records are written through dcast_io (io_uring)
 * and fdatasynced after the COMMIT record by the sync thread (syncer.c):
 * READY does not wait for the disk.  Their writeback is left to that
 * fdatasync (no sync_file_range as they arrive): while an anchor streams
 * in, the disk's work would take the CPU the intake needs (201 MB anchor
 * to 4 consumers on 2 cores: 650-730 ms to the last READY with it,
 * 460-520 ms without). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include "store_impl.h"
#include "dcast_common.h"
#include "dcast_landing.h"
#include "dcast_reclog.h"
#include "deltacast/safetensors.h"
#include <zmq.h>

/* ---- the store's mutex ----
 * Which store's mutex this thread holds is kept thread-local, so that each
 * call can assert what it needs without reading another thread's state. */
static _Thread_local const cs_store *held_here;

void cs_store_lock(cs_store *s)
{
	DCAST_ASSERT(held_here != s && "the store's mutex taken twice");
	pthread_mutex_lock(&s->mu);
	held_here = s;
}

void cs_store_unlock(cs_store *s)
{
	held_here = NULL;
	pthread_mutex_unlock(&s->mu);
}

void cs_store_wait(cs_store *s, pthread_cond_t *cv)
{
	DCAST_ASSERT(held_here == s);
	pthread_cond_wait(cv, &s->mu);
}

int cs_store_held(const cs_store *s)
{
	return held_here == s;
}

void cs_store_handed_lock(pthread_mutex_t *lock)
{
	DCAST_ASSERT(!held_here && "the consumer's lock taken inside the store's mutex");
	pthread_mutex_lock(lock);
}

void cs_ckpt_version_path(const dcast_consumer *c, uint64_t version, char *out, size_t cap)
{
	snprintf(out, cap, "%s/%020" PRIu64 ".rec", c->store->log_dir, version);
}

static int pool_index(const dcast_consumer *c, const void *p, uint64_t len)
{
	const unsigned char *b = p;

	return b >= c->pool.base && b + len <= c->pool.base + c->pool.bytes &&
	       dcast_io_buffers_fixed(c->io) ? 0 : DCAST_IO_NO_BUF;
}

int cs_ckpt_io_attach(dcast_consumer *c, cs_version *v, const char *path)
{
	int h = dcast_io_file_add(c->io, v->fd, path);

	if (h < 0)
		return dcast_fail(-h, "%s: cannot add to the I/O engine", path);
	v->io = c->io;
	v->io_file = h;
	return 0;
}

/* A record's prefix and header, contiguous, ready to write: len bytes. */
typedef struct rec_head {
	uint8_t *p;
	size_t cap, len;
} rec_head;

/* Fill h with record r whose header is hdr[0..hdr_len). */
static int head_put(rec_head *h, dcast_rec *r, const void *hdr, size_t hdr_len)
{
	if (DCAST_REC_PREFIX + hdr_len > h->cap) {
		uint8_t *p = realloc(h->p, DCAST_REC_PREFIX + hdr_len);
		if (!p)
			return dcast_fail(DCAST_ENOMEM, "record header of %zu bytes", hdr_len);
		h->p = p;
		h->cap = DCAST_REC_PREFIX + hdr_len;
	}
	memcpy(h->p + DCAST_REC_PREFIX, hdr, hdr_len);
	r->hdr_len = (uint32_t)hdr_len;
	dcast_rec_encode(h->p, r, hdr);
	h->len = DCAST_REC_PREFIX + hdr_len;
	return 0;
}

/* Fill h with record r whose header is message m, encoded. */
static int head_msg(rec_head *h, dcast_rec *r, const dcast_msg *m)
{
	void *enc = NULL;
	size_t len = 0;
	int err = dcast_msg_encode(m, &enc, &len);

	if (!err)
		err = head_put(h, r, enc, len);
	free(enc);
	return err;
}

static int append(dcast_consumer *c, cs_version *v, const rec_head *h);

/* The first records of a version's file: FILE (the model's name), and for
 * an anchor the MANIFEST of the tensors it fills. */
static int write_opening(dcast_consumer *c, cs_version *v)
{
	dcast_rec r = {DCAST_REC_FILE, 0, 0, v->version, dcast_checksum(NULL, 0)};
	rec_head h = {0};
	dcast_msg m;
	int err = head_put(&h, &r, c->model, strlen(c->model));

	if (!err)
		err = append(c, v, &h);
	if (err || !v->anchor) {
		free(h.p);
		return err;
	}
	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	snprintf(m.u.manifest.model, sizeof(m.u.manifest.model), "%s", c->model);
	m.u.manifest.n_tensors = c->n_tensors;
	m.u.manifest.tensors = calloc(c->n_tensors ? c->n_tensors : 1, sizeof(dcast_tensor_desc));
	err = m.u.manifest.tensors ? 0 : dcast_fail(DCAST_ENOMEM, "manifest record");
	for (uint32_t i = 0; !err && i < c->n_tensors; i++)
		m.u.manifest.tensors[i] = c->tensors[i].desc;
	r.kind = DCAST_REC_MANIFEST;
	if (!err && !(err = head_msg(&h, &r, &m)))
		err = append(c, v, &h);
	free(m.u.manifest.tensors);
	free(h.p);
	return err;
}

int cs_ckpt_version_create(dcast_consumer *c, cs_version *v)
{
	char path[4096];

	cs_ckpt_version_path(c, v->version, path, sizeof(path));
	v->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (v->fd < 0)
		return dcast_fail(DCAST_EIO, "%s: create: %s", path, strerror(errno));
	v->file_bytes = 0;
	int err = cs_ckpt_io_attach(c, v, path);
	return err ? err : write_opening(c, v);
}

/* A CHUNK record's prefix and header: the header as the wire had it. */
static int chunk_head(const dcast_chunk *k, uint64_t payload_sum, rec_head *h)
{
	dcast_rec r = {DCAST_REC_CHUNK, 0, (uint32_t)k->payload_bytes, k->version, payload_sum};
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_CHUNK);
	m.u.chunk = *k;
	return head_msg(h, &r, &m);
}

/* ---- chunk records, written behind ----
 * A chunk's record goes to the I/O engine without waiting for it: the
 * header is kept in a slot here, and the payload (ZeroMQ's message when
 * the chunk is not kept resident) is held until both writes are done; only
 * then does its credit go back to the broker, so what is held stays within
 * the window.  The session thread receives the next chunks meanwhile.
 The session thread reaps finished writes on every turn
 * (cs_ckpt_progress) and polls its socket with a 1 ms timeout while any is
 * pending; whatever else uses the engine waits for them all first (other
 * records: cs_ckpt_flush; reads, folds, dropping a version:
 * cs_ckpt_settle).  A failed write marks its version (it can never be
 * READY) and is reported by the next cs_ckpt_flush or cs_ckpt_progress.
 *
 * Small records (at most WB_SMALL bytes, header and payload: a delta's
 * chunks, or any chunk of a model of many small tensors) are not written
 * one by one: each is copied into the buffer of the slot that is filling,
 * and that buffer goes as one write when the next record does not continue
 * it (another file, a gap, no room), at the end of every turn of the
 * session thread (cs_ckpt_progress) and before anything waits for the
 * writes.  Their credit goes back when that write is done, as for any
 * record.  Two io_uring writes per chunk, each a wake-up of a kernel
 * worker, cost a model of 20,000 small tensors most of its consumer's CPU
 * per version (docs/benchmarks.md, "Many tensors").
 *
 * An anchor's range of its own file (v->direct) holds nothing of the
 * pool's and no credit: when every slot is busy, or WB_DIRECT_SLOTS hold
 * such ranges (the others stay for the records of the versions behind
 * it, and a record without payload waits for records alone: append), it
 * waits in a queue instead of the receive, and each reap hands the freed
 * slots to it, so that the anchor is READY once received and checked, not
 * once the disk has it (anchor.c, new_commit).  Its writes read the tensors: whatever
 * changes them first waits for them (cs_ckpt_settle_direct), and the seal
 * of its file waits for them all (anchor_new.c).  A failed one marks the
 * file (new_write_lost), which is then never sealed (direct_lost). */
#define WB_SLOTS 16
#define WB_DIRECT_SLOTS 12 /* an anchor's own file takes at most these: the rest stay for records */
#define WB_TAG 0x57420000u
#define WB_SMALL (64u << 10)    /* records copied into a combined write */
#define WB_COMBINE (256u << 10) /* one combined write, at most */

typedef struct wb_slot {
	rec_head h;         /* the record's prefix and CHUNK header */
	zmq_msg_t msg;      /* the payload, when held (has_msg) */
	uint64_t version, off, bytes, credit; /* credit: given back when written (0: at once) */
	int left, has_msg, err;
	int is_log;         /* record file bytes (0: an anchor's range in its own file) */
	int file;           /* combined: the engine's file of its one write */
	uint8_t *cb;        /* combined: WB_COMBINE bytes of records, kept for reuse */
	char why[200];      /* err's detail, taken when err was (slot_fail) */
} wb_slot;

/* The slot's first failure, with its detail as the thread that met it has
 * it now: the slot may be done later, on another thread. */
static void slot_fail(wb_slot *s, int err)
{
	if (s->err)
		return;
	s->err = err;
	snprintf(s->why, sizeof(s->why), "%s", dcast_last_error());
}

/* A range of an anchor's own file waiting for a slot (below: its writes
 * never hold up the receive). */
typedef struct wb_later {
	const unsigned char *src; /* in the tensor, or the file's header (new_header) */
	uint64_t off, len, version;
	int file;
} wb_later;

struct cs_wb {
	wb_slot s[WB_SLOTS];
	uint32_t busy;      /* bit i: s[i] in use */
	wb_later *later;    /* FIFO: later[at .. n) wait, in the order they came */
	uint32_t at, n, cap;
	int filling;        /* the slot taking small records, not written yet; -1: none */
	rec_head head;      /* a small record's header, before it is copied */
	int err;            /* first failure not yet reported */
	char why[256];      /* its detail (file, offset, the system's words) */
};

int cs_ckpt_wb_open(dcast_consumer *c)
{
	struct cs_wb *wb = calloc(1, sizeof(*wb));

	if (!wb)
		return dcast_fail(DCAST_ENOMEM, "consumer: record write queue");
	wb->filling = -1;
	cs_store_lock(c->store);
	c->store->wb = wb;
	cs_store_unlock(c->store);
	return 0;
}

void cs_ckpt_wb_close(dcast_consumer *c)
{
	cs_store_lock(c->store);
	DCAST_ASSERT(!c->store->wb || !c->store->wb->busy); /* flushed by the session thread */
	for (int i = 0; c->store->wb && i < WB_SLOTS; i++) {
		free(c->store->wb->s[i].h.p);
		free(c->store->wb->s[i].cb);
	}
	if (c->store->wb) {
		DCAST_ASSERT(c->store->wb->at == c->store->wb->n); /* no range still waits */
		free(c->store->wb->head.p);
		free(c->store->wb->later);
	}
	free(c->store->wb);
	c->store->wb = NULL;
	cs_ckpt_direct_wake(c->store);
	cs_store_unlock(c->store);
}

/* The first failure of a write behind, kept for the next report. */
static void wb_fail(struct cs_wb *wb, int err, const char *why)
{
	if (!wb->err) {
		wb->err = err;
		snprintf(wb->why, sizeof(wb->why), "%s", why);
	}
}

/* An anchor's own file is the store's from its COMMIT on (new_file): a
 * write of it that fails after that loses the checkpoint, not the version,
 * which the tensors hold, received and checked. */
static int trailing(const dcast_consumer *c, const wb_slot *s)
{
	return !s->is_log && c->store->new_file >= 0; /* one anchor in place at a time */
}

/* A write of version's anchor file failed (why): the file is never sealed.
 * Before its COMMIT the version goes with it, as for any record that fails
 * (reported by the session); after, the seal says why and folds from the
 * tensors instead (anchor_new.c). */
static void direct_lost(dcast_consumer *c, uint64_t version, int err, const char *why)
{
	c->store->new_write_lost = 1;
	if (c->store->new_file < 0) {
		c->store->sink->written(c, version, 0, 1);
		wb_fail(c->store->wb, err, why);
	} else if (!c->store->new_write_why[0]) {
		snprintf(c->store->new_write_why, sizeof(c->store->new_write_why), "%s", why);
	}
}

static void wb_done(dcast_consumer *c, wb_slot *s)
{
	uint64_t len = s->h.len + s->bytes;

	if (s->has_msg)
		zmq_msg_close(&s->msg);
	c->store->sink->written(c, s->version, s->credit, s->err && s->is_log);
	if (!s->is_log)
		cs_ckpt_direct_wake(c->store);
	if (s->err && !s->is_log)
		direct_lost(c, s->version, s->err, s->why);
	else if (s->err) {
		wb_fail(c->store->wb, s->err, s->why);
	} else {
		c->store->log_write_bytes += len;
		c->store->log_since_fold += s->is_log ? len : 0; /* records only: an anchor's own file is no log */
	}
	c->store->wb->busy &= ~(1u << (s - c->store->wb->s));
}

static void wb_pump(dcast_consumer *c);

/* Reap finished writes, waiting for at least min_done of them (and hand
 * the slots freed to the ranges waiting). */
static int wb_reap(dcast_consumer *c, unsigned min_done)
{
	dcast_io_done d[8];
	int n = dcast_io_wait(c->io, min_done, d, 8);

	if (n < 0)
		return -n;
	for (int i = 0; i < n; i++) {
		wb_slot *s = &c->store->wb->s[d[i].tag & 0xffff];

		DCAST_ASSERT((d[i].tag & ~0xffffull) == WB_TAG && s->left > 0);
		if (trailing(c, s) && !d[i].err && cs_fault_file_write(c, s->version))
			d[i].err = dcast_fail(DCAST_EIO, "model.safetensors.new: write at %" PRIu64
					      ": Input/output error (test fault)", s->off);
		if (d[i].err)
			slot_fail(s, d[i].err);
		c->store->direct_write_bytes += d[i].direct && !d[i].err ? d[i].bytes : 0;
		if (--s->left == 0)
			wb_done(c, s);
	}
	wb_pump(c);
	return 0;
}

static void combine_submit(dcast_consumer *c);

/* Wait for every pending write; a broken ring fails them all. */
static void wb_wait_all(dcast_consumer *c)
{
	int err = 0;

	combine_submit(c);
	wb_pump(c);
	while (c->store->wb->busy && !err)
		err = wb_reap(c, 1);
	for (int i = 0; err && i < WB_SLOTS; i++)
		if (c->store->wb->busy & (1u << i)) {
			slot_fail(&c->store->wb->s[i], err);
			wb_done(c, &c->store->wb->s[i]);
		}
	if (err && c->store->wb->at < c->store->wb->n) /* ranges that will never be written */
		direct_lost(c, c->store->wb->later[c->store->wb->at].version, err, dcast_last_error());
	c->store->wb->at = c->store->wb->n = 0;
	cs_ckpt_direct_wake(c->store);
}

/* The failure not yet reported, with its detail, and forget it; or 0. */
static int wb_report(dcast_consumer *c)
{
	int err = c->store->wb->err;

	c->store->wb->err = 0;
	return err ? dcast_fail(err, "record log: %s", c->store->wb->why) : 0;
}

/* A write under way, or a range waiting for a slot. */
static int wb_pending(const struct cs_wb *wb)
{
	return wb->busy || wb->at < wb->n;
}

/* Slots under way with records (is_log 1), or with ranges of an anchor's
 * own file (0). */
static int busy_slots(const struct cs_wb *wb, int is_log)
{
	int n = 0;

	for (int i = 0; i < WB_SLOTS; i++)
		n += (wb->busy & (1u << i)) && wb->s[i].is_log == is_log;
	return n;
}

/* Some write of an anchor's own file is queued or under way. */
static int direct_pending(const struct cs_wb *wb)
{
	return busy_slots(wb, 0) || wb->at < wb->n;
}

/* test(s->wb), under the store's mutex; 0 without a queue. */
static int wb_ask(cs_store *s, int (*test)(const struct cs_wb *))
{
	int yes;

	cs_store_lock(s);
	yes = s->wb && test(s->wb);
	cs_store_unlock(s);
	return yes;
}

int cs_ckpt_wait_hint(dcast_consumer *c, int *fd)
{
	int ms = -1;

	*fd = -1;
	cs_store_lock(c->store);
	if (c->store->wb && wb_pending(c->store->wb)) {
		*fd = dcast_io_event_fd(c->io);
		/* ranges queued with no slot busy: no completion will come to
		 * wake the thread, and the next turn's pump has room for them */
		ms = *fd < 0 ? 1 : dcast_io_has_work(c->io) || !c->store->wb->busy ? 0 : -1;
	}
	cs_store_unlock(c->store);
	return ms;
}

int cs_ckpt_direct_pending(cs_store *s)
{
	return wb_ask(s, direct_pending);
}

int cs_ckpt_progress(dcast_consumer *c)
{
	int err = 0;

	cs_store_lock(c->store);
	if (c->store->wb) {
		combine_submit(c);
		wb_pump(c);
		if (c->store->wb->busy && wb_reap(c, 0))
			wb_wait_all(c);
		err = wb_report(c);
	}
	cs_store_unlock(c->store);
	return err;
}

void cs_ckpt_settle(dcast_consumer *c)
{
	cs_store_lock(c->store);
	if (c->store->wb && wb_pending(c->store->wb))
		wb_wait_all(c);
	cs_store_unlock(c->store);
}

/* cs_ckpt_settle_direct; with forget, the ranges still waiting for a slot
 * dropped first, the file marked as lost (never sealed with the holes). */
static void direct_settle(dcast_consumer *c, int forget)
{
	cs_store_lock(c->store);
	if (c->store->wb) {
		struct cs_wb *wb = c->store->wb;
		if (forget && wb->at < wb->n) { /* the version goes too: nothing to fail */
			wb->at = wb->n = 0;
			c->store->new_write_lost = 1;
		}
		combine_submit(c); /* a filling slot of small ranges goes now */
		wb_pump(c);
		while (direct_pending(c->store->wb)) /* a range waits only while the slots it may take are busy */
			if (wb_reap(c, 1)) {
				wb_wait_all(c);
				break;
			}
		cs_ckpt_direct_wake(c->store); /* forget may have dropped the last of them */
	}
	cs_store_unlock(c->store);
}

void cs_ckpt_settle_direct(dcast_consumer *c)
{
	direct_settle(c, 0);
}

void cs_ckpt_forget_direct(dcast_consumer *c)
{
	direct_settle(c, 1);
}

void cs_ckpt_direct_wake(cs_store *s)
{
	DCAST_ASSERT(held_here == s);
	pthread_cond_broadcast(&s->direct_cv);
}

int cs_ckpt_await_direct(dcast_consumer *c)
{
	int stop = 0;

	cs_store_lock(c->store);
	while (c->store->wb && direct_pending(c->store->wb) && !(stop = atomic_load(&c->store->stop)))
		cs_store_wait(c->store, &c->store->direct_cv); /* woken by cs_ckpt_direct_wake */
	cs_store_unlock(c->store);
	return stop;
}

int cs_ckpt_flush(dcast_consumer *c)
{
	uint64_t t0 = dcast_now_ns();
	int err = 0;

	cs_store_lock(c->store);
	if (c->store->wb && (wb_pending(c->store->wb) || c->store->wb->err)) {
		wb_wait_all(c);
		c->store->log_write_ns += dcast_now_ns() - t0;
		err = wb_report(c);
	}
	cs_store_unlock(c->store);
	return err;
}

/* A free slot, taken; NULL when every one is busy. */
static wb_slot *wb_slot_try(dcast_consumer *c)
{
	for (int i = 0; i < WB_SLOTS; i++)
		if (!(c->store->wb->busy & (1u << i))) {
			c->store->wb->busy |= 1u << i;
			return &c->store->wb->s[i];
		}
	return NULL;
}

/* A free slot for a range of an anchor's own file, taken; NULL when every
 * slot is busy, or WB_DIRECT_SLOTS of them with such ranges.  The rest
 * stay for records: a delta right behind the anchor writes its records
 * at once, where it would wait for the anchor's file (at the disk's pace,
 * the session thread held and no heartbeat sent). */
static wb_slot *direct_slot_try(dcast_consumer *c)
{
	return busy_slots(c->store->wb, 0) < WB_DIRECT_SLOTS ? wb_slot_try(c) : NULL;
}

static wb_slot *wb_slot_get(dcast_consumer *c)
{
	while (c->store->wb->busy == (1u << WB_SLOTS) - 1)
		if (wb_reap(c, 1)) {
			wb_wait_all(c);
			break;
		}
	return wb_slot_try(c);
}

/* Fill slot s for chunk k's record and write its CHUNK header (an anchor
 * written straight to its file goes by direct_submit). */
static int slot_head(dcast_consumer *c, cs_version *v, const dcast_chunk *k, uint64_t payload_sum, wb_slot *s,
		     uint64_t tag)
{
	int err;

	DCAST_ASSERT(!v->direct); /* its writes: direct_submit */
	s->version = k->version;
	s->bytes = k->payload_bytes;
	s->credit = v->in_place ? 0 : k->payload_bytes; /* in place: in the tensor, not the pool */
	s->has_msg = s->err = 0;
	s->is_log = 1;
	if ((err = chunk_head(k, payload_sum, &s->h)))
		return err;
	s->off = v->file_bytes;
	s->left = 2;
	return dcast_io_write(c->io, v->io_file, s->h.p, s->h.len, s->off, DCAST_IO_NO_BUF, tag);
}

/* One write of a chunk's range of an anchor's own file. */
typedef struct wb_part {
	const unsigned char *src;
	uint64_t off, len;
	int direct;
} wb_part;

/* The range [off, off + len) of the anchor file, from src, cut into at
 * most 3 writes: the whole pages of the file inside it go with O_DIRECT
 * (the kernel reads the tensor's memory, nothing is copied into the page
 * cache), the head and tail before and after them through the page cache.
 * A page is written one way only: one this range shares with a
 * neighbouring range (or the header) is whole inside neither, so neither
 * writes it direct, and a page written direct lies inside this range
 * alone.  src must be congruent to off modulo CS_FILE_ALIGN for that (the
 * arena places tensors so: state.c); where it is not, or the file has no
 * O_DIRECT fd, the range goes buffered in one write.  Returns how many. */
static int range_parts(const unsigned char *src, uint64_t off, uint64_t len, int direct_ok, wb_part p[3])
{
	uint64_t a = (off + CS_FILE_ALIGN - 1) / CS_FILE_ALIGN * CS_FILE_ALIGN;
	uint64_t b = (off + len) / CS_FILE_ALIGN * CS_FILE_ALIGN;
	int n = 0;

	if (!direct_ok || ((uintptr_t)src - off) % CS_FILE_ALIGN || a >= b) {
		p[0] = (wb_part){src, off, len, 0};
		return 1;
	}
	if (a > off)
		p[n++] = (wb_part){src, off, a - off, 0};
	p[n++] = (wb_part){src + (a - off), a, b - a, 1};
	if (off + len > b)
		p[n++] = (wb_part){src + (b - off), b, off + len - b, 0};
	DCAST_ASSERT(p[n - 1].off + p[n - 1].len == off + len); /* the parts tile the range */
	DCAST_ASSERT(a - off < CS_FILE_ALIGN && off + len - b < CS_FILE_ALIGN); /* head, tail: part of a page */
	return n;
}

/* Slot s for len bytes of version's at off of an anchor's own file. */
static void direct_slot(wb_slot *s, uint64_t version, uint64_t off, uint64_t len)
{
	s->version = version;
	s->off = off;
	s->bytes = len;
	s->credit = 0; /* in place: in the tensor, not the pool */
	s->has_msg = s->err = 0;
	s->is_log = 0;
	s->h.len = 0;
}

/* The range of slot s of an anchor's own file (engine file `file`), from
 * src in the tensor, in the writes of range_parts: it is done when all of
 * them are.  On an error that sent nothing the slot is free again. */
static int range_submit(dcast_consumer *c, int file, const unsigned char *src, wb_slot *s)
{
	uint64_t tag = WB_TAG | (uint64_t)(s - c->store->wb->s);
	wb_part p[3];
	int n = range_parts(src, s->off, s->bytes, dcast_io_file_has_direct(c->io, file), p);
	int went, err = 0;

	for (went = 0; went < n; went++) {
		const wb_part *w = &p[went];
		err = w->direct ? dcast_io_write_direct(c->io, file, w->src, w->len, w->off, tag)
				: dcast_io_write(c->io, file, w->src, w->len, w->off, DCAST_IO_NO_BUF, tag);
		if (err)
			break;
	}
	s->left = went; /* each completion takes one off: the slot is done with the last */
	if (err && !went) /* nothing went */
		c->store->wb->busy &= ~(1u << (s - c->store->wb->s));
	else if (err) /* what went finds the slot failed */
		slot_fail(s, err);
	return err;
}

/* A range waits for a slot; -1 when the queue cannot grow. */
static int later_push(struct cs_wb *wb, const wb_later *l)
{
	if (wb->n == wb->cap && wb->at) { /* the front went: move the rest down */
		memmove(wb->later, wb->later + wb->at, (wb->n - wb->at) * sizeof(*wb->later));
		wb->n -= wb->at;
		wb->at = 0;
	}
	if (wb->n == wb->cap) {
		uint32_t cap = wb->cap ? 2 * wb->cap : 64;
		wb_later *grown = realloc(wb->later, cap * sizeof(*grown));
		if (!grown)
			return -1;
		wb->later = grown;
		wb->cap = cap;
	}
	wb->later[wb->n++] = *l;
	return 0;
}

/* The ranges waiting, into the free slots, in the order they came.  One
 * that cannot be sent is lost: its file is marked failed. */
static void wb_pump(dcast_consumer *c)
{
	struct cs_wb *wb = c->store->wb;
	wb_slot *s;

	while (wb->at < wb->n && (s = direct_slot_try(c))) {
		const wb_later *l = &wb->later[wb->at++];
		direct_slot(s, l->version, l->off, l->len);
		if (range_submit(c, l->file, l->src, s) && !(wb->busy & (1u << (s - wb->s))))
			direct_lost(c, l->version, DCAST_EIO, dcast_last_error());
	}
	if (wb->at == wb->n)
		wb->at = wb->n = 0;
}

/* Range l of an anchor's own file: into a free slot, else to wait for one
 * (the receive goes on), else, when the queue cannot grow, into the next
 * slot freed. */
static int direct_write(dcast_consumer *c, const wb_later *l)
{
	wb_slot *s;

	if (!(s = direct_slot_try(c)) && later_push(c->store->wb, l) == 0)
		return 0;
	if (!s && !(s = wb_slot_get(c)))
		return dcast_fail(DCAST_EIO, "version %" PRIu64 ": record writes failed", l->version);
	direct_slot(s, l->version, l->off, l->len);
	return range_submit(c, l->file, l->src, s);
}

/* Chunk k's range of the anchor file (v->direct), from the tensor. */
static int direct_submit(dcast_consumer *c, cs_version *v, const dcast_chunk *k, const void *payload,
			 uint64_t *payload_off)
{
	wb_later l = {payload, c->store->new_offs[k->tensor] + k->start * k->elem_size, /* k checked */
		      k->payload_bytes, k->version, v->io_file};

	DCAST_ASSERT(v->in_place);
	*payload_off = l.off;
	return direct_write(c, &l);
}

int cs_ckpt_direct_bytes(dcast_consumer *c, const cs_version *v, const void *src, uint64_t off, uint64_t len)
{
	wb_later l = {src, off, len, v->version, v->io_file};
	int err;

	DCAST_ASSERT(v->direct);
	cs_store_lock(c->store);
	if (!(err = direct_write(c, &l)) && wb_reap(c, 0))
		wb_wait_all(c); /* the ring failed: every pending write fails, reported by the flush */
	cs_store_unlock(c->store);
	return err;
}

/* Chunk k's record (or, v->direct, its range of the anchor file) in a
 * write of its own: the header, then the payload from where it lies (ZeroMQ's
 * message, held until written, or a pool slot or the tensor). */
static int submit_own(dcast_consumer *c, cs_version *v, const dcast_chunk *k, zmq_msg_t *held,
		      const void *payload, uint64_t payload_sum, uint64_t *payload_off)
{
	uint64_t tag;
	wb_slot *s;
	int err;

	if (v->direct) {
		DCAST_ASSERT(!held); /* in place: the payload is the tensor's range */
		return direct_submit(c, v, k, payload, payload_off);
	}
	if (!(s = wb_slot_get(c)))
		return dcast_fail(DCAST_EIO, "version %" PRIu64 ": record writes failed", k->version);
	tag = WB_TAG | (uint64_t)(s - c->store->wb->s);
	if ((err = slot_head(c, v, k, payload_sum, s, tag))) {
		c->store->wb->busy &= ~(1u << (s - c->store->wb->s));
		return err; /* nothing went: the caller still owns the payload and its credit */
	}
	if (held) { /* a small message keeps its bytes inside zmq_msg_t: take them from ours */
		zmq_msg_init(&s->msg);
		zmq_msg_move(&s->msg, held);
		s->has_msg = 1;
		payload = zmq_msg_data(&s->msg);
	}
	err = dcast_io_write(c->io, v->io_file, payload, k->payload_bytes, s->off + s->h.len,
			     pool_index(c, payload, k->payload_bytes), tag);
	if (err) { /* the header went: its completion finds the slot failed */
		slot_fail(s, err);
		s->left = 1;
		s->credit = 0; /* the caller gives it back */
		return err;
	}
	*payload_off = s->off + s->h.len;
	return 0;
}

/* Write the filling slot's records, now (a failure fails the slot). */
static void combine_submit(dcast_consumer *c)
{
	struct cs_wb *wb = c->store->wb;
	wb_slot *s;
	int err;

	if (wb->filling < 0)
		return;
	s = &wb->s[wb->filling];
	wb->filling = -1;
	s->left = 1;
	err = dcast_io_write(c->io, s->file, s->cb, s->bytes, s->off, DCAST_IO_NO_BUF,
			     WB_TAG | (uint64_t)(s - wb->s));
	if (err) {
		slot_fail(s, err);
		s->left = 0;
		wb_done(c, s);
	}
}

/* The filling slot, if it continues at (file, off) with room for len more
 * bytes of version's; else NULL. */
static wb_slot *combine_continues(struct cs_wb *wb, int file, uint64_t off, uint64_t version, size_t len)
{
	wb_slot *s = wb->filling < 0 ? NULL : &wb->s[wb->filling];

	return s && s->file == file && s->version == version && s->off + s->bytes == off &&
			       s->bytes + len <= WB_COMBINE ? s : NULL;
}

/* The filling slot if it continues at (file, off) with room for len more
 * bytes of version's; else, the one filling written, a new one (nowait:
 * 1 when none is free, rather than waiting for one). */
static int combine_slot(dcast_consumer *c, int file, uint64_t off, uint64_t version, size_t len, int nowait,
			wb_slot **out)
{
	struct cs_wb *wb = c->store->wb;
	wb_slot *s = combine_continues(wb, file, off, version, len);

	if (s) {
		*out = s;
		return 0;
	}
	combine_submit(c);
	if (nowait && !(s = direct_slot_try(c)))
		return 1;
	if (!nowait && !(s = wb_slot_get(c)))
		return dcast_fail(DCAST_EIO, "version %" PRIu64 ": record writes failed", version);
	if (!s->cb && !(s->cb = malloc(WB_COMBINE))) {
		wb->busy &= ~(1u << (s - wb->s));
		return dcast_fail(DCAST_ENOMEM, "record write buffer of %u bytes", WB_COMBINE);
	}
	*s = (wb_slot){.h = s->h, .cb = s->cb, .version = version, .off = off, .file = file};
	s->h.len = 0; /* its header buffer is kept for a record of its own later */
	wb->filling = (int)(s - wb->s);
	*out = s;
	return 0;
}

/* Wait until slot s, or (s NULL) every write of the record log, is done;
 * an anchor's own file's writes, at the disk's pace behind its COMMIT,
 * go on.  A broken ring fails them all. */
static void wb_wait_log(dcast_consumer *c, const wb_slot *s)
{
	const struct cs_wb *wb = c->store->wb;
	uint32_t bit = s ? 1u << (s - wb->s) : 0;

	if (!s)
		combine_submit(c); /* a filling slot of small records goes now */
	while (s ? (wb->busy & bit) != 0 : busy_slots(wb, 1) > 0)
		if (wb_reap(c, 1)) {
			wb_wait_all(c);
			return;
		}
}

void cs_ckpt_settle_log(dcast_consumer *c)
{
	cs_store_lock(c->store);
	if (c->store->wb)
		wb_wait_log(c, NULL);
	cs_store_unlock(c->store);
}

/* Slot s writes record h at the end of v's file. */
static int slot_record(dcast_consumer *c, const cs_version *v, const rec_head *h, wb_slot *s)
{
	uint64_t tag = WB_TAG | (uint64_t)(s - c->store->wb->s);
	int err = 0;

	if (h->len > s->h.cap) {
		uint8_t *p = realloc(s->h.p, h->len);
		if (!p)
			err = dcast_fail(DCAST_ENOMEM, "record header of %zu bytes", h->len);
		else
			s->h.p = p, s->h.cap = h->len;
	}
	if (!err) {
		memcpy(s->h.p, h->p, h->len);
		s->h.len = h->len;
		*s = (wb_slot){.h = s->h, .cb = s->cb, .version = v->version, .off = v->file_bytes, .is_log = 1, .left = 1};
		err = dcast_io_write(c->io, v->io_file, s->h.p, h->len, s->off, DCAST_IO_NO_BUF, tag);
	}
	if (err)
		c->store->wb->busy &= ~(1u << (s - c->store->wb->s));
	return err;
}

/* Write a record without payload (FILE, MANIFEST, COMMIT) at the end of
 * v's file and wait for it, after the chunk records written behind (not
 * after an anchor's own file's writes: a delta right behind an anchor
 * taken in place would wait for the disk, its session thread held). */
static int append(dcast_consumer *c, cs_version *v, const rec_head *h)
{
	uint64_t t0 = dcast_now_ns();
	wb_slot *s = NULL;
	int err;

	cs_store_lock(c->store);
	wb_wait_log(c, NULL); /* chunk records first */
	if (!(err = wb_report(c)) && !(s = wb_slot_get(c)))
		err = dcast_fail(DCAST_EIO, "version %" PRIu64 ": record writes failed", v->version);
	if (!err && !(err = slot_record(c, v, h, s))) {
		wb_wait_log(c, s);
		err = wb_report(c);
	}
	c->store->log_write_ns += dcast_now_ns() - t0;
	cs_store_unlock(c->store);
	v->file_bytes += err ? 0 : h->len;
	return err;
}

/* Chunk k's record (or its range of the anchor file) copied into the
 * filling slot's write. */
static int combine_chunk(dcast_consumer *c, cs_version *v, const dcast_chunk *k, const void *payload,
			 uint64_t payload_sum, uint64_t *payload_off)
{
	rec_head *h = &c->store->wb->head;
	uint64_t off = v->direct ? c->store->new_offs[k->tensor] + k->start * k->elem_size : v->file_bytes;
	wb_slot *s = NULL;
	int err;

	h->len = 0;
	if (!v->direct && (err = chunk_head(k, payload_sum, h)))
		return err;
	DCAST_ASSERT(h->len <= WB_COMBINE - WB_SMALL); /* a CHUNK header: fixed fields, re-encoded */
	err = combine_slot(c, v->io_file, off, k->version, h->len + k->payload_bytes, v->direct, &s);
	if (err == 1) /* an anchor's range, no slot free: it waits alone, the receive goes on */
		return direct_submit(c, v, k, payload, payload_off);
	if (err)
		return err; /* nothing went: the caller still owns the payload and its credit */
	if (h->len) /* none for an anchor's range in its own file (h->p may be NULL) */
		memcpy(s->cb + s->bytes, h->p, h->len);
	memcpy(s->cb + s->bytes + h->len, payload, k->payload_bytes);
	*payload_off = s->off + s->bytes + h->len;
	s->bytes += h->len + k->payload_bytes;
	s->credit += v->in_place ? 0 : k->payload_bytes;
	s->is_log = !v->direct;
	return 0;
}

/* The digest blocks that chunk k of the anchor in place holds whole, for
 * the file digest at its COMMIT (anchor.c, landed_digest): the hashes
 * taken as it landed, else hashed from its range of the tensor (payload)
 * while its bytes may still be in cache.  With the store's mutex held: a
 * drop frees the tables under it. */
static void blocks_land(struct cs_store *s, const dcast_consumer *c, const dcast_chunk *k,
			const unsigned char *payload, const dcast_landing *landed)
{
	const uint64_t B = DCAST_DIGEST_BLOCK_BYTES, bytes = c->tensors[k->tensor].bytes;
	uint64_t b0 = k->start * k->elem_size, b1 = b0 + k->payload_bytes, first = 0;
	const uint64_t *pre = NULL;
	uint32_t n_pre = landed ? dcast_landing_blocks(landed, &first, &pre) : 0;
	cs_landed *l = &s->new_landed;

	if (!l->hash)
		return;
	for (uint64_t i = (b0 + B - 1) / B; i * B < b1 && (i * B + B <= b1 || b1 == bytes); i++) {
		uint64_t at = l->block[k->tensor] + i, n = bytes - i * B < B ? bytes - i * B : B;
		DCAST_ASSERT(!landed || (i >= first && i - first < n_pre));
		l->hash[at] = landed ? pre[i - first] : dcast_checksum(payload + (i * B - b0), n);
		DCAST_DEBUG_ASSERT(!landed || l->hash[at] == dcast_checksum(payload + (i * B - b0), n));
		l->have[at] = 1;
	}
}

void cs_ckpt_chunk_landed(dcast_consumer *c, const cs_version *v, const dcast_chunk *k, const void *payload,
			  const dcast_landing *landed)
{
	if (!v->direct)
		return;
	cs_store_lock(c->store);
	blocks_land(c->store, c, k, payload, landed);
	cs_store_unlock(c->store);
}

/* Chunk k's record written behind, with the store's mutex held. */
static int chunk_submit(dcast_consumer *c, cs_version *v, const dcast_chunk *k, zmq_msg_t *held,
			const void *payload, uint64_t payload_sum, uint64_t *payload_off)
{
	uint64_t t0 = dcast_now_ns();
	int err = k->payload_bytes <= WB_SMALL ? combine_chunk(c, v, k, payload, payload_sum, payload_off)
					       : submit_own(c, v, k, held, payload, payload_sum, payload_off);

	if (err)
		return err;
	if (!v->direct)
		v->file_bytes = *payload_off + k->payload_bytes;
	if (wb_reap(c, 0)) /* what is done already: credit back early */
		wb_wait_all(c); /* the ring failed: every pending write fails, reported by the flush */
	c->store->log_write_ns += dcast_now_ns() - t0;
	return 0;
}

int cs_ckpt_chunk_submit(dcast_consumer *c, cs_version *v, const dcast_chunk *k, zmq_msg_t *held,
			 const void *payload, uint64_t payload_sum, uint64_t *payload_off)
{
	int err;

	cs_store_lock(c->store);
	err = chunk_submit(c, v, k, held, payload, payload_sum, payload_off);
	cs_store_unlock(c->store);
	return err;
}

int cs_ckpt_commit_write(dcast_consumer *c, cs_version *v)
{
	dcast_rec r = {DCAST_REC_COMMIT, 0, 0, v->version, dcast_checksum(NULL, 0)};
	rec_head h = {0};
	dcast_msg m;
	int err;

	dcast_msg_init(&m, DCAST_MSG_COMMIT);
	m.u.commit = v->commit; /* borrowed: its digests stay v's */
	err = head_msg(&h, &r, &m);
	if (!err)
		err = append(c, v, &h);
	free(h.p);
	return err ? err : cs_syncer_push(&c->store->syncer, v->fd, v->version); /* durable later */
}

int cs_io_read(dcast_consumer *c, int file, void *dst, uint64_t len, uint64_t off, const char *what)
{
	dcast_io_done d;
	int n, err;

	cs_ckpt_settle(c); /* the engine to ourselves; a failed record write is the session's */
	if ((err = dcast_io_read(c->io, file, dst, len, off, pool_index(c, dst, len), 3)))
		return err;
	n = dcast_io_wait(c->io, 1, &d, 1);
	if (n < 0)
		return -n;
	if (n == 1 && !d.err && d.bytes == len)
		return 0;
	return n == 1 && d.err ? d.err : dcast_fail(DCAST_ETRUNCATED, "%s: %" PRIu64 " bytes at %"
						      PRIu64 " run past its end", what, len, off);
}

/* k's payload read with pread on v's own descriptor once the record
 * writes are done, beside an anchor's file's writes on the engine, for
 * which the engine's read would wait first (cs_io_read: the session
 * thread held at the disk's pace; a delta that spilled, right behind the
 * anchor, is read back to be checked ahead). */
static int read_beside(dcast_consumer *c, const cs_version *v, const cs_chunk *k, void *dst, const char *path)
{
	cs_ckpt_settle_log(c);
	return dcast_pread_full(v->fd, dst, k->info.payload_bytes, k->file_off, path);
}

int cs_ckpt_read_payload(dcast_consumer *c, const cs_version *v, const cs_chunk *k, void *dst)
{
	char path[4096];
	int err;

	cs_ckpt_version_path(c, v->version, path, sizeof(path));
	if (v->fd >= 0 && cs_ckpt_direct_pending(c->store))
		return read_beside(c, v, k, dst, path);
	if (v->io_file < 0 && (err = cs_ckpt_io_attach(c, (cs_version *)v, path)))
		return err;
	return cs_io_read(c, v->io_file, dst, k->info.payload_bytes, k->file_off, path);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Versions of the record files present, sorted; *n at most cap. */
int cs_ckpt_list(dcast_consumer *c, uint64_t *out, uint32_t cap, uint32_t *n)
{
	DIR *d = opendir(c->store->log_dir);
	struct dirent *e;

	*n = 0;
	if (!d)
		return dcast_fail(DCAST_EIO, "%s: %s", c->store->log_dir, strerror(errno));
	while ((e = readdir(d)) && *n < cap) {
		char *end;
		unsigned long long v = strtoull(e->d_name, &end, 10);
		if (end != e->d_name && !strcmp(end, ".rec"))
			out[(*n)++] = v;
	}
	closedir(d);
	qsort(out, *n, sizeof(*out), cmp_u64);
	return 0;
}

void cs_ckpt_remove(dcast_consumer *c, uint64_t version)
{
	char path[4096];

	cs_ckpt_version_path(c, version, path, sizeof(path));
	unlink(path);
}
