/* Durability glue between the broker's log and broker/segment.c.  With
 * --data-dir every committed version is handed to one writer thread that
 * owns the segment store: it writes the version's records through dcast_io
 * (io_uring, or pread/pwrite where io_uring is refused) and fsyncs them,
 * strictly in commit order, and reports each completion through an eventfd
 * in the event loop's poll set.  The loop then ACKs the version: only what
 * is durable is acknowledged, and the loop never waits for a disk.  At
 * start-up the segments are replayed into the log (broker_durable_restore)
 * on the loop's thread, before the writer starts.  One store per process.
 *
 * Why a thread and not the ring's own eventfd: a version's write is a
 * sequence (create the segment file, fsync its directory, the records, the
 * fsync, then delete the superseded segment; on a failure truncate back),
 * of which io_uring expresses the writes and fsyncs but not the truncate or
 * the unlink on every kernel this runs on.  The thread runs segment.c's one
 * tested sequence, the same on the io_uring and the plain path.
 *
 * Ownership: a job holds a reference of its version, taken and released on
 * the loop's thread (refcounts are not atomic); the writer reads only the
 * version's immutable bytes, whose addresses the job captured at commit.
 * Rule after a failed write: docs/operations.md, "Durability". */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include "broker.h"
#include "dcast_common.h"
#include "durable.h"
#include "segment.h"

#define DURABLE_TURN_WARN_NS 10000000ull /* a turn's durable work past 10 ms is logged */

/* One CHUNK record to write, captured on the loop's thread: the header's
 * address (the version's frame, which the job's reference keeps), and the
 * payload as a copy of its frame (zmq_msg_copy: the same bytes, kept by the
 * job even once the version's payloads move to disk) or, already on disk,
 * a reference of its segment file. */
struct durable_rec {
	const void *hdr;
	size_t hdr_len;
	zmq_msg_t payload;
	struct broker_segfile *file;   /* reference, or NULL: payload */
	uint64_t file_off, len, sum;
};

/* One version to make durable.  Set on the loop before it is queued and
 * then only read by the writer, except err, why and write_ns, which the
 * writer sets before it posts the job done (the mutex orders both ways). */
struct durable_job {
	struct durable_job *next;
	struct broker_model *m;     /* loop side; the writer only compares it */
	struct broker_version *v;   /* the job's reference (loop side) */
	char model[DCAST_MAX_NAME + 1];
	uint64_t seq, version, queued_ns, write_ns;
	int anchor, ack;
	int drop;                   /* delete the model's files (then free j->m if free_model) */
	int poison;                 /* write the poison mark in `mark` (not a version) */
	void *mark;                 /* owned: the encoded ERROR(DCAST_EPOISONED) */
	size_t mark_len;
	int free_model;
	uint64_t run;               /* j->m->run when queued: a later run skips the completion */
	uint64_t clears;            /* j->m->clears when queued: so does a log cleared since
				       (a run A, then B, then A again) */
	const void *manifest, *commit;
	size_t manifest_len, commit_len;
	uint32_t n_rec;
	struct durable_rec *rec;    /* [n_rec] */
	uint64_t *at;               /* [n_rec]: where each payload went (the writer's) */
	int read_fd;                /* durable: a read handle of its segment (the writer's,
				       taken over by the loop), -1 if none */
	int err;
	char why[DCAST_MAX_TEXT];
};

struct job_queue {
	struct durable_job *head, *tail;
};

/* b->dur: set with --data-dir.  The writer thread owns the segment store
 * while it runs; the queues are shared under mu. */
struct broker_durable {
	broker_seg_store *store;
	pthread_t writer;
	int writer_on, efd, stop;
	uint64_t slowdisk_ms;              /* DELTACAST_BROKER_FAULT=slowdisk:MS */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct job_queue todo, done;       /* under mu */
	/* writer only: models whose last write failed (a hole in the segment) */
	const struct broker_model *failed[BROKER_MAX_MODELS];
	unsigned n_failed;
	/* loop only */
	uint64_t seq_queued, seq_done, turn_ns;
};

/* Restore state: the version being rebuilt from its records. */
struct restore {
	struct broker *b;
	struct broker_model *m;
	struct broker_version *v;
	uint32_t cap;
	uint64_t versions;
	int tail;                   /* past a damaged record: versions go to m->tail */
};

/* ---- queues (callers hold d->mu) ---------------------------------- */

static void queue_push(struct job_queue *q, struct durable_job *j)
{
	j->next = NULL;
	if (q->tail)
		q->tail->next = j;
	else
		q->head = j;
	q->tail = j;
}

static struct durable_job *queue_pop(struct job_queue *q)
{
	struct durable_job *j = q->head;

	if (j && !(q->head = j->next))
		q->tail = NULL;
	return j;
}

/* ---- the writer thread --------------------------------------------- */

static void fault_sleep(const struct broker_durable *d)
{
	if (d->slowdisk_ms)
		dcast_sleep_ms(d->slowdisk_ms);
}

static int failed_find(const struct broker_durable *d, const struct broker_model *m)
{
	for (unsigned i = 0; i < d->n_failed; i++)
		if (d->failed[i] == m)
			return (int)i;
	return -1;
}

static void failed_set(struct broker_durable *d, const struct broker_model *m, int on)
{
	int i = failed_find(d, m);

	if (on && i < 0 && d->n_failed < BROKER_MAX_MODELS)
		d->failed[d->n_failed++] = m;
	if (!on && i >= 0)
		d->failed[i] = d->failed[--d->n_failed];
}

static int rec_write(struct broker_durable *d, struct durable_job *j, uint32_t i)
{
	struct durable_rec *r = &j->rec[i];
	struct broker_seg_payload p = {.len = r->len, .sum = r->sum};

	if (r->file) {
		p.fd = r->file->fd;
		p.off = r->file_off;
	} else {
		p.mem = zmq_msg_data(&r->payload);
	}
	return broker_seg_put_chunk(d->store, j->model, j->version, r->hdr, r->hdr_len, &p,
				    &j->at[i]);
}

/* The job's records, then the COMMIT record and the fsync.  The slowdisk
 * fault sleeps between the CHUNK records and the COMMIT, and after the
 * fsync: a SIGKILL in the first sleep leaves a torn version behind. */
static int job_write(struct broker_durable *d, struct durable_job *j)
{
	int rc = 0;

	if (j->anchor)
		rc = broker_seg_begin_anchor(d->store, j->model, j->version, j->manifest,
					     j->manifest_len);
	for (uint32_t i = 0; !rc && i < j->n_rec; i++)
		rc = rec_write(d, j, i);
	if (rc) {
		broker_seg_abort(d->store, j->model);
		return rc;
	}
	fault_sleep(d);
	if ((rc = broker_seg_commit(d->store, j->model, j->version, j->commit, j->commit_len)))
		return rc;
	if ((j->read_fd = broker_seg_reader(d->store, j->model)) < 0)
		DCAST_LOG_W("model %s: version %llu is served from memory: %s", j->model,
			    (unsigned long long)j->version, dcast_last_error());
	fault_sleep(d);
	return 0;
}

/* A poison mark goes after the version it names, unless a write of the
 * model failed since its last anchor (the version is not on disk then). */
static void job_poison(struct broker_durable *d, struct durable_job *j)
{
	if (failed_find(d, j->m) >= 0) {
		j->err = DCAST_EIO;
		snprintf(j->why, sizeof(j->why), "not written: the model's segment has a hole "
			 "(the poisoned version is not on disk either)");
	} else if ((j->err = broker_seg_poison(d->store, j->model, j->version, j->mark,
					       j->mark_len)) != 0) {
		snprintf(j->why, sizeof(j->why), "%s", dcast_last_error());
	}
}

/* After a failed write the model's segment has a hole: no later version
 * of it is written until an anchor starts a whole segment again. */
static void job_run(struct broker_durable *d, struct durable_job *j)
{
	uint64_t t0 = dcast_now_ns();

	if (j->drop) {
		if ((j->err = broker_seg_drop(d->store, j->model)) != 0)
			snprintf(j->why, sizeof(j->why), "%s", dcast_last_error());
		failed_set(d, j->m, 0); /* no hole left; a removed m is freed next */
	} else if (j->poison) {
		job_poison(d, j);
		j->write_ns = dcast_now_ns() - t0;
		return; /* a mark leaves no hole */
	} else if (failed_find(d, j->m) >= 0 && !j->anchor) {
		j->err = DCAST_EIO;
		snprintf(j->why, sizeof(j->why), "not written: an earlier version of the model "
			 "failed to become durable (a hole), and only an anchor starts a whole "
			 "segment again");
	} else if ((j->err = job_write(d, j)) != 0) {
		snprintf(j->why, sizeof(j->why), "%s", dcast_last_error());
	}
	failed_set(d, j->m, j->err != 0);
	j->write_ns = dcast_now_ns() - t0;
}

static void efd_signal(const struct broker_durable *d)
{
	uint64_t one = 1;

	if (write(d->efd, &one, sizeof(one)) != sizeof(one))
		DCAST_LOG_W("durable: eventfd write: %s", strerror(errno));
}

/* Jobs in queue order, one at a time; leaves once stopped and drained. */
static void *writer_main(void *arg)
{
	struct broker_durable *d = arg;
	struct durable_job *j;

	pthread_mutex_lock(&d->mu);
	while ((j = queue_pop(&d->todo)) || !d->stop) {
		if (!j) {
			pthread_cond_wait(&d->cv, &d->mu);
			continue;
		}
		pthread_mutex_unlock(&d->mu);
		job_run(d, j);
		pthread_mutex_lock(&d->mu);
		queue_push(&d->done, j);
		efd_signal(d);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

/* ---- the loop's side ------------------------------------------------ */

static void job_free(struct durable_job *j)
{
	for (uint32_t i = 0; i < j->n_rec; i++) {
		zmq_msg_close(&j->rec[i].payload);
		broker_segfile_put(j->rec[i].file);
	}
	if (j->read_fd >= 0)
		close(j->read_fd);
	broker_version_put(j->v);
	free(j->rec);
	free(j->at);
	free(j->mark);
	free(j);
}

static void job_queue(struct broker_durable *d, struct durable_job *j)
{
	pthread_mutex_lock(&d->mu);
	j->seq = ++d->seq_queued;
	queue_push(&d->todo, j);
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
}

static void job_capture(struct durable_job *j, struct broker_version *v)
{
	if (v->anchor) {
		j->manifest = v->manifest->enc;
		j->manifest_len = v->manifest->enc_len;
	}
	for (uint32_t i = 0; i < v->n_chunks; i++) {
		const struct broker_chunk *ch = &v->chunks[i];
		struct durable_rec *r = &j->rec[i];

		r->hdr = zmq_msg_data((zmq_msg_t *)&ch->hdr);
		r->hdr_len = zmq_msg_size((zmq_msg_t *)&ch->hdr);
		r->len = ch->payload_len;
		r->sum = ch->payload_sum;
		r->file_off = ch->file_off;
		zmq_msg_init(&r->payload);
		if ((r->file = ch->file) != NULL)
			r->file->refs++;
		else
			zmq_msg_copy(&r->payload, (zmq_msg_t *)&ch->payload);
	}
	j->n_rec = v->n_chunks;
	j->commit = zmq_msg_data(&v->commit_hdr);
	j->commit_len = zmq_msg_size(&v->commit_hdr);
}

/* j is model m's as it is now: its run and log clears (a completion after
 * either moved counts for nothing), its name, its queue time. */
static void job_of(struct durable_job *j, struct broker_model *m)
{
	j->m = m;
	j->read_fd = -1;
	j->run = m->run;
	j->clears = m->clears;
	snprintf(j->model, sizeof(j->model), "%s", m->name);
	j->queued_ns = dcast_now_ns();
}

static struct durable_job *job_new(struct broker_model *m, struct broker_version *v, int ack)
{
	struct durable_job *j = calloc(1, sizeof(*j));

	if (!j || (v->n_chunks && (!(j->rec = calloc(v->n_chunks, sizeof(*j->rec))) ||
				   !(j->at = calloc(v->n_chunks, sizeof(*j->at)))))) {
		if (j)
			free(j->rec);
		free(j);
		dcast_fail(DCAST_ENOMEM, "durable: a write job of %u records", v->n_chunks);
		return NULL;
	}
	job_of(j, m);
	j->v = v;
	v->refs++;
	j->version = v->version;
	j->anchor = v->anchor;
	j->ack = ack;
	job_capture(j, v);
	return j;
}

int broker_durable_drop(struct broker *b, struct broker_model *m, int free_model)
{
	struct broker_durable *d = b->dur;
	struct durable_job *j = calloc(1, sizeof(*j));

	DCAST_ASSERT(d && d->store && (m->deleting || !free_model));
	if (!j)
		return dcast_fail(DCAST_ENOMEM, "durable: a job to delete model %s's files", m->name);
	job_of(j, m);
	j->drop = 1;
	j->free_model = free_model;
	job_queue(d, j);
	return 0;
}

int broker_durable_poison(struct broker *b, struct broker_model *m, uint64_t version,
			  const char *text)
{
	struct broker_durable *d = b->dur;
	struct durable_job *j;
	dcast_msg e;
	int rc;

	if (!d || !d->store)
		return 0;
	if (!(j = calloc(1, sizeof(*j))))
		return dcast_fail(DCAST_ENOMEM, "durable: a job to mark version %llu poisoned",
				  (unsigned long long)version);
	dcast_msg_init(&e, DCAST_MSG_ERROR);
	e.u.error.code = DCAST_EPOISONED;
	e.u.error.version = version;
	snprintf(e.u.error.model, sizeof(e.u.error.model), "%s", m->name);
	snprintf(e.u.error.text, sizeof(e.u.error.text), "%s", text);
	if ((rc = dcast_msg_encode(&e, &j->mark, &j->mark_len))) {
		free(j);
		return rc;
	}
	job_of(j, m);
	j->poison = 1;
	j->version = version;
	job_queue(d, j);
	return 0;
}

/* The poison mark is on disk (or not: logged, the mark holds until a
 * restart). */
static void job_poisoned(const struct durable_job *j)
{
	if (j->err)
		DCAST_LOG_E("model %s: poison mark of version %llu not written (%s): %s; a restart "
			    "serves that version again", j->model, (unsigned long long)j->version,
			    dcast_errname(j->err), j->why);
	else
		DCAST_LOG_I("model %s: poison mark of version %llu written and fsynced", j->model,
			    (unsigned long long)j->version);
}

/* A model's files are gone (or not: logged); the job of a removed model
 * held it until now, behind every write of it queued before. */
static void job_dropped(struct broker *b, struct durable_job *j)
{
	if (j->err)
		DCAST_LOG_E("model %s: files not all deleted: %s", j->model, j->why);
	else
		DCAST_LOG_I("model %s: segments deleted from %s in %.1f ms", j->model,
			    b->cfg.data_dir, (double)j->write_ns / 1e6);
	if (j->free_model) { /* removed (retire.c): in no table, the job held it */
		DCAST_ASSERT(j->m->deleting);
		broker_model_free(j->m);
	}
}

int broker_durable_on(const struct broker *b)
{
	return b->dur && b->dur->store;
}

int broker_durable_commit(struct broker *b, struct broker_model *m, struct broker_version *v,
			  int ack)
{
	struct broker_durable *d = b->dur;
	uint64_t t0 = dcast_now_ns();
	struct durable_job *j;

	if (!d || !d->store)
		return 0;
	if (!(j = job_new(m, v, ack)))
		return DCAST_ENOMEM;
	job_queue(d, j);
	d->turn_ns += dcast_now_ns() - t0;
	return 0;
}

/* The version's payloads are durable: from now on they are read from the
 * segment (ondisk.c), and the heap lets them go. */
static void job_to_disk(struct broker *b, struct broker_model *m, struct durable_job *j)
{
	struct broker_segfile *f;

	if (j->read_fd < 0)
		return;
	f = broker_segfile_share(&m->segfile, j->read_fd);
	j->read_fd = -1;
	if (!f) {
		DCAST_LOG_W("model %s: version %llu is served from memory: %s", m->name,
			    (unsigned long long)j->version, dcast_last_error());
		return;
	}
	broker_version_to_disk(j->v, f, j->at);
	broker_segfile_put(f);
	b->stats.versions_to_disk++; /* a heap trim is due (log.c) */
}

static void job_durable(struct broker *b, struct durable_job *j)
{
	struct broker_model *m = j->m;

	job_to_disk(b, m, j);
	DCAST_LOG_I("model %s: version %llu durable: %llu bytes written and fsynced in %.1f ms, "
		    "%.1f ms after its commit (off the event loop)", m->name,
		    (unsigned long long)j->version, (unsigned long long)j->v->payload_bytes,
		    (double)j->write_ns / 1e6, (double)(dcast_now_ns() - j->queued_ns) / 1e6);
	if (!j->ack)
		return; /* a made anchor, or a delta written again after one */
	DCAST_ASSERT(m->durable_version == DCAST_VERSION_NONE || j->version > m->durable_version);
	m->durable_version = j->version;
	broker_version_ack(b, m, j->version);
}

static void job_lost(struct broker *b, struct durable_job *j)
{
	b->stats.durable_failures++;
	DCAST_LOG_E("model %s: version %llu not durable (%s): %s; not acknowledged", j->m->name,
		    (unsigned long long)j->version, dcast_errname(j->err), j->why);
	if (j->ack)
		broker_version_lost(b, j->m, j->version, j->why);
}

/* The eventfd: every finished job, in commit order. */
static void on_done(struct broker *b, int fd, void *arg)
{
	struct broker_durable *d = arg;
	uint64_t t0 = dcast_now_ns(), n;
	struct durable_job *j;

	if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		DCAST_LOG_W("durable: eventfd read: %s", strerror(errno));
	for (;;) {
		pthread_mutex_lock(&d->mu);
		j = queue_pop(&d->done);
		pthread_mutex_unlock(&d->mu);
		if (!j)
			break;
		DCAST_ASSERT(j->seq == ++d->seq_done); /* completions in commit order */
		if (j->drop)
			job_dropped(b, j);
		else if (j->m->deleting || j->run != j->m->run || j->clears != j->m->clears)
			; /* removed or cleared since: nothing to ACK, its files go next */
		else if (j->poison)
			job_poisoned(j);
		else if (j->err)
			job_lost(b, j);
		else
			job_durable(b, j);
		job_free(j);
	}
	d->turn_ns += dcast_now_ns() - t0;
}

void broker_durable_turn_end(struct broker *b)
{
	uint64_t ns = b->dur ? b->dur->turn_ns : 0;

	if (!ns)
		return;
	b->dur->turn_ns = 0;
	if (ns > b->stats.loop_stall_max_ns)
		b->stats.loop_stall_max_ns = ns;
	if (ns > DURABLE_TURN_WARN_NS)
		DCAST_LOG_W("event loop spent %.1f ms on durable work in one turn", (double)ns / 1e6);
}

uint64_t broker_durable_in_flight(const struct broker *b)
{
	return b->dur ? b->dur->seq_queued - b->dur->seq_done : 0;
}

static int writer_start(struct broker *b, struct broker_durable *d)
{
	int rc;

	d->slowdisk_ms = b->cfg.fault_slowdisk_ms;
	if ((d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
		return dcast_fail(DCAST_EIO, "durable: eventfd: %s", strerror(errno));
	if ((rc = broker_poll_add(b, d->efd, on_done, d)))
		return rc;
	if ((rc = pthread_create(&d->writer, NULL, writer_main, d)))
		return dcast_fail(DCAST_EIO, "durable: writer thread: %s", strerror(rc));
	d->writer_on = 1;
	if (d->slowdisk_ms)
		DCAST_LOG_W("fault injection: slowdisk: the durable writer sleeps %llu ms before "
			    "each COMMIT record and again after each fsync",
			    (unsigned long long)d->slowdisk_ms);
	return 0;
}

static int frame_copy(zmq_msg_t *msg, const void *data, size_t len)
{
	if (zmq_msg_init_size(msg, len))
		return dcast_fail(DCAST_ENOMEM, "restore: %zu-byte frame", len);
	memcpy(zmq_msg_data(msg), data, len);
	return 0;
}

/* The segment's record checksum covered hdr; a MANIFEST an older build
 * stored has no `sum`, and broker_manifest_new() encodes it with one. */
static int restore_manifest(struct restore *r, const char *model, const void *hdr, size_t len)
{
	struct broker_manifest *mf;
	dcast_msg msg;
	int rc = dcast_msg_decode_stored(hdr, len, &msg);

	if (rc)
		return rc;
	if (!broker_model_get(r->b, model, 0) && (r->m = broker_model_get(r->b, model, 1)))
		broker_run_restore(r->b, r->m); /* the run the segments belong to */
	r->m = broker_model_get(r->b, model, 0);
	mf = r->m ? broker_manifest_new(&msg.u.manifest) : NULL;
	dcast_msg_free(&msg);
	if (!mf)
		return r->m ? dcast_fail(DCAST_ENOMEM, "restore: manifest of %s", model)
			    : DCAST_EBUSY;
	broker_manifest_put(r->m->manifest);
	r->m->manifest = mf;
	return 0;
}

static int restore_version_new(struct restore *r, uint64_t version)
{
	struct broker_version *v = calloc(1, sizeof(*v));

	if (!v)
		return dcast_fail(DCAST_ENOMEM, "restore: version %llu", (unsigned long long)version);
	v->refs = 1;
	v->version = version;
	v->manifest = r->m->manifest;
	v->manifest->refs++;
	zmq_msg_init(&v->commit_hdr);
	r->v = v;
	r->cap = 0;
	return 0;
}

/* A restored chunk's payload stays in its file, read when it is served
 * (ondisk.c): the heap does not grow with the restored log. */
static int restore_payload(struct restore *r, struct broker_chunk *ch, uint64_t len)
{
	int fd;

	broker_seg_replay_at(r->b->dur->store, &fd, &ch->file_off);
	if ((fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
		return dcast_fail(DCAST_EIO, "restore: read handle: %s", strerror(errno));
	if (!(ch->file = broker_segfile_share(&r->m->segfile, fd)))
		return DCAST_EIO; /* or DCAST_ENOMEM: the detail names it */
	zmq_msg_init(&ch->payload);
	ch->payload_len = len;
	return 0;
}

static int restore_chunk(struct restore *r, const dcast_rec *rec, const void *hdr)
{
	struct broker_chunk *ch;
	struct broker_version *v;
	int rc;

	if (!r->v && (rc = restore_version_new(r, rec->version)))
		return rc;
	v = r->v;
	if (v->n_chunks == r->cap) {
		uint32_t cap = r->cap ? r->cap * 2 : 64;
		struct broker_chunk *c = realloc(v->chunks, cap * sizeof(*c));

		if (!c)
			return dcast_fail(DCAST_ENOMEM, "restore: %u chunks", cap);
		v->chunks = c;
		r->cap = cap;
	}
	ch = &v->chunks[v->n_chunks];
	memset(ch, 0, sizeof(*ch));
	if ((rc = restore_payload(r, ch, rec->payload_len)))
		return rc;
	if ((rc = frame_copy(&ch->hdr, hdr, rec->hdr_len))) {
		broker_segfile_put(ch->file);
		return rc;
	}
	ch->payload_sum = rec->payload_sum; /* checked by the load */
	v->n_chunks++;
	v->payload_bytes += rec->payload_len;
	return 0;
}

/* A whole version past the damage: kept for consumers that hold what it
 * builds on, or (one that does not chain) dropped with the rest. */
static int restore_tail(struct restore *r, struct broker_version *v)
{
	if (r->tail < 0 || broker_log_tail_append(r->m, v)) {
		if (r->tail > 0)
			DCAST_LOG_W("model %s: %s; not served", r->m->name, dcast_last_error());
		r->tail = -1;
		broker_version_put(v);
		return 0;
	}
	DCAST_LOG_I("model %s: version %llu, past the damage, is served to consumers that hold "
		    "version %llu", r->m->name, (unsigned long long)v->version,
		    (unsigned long long)v->base_version);
	return 0;
}

static int restore_commit(struct restore *r, uint64_t version, const void *hdr, size_t len)
{
	struct broker_version *v;
	dcast_msg msg;
	int rc;

	if (!r->v && (rc = restore_version_new(r, version)))
		return rc;
	v = r->v;
	r->v = NULL;
	if ((rc = dcast_msg_decode(hdr, len, &msg)) == 0) {
		v->base_version = msg.u.commit.base_version;
		v->anchor = (int)msg.u.commit.anchor;
		v->n_digests = msg.u.commit.n_digests;
		v->digests = msg.u.commit.digests;
		msg.u.commit.digests = NULL;
		dcast_msg_free(&msg);
		rc = frame_copy(&v->commit_hdr, hdr, len);
	}
	if (!rc && r->tail)
		return restore_tail(r, v);
	if (!rc)
		rc = broker_log_append(r->b, r->m, v);
	if (rc) {
		broker_version_put(v);
		return rc;
	}
	r->versions++;
	return 0;
}

/* A damaged segment lost versions (segment.c set them aside): the model
 * exists, asks its producers for an anchor, and never takes a lost number
 * again.  A relay asks its upstream again from its newest intact version
 * (its HELLO at start): the upstream's numbers name the same bytes. */
#define NO_ANCHOR "its anchor's segment record is damaged (no intact anchor)"
static int restore_lost(struct restore *r, const char *model, uint64_t whole)
{
	struct broker_model *m = broker_model_get(r->b, model, 0);
	char kept[96] = "";

	if (!m && (m = broker_model_get(r->b, model, 1)))
		DCAST_LOG_I("model %s: restored from %s with no whole version, a new run %016llx",
			    model, r->b->cfg.data_dir, (unsigned long long)m->run);
	r->tail = 0; /* the tail, if any, came before */
	if (!m)
		return DCAST_EBUSY;
	if (whole == DCAST_VERSION_NONE)
		return 0;
	if (m->n_tail)
		snprintf(kept, sizeof(kept), "; versions %llu..%llu after the damage are served to "
			 "consumers that hold version %llu or later",
			 (unsigned long long)m->tail[0]->version,
			 (unsigned long long)m->tail[m->n_tail - 1]->version,
			 (unsigned long long)m->tail[0]->base_version);
	if (m->relayed) {
		DCAST_LOG_E("model %s: %s; versions up to %llu were whole on disk and are lost%s: "
			    "asking the upstream again from version %lld", model,
			    m->n_log ? "a segment record is damaged" : NO_ANCHOR,
			    (unsigned long long)whole, kept, (long long)broker_model_newest(m));
		return 0;
	}
	m->lost_version = whole;
	m->need_anchor = 1;
	DCAST_LOG_E("model %s: %s; versions up to %llu were whole on disk and are lost%s: asking "
		    "its producers for an anchor above %llu", model,
		    m->n_log ? "a segment record is damaged" : NO_ANCHOR,
		    (unsigned long long)whole, kept, (unsigned long long)whole);
	return 0;
}

/* A poison mark after the versions it names (segment.c checked it): the
 * version and those after it stay unserved, and the model asks for an
 * anchor, as before the restart. */
static int restore_poison(struct restore *r, uint64_t version)
{
	if (broker_log_find(r->m, version) < 0)
		return 0; /* an anchor after it replaced it */
	if (r->m->poisoned == DCAST_VERSION_NONE || version < r->m->poisoned)
		r->m->poisoned = version;
	r->m->need_anchor = !r->m->relayed; /* a relay's upstream decides what comes */
	DCAST_LOG_W("model %s: version %llu was found poisoned before the restart: it and the "
		    "versions after it are not served; the next version must be an anchor",
		    r->m->name, (unsigned long long)version);
	return 0;
}

static int restore_visit(void *ctx, const char *model, const dcast_rec *rec, const void *hdr,
			 const void *payload)
{
	struct restore *r = ctx;

	(void)payload; /* checked by the load; served from the file (restore_payload) */
	if (rec->kind == BROKER_SEG_MANIFEST)
		return restore_manifest(r, model, hdr, rec->hdr_len);
	if (rec->kind == BROKER_SEG_LOST)
		return restore_lost(r, model, rec->version);
	if (rec->kind == BROKER_SEG_TAIL)
		return r->tail = 1, 0;
	if (!r->m)
		return dcast_fail(DCAST_ECORRUPT, "restore: %s: version before its manifest", model);
	if (rec->kind == BROKER_SEG_CHUNK)
		return restore_chunk(r, rec, hdr);
	if (rec->kind == BROKER_SEG_POISON)
		return restore_poison(r, rec->version);
	return restore_commit(r, rec->version, hdr, rec->hdr_len);
}

static struct broker_durable *durable_new(void)
{
	struct broker_durable *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	d->efd = -1;
	pthread_mutex_init(&d->mu, NULL);
	pthread_cond_init(&d->cv, NULL);
	return d;
}

int broker_durable_restore(struct broker *b)
{
	struct restore r = {.b = b};
	struct broker_durable *d;
	int rc;

	if (!b->cfg.data_dir)
		return 0;
	if (!(d = b->dur = durable_new()))
		return dcast_fail(DCAST_ENOMEM, "durable state");
	if ((rc = broker_seg_open(&d->store, b->cfg.data_dir)))
		return rc;
	DCAST_LOG_I("data dir %s: segments written through %s on a writer thread; ACKs on "
		    "completion", b->cfg.data_dir,
		    broker_seg_uses_uring(d->store) ? "io_uring" : "pread/pwrite");
	rc = broker_seg_load(d->store, restore_visit, &r);
	if (r.v)
		broker_version_put(r.v);
	if (rc)
		return dcast_fail(rc, "restore from %s: %s", b->cfg.data_dir, dcast_last_error());
	DCAST_LOG_I("data dir %s: %llu committed version(s) restored", b->cfg.data_dir,
		    (unsigned long long)r.versions);
	return writer_start(b, d);
}

void broker_durable_close(struct broker *b)
{
	struct broker_durable *d = b->dur;
	struct durable_job *j;

	if (!d)
		return;
	if (d->writer_on) {
		pthread_mutex_lock(&d->mu);
		d->stop = 1;
		pthread_cond_signal(&d->cv);
		pthread_mutex_unlock(&d->mu);
		pthread_join(d->writer, NULL);
		d->writer_on = 0;
	}
	while ((j = queue_pop(&d->done)) != NULL) { /* durable, but the loop is gone: no ACK */
		if (j->drop && j->free_model)
			broker_model_free(j->m); /* removed: in no table, the job held it */
		job_free(j);
	}
	if (d->store)
		DCAST_LOG_I("durable: longest event loop turn on durable work %.2f ms",
			    (double)b->stats.loop_stall_max_ns / 1e6);
	if (d->efd >= 0) {
		broker_poll_del(b, d->efd);
		close(d->efd);
	}
	broker_seg_close(&d->store);
	pthread_mutex_destroy(&d->mu);
	pthread_cond_destroy(&d->cv);
	free(d);
	b->dur = NULL;
}
