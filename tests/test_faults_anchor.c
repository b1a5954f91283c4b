/* test_faults_anchor: one flipped bit in the header of a consumer's
 * checkpoint anchor (DIR/model.safetensors) that still parses must not load
 * as a committed version (found by the fault suite: SEED=714783 renamed a
 * tensor, and the consumer reported "loaded 3" with a tensor set that was
 * not version 3's).  The anchor's model digest covers the tensor names,
 * dtypes and shapes and the version as well as the data: open drops a
 * checkpoint with a renamed tensor or a changed version instead of loading
 * it, and fetches the model from the broker by itself: it reaches the
 * producer's version bit-exact (a renamed tensor once left the consumer
 * with the file's tensor table, so the broker's MANIFEST never matched).
 * A record log (DIR/model.dlog) replaced by a plain file is damage too:
 * dropped the same way, not a failed open.  The undamaged file loads
 * bit-exact. */
#include "check.h"
#include "consumer_harness.h"

static char root[] = "/tmp/dcast-faults-anchor-XXXXXX";
static char dir[300], path[400];
static unsigned char *orig;
static long orig_len;

static void put_file(const unsigned char *b, long n)
{
	FILE *f = fopen(path, "wb");

	REQUIRE(f && fwrite(b, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
}

/* Write the anchor with bit 0 of the byte after the first `at` flipped. */
static void flip_after(const char *at)
{
	unsigned char *b = malloc((size_t)orig_len);
	unsigned char *p;

	memcpy(b, orig, (size_t)orig_len);
	p = memmem(b, (size_t)orig_len, at, strlen(at));
	REQUIRE(p);
	p[strlen(at)] ^= 1;
	put_file(b, orig_len);
	free(b);
}

/* The damaged checkpoint is dropped at open (logged), never loaded as a
 * version: the consumer holds none until it applies one from the broker,
 * then reaches version 3 bit-exact. */
static void expect_dropped(const h_broker *br, const h_model *m, const char *what)
{
	dcast_consumer *c = NULL;
	h_seen seen = {0};

	CHECK_ERR(dcast_consumer_open(br->consumers, "m", dir, 16u << 20, NULL, &c), 0);
	if (!c)
		return;
	CHECK(dcast_consumer_version(c) == DCAST_VERSION_NONE);
	fprintf(stderr, "%s: dropped, version %lld\n", what, (long long)dcast_consumer_version(c));
	CHECK(h_drive(c, m, 3, &seen) == 0);
	CHECK(h_equal(c, m, 3));
	fprintf(stderr, "%s: then version %lld from the broker (%d errors)\n", what,
		(long long)dcast_consumer_version(c), seen.errors);
	dcast_consumer_close(&c);
}

/* The same directory opened for another model: refused (DCAST_ESTATE),
 * and its anchor file left as it is, model.dlog in the way or not. */
static void expect_foreign(const h_broker *br)
{
	dcast_consumer *c = NULL;
	FILE *f;
	long n = -1;

	CHECK_ERR(dcast_consumer_open(br->consumers, "other", dir, 16u << 20, NULL, &c), DCAST_ESTATE);
	fprintf(stderr, "another model: %s\n", dcast_last_error());
	if ((f = fopen(path, "rb")) && !fseek(f, 0, SEEK_END))
		n = ftell(f);
	if (f)
		fclose(f);
	CHECK(n == orig_len);
	dcast_consumer_close(&c);
}

/* DIR/model.dlog, a directory of record files, replaced by a plain file. */
static void dlog_to_file(void)
{
	char cmd[600];
	FILE *f;

	snprintf(cmd, sizeof(cmd), "rm -rf '%s/model.dlog'", dir);
	REQUIRE(system(cmd) == 0);
	snprintf(cmd, sizeof(cmd), "%s/model.dlog", dir);
	REQUIRE((f = fopen(cmd, "wb")) && fputs("not a directory\n", f) >= 0);
	fclose(f);
}

int main(void)
{
	dcast_consumer_opts o;
	dcast_consumer *c = NULL;
	dcast_producer *p = NULL;
	h_seen seen = {0};
	h_broker br;
	h_model m;
	FILE *f;

	REQUIRE(mkdtemp(root));
	snprintf(dir, sizeof(dir), "%s/c", root);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	REQUIRE(h_broker_start_args(&br, NULL) == 0);
	h_model_init(&m, 11, 1);
	REQUIRE(h_producer_open(&br, "m", &m, &p) == 0);
	for (uint64_t v = 1; v <= 3; v++)
		REQUIRE(h_publish(p, &m, v, 100) == 0);
	dcast_consumer_opts_init(&o);
	o.fold_every = 1;
	REQUIRE(dcast_consumer_open(br.consumers, "m", dir, 16u << 20, &o, &c) == 0);
	CHECK(h_drive(c, &m, 3, &seen) == 0);
	CHECK(dcast_consumer_checkpoint(c) == 0);
	dcast_consumer_close(&c);

	REQUIRE((f = fopen(path, "rb")) && !fseek(f, 0, SEEK_END) && (orig_len = ftell(f)) > 0);
	REQUIRE((orig = malloc((size_t)orig_len)));
	rewind(f);
	REQUIRE(fread(orig, 1, (size_t)orig_len, f) == (size_t)orig_len);
	fclose(f);

	flip_after("\"layers.0."); /* "layers.0.w" becomes "layers.0.v" */
	expect_dropped(&br, &m, "renamed tensor");
	flip_after("\"deltacast.version\":\""); /* "3" becomes "2" */
	expect_dropped(&br, &m, "version");
	put_file(orig, orig_len);
	dlog_to_file();
	expect_foreign(&br);
	expect_dropped(&br, &m, "model.dlog a plain file");

	put_file(orig, orig_len);
	REQUIRE(dcast_consumer_open(br.consumers, "m", dir, 16u << 20, &o, &c) == 0);
	CHECK(dcast_consumer_version(c) == 3);
	CHECK(h_equal(c, &m, 3));
	dcast_consumer_close(&c);

	free(orig);
	dcast_producer_close(&p);
	h_broker_stop(&br);
	h_model_free(&m);
	check_remove_dir(root);
	return check_done("test_faults_anchor");
}
