/* Leveled logging (to stderr, or to a handler the host installs) and the
 * monotonic clock.  The handler sits behind a read-write lock: log lines
 * take it shared, so they run concurrently, and dcast_log_set_handler takes
 * it exclusively, so that once it returns nobody runs the old handler. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include "dcast_common.h"

static _Atomic int log_threshold = -1;
static pthread_rwlock_t handler_lock = PTHREAD_RWLOCK_INITIALIZER;
static dcast_log_fn handler_fn;
static void *handler_arg;

static int level_from_env(void)
{
	const char *s = getenv("DELTACAST_LOG");
	static const char *names[] = {"error", "warn", "info", "debug"};

	for (int i = 0; s && i < 4; i++)
		if (strcmp(s, names[i]) == 0)
			return i;
	return DCAST_LOG_INFO;
}

void dcast_log_set_level(int level)
{
	log_threshold = level < DCAST_LOG_ERROR ? DCAST_LOG_ERROR
		      : level > DCAST_LOG_DEBUG ? DCAST_LOG_DEBUG : level;
}

int dcast_log_get_level(void)
{
	int t = log_threshold;

	if (t < 0) {
		t = level_from_env();
		log_threshold = t;
	}
	return t;
}

void dcast_log_set_handler(dcast_log_fn fn, void *arg)
{
	pthread_rwlock_wrlock(&handler_lock);
	handler_fn = fn;
	handler_arg = arg;
	pthread_rwlock_unlock(&handler_lock);
}

void dcast_log(int level, const char *fmt, ...)
{
	static const char tag[] = "EWID";
	char line[1024];
	struct timespec ts;
	va_list ap;

	if (level > dcast_log_get_level())
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	pthread_rwlock_rdlock(&handler_lock);
	if (handler_fn) {
		handler_fn(level, line, handler_arg);
	} else {
		clock_gettime(CLOCK_REALTIME, &ts);
		fprintf(stderr, "%lld.%03ld %c %s\n", (long long)ts.tv_sec, ts.tv_nsec / 1000000,
			tag[level & 3], line);
	}
	pthread_rwlock_unlock(&handler_lock);
}

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t dcast_now_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

uint64_t dcast_wall_ns(void)
{
	return clock_ns(CLOCK_REALTIME);
}

uint64_t dcast_thread_cpu_ns(void)
{
	return clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

uint64_t dcast_now_ms(void)
{
	return dcast_now_ns() / 1000000u;
}

void dcast_sleep_ms(uint64_t ms)
{
	struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}
