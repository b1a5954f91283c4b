/* Durability over real processes: a broker with --data-dir takes an anchor
 * and deltas (each ACKed after fsync), is killed with SIGKILL, restarts, and
 * serves every committed version to a fresh consumer bit-exact with no
 * producer resending, from its own data dir and from one whose MANIFEST
 * record an older build wrote (no "sum"); then a torn segment tail is cut
 * back to the last whole version, with a log line naming the file and
 * offset; last, a segment of another format stops the broker's start and
 * is left as it is. */
#include <dirent.h>
#include <sys/stat.h>
#include <xxhash.h>
#include "broker_harness.h"
#include "dcast_reclog.h"
#include "old_format.h"

#define VERSIONS 6

/* Path of the one segment file under root/<model folder>/. */
static int find_segment(const char *root, char *out, size_t cap)
{
	DIR *d = opendir(root), *m;
	struct dirent *e, *f;
	int found = 0;

	while (d && !found && (e = readdir(d)))
		if (e->d_name[0] != '.') {
			char sub[1024];

			snprintf(sub, sizeof(sub), "%s/%s", root, e->d_name);
			m = opendir(sub);
			while (m && !found && (f = readdir(m)))
				if (!strncmp(f->d_name, "seg-", 4)) {
					snprintf(out, cap, "%s/%s", sub, f->d_name);
					found = 1;
				}
			if (m)
				closedir(m);
		}
	if (d)
		closedir(d);
	return found;
}

/* Redo the checksum of the record at p: XXH3-64 of the 32 bytes before
 * it, chained over the header that follows the 40-byte prefix
 * (common/dcast_reclog.h). */
static void reseal(uint8_t *p)
{
	uint32_t hdr_len;
	uint64_t h;

	memcpy(&hdr_len, p + 8, 4);
	h = XXH3_64bits_withSeed(p + DCAST_REC_PREFIX, hdr_len, XXH3_64bits(p, 32));
	memcpy(p + 32, &h, 8);
}

/* Rewrite a segment's first record (FILE) as format fmt. */
static void as_format(uint8_t *p, char fmt)
{
	p[3] = (uint8_t)fmt;
	reseal(p);
}

/* Offset of the first MANIFEST record of img[0..n). */
static size_t manifest_record(const uint8_t *img, size_t n)
{
	size_t off = 0;
	uint32_t hdr_len, payload_len;
	uint16_t kind;

	for (; off + DCAST_REC_PREFIX <= n; off += DCAST_REC_PREFIX + hdr_len + payload_len) {
		memcpy(&kind, img + off + 4, 2);
		memcpy(&hdr_len, img + off + 8, 4);
		memcpy(&payload_len, img + off + 12, 4);
		if (kind == DCAST_REC_MANIFEST)
			return off;
	}
	REQUIRE(!"a MANIFEST record");
	return 0;
}

/* Rewrite the segment at path as a build from before MANIFEST.sum wrote
 * it: its MANIFEST record's header without "sum", the records after it
 * moved up. */
static void as_old_manifest(const char *path)
{
	size_t n, off, old_len, rest;
	uint8_t *img = check_read_file(path, &n), *out;
	uint32_t hdr_len;
	void *old;

	off = manifest_record(img, n) + DCAST_REC_PREFIX; /* its header */
	memcpy(&hdr_len, img + off - DCAST_REC_PREFIX + 8, 4);
	REQUIRE(old_without_sum(img + off, hdr_len, &old, &old_len) == 0);
	rest = n - off - hdr_len;
	REQUIRE((out = malloc(n)));
	memcpy(out, img, off);
	memcpy(out + off, old, old_len);
	memcpy(out + off + old_len, img + off + hdr_len, rest);
	hdr_len = (uint32_t)old_len;
	memcpy(out + off - DCAST_REC_PREFIX + 8, &hdr_len, 4);
	reseal(out + off - DCAST_REC_PREFIX);
	check_write_file(path, out, off + old_len + rest);
	free(img), free(out), free(old);
}

int main(void)
{
	static struct h_client prod, cons;
	static uint16_t snap[VERSIONS + 1][H_TENSORS][H_ELEMS];
	static char dir[] = "/tmp/dcast_test_durable_XXXXXX";
	tp_broker br = {0};
	uint32_t rng = 4242;
	char seg[2100], data[300];
	struct stat st;

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	snprintf(data, sizeof(data), "%s/data", dir);
	br.extra[br.n_extra++] = "--data-dir";
	br.extra[br.n_extra++] = data;
	br.with_metrics = 1;
	REQUIRE(h_broker_start(&br) == 0);

	/* Publish an anchor and deltas; every one ACKed (= durable). */
	h_client_open(&prod, br.pport, "durable/model");
	REQUIRE(h_producer_join(&prod) == 0);
	for (uint64_t v = 1; v <= VERSIONS; v++) {
		h_mutate(&prod, &rng, v == 1 ? 1 : 50);
		CHECK(h_client_publish(&prod, v, v == 1, 100) == 0);
		memcpy(snap[v], prod.state, sizeof(prod.state));
	}
	CHECK(prod.last_ack == VERSIONS);
	h_client_close(&prod);

	/* SIGKILL, restart on the same ports and data dir: no producer. */
	tp_broker_kill(&br, SIGKILL);
	REQUIRE(h_broker_start(&br) == 0);
	/* the 6 committed versions restored */
	CHECK(tp_metric_now(br.mport, "deltacast_model_log_versions{model=\"durable/model\"}") == VERSIONS);
	CHECK(tp_metric_now(br.mport, "deltacast_model_version{model=\"durable/model\"}") == VERSIONS);
	h_client_open(&cons, br.cport, "durable/model");
	CHECK(h_consume_until(&cons, DCAST_VERSION_NONE, VERSIONS, 100) == 0);
	CHECK(cons.welcome_version == VERSIONS);
	CHECK(cons.commits == VERSIONS && cons.anchors == 1);
	CHECK(cons.errors == 0 && cons.digest_mismatch == 0);
	CHECK(memcmp(cons.state, snap[VERSIONS], sizeof(cons.state)) == 0);
	h_client_close(&cons);

	/* The data dir of a build from before MANIFEST.sum (its MANIFEST
	 * record without the key): it loads, and the MANIFEST is served with
	 * its sum (the consumer's decoder requires it). */
	tp_broker_kill(&br, SIGKILL);
	REQUIRE(find_segment(data, seg, sizeof(seg)));
	as_old_manifest(seg);
	h_broker_start(&br);
	CHECK(tp_metric_now(br.mport, "deltacast_model_log_versions{model=\"durable/model\"}") == VERSIONS);
	h_client_open(&cons, br.cport, "durable/model");
	CHECK(h_consume_until(&cons, DCAST_VERSION_NONE, VERSIONS, 100) == 0);
	CHECK(cons.commits == VERSIONS && cons.errors == 0 && cons.digest_mismatch == 0);
	CHECK(memcmp(cons.state, snap[VERSIONS], sizeof(cons.state)) == 0);
	h_client_close(&cons);

	/* Tear the tail: the last version's COMMIT record loses 5 bytes. */
	tp_broker_kill(&br, SIGKILL);
	REQUIRE(find_segment(data, seg, sizeof(seg)));
	REQUIRE(stat(seg, &st) == 0 && st.st_size > 5);
	REQUIRE(truncate(seg, st.st_size - 5) == 0);
	REQUIRE(h_broker_start(&br) == 0);
	CHECK(check_file_has(br.log, "cut back to offset"));
	CHECK(check_file_has(br.log, "last whole version 5"));
	CHECK(check_file_has(br.log, seg));
	h_client_open(&cons, br.cport, "durable/model");
	CHECK(h_consume_until(&cons, DCAST_VERSION_NONE, VERSIONS - 1, 100) == 0);
	CHECK(cons.welcome_version == VERSIONS - 1);
	CHECK(cons.version == VERSIONS - 1 && cons.errors == 0 && cons.digest_mismatch == 0);
	CHECK(memcmp(cons.state, snap[VERSIONS - 1], sizeof(cons.state)) == 0);
	h_client_close(&cons);

	/* The producer can publish version 6 again on top of 5. */
	h_client_open(&prod, br.pport, "durable/model");
	memcpy(prod.state, snap[VERSIONS - 1], sizeof(prod.state));
	memcpy(prod.base, snap[VERSIONS - 1], sizeof(prod.base));
	prod.version = VERSIONS - 1;
	REQUIRE(h_producer_join(&prod) == 0);
	CHECK(prod.welcome_version == VERSIONS - 1);
	memcpy(prod.state, snap[VERSIONS], sizeof(prod.state));
	CHECK(h_client_publish(&prod, VERSIONS, 0, 100) == 0);
	h_client_close(&prod);

	/* A segment of another format (its FILE record rewritten whole as
	 * "DCR2"): the broker refuses to start, names the file, leaves it. */
	tp_broker_kill(&br, SIGKILL);
	size_t n;
	uint8_t *img = check_read_file(seg, &n), *after;
	REQUIRE(n > 40 && img[3] == '3');
	as_format(img, '2');
	check_write_file(seg, img, n);
	CHECK(tp_broker_try(&br) != 0 && br.pid == 0); /* exited before binding */
	CHECK(!WIFEXITED(br.exit_status) || WEXITSTATUS(br.exit_status) != 0);
	CHECK(check_file_has(br.log, "record of format 2"));
	CHECK(check_file_has(br.log, seg));
	after = check_read_file(seg, &n);
	CHECK(memcmp(after, img, n) == 0);
	free(img);
	free(after);

	return h_finish(&br, dir, "test_broker_durable");
}
