/* The outbox: what a caller's thread (apply, poll, close) or the version
 * state machine leaves for the session thread, which alone owns the
 * socket: an ACK, a HELLO (the stream started over), credit freed (not
 * for the bytes of an anchor a bulk connection brings), and
 * the wake-up of its poll; and the one back-off of every re-join that
 * follows a refusal (docs/protocol.md, "Consumer and broker").  Below the
 * public calls (api.c), the state machine (intake.c) and the session. */
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

int cs_stream_restart(dcast_consumer *c)
{
	c->ss.progress_ms = dcast_now_ms();
	c->ss.credit_pending = 0;
	c->ss.drop_version = DCAST_VERSION_NONE;
	return cs_request_hello(c);
}

void cs_credit_free(dcast_consumer *c, uint64_t version, uint64_t bytes)
{
	if (version == c->bulk.rx.version)
		c->bulk.freed += bytes; /* came over the bulk connection, outside the window */
	else
		c->ss.credit_pending += bytes;
}

/* The wait before the HELLO that follows the n-th refusal of one cause
 * in a row: none after the first, then 100 ms doubling to the cap. */
static uint64_t backoff_ms(uint32_t n)
{
	uint64_t ms;

	if (n < 2)
		return 0;
	if (n - 2 >= 9)
		return CS_BACKOFF_MAX_MS;
	ms = (uint64_t)CS_BACKOFF_FIRST_MS << (n - 2);
	return ms < CS_BACKOFF_MAX_MS ? ms : CS_BACKOFF_MAX_MS;
}

static void refused_what(const cs_refusal *r, char *buf, size_t cap)
{
	if (r->what == CS_REFUSED_VERSION)
		snprintf(buf, cap, "version %" PRIu64, r->version);
	else
		snprintf(buf, cap, "%s", r->what == CS_REFUSED_MANIFEST ? "the MANIFEST"
					 : "a message that does not decode");
}

/* The same cause again: the caller hears of it as an ERROR event, the log
 * at E level, both saying when the next HELLO goes. */
static void report_persistent(dcast_consumer *c, uint64_t delay_ms)
{
	const cs_refusal *r = &c->ob.refused;
	char what[64], why[256], text[512];

	snprintf(why, sizeof(why), "%s", dcast_last_error());
	refused_what(r, what, sizeof(what));
	snprintf(text, sizeof(text), "refusal of %s persists (%s, %u times in a row; joining again in %" PRIu64
		 " ms): %s", what, dcast_errname(r->code), c->ob.refusals, delay_ms, why);
	DCAST_LOG_E("consumer %s: %s", c->model, text);
	cs_event_push(c, DCAST_EV_ERROR, r->what == CS_REFUSED_VERSION ? r->version : DCAST_VERSION_NONE,
		      r->code, text);
}

/* The same cause is the same thing refused with the same error at the same
 * place: a version that fails at a different chunk each time is being
 * damaged on the way, and is not backed off. */
void cs_refusal_backoff(dcast_consumer *c, cs_refusal now)
{
	cs_refusal *last = &c->ob.refused;
	int same = c->ob.refusals && last->what == now.what && last->code == now.code &&
		   last->version == now.version && last->place == now.place;
	uint64_t delay_ms;

	c->ob.refusals = same ? c->ob.refusals + 1 : 1;
	*last = now;
	delay_ms = backoff_ms(c->ob.refusals);
	c->ob.hello_at_ms = dcast_now_ms() + delay_ms;
	if (same)
		report_persistent(c, delay_ms);
}

void cs_refusal_clear(dcast_consumer *c, int what)
{
	if (c->ob.refused.what == what)
		c->ob.refusals = 0;
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
