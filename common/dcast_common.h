/* Private helpers shared by every deltacast folder: setting errors with a
 * detail message, leveled logging to stderr, monotonic time, assertions for
 * programming errors (never for peer input). */
#ifndef DCAST_COMMON_H
#define DCAST_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "deltacast/err.h"
#include "deltacast/log.h"

/* Record `err` with a printf-style detail for dcast_last_error() and return
 * it, so that a failure path reads `return dcast_fail(DCAST_EX, "...", ...)`. */
int dcast_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Bytes a peer or a file sent, for an error detail or a log line: the
 * len bytes at s written to out (cap bytes, cap >= 1, always
 * NUL-terminated) as printable ASCII, each byte outside 0x20..0x7e, each
 * backslash and double quote as \xHH, so the text is well-formed UTF-8
 * whatever came and cannot be mistaken for the text around it.  Stops at
 * the last whole escape that fits (DCAST_PRINTABLE_CAP(len) always fits).
 * Returns out, for a printf argument. */
#define DCAST_PRINTABLE_CAP(len) (4 * (len) + 1)
const char *dcast_printable(char *out, size_t cap, const void *s, size_t len);

/* Clear this thread's detail message. */
void dcast_clear_error(void);

/* Log one line (to stderr with a timestamp and level, or to the handler
 * of dcast_log_set_handler) when `level` is at or below the threshold
 * (deltacast/log.h: DELTACAST_LOG=error|warn|info|debug, default info). */
void dcast_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DCAST_LOG_E(...) dcast_log(DCAST_LOG_ERROR, __VA_ARGS__)
#define DCAST_LOG_W(...) dcast_log(DCAST_LOG_WARN, __VA_ARGS__)
#define DCAST_LOG_I(...) dcast_log(DCAST_LOG_INFO, __VA_ARGS__)
#define DCAST_LOG_D(...) dcast_log(DCAST_LOG_DEBUG, __VA_ARGS__)

/* Monotonic clock in nanoseconds / milliseconds. */
uint64_t dcast_now_ns(void);
uint64_t dcast_now_ms(void);
/* Sleep ms milliseconds, the whole of them: a signal's interruption
 * sleeps the rest.  No errors. */
void dcast_sleep_ms(uint64_t ms);
/* CLOCK_REALTIME in nanoseconds: times that other processes compare. */
uint64_t dcast_wall_ns(void);
/* The calling thread's CPU time in nanoseconds. */
uint64_t dcast_thread_cpu_ns(void);

/* Programming-error check: prints file:line and aborts. */
#define DCAST_ASSERT(c)                                                        \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "deltacast: assertion failed: %s (%s:%d)\n", \
				#c, __FILE__, __LINE__);                       \
			abort();                                               \
		}                                                              \
	} while (0)

/* The debug tier (DCAST_DEBUG=1, on in `make test SAN=1`): checks too
 * costly or too fine for every build, such as each transition of the
 * consumer's version state machine at both its ends.  Off, the condition
 * is not evaluated. */
#if defined(DCAST_DEBUG) && DCAST_DEBUG
#define DCAST_DEBUG_ASSERT(c) DCAST_ASSERT(c)
#else
#define DCAST_DEBUG_ASSERT(c) ((void)sizeof(!(c)))
#endif

#define DCAST_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
