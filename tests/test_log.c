/* dcast_log_set_handler: lines from several threads reach the handler whole,
 * the threshold drops lines before the handler sees them, and once
 * dcast_log_set_handler returns no thread is still inside the old one. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "proc.h"
#include "dcast_common.h"
#include "deltacast/log.h"

#define THREADS 4
#define LINES 2000

static atomic_int seen[THREADS];
static atomic_int bad_lines;
static atomic_int in_handler, slow_done;
static int slow_arg;

static void count_handler(int level, const char *msg, void *arg)
{
	int t = -1, i = -1;

	if (arg != (void *)&seen || level != DCAST_LOG_INFO ||
	    sscanf(msg, "thread %d line %d", &t, &i) != 2 || t < 0 || t >= THREADS)
		bad_lines++;
	else
		seen[t]++;
}

static void *log_lines(void *p)
{
	int t = (int)(intptr_t)p;

	for (int i = 0; i < LINES; i++) {
		dcast_log(DCAST_LOG_INFO, "thread %d line %d", t, i);
		dcast_log(DCAST_LOG_DEBUG, "thread %d debug %d", t, i); /* above the threshold */
	}
	return NULL;
}

/* The scenario, not a wait: a handler still busy 200 ms after the main
 * thread has seen it start, so that the handler is replaced while a call
 * is in flight. */
static void slow_handler(int level, const char *msg, void *arg)
{
	(void)level, (void)msg, (void)arg;
	in_handler = 1;
	tp_sleep_ms(200);
	slow_done = 1;
}

static int handler_entered(void *arg)
{
	(void)arg;
	return in_handler;
}

static void *log_one(void *p)
{
	(void)p;
	dcast_log(DCAST_LOG_WARN, "slow line");
	return NULL;
}

int main(void)
{
	pthread_t th[THREADS];

	dcast_log_set_level(99);
	CHECK(dcast_log_get_level() == DCAST_LOG_DEBUG);
	dcast_log_set_level(DCAST_LOG_INFO);
	CHECK(dcast_log_get_level() == DCAST_LOG_INFO);
	dcast_log_set_handler(count_handler, &seen);
	for (int t = 0; t < THREADS; t++)
		REQUIRE(pthread_create(&th[t], NULL, log_lines, (void *)(intptr_t)t) == 0);
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	for (int t = 0; t < THREADS; t++)
		CHECK(seen[t] == LINES);
	CHECK(bad_lines == 0);

	/* Replacing the handler waits for a call in flight. */
	dcast_log_set_handler(slow_handler, &slow_arg);
	REQUIRE(pthread_create(&th[0], NULL, log_one, NULL) == 0);
	REQUIRE(tp_wait_until(5000, handler_entered, NULL));
	dcast_log_set_handler(NULL, NULL);
	CHECK(slow_done == 1);
	pthread_join(th[0], NULL);
	dcast_log(DCAST_LOG_INFO, "test_log: back on stderr");
	return check_done("test_log");
}
