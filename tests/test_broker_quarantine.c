/* Damaged segments over a real broker process: a log of
 * an anchor and 6 deltas, all ACKed, then one bit flipped on disk in the
 * anchor's record, in a middle delta's record, in the last record, and a
 * torn last record.  Each time the restarted broker keeps what it cannot
 * read in DATA_DIR/quarantine/ (byte for byte), serves exactly the intact
 * prefix (bit-exact) to new joiners and the intact deltas after the damage
 * to consumers that hold what they build on, names the lost versions, file
 * and quarantine copy in one log line, says at E level that it asks its
 * producers for an anchor, and refuses the numbers of versions that were
 * whole on disk; producers then recover with an anchor. */
#include <dirent.h>
#include <sys/stat.h>
#include "broker_harness.h"
#include "dcast_reclog.h"

#define VERSIONS 7
#define REC_CHUNK 3  /* broker/segment.h record kinds */
#define REC_COMMIT 4

static uint16_t snap[VERSIONS + 2][H_TENSORS][H_ELEMS];
static char dir[] = "/tmp/dcast_test_quarantine_XXXXXX";
static char data[300], qdir[320], mdir[1100];

/* Offset of the first record of `kind` and `version` in a segment image,
 * and (end) where it ends; -1 if none.  Prefix: common/dcast_reclog.h. */
static long find_rec(const uint8_t *p, size_t n, int kind, uint64_t version, size_t *end)
{
	for (size_t off = 0; off + DCAST_REC_PREFIX <= n;) {
		uint32_t hdr_len, payload_len;
		uint64_t v;

		memcpy(&hdr_len, p + off + 8, 4);
		memcpy(&payload_len, p + off + 12, 4);
		memcpy(&v, p + off + 16, 8);
		*end = off + DCAST_REC_PREFIX + hdr_len + payload_len;
		if (p[off + 4] == kind && v == version)
			return (long)off;
		off = *end;
	}
	return -1;
}

/* The path of the one file under DIR (a segment's model folder, or the
 * quarantine); 0 when there is not exactly one. */
static int one_file(const char *d, const char *prefix, char *out, size_t cap)
{
	DIR *h = opendir(d);
	struct dirent *e;
	int n = 0;

	while (h && (e = readdir(h)))
		if (!strncmp(e->d_name, prefix, strlen(prefix)) && e->d_name[0] != '.' && !n++)
			snprintf(out, cap, "%s/%s", d, e->d_name);
	if (h)
		closedir(h);
	return n == 1;
}

/* The quarantined file equals want[0, n); its path goes to q. */
static int quarantined(const uint8_t *want, size_t n, char *q, size_t cap)
{
	size_t got_n;
	uint8_t *got;
	int same;

	if (!one_file(qdir, "", q, cap))
		return 0;
	got = check_read_file(q, &got_n);
	same = got_n == n && memcmp(got, want, n) == 0;
	free(got);
	return same;
}

/* The segment at seg equals want[0, n). */
static int segment_is(const char *seg, const uint8_t *want, size_t n)
{
	size_t got_n;
	uint8_t *got = check_read_file(seg, &got_n);
	int same = got_n == n && memcmp(got, want, n) == 0;

	free(got);
	return same;
}

/* Put `img` (n bytes) back as the only segment of the model's folder
 * (a later anchor's segment goes), with no quarantine. */
static void reset_data(const char *seg, const uint8_t *img, size_t n)
{
	char cmd[2400];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -p '%s'", data, mdir);
	REQUIRE(system(cmd) == 0);
	check_write_file(seg, img, n);
}

/* A fresh consumer receives versions until `want`; its state is snap[want]. */
static void consume_check(tp_broker *br, uint64_t welcome, uint64_t want)
{
	static struct h_client cons;

	h_client_open(&cons, br->cport, "q/model");
	CHECK(h_consume_until(&cons, DCAST_VERSION_NONE, want, 100) == 0);
	CHECK(cons.welcome_version == welcome);
	CHECK(cons.version == want && cons.errors == 0 && cons.digest_mismatch == 0);
	CHECK(memcmp(cons.state, snap[want], sizeof(cons.state)) == 0);
	h_client_close(&cons);
}

/* A consumer that holds `have` (state snap[have]) receives the versions
 * after it until `want`, bit-exact: the deltas past a damaged record. */
static void consume_from(tp_broker *br, uint64_t have, uint64_t want)
{
	static struct h_client cons;

	h_client_open(&cons, br->cport, "q/model");
	memcpy(cons.state, snap[have], sizeof(cons.state));
	cons.version = have;
	CHECK(h_consume_until(&cons, have, want, 100) == 0);
	CHECK(cons.version == want && cons.errors == 0 && cons.digest_mismatch == 0);
	CHECK(cons.commits == want - have && cons.anchors == 0);
	CHECK(memcmp(cons.state, snap[want], sizeof(cons.state)) == 0);
	h_client_close(&cons);
}

/* A producer whose last published version is `at` (state snap[at]). */
static void producer_at(struct h_client *prod, const tp_broker *br, uint64_t at)
{
	h_client_open(prod, br->pport, "q/model");
	memcpy(prod->state, snap[at], sizeof(prod->state));
	memcpy(prod->base, snap[at], sizeof(prod->base));
	prod->version = at;
	REQUIRE(h_producer_join(prod) == 0);
}

/* Case 1: a bit of the anchor's CHUNK payload.  Nothing is whole: the file
 * goes to quarantine whole, the model starts empty, numbers up to 7 are
 * spent, an error line says the producers are asked for an anchor, and an
 * anchor at 8 serves again.  Meanwhile deltas 2..7, intact, are served to
 * consumers that hold 1 or later. */
static void anchor_flipped(tp_broker *br, const char *seg, const uint8_t *orig, size_t n)
{
	static struct h_client prod;
	uint8_t *img = malloc(n);
	char q[700];
	size_t end;
	long off = find_rec(orig, n, REC_CHUNK, 1, &end);

	REQUIRE(img && off > 0);
	memcpy(img, orig, n);
	img[end - 100] ^= 0x10;
	reset_data(seg, img, n);
	REQUIRE(h_broker_start(br) == 0);
	CHECK(check_file_has(br->log, "model q/model: versions 1..7 lost"));
	CHECK(check_file_has(br->log, "whole on disk up to version 7"));
	CHECK(check_file_has(br->log, "no intact anchor left"));
	CHECK(check_file_has(br->log, seg));
	REQUIRE(quarantined(img, n, q, sizeof(q)));
	CHECK(check_file_has(br->log, q));
	CHECK(access(seg, F_OK) != 0);
	CHECK(check_file_has(br->log, "its anchor's segment record is damaged (no intact anchor)"));
	CHECK(check_file_has(br->log, "versions 2..7 after the damage are served to consumers "
			     "that hold version 1 or later: asking its producers for an anchor above 7"));
	consume_from(br, 1, VERSIONS);
	consume_from(br, 5, VERSIONS);

	producer_at(&prod, br, VERSIONS);
	CHECK(prod.welcome_version == DCAST_VERSION_NONE);
	CHECK(tp_metric_now(br->mport, "deltacast_model_lost_version{model=\"q/model\"}") == VERSIONS);
	CHECK(h_client_publish(&prod, VERSIONS, 1, 5) != 0); /* a spent number */
	CHECK(check_file_has(br->log, "version 7 is not above 7, the newest version lost"));
	h_client_close(&prod);
	producer_at(&prod, br, VERSIONS);
	memcpy(snap[VERSIONS + 1], snap[VERSIONS], sizeof(snap[0]));
	CHECK(h_client_publish(&prod, VERSIONS + 1, 1, 100) == 0);
	h_client_close(&prod);
	consume_check(br, VERSIONS + 1, VERSIONS + 1);
	tp_broker_kill(br, SIGKILL);
	free(img);
}

/* Case 2: a bit of delta 4's first CHUNK.  1..3 are served, 4..7 are in
 * quarantine, 5..7 are served to consumers that hold 4 or later; delta 4
 * on 3 is refused (4 was whole on disk), an anchor at 8 is taken. */
static void delta_flipped(tp_broker *br, const char *seg, const uint8_t *orig, size_t n)
{
	static struct h_client prod;
	uint8_t *img = malloc(n);
	char q[700];
	size_t end, keep;
	long off = find_rec(orig, n, REC_CHUNK, 4, &end);

	REQUIRE(img && off > 0 && find_rec(orig, n, REC_COMMIT, 3, &keep) > 0);
	memcpy(img, orig, n);
	img[off + 40] ^= 0x01;
	reset_data(seg, img, n);
	REQUIRE(h_broker_start(br) == 0);
	CHECK(check_file_has(br->log, "model q/model: versions 4..7 lost"));
	CHECK(check_file_has(br->log, "last whole version 3"));
	CHECK(check_file_has(br->log, "whole on disk up to version 7"));
	REQUIRE(quarantined(img + keep, n - keep, q, sizeof(q)));
	CHECK(check_file_has(br->log, q));
	CHECK(segment_is(seg, orig, keep));
	CHECK(check_file_has(br->log, "versions 5..7 after the damage are served to consumers "
			     "that hold version 4 or later"));
	consume_check(br, 3, 3);
	consume_from(br, 4, VERSIONS);

	producer_at(&prod, br, 3);
	CHECK(prod.welcome_version == 3);
	memcpy(prod.state, snap[4], sizeof(prod.state));
	CHECK(h_client_publish(&prod, 4, 0, 5) != 0);
	CHECK(check_file_has(br->log, "version 4 is not above 7, the newest version lost"));
	h_client_close(&prod);
	producer_at(&prod, br, VERSIONS);
	memcpy(snap[VERSIONS + 1], snap[VERSIONS], sizeof(snap[0]));
	CHECK(h_client_publish(&prod, VERSIONS + 1, 1, 100) == 0);
	h_client_close(&prod);
	consume_check(br, VERSIONS + 1, VERSIONS + 1);
	tp_broker_kill(br, SIGKILL);
	free(img);
}

/* Case 3: the last record (7's COMMIT) flipped, or torn (cut 5 bytes
 * short).  1..6 are served, 7's records are in quarantine; 7 was not known
 * whole, so the producer may publish it again as a delta on 6. */
static void last_damaged(tp_broker *br, const char *seg, const uint8_t *orig, size_t n,
			 int torn)
{
	static struct h_client prod;
	uint8_t *img = malloc(n);
	char q[700];
	size_t end, keep, len = torn ? n - 5 : n;
	long off = find_rec(orig, n, REC_COMMIT, VERSIONS, &end);

	REQUIRE(img && off > 0 && end == n && find_rec(orig, n, REC_COMMIT, 6, &keep) > 0);
	memcpy(img, orig, n);
	if (!torn)
		img[off + 36] ^= 0x80;
	reset_data(seg, img, len);
	REQUIRE(h_broker_start(br) == 0);
	CHECK(check_file_has(br->log, "model q/model: version 7 lost"));
	CHECK(check_file_has(br->log, torn ? "torn record" : "record checksum mismatch"));
	CHECK(check_file_has(br->log, "last whole version 6"));
	CHECK(!check_file_has(br->log, "whole on disk up to"));
	REQUIRE(quarantined(img + keep, len - keep, q, sizeof(q)));
	CHECK(segment_is(seg, orig, keep));
	consume_check(br, 6, 6);

	producer_at(&prod, br, 6);
	memcpy(prod.state, snap[VERSIONS], sizeof(prod.state));
	CHECK(h_client_publish(&prod, VERSIONS, 0, 100) == 0);
	h_client_close(&prod);
	consume_check(br, VERSIONS, VERSIONS);
	tp_broker_kill(br, SIGKILL);
	free(img);
}

int main(void)
{
	static struct h_client prod;
	tp_broker br = {0};
	uint32_t rng = 777;
	char seg[2100];
	uint8_t *orig;
	size_t n;

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	snprintf(data, sizeof(data), "%s/data", dir);
	snprintf(qdir, sizeof(qdir), "%s/quarantine", data);
	br.extra[br.n_extra++] = "--data-dir";
	br.extra[br.n_extra++] = data;
	br.extra[br.n_extra++] = "--anchor-fraction";
	br.extra[br.n_extra++] = "0";
	br.with_metrics = 1;
	REQUIRE(h_broker_start(&br) == 0);

	h_client_open(&prod, br.pport, "q/model");
	REQUIRE(h_producer_join(&prod) == 0);
	for (uint64_t v = 1; v <= VERSIONS; v++) {
		h_mutate(&prod, &rng, v == 1 ? 1 : 40);
		CHECK(h_client_publish(&prod, v, v == 1, 100) == 0);
		memcpy(snap[v], prod.state, sizeof(prod.state));
	}
	CHECK(prod.last_ack == VERSIONS);
	h_client_close(&prod);
	tp_broker_kill(&br, SIGKILL);

	REQUIRE(one_file(data, "q", mdir, sizeof(mdir)));
	REQUIRE(one_file(mdir, "seg-", seg, sizeof(seg)));
	orig = check_read_file(seg, &n);
	anchor_flipped(&br, seg, orig, n);
	delta_flipped(&br, seg, orig, n);
	last_damaged(&br, seg, orig, n, 0);
	last_damaged(&br, seg, orig, n, 1);
	free(orig);
	return h_finish(&br, dir, "test_broker_quarantine");
}
