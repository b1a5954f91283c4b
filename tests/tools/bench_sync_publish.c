/* bench_sync_publish: the paced producer of scripts/bench_sync.sh.  Before
 * each version it waits for a line on stdin (EOF: exit 0), opens FILE[i],
 * registers its tensors and reads every page of them (so that page faults
 * on the file's mapping stay outside the timing, as a trainer's weights are
 * already in memory), then publishes it as version FIRST+i (the first an
 * anchor, then deltas) and waits for the broker's ACK.  Prints, with
 * CLOCK_REALTIME nanoseconds:
 *   publish V T_START_NS T_ACKED_NS
 * T_START_NS is taken just before dcast_producer_publish().
 * usage: bench_sync_publish ENDPOINT MODEL FIRST FILE...
 * Exit 0 at EOF or when every file is acknowledged; 1 with the error on
 * stderr. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"
#include "st_register.h"

static uint64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Read one byte of every 4 KiB page of every tensor of f. */
static void touch_file(const dcast_st_file *f)
{
	volatile unsigned char sink = 0;

	for (size_t i = 0; i < dcast_st_count(f); i++) {
		const dcast_st_tensor *t = dcast_st_tensor_at(f, i);
		const unsigned char *b = t->data;
		for (uint64_t off = 0; off < t->nbytes; off += 4096)
			sink ^= b[off];
	}
	(void)sink;
}

/* Publish FILE as version v: the file stays open in *f (the producer
 * points into it until the next version is registered). */
static int publish_one(dcast_producer *p, const char *path, uint64_t v, dcast_st_file **f)
{
	uint64_t t0;
	int rc;

	if ((rc = dcast_st_open(path, f)) || (rc = st_register_file(p, *f)))
		return rc;
	touch_file(*f);
	t0 = realtime_ns();
	if ((rc = dcast_producer_publish(p, v)) || (rc = dcast_producer_wait(p, v, 60000)))
		return rc;
	printf("publish %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", v, t0, realtime_ns());
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	dcast_st_file *prev = NULL, *f = NULL;
	dcast_producer_opts o;
	dcast_producer *p = NULL;
	uint64_t first;
	int rc = 0;

	if (argc < 5) {
		fprintf(stderr, "usage: bench_sync_publish ENDPOINT MODEL FIRST FILE...\n");
		return 2;
	}
	first = strtoull(argv[3], NULL, 10);
	dcast_producer_opts_init(&o);
	o.client = "bench_sync_publish";
	rc = dcast_producer_open(argv[1], argv[2], 0, 1, &o, &p);
	for (int i = 4; i < argc && !rc; i++) {
		char go[64];
		if (!fgets(go, sizeof(go), stdin))
			break;
		if ((rc = publish_one(p, argv[i], first + (uint64_t)(i - 4), &f)))
			break;
		dcast_st_close(&prev);
		prev = f;
		f = NULL;
	}
	if (rc)
		fprintf(stderr, "bench_sync_publish: %s: %s\n", dcast_errname(rc), dcast_last_error());
	dcast_st_close(&f);
	dcast_st_close(&prev);
	dcast_producer_close(&p);
	return rc ? 1 : 0;
}
