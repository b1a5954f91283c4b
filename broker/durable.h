/* Private to broker/: --data-dir durability (durable.c over segment.c).
 * A committed version is queued to a writer thread that writes and fsyncs
 * it in commit order; its completion comes back through an eventfd in the
 * loop's poll set, and only then is the version ACKed.  The loop itself
 * never waits for the disk.  docs/operations.md, "Durability". */
#ifndef DCAST_BROKER_DURABLE_H
#define DCAST_BROKER_DURABLE_H

#include "broker.h"

/* 1 with --data-dir (after broker_durable_restore): ACKs wait for the
 * durable completion; 0 without, and committed versions are ACKed at once. */
int broker_durable_on(const struct broker *b);

/* Queue v's records for the model's segment (a new segment when v is an
 * anchor) and their fsync, behind every version queued before; returns at
 * once.  The job takes its own reference of v (released on the loop once
 * written).  With ack, the completion ACKs v (broker_version_ack) when it
 * is durable, or reports it lost (broker_version_lost) when not: a failed
 * write, or any later version of the model until an anchor (a hole).
 * No-op without --data-dir.  Errors: DCAST_ENOMEM (nothing queued). */
int broker_durable_commit(struct broker *b, struct broker_model *m, struct broker_version *v,
			  int ack);

/* Queue a poison mark for `version` of m (broker_version_poison): a
 * record after the version's in the model's segment, fsynced, so that a
 * restart restores m->poisoned and need_anchor.  `text` (the ERROR's) is
 * copied.  Written behind every version queued before; skipped when the
 * version did not become durable.  No-op without --data-dir.  Errors:
 * DCAST_ENOMEM (nothing queued). */
int broker_durable_poison(struct broker *b, struct broker_model *m, uint64_t version,
			  const char *text);

/* Queue the deletion of model m's files (its segments), behind every write
 * of it queued before; completions of those writes are skipped (nothing is
 * ACKed) once m is removed (m->deleting) or its run changed.  With
 * free_model (a removed model: m->deleting set, m out of the model table)
 * the completion frees m, once its files are gone (so does
 * broker_durable_close at shutdown).  Only with --data-dir.  Errors:
 * DCAST_ENOMEM (nothing queued). */
int broker_durable_drop(struct broker *b, struct broker_model *m, int free_model);

/* Called at the end of every loop turn: the time this turn spent queueing
 * writes and handling completions goes into stats.loop_stall_max_ns, and a
 * turn over 10 ms of it is logged. */
void broker_durable_turn_end(struct broker *b);

/* Versions queued and not yet reported back (for metrics). */
uint64_t broker_durable_in_flight(const struct broker *b);

/* Open the store in --data-dir, re-insert every durable committed version
 * into the log with broker_log_append(), cutting torn tails, then start the
 * writer thread and put its eventfd in the poll set.  No-op without
 * --data-dir.  Errors: DCAST_EIO (also eventfd, thread), DCAST_ENOMEM, log
 * and poll-set errors. */
int broker_durable_restore(struct broker *b);

/* At shutdown: let the writer finish what is queued (durable, not ACKed:
 * the loop is gone), join it, close the store.  Safe without one. */
void broker_durable_close(struct broker *b);

#endif
