/* The outbox: what a caller's thread (apply, poll, close) leaves for the
 * session thread, which alone owns the socket: an ACK, a HELLO (a re-join,
 * backed off after repeated refusals), a refusal, and the wake-up of its
 * poll.  Below the public calls (api.c) and the session itself. */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "consumer_impl.h"
#include "dcast_common.h"

#define CS_BACKOFF_FIRST_MS 100
#define CS_BACKOFF_MAX_MS 30000

/* From here on the old stream is ignored; the HELLO itself goes out on the
 * session thread's next turn (any thread may ask for it). */
int cs_request_hello(dcast_consumer *c)
{
	c->ss.welcomed = 0;
	c->ss.hello_ms = dcast_now_ms();
	c->ob.hello_due = 1;
	cs_wake(c);
	return 0;
}

/* Start over after what we hold: the broker resends what we need.  Versions
 * announced READY stay (a re-join is about the stream, not about them: the
 * caller may apply them at any time); what was still staging is dropped.
 * A refused version is dropped by the caller first (cs_drop_from). */
int cs_rejoin(dcast_consumer *c)
{
	uint32_t keep = cs_ready_chain(c);

	c->ss.progress_ms = dcast_now_ms();
	while (c->n_staged > keep)
		cs_version_drop(c, &c->staged[c->n_staged - 1], 1);
	c->ss.credit_pending = 0;
	c->ss.drop_version = DCAST_VERSION_NONE;
	return cs_request_hello(c);
}

void cs_note_refusal(dcast_consumer *c, uint64_t version)
{
	uint64_t delay = 0;

	c->ob.refusals = c->ob.refused_version == version ? c->ob.refusals + 1 : 1;
	c->ob.refused_version = version;
	if (c->ob.refusals > 1)
		delay = c->ob.refusals - 2 >= 9 ? CS_BACKOFF_MAX_MS : (uint64_t)CS_BACKOFF_FIRST_MS << (c->ob.refusals - 2);
	if (delay > CS_BACKOFF_MAX_MS)
		delay = CS_BACKOFF_MAX_MS;
	c->ob.hello_at_ms = dcast_now_ms() + delay;
	if (delay)
		DCAST_LOG_W("consumer %s: version %" PRIu64 " refused %u times in a row; joining again "
			    "in %" PRIu64 " ms", c->model, version, c->ob.refusals, delay);
}

static int refuse(dcast_consumer *c, uint64_t version, int code, int drop)
{
	DCAST_LOG_W("consumer %s: version %" PRIu64 " refused: %s", c->model, version, dcast_last_error());
	cs_event_push(c, DCAST_EV_ERROR, version, code, dcast_last_error());
	cs_note_refusal(c, version);
	if (drop)
		cs_drop_from(c, version);
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

void cs_wake(dcast_consumer *c)
{
	uint64_t one = 1;

	if (c->ob.wake_fd >= 0 && write(c->ob.wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		DCAST_LOG_W("consumer %s: wake the session thread: %s", c->model, strerror(errno));
}

void cs_ack(dcast_consumer *c, uint64_t version)
{
	c->ob.ack_due = version;
	cs_wake(c);
}

void cs_deadline(struct timespec *ts, int timeout_ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000)
		ts->tv_sec++, ts->tv_nsec -= 1000000000;
}
