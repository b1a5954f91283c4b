/* deltacast logging: where the libraries' log lines go.  By default each
 * line goes to stderr with a timestamp and a level letter, when its level is
 * at or below the threshold (DELTACAST_LOG=error|warn|info|debug in the
 * environment, default info).  A handler takes the lines instead, e.g. to
 * route them into a host application's logger (the Python binding sends
 * them to logging.getLogger("deltacast")).
 *
 * Lines come from any thread, including each consumer's own thread and the
 * producer's encoder threads. */
#ifndef DELTACAST_LOG_H
#define DELTACAST_LOG_H

#include "deltacast/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dcast_log_level {
	DCAST_LOG_ERROR = 0,
	DCAST_LOG_WARN = 1,
	DCAST_LOG_INFO = 2,
	DCAST_LOG_DEBUG = 3
} dcast_log_level;

/* A log handler: `level` a dcast_log_level, `msg` one line without a
 * trailing newline or timestamp (valid only during the call), `arg` as
 * given to dcast_log_set_handler.  Called from any thread, possibly from
 * several at once; it must not call dcast_log_set_handler. */
typedef void (*dcast_log_fn)(int level, const char *msg, void *arg);

/* Send every log line at or below the threshold to fn(level, msg, arg)
 * instead of stderr; fn NULL restores stderr.  Thread-safe: when it returns,
 * no thread is still inside the previous handler, so its `arg` may be freed.
 * `arg` stays the caller's.  Never fails. */
DCAST_API void dcast_log_set_handler(dcast_log_fn fn, void *arg);

/* Set the threshold: lines of a level above it are dropped before they are
 * formatted.  A value outside DCAST_LOG_ERROR..DCAST_LOG_DEBUG is clamped.
 * Overrides DELTACAST_LOG.  Thread-safe; never fails. */
DCAST_API void dcast_log_set_level(int level);

/* The current threshold (DELTACAST_LOG, or the last dcast_log_set_level). */
DCAST_API int dcast_log_get_level(void);

#ifdef __cplusplus
}
#endif
#endif
