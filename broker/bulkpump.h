/* The threads that move --bulk transfers' bytes (broker/bulkpump.c).
 * The event loop takes a bulk connection's token and plans what it sends
 * (broker/bulk.c), then gives the connection to one of these threads,
 * which writes it out and gives it back when it is done, failed, went
 * quiet or was cancelled.  While a thread holds a job, the loop touches
 * nothing of it but `cancel` and the counters its step keeps atomic. */
#ifndef DELTACAST_BROKER_BULKPUMP_H
#define DELTACAST_BROKER_BULKPUMP_H

#include <stdatomic.h>
#include <stdint.h>

#define BULK_PUMPS_MAX 16
#define BULK_PUMP_JOBS_MAX 128 /* jobs one thread holds at once (its caller keeps to it) */

/* One write of a job: BULK_STEP_MORE when bytes went out, BULK_STEP_FULL
 * when the socket takes no more now, BULK_STEP_DONE when nothing is left,
 * BULK_STEP_ERR on an error (errno set). */
enum { BULK_STEP_ERR = -1, BULK_STEP_FULL = 0, BULK_STEP_MORE = 1, BULK_STEP_DONE = 2 };

struct bulk_pump_job {
	int fd;                       /* the connection, non-blocking */
	uint64_t quiet_ms;            /* no byte out for this long: the job ends, ETIMEDOUT */
	atomic_int cancel;            /* set by the loop (bulk_pumps_cancel): ends, ECANCELED */
	int rc;                       /* once back: 0 done, else an errno */
	/* the pump's own */
	uint32_t pump;                /* the thread that holds it */
	uint64_t deadline_ms;
	struct bulk_pump_job *next;   /* inbox and finished list */
};

typedef int (*bulk_pump_step_fn)(struct bulk_pump_job *job);

struct bulk_pumps;

/* Start n threads (1..BULK_PUMPS_MAX), each calling step on the jobs it
 * holds, and the eventfd that says jobs came back (bulk_pumps_fd).  *out:
 * owned by the caller (bulk_pumps_free).  Errors: DCAST_ENOMEM,
 * DCAST_EIO (eventfd, epoll or a thread that would not start: nothing is
 * left running). */
int bulk_pumps_start(struct bulk_pumps **out, uint32_t n, bulk_pump_step_fn step);

/* Readable when a job came back: poll it for input, then bulk_pumps_take. */
int bulk_pumps_fd(const struct bulk_pumps *p);

/* Hand job (fd and quiet_ms set, cancel 0) to the thread holding the
 * fewest; it belongs to that thread (job->pump) until bulk_pumps_take
 * returns it.  job->fd must be in no other poll set.  A thread that
 * cannot watch the fd gives the job back at once, rc its errno. */
void bulk_pumps_give(struct bulk_pumps *p, struct bulk_pump_job *job);

/* A job given and not yet back ends soon, with ECANCELED (unless it
 * finishes first). */
void bulk_pumps_cancel(struct bulk_pumps *p, struct bulk_pump_job *job);

/* One job that came back, its rc set, or NULL when none waits. */
struct bulk_pump_job *bulk_pumps_take(struct bulk_pumps *p);

/* Stop every thread and wait for it: the jobs they held come back with
 * ECANCELED (bulk_pumps_take still returns them).  NULL-safe, once. */
void bulk_pumps_stop(struct bulk_pumps *p);

/* Free what bulk_pumps_start made; stops the threads first.  *p NULL
 * after; NULL-safe. */
void bulk_pumps_free(struct bulk_pumps **p);

#endif
