/* The record log's durability, off the stream's path.
 *
 * A version is READY once it is whole and checked (checksums of every
 * record, digests of the tensors): that is what correctness needs.  Making
 * its record file durable (fdatasync) is the disk's business and goes to a
 * thread of its own, so an anchor's intake is not held up by an fsync of
 * every byte.  What a restart may trust is unchanged: the loader keeps only
 * records whose checksums verify and cuts the log at the first torn or
 * missing one (ckpt_load.c), so a version the disk did not get whole is
 * never loaded, whatever the page cache had; `synced` tells what the disk
 * has for sure (close waits for it).  A failed fdatasync is reported to the
 * next poll() as DCAST_EIO naming the file: that version may be lost on a
 * power failure, and the next fold (an fsynced model file) covers it. */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>
#include "store_impl.h"
#include "dcast_common.h"

/* fd (record file of version v) durable, what the consumer needs on the
 * disk before it first (the sink's `durable`): 0, or errno with the
 * failure's words in why. */
static int sync_record(cs_syncer *s, int fd, uint64_t v, char *why, size_t cap)
{
	int e;

	if (s->c->store->sink->durable(s->c)) {
		snprintf(why, cap, "record file of version %" PRIu64 ": %s", v, dcast_last_error());
		return EIO;
	}
	if (fdatasync(fd) == 0)
		return 0;
	e = errno;
	snprintf(why, cap, "record file of version %" PRIu64 ": fdatasync: %s", v, strerror(e));
	return e;
}

static void *syncer_main(void *arg)
{
	cs_syncer *s = arg;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->n && !s->stop)
			pthread_cond_wait(&s->cv, &s->mu);
		if (!s->n)
			break; /* stopped, and nothing left */
		int fd = s->fds[s->head];
		uint64_t v = s->vers[s->head];
		pthread_mutex_unlock(&s->mu);
		char why[sizeof(s->err_text)];
		int rc = sync_record(s, fd, v, why, sizeof(why));
		close(fd);
		pthread_mutex_lock(&s->mu);
		s->head = (s->head + 1) % CS_SYNC_QUEUE;
		s->n--;
		if (rc && !s->err) {
			s->err = DCAST_EIO;
			snprintf(s->err_text, sizeof(s->err_text), "%.200s (not durable)", why);
		}
		if (!rc)
			atomic_store(&s->synced, v);
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

int cs_syncer_open(cs_syncer *s, dcast_consumer *c)
{
	memset(s, 0, sizeof(*s));
	s->c = c;
	atomic_init(&s->synced, DCAST_VERSION_NONE);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->inited = 1;
	if (pthread_create(&s->th, NULL, syncer_main, s))
		return dcast_fail(DCAST_ENOMEM, "record log sync thread: %s", strerror(errno));
	pthread_setname_np(s->th, "dcast-sync");
	s->started = 1;
	return 0;
}

int cs_syncer_push(cs_syncer *s, int fd, uint64_t version)
{
	int d = s->started ? dup(fd) : -1;
	char why[sizeof(s->err_text)];

	if (d < 0) /* no thread, or no descriptor to spare: sync here */
		return sync_record(s, fd, version, why, sizeof(why)) ? dcast_fail(DCAST_EIO, "%s", why) : 0;
	pthread_mutex_lock(&s->mu);
	while (s->n == CS_SYNC_QUEUE) /* the disk is this far behind: wait for it */
		pthread_cond_wait(&s->cv, &s->mu);
	s->fds[(s->head + s->n) % CS_SYNC_QUEUE] = d;
	s->vers[(s->head + s->n) % CS_SYNC_QUEUE] = version;
	s->n++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

int cs_syncer_error(cs_syncer *s)
{
	int err;

	if (!s->inited)
		return 0;
	pthread_mutex_lock(&s->mu);
	err = s->err;
	if (err)
		dcast_fail(err, "%s", s->err_text);
	s->err = 0;
	pthread_mutex_unlock(&s->mu);
	return err;
}

void cs_syncer_close(cs_syncer *s)
{
	if (!s->inited)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (s->started)
		pthread_join(s->th, NULL); /* it syncs what is queued first */
	if (cs_syncer_error(s))
		DCAST_LOG_W("consumer: at close: %s", dcast_last_error());
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	s->inited = 0;
}
