/* fault_publish: a paced `deltacast publish` for the fault suite, so that
 * faults strike while versions are still flowing.  Publishes FILE[i] as
 * version FIRST+i with the producer library (the first as an anchor, then
 * deltas), waits for each ACK, prints "acked V", then sleeps INTERVAL_MS.
 * INTERVAL_MS -1: before each version, waits for a line on stdin instead
 * (scripts/bench_e2e.sh paces it; EOF stops it, exit 0).
 * usage: fault_publish ENDPOINT MODEL FIRST INTERVAL_MS FILE...
 * Exit 0 when every file is acknowledged; 1 with the error on stderr. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"
#include "st_register.h"

static void nap(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
	dcast_st_file *prev = NULL, *f = NULL;
	dcast_producer_opts o;
	dcast_producer *p = NULL;
	uint64_t first;
	long interval_ms;
	int rc = 0;

	if (argc < 6) {
		fprintf(stderr, "usage: fault_publish ENDPOINT MODEL FIRST INTERVAL_MS FILE...\n");
		return 2;
	}
	first = strtoull(argv[3], NULL, 10);
	interval_ms = atol(argv[4]);
	dcast_producer_opts_init(&o);
	o.client = "fault_publish";
	o.max_reconnects = 10;
	if ((rc = dcast_producer_open(argv[1], argv[2], 0, 1, &o, &p)))
		goto out;
	for (int i = 5; i < argc && !rc; i++) {
		uint64_t v = first + (uint64_t)(i - 5);
		char go[64];
		if (interval_ms < 0 && !fgets(go, sizeof(go), stdin))
			break;
		if ((rc = dcast_st_open(argv[i], &f)) || (rc = st_register_file(p, f)) ||
		    (rc = dcast_producer_publish(p, v)) || (rc = dcast_producer_wait(p, v, 20000)))
			break;
		dcast_st_close(&prev); /* the producer now points into f */
		prev = f;
		f = NULL;
		printf("acked %" PRIu64 "\n", v);
		fflush(stdout);
		nap(interval_ms > 0 ? interval_ms : 0);
	}
out:
	if (rc)
		fprintf(stderr, "fault_publish: %s: %s\n", dcast_errname(rc), dcast_last_error());
	dcast_st_close(&f);
	dcast_st_close(&prev);
	dcast_producer_close(&p);
	return rc ? 1 : 0;
}
