/* Leveled logging to stderr and the monotonic clock. */
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include "dcast_common.h"

static int log_threshold = -1;

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
	log_threshold = level;
}

void dcast_log(int level, const char *fmt, ...)
{
	static const char tag[] = "EWID";
	char line[1024];
	struct timespec ts;
	va_list ap;

	if (log_threshold < 0)
		log_threshold = level_from_env();
	if (level > log_threshold)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "%lld.%03ld %c %s\n", (long long)ts.tv_sec, ts.tv_nsec / 1000000,
		tag[level & 3], line);
}

uint64_t dcast_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t dcast_now_ms(void)
{
	return dcast_now_ns() / 1000000u;
}
