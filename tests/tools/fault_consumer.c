/* fault_consumer: `deltacast subscribe` for the fault suite.  Follows a
 * model with the consumer library into DIR (checkpoint after every apply,
 * so a restart resumes from DIR) and, after every apply and after loading
 * the checkpoint, prints the model digest of the LIVE tensors
 * (tests/tools/fault_digest.h):
 *   loaded V DIGEST run RUN
 *   applied V anchor|delta DIGEST run RUN
 * RUN is the run a WELCOME confirmed (dcast_consumer_run, 0 before the
 * first).  The suite checks each line against the producer's file for V
 * of that run, so a version reported as applied with other weights, or
 * with another run's, is caught.
 * With FAULT_APPLY_HOLD_MS=N in the environment, a READY version is held
 * N ms before the apply of the newest one READY then, as an engine that
 * waits for its pause point does (a run change or a re-join may drop it
 * meanwhile: nothing is applied, or the apply is refused, and the consumer
 * follows on).
 * Errors the library recovers from (a refused chunk or version, a failed
 * apply or checkpoint write: it re-joins, or the next apply writes the
 * checkpoint again) are printed and followed on; only DCAST_EZMQ from poll
 * (the session itself broken) and a failed digest end it.
 * usage: fault_consumer ENDPOINT MODEL DIR UNTIL [BUDGET_BYTES]
 * Exit 0 once UNTIL is applied and checkpointed; 1 on an error (named on
 * stderr). */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "deltacast/consumer.h"
#include "fault_digest.h"

static fault_entry entries[FAULT_MAX_TENSORS];
static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static int live_digest(dcast_consumer *c, uint64_t *out)
{
	uint32_t n = dcast_consumer_tensor_count(c);

	if (n > FAULT_MAX_TENSORS)
		return DCAST_ETOO_LARGE;
	for (uint32_t i = 0; i < n; i++) {
		dcast_tensor_desc d;
		void *ptr = NULL;
		dcast_mem mem;
		uint64_t bytes;
		int rc = dcast_consumer_tensor_at(c, i, &d);

		if (!rc)
			rc = dcast_consumer_tensor(c, d.name, &ptr, NULL, &mem);
		if (rc)
			return rc;
		bytes = dcast_tensor_elems(&d) * dcast_dtype_size((int)d.dtype);
		fault_entry_set(&entries[i], d.name, ptr, bytes);
	}
	*out = fault_model_digest(entries, n);
	return 0;
}

/* Print the version held and the digest of the live tensors.  The
 * consumer's thread may drop the state between the two reads (a WELCOME of
 * another run: version() becomes NONE, the tensors stay as they were), so
 * the version is read before and after: a line is printed only when both
 * name the same version, never "applied NONE" (seen by the fault suite,
 * segment_corrupt trials that damage the broker's run file). */
static int report(dcast_consumer *c, const char *what)
{
	dcast_consumer_stats st;
	uint64_t digest, v = dcast_consumer_version(c), run = dcast_consumer_run(c);
	int rc = live_digest(c, &digest);

	if (rc) {
		fprintf(stderr, "fault_consumer: digest: %s\n", dcast_last_error());
		return rc;
	}
	if (v == DCAST_VERSION_NONE || dcast_consumer_version(c) != v || dcast_consumer_run(c) != run) {
		fprintf(stderr, "fault_consumer: the state was dropped while reporting; not reported\n");
		return 0;
	}
	dcast_consumer_stats_get(c, &st);
	if (what)
		printf("%s %" PRIu64 " %016" PRIx64, what, v, digest);
	else
		printf("applied %" PRIu64 " %s %016" PRIx64, v, st.anchor ? "anchor" : "delta", digest);
	printf(" run %016" PRIx64 "\n", run);
	fflush(stdout);
	return 0;
}

/* UNTIL held, of the run the broker serves (a WELCOME confirmed it: a
 * checkpoint of an earlier run loaded at open is not the end). */
static int reached(dcast_consumer *c, uint64_t until)
{
	uint64_t v = dcast_consumer_version(c);
	return v != DCAST_VERSION_NONE && v >= until && dcast_consumer_run(c) != 0;
}

/* Print a recoverable error; 0 to go on. */
static int going_on(const char *what, int err)
{
	fprintf(stderr, "fault_consumer: %s: %s: %s; going on\n", what, dcast_errname(err),
		dcast_last_error());
	return 0;
}

static long hold_ms;

/* The engine's wait for its pause point (FAULT_APPLY_HOLD_MS). */
static void hold(void)
{
	struct timespec ts = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};

	if (hold_ms > 0)
		nanosleep(&ts, NULL);
}

/* Apply the newest READY version, once the engine's hold is over, then
 * checkpoint and report it (an event for a version applied already is
 * passed over).  A failed checkpoint is written again after the next
 * apply, or at the end (unsaved). */
static int take(dcast_consumer *c, uint64_t version, int *unsaved)
{
	uint64_t have = dcast_consumer_version(c), ready;
	int err;

	if (have != DCAST_VERSION_NONE && have >= version)
		return 0;
	hold();
	if ((ready = dcast_consumer_ready_version(c)) == DCAST_VERSION_NONE)
		return 0; /* dropped while held (a re-join, a new run) */
	if ((err = dcast_consumer_apply(c, ready))) /* the library dropped it and re-joins */
		return going_on("apply", err);
	if ((err = dcast_consumer_checkpoint(c)))
		going_on("checkpoint", err);
	*unsaved = err != 0;
	return report(c, NULL);
}

static int follow(dcast_consumer *c, uint64_t until)
{
	dcast_event ev;
	int err = 0, unsaved = 0;

	while (!stop && !err && !reached(c, until)) {
		if ((err = dcast_consumer_poll(c, 200, &ev))) {
			err = err == DCAST_EZMQ ? err : going_on("poll", err);
			continue;
		}
		if (ev.type == DCAST_EV_ERROR || ev.type == DCAST_EV_GAP)
			fprintf(stderr, "fault_consumer: %s at version %" PRIu64 ": %s\n",
				ev.type == DCAST_EV_GAP ? "gap" : dcast_errname(ev.code), ev.version,
				ev.text);
		if (ev.type == DCAST_EV_VERSION_READY)
			err = take(c, ev.version, &unsaved);
	}
	return err || stop || !unsaved ? err : dcast_consumer_checkpoint(c);
}

int main(int argc, char **argv)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;
	uint64_t until, budget = 16u << 20;
	int err;

	if (argc < 5 || argc > 6) {
		fprintf(stderr, "usage: fault_consumer ENDPOINT MODEL DIR UNTIL [BUDGET_BYTES]\n");
		return 2;
	}
	until = strtoull(argv[4], NULL, 10);
	if (argc == 6)
		budget = strtoull(argv[5], NULL, 10);
	hold_ms = getenv("FAULT_APPLY_HOLD_MS") ? atol(getenv("FAULT_APPLY_HOLD_MS")) : 0;
	dcast_consumer_opts_init(&o);
	o.fold_every = 1;
	o.client = "fault_consumer";
	signal(SIGTERM, on_signal);
	if ((err = dcast_consumer_open(argv[1], argv[2], argv[3], budget, &o, &c))) {
		fprintf(stderr, "fault_consumer: open: %s: %s\n", dcast_errname(err), dcast_last_error());
		return 1;
	}
	if (dcast_consumer_version(c) != DCAST_VERSION_NONE)
		err = report(c, "loaded");
	if (!err)
		err = follow(c, until);
	if (err)
		fprintf(stderr, "fault_consumer: %s: %s\n", dcast_errname(err), dcast_last_error());
	dcast_consumer_close(&c);
	return err || stop ? 1 : 0;
}
