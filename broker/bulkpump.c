/* The threads that write --bulk transfers (bulkpump.h).  One event-loop
 * thread writing every transfer was the broker's bound with cores to
 * spare: 16 joiners on a 16-core host took 12x raw TCP, the loop's one
 * core busy copying (docs/benchmarks.md, "Fan-out", 16-core H200 host).
 * Each thread here is an epoll loop over the connections it holds,
 * level-triggered for output, a bounded burst of steps per connection
 * per wake-up, woken by an eventfd for new jobs, cancels and stop.
 * Finished jobs go on one list the event loop takes from, with an
 * eventfd to wake it. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include "bulkpump.h"
#include "dcast_common.h"

#define PUMP_BURST 16  /* steps per connection per wake-up: the others' turn */
#define PUMP_EVENTS 32

struct pump {
	struct bulk_pumps *all;
	uint32_t id;
	pthread_t th;
	int epfd, wake;                /* wake: eventfd, data.ptr NULL in epfd */
	struct bulk_pump_job *inbox;   /* under all->mu */
	uint32_t given;                /* under all->mu: held or in the inbox */
	/* the thread's own */
	struct bulk_pump_job *held[BULK_PUMP_JOBS_MAX];
	uint32_t n_held;
	struct epoll_event ev[PUMP_EVENTS];
	int n_ev;
};

struct bulk_pumps {
	pthread_mutex_t mu;
	bulk_pump_step_fn step;
	int done_fd;
	struct bulk_pump_job *done;    /* under mu */
	int stop;                      /* under mu */
	uint32_t n;
	struct pump pump[BULK_PUMPS_MAX];
};

static void poke(int fd)
{
	uint64_t one = 1;

	if (write(fd, &one, sizeof(one)) != sizeof(one) && errno != EAGAIN)
		DCAST_LOG_W("bulk: eventfd write: %s", strerror(errno));
}

static void drain(int fd)
{
	uint64_t n;

	if (read(fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		DCAST_LOG_W("bulk: eventfd read: %s", strerror(errno));
}

/* j leaves q (held, or not yet: a failed hold): its events later in this
 * batch are dropped (the loop may reuse its memory as soon as it is on the
 * done list). */
static void finish(struct pump *q, struct bulk_pump_job *j, int rc, int watched)
{
	uint32_t i = 0;

	while (i < q->n_held && q->held[i] != j)
		i++;
	if (i < q->n_held)
		q->held[i] = q->held[--q->n_held];
	for (int k = 0; k < q->n_ev; k++)
		if (q->ev[k].data.ptr == j)
			q->ev[k].data.ptr = q; /* skipped */
	if (watched)
		epoll_ctl(q->epfd, EPOLL_CTL_DEL, j->fd, NULL);
	j->rc = rc;
	pthread_mutex_lock(&q->all->mu);
	j->next = q->all->done;
	q->all->done = j;
	DCAST_ASSERT(q->given > 0);
	q->given--;
	pthread_mutex_unlock(&q->all->mu);
	poke(q->all->done_fd);
}

static void hold(struct pump *q, struct bulk_pump_job *j)
{
	struct epoll_event e = {.events = EPOLLOUT, .data.ptr = j};

	DCAST_ASSERT(q->n_held < BULK_PUMP_JOBS_MAX);
	if (epoll_ctl(q->epfd, EPOLL_CTL_ADD, j->fd, &e)) {
		int err = errno;
		DCAST_LOG_W("bulk: thread %u cannot watch a connection: %s", q->id, strerror(err));
		finish(q, j, err, 0);
		return;
	}
	j->deadline_ms = dcast_now_ms() + j->quiet_ms;
	q->held[q->n_held++] = j;
}

/* The wake-up: new jobs held, cancels and stop seen.  1: stop. */
static int woken(struct pump *q)
{
	struct bulk_pump_job *in;
	int stop;

	drain(q->wake);
	pthread_mutex_lock(&q->all->mu);
	in = q->inbox;
	q->inbox = NULL;
	stop = q->all->stop;
	pthread_mutex_unlock(&q->all->mu);
	while (in) {
		struct bulk_pump_job *next = in->next;
		hold(q, in);
		in = next;
	}
	for (uint32_t i = q->n_held; i-- > 0;)
		if (stop || atomic_load_explicit(&q->held[i]->cancel, memory_order_relaxed))
			finish(q, q->held[i], ECANCELED, 1);
	return stop;
}

static void run(struct pump *q, struct bulk_pump_job *j)
{
	int r = BULK_STEP_MORE, moved = 0;

	for (int i = 0; i < PUMP_BURST && r == BULK_STEP_MORE; i++) {
		r = q->all->step(j);
		moved |= r == BULK_STEP_MORE;
	}
	if (r == BULK_STEP_DONE)
		finish(q, j, 0, 1);
	else if (r == BULK_STEP_ERR)
		finish(q, j, errno ? errno : EIO, 1);
	else if (moved)
		j->deadline_ms = dcast_now_ms() + j->quiet_ms;
}

/* Jobs that moved nothing for their quiet_ms end. */
static void expire(struct pump *q)
{
	uint64_t now = dcast_now_ms();

	for (uint32_t i = q->n_held; i-- > 0;)
		if (now >= q->held[i]->deadline_ms)
			finish(q, q->held[i], ETIMEDOUT, 1);
}

static int wait_ms(const struct pump *q)
{
	uint64_t now = dcast_now_ms(), first = UINT64_MAX;

	for (uint32_t i = 0; i < q->n_held; i++)
		first = q->held[i]->deadline_ms < first ? q->held[i]->deadline_ms : first;
	if (first == UINT64_MAX)
		return -1;
	return first <= now ? 0 : first - now > 60000 ? 60000 : (int)(first - now);
}

/* One epoll batch: the wake-up first, so that a job whose event is in the
 * batch is held before it runs.  1: stop. */
static int batch(struct pump *q)
{
	int stop = 0;

	q->n_ev = epoll_wait(q->epfd, q->ev, PUMP_EVENTS, wait_ms(q));
	if (q->n_ev < 0) {
		DCAST_ASSERT(errno == EINTR);
		q->n_ev = 0;
	}
	for (int k = 0; k < q->n_ev; k++)
		if (!q->ev[k].data.ptr)
			stop |= woken(q);
	for (int k = 0; !stop && k < q->n_ev; k++)
		if (q->ev[k].data.ptr && q->ev[k].data.ptr != q)
			run(q, q->ev[k].data.ptr);
	q->n_ev = 0;
	expire(q);
	return stop;
}

/* SIGPIPE blocked on this thread: sendfile(2) has no MSG_NOSIGNAL, and a
 * peer gone between two writes would otherwise end the process; the
 * write fails with EPIPE instead, and the transfer with it. */
static void *pump_main(void *arg)
{
	struct pump *q = arg;
	sigset_t mask;

	sigemptyset(&mask);
	sigaddset(&mask, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	while (!batch(q))
		;
	return NULL;
}

static void pump_close(struct pump *q)
{
	if (q->epfd >= 0)
		close(q->epfd);
	if (q->wake >= 0)
		close(q->wake);
	q->epfd = q->wake = -1;
}

static int pump_start(struct bulk_pumps *all, uint32_t id)
{
	struct pump *q = &all->pump[id];
	struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
	char name[32];

	*q = (struct pump){.all = all, .id = id, .epfd = epoll_create1(EPOLL_CLOEXEC),
			   .wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
	if (q->epfd < 0 || q->wake < 0 || epoll_ctl(q->epfd, EPOLL_CTL_ADD, q->wake, &e) ||
	    (errno = pthread_create(&q->th, NULL, pump_main, q))) {
		int rc = dcast_fail(DCAST_EIO, "bulk: thread %u: %s", id, strerror(errno));
		pump_close(q);
		return rc;
	}
	snprintf(name, sizeof(name), "dcast-bulk-%u", id);
	name[15] = '\0'; /* the kernel's limit */
	pthread_setname_np(q->th, name);
	return 0;
}

int bulk_pumps_start(struct bulk_pumps **out, uint32_t n, bulk_pump_step_fn step)
{
	struct bulk_pumps *p = calloc(1, sizeof(*p));
	int rc = 0;

	DCAST_ASSERT(n >= 1 && n <= BULK_PUMPS_MAX);
	*out = NULL;
	if (!p)
		return dcast_fail(DCAST_ENOMEM, "bulk: %u threads", n);
	pthread_mutex_init(&p->mu, NULL);
	p->step = step;
	if ((p->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
		rc = dcast_fail(DCAST_EIO, "bulk: eventfd: %s", strerror(errno));
	while (!rc && p->n < n && !(rc = pump_start(p, p->n)))
		p->n++;
	if (rc) {
		bulk_pumps_free(&p);
		return rc;
	}
	*out = p;
	return 0;
}

int bulk_pumps_fd(const struct bulk_pumps *p)
{
	return p->done_fd;
}

void bulk_pumps_give(struct bulk_pumps *p, struct bulk_pump_job *job)
{
	struct pump *q = &p->pump[0];

	pthread_mutex_lock(&p->mu);
	DCAST_ASSERT(!p->stop);
	for (uint32_t i = 1; i < p->n; i++)
		q = p->pump[i].given < q->given ? &p->pump[i] : q;
	job->pump = q->id;
	job->rc = 0;
	job->next = q->inbox;
	q->inbox = job;
	q->given++;
	pthread_mutex_unlock(&p->mu);
	poke(q->wake);
}

void bulk_pumps_cancel(struct bulk_pumps *p, struct bulk_pump_job *job)
{
	atomic_store_explicit(&job->cancel, 1, memory_order_relaxed);
	poke(p->pump[job->pump].wake);
}

struct bulk_pump_job *bulk_pumps_take(struct bulk_pumps *p)
{
	struct bulk_pump_job *j;

	drain(p->done_fd);
	pthread_mutex_lock(&p->mu);
	if ((j = p->done))
		p->done = j->next;
	pthread_mutex_unlock(&p->mu);
	return j;
}

void bulk_pumps_stop(struct bulk_pumps *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	if (p->stop) {
		pthread_mutex_unlock(&p->mu);
		return;
	}
	p->stop = 1;
	pthread_mutex_unlock(&p->mu);
	for (uint32_t i = 0; i < p->n; i++)
		poke(p->pump[i].wake);
	for (uint32_t i = 0; i < p->n; i++) {
		pthread_join(p->pump[i].th, NULL);
		pump_close(&p->pump[i]);
	}
}

void bulk_pumps_free(struct bulk_pumps **pp)
{
	struct bulk_pumps *p = *pp;

	if (!p)
		return;
	bulk_pumps_stop(p);
	if (p->done_fd >= 0)
		close(p->done_fd);
	pthread_mutex_destroy(&p->mu);
	free(p);
	*pp = NULL;
}
