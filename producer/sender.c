/* The sender thread: publish() of a host anchor copies the tensors into the
 * baseline and returns; this thread then sends the version from the
 * baseline, under the broker's credit, as publish() would have (re-joins
 * and failures included: a failure settles the version, for wait(),
 * flush() and the stats).  One at a time: the caller's thread joins it
 * before it touches the connection again, so two versions never interleave
 * on the wire. */
#include <errno.h>
#include <string.h>
#include "producer_shared.h"

static void *sender_main(void *arg)
{
	dcast_producer *p = arg;
	prod_sender *s = &p->sender;

	s->send(p, &s->run);
	pthread_mutex_lock(&s->lock);
	s->done = 1;
	pthread_cond_broadcast(&s->done_cv);
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

static int sender_init(prod_sender *s)
{
	pthread_condattr_t ca;

	if (s->ready)
		return 0;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_mutex_init(&s->lock, NULL) || pthread_cond_init(&s->done_cv, &ca)) {
		pthread_condattr_destroy(&ca);
		return dcast_fail(DCAST_ENOMEM, "publish: cannot set up the sender thread's lock");
	}
	pthread_condattr_destroy(&ca);
	s->ready = 1;
	return 0;
}

/* Start the thread sending r with send(); p->sender.shown must already hold
 * what stats_get() reports meanwhile.  Errors: DCAST_ENOMEM (no thread:
 * the caller sends the version itself). */
int prod_sender_start(dcast_producer *p, const prod_run *r, prod_send_fn send)
{
	prod_sender *s = &p->sender;
	int rc;

	DCAST_ASSERT(!s->running);
	if ((rc = sender_init(s)))
		return rc;
	s->run = *r;
	s->send = send;
	s->done = 0;
	if ((rc = pthread_create(&s->thread, NULL, sender_main, p)))
		return dcast_fail(DCAST_ENOMEM, "publish: cannot start the sender thread: %s",
				  strerror(rc));
	s->running = 1;
	return 0;
}

static int wait_done(prod_sender *s, int timeout_ms)
{
	struct timespec ts;
	int rc = 0;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&s->lock);
	while (!s->done && rc != ETIMEDOUT)
		rc = timeout_ms < 0 ? pthread_cond_wait(&s->done_cv, &s->lock)
				    : pthread_cond_timedwait(&s->done_cv, &s->lock, &ts);
	rc = s->done;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* Join the sender thread if one runs: wait up to timeout_ms for it (< 0:
 * as long as it takes; it gives up by itself after ack_timeout_ms without
 * progress).  0 when none runs any more; DCAST_ETIMEDOUT when it still
 * sends. */
int prod_sender_join(dcast_producer *p, int timeout_ms)
{
	prod_sender *s = &p->sender;

	if (!s->running)
		return 0;
	if (!wait_done(s, timeout_ms))
		return dcast_fail(DCAST_ETIMEDOUT, "producer: version %llu is still being sent to "
				  "the broker at %s (%llu of %llu bytes taken)",
				  (unsigned long long)s->run.version, p->endpoint,
				  (unsigned long long)__atomic_load_n(&p->progress.bytes_taken,
								      __ATOMIC_ACQUIRE),
				  (unsigned long long)__atomic_load_n(&p->progress.bytes_total,
								      __ATOMIC_ACQUIRE));
	pthread_join(s->thread, NULL);
	s->running = 0;
	return 0;
}

/* While a sender thread sends (not yet done): copy its `shown` stats into
 * *out and return 1; else 0 (p->stats is the caller's to read). */
int prod_sender_shown(const dcast_producer *p, dcast_producer_stats *out)
{
	prod_sender *s = (prod_sender *)&p->sender;
	int busy;

	if (!s->running)
		return 0;
	pthread_mutex_lock(&s->lock);
	busy = !s->done;
	if (busy)
		*out = s->shown;
	pthread_mutex_unlock(&s->lock);
	return busy;
}

/* Join (as long as it takes) and free: close() after its flush. */
void prod_sender_free(dcast_producer *p)
{
	prod_sender *s = &p->sender;

	prod_sender_join(p, -1);
	if (s->ready) {
		pthread_mutex_destroy(&s->lock);
		pthread_cond_destroy(&s->done_cv);
	}
	s->ready = 0;
}
