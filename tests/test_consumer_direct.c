/* An anchor received in place goes to model.safetensors.new with O_DIRECT
 * (docs/architecture.md, "An anchor's bytes, socket to READY"): the whole
 * pages of each chunk's range straight from the tensors' memory, the head
 * and tail it shares with its neighbours through the page cache.  With the
 * real broker binary and the producer library over loopback TCP, for
 * three models: the harness's (tensors on page boundaries), one whose
 * tensors all but the first start inside a page of the file and end
 * inside one (odd sizes), and one whose f32 tensor follows an odd-length
 * bf16 one (its file offset does not suit its elements: its host copy is
 * on a page of its own and it goes through the page cache).  Chunks of
 * 50001 elements start inside pages too; a fourth model has tensors of
 * megabytes in chunks of 786432 elements (1.5 MiB of bf16, 3 MiB of f32),
 * so that some of the file digest's 1 MiB blocks lie whole in one chunk
 * and are hashed as it lands, others span two and are hashed at the
 * COMMIT (store/anchor.c).  For each: the anchor applies
 * bit-exact, the direct byte counter (dcast_consumer_stats) is above 0
 * where the folder takes O_DIRECT writes (probed here) and 0 where it
 * does not or DELTACAST_DIRECT_IO=0, model.safetensors' data section
 * starts at a multiple of 4096 and holds the anchor bit-exact, and a
 * restart loads it (its file digest checked) and applies the next delta.
 * tests/test_consumer_direct_plain.sh runs it on the pread/pwrite path,
 * _off.sh with DELTACAST_DIRECT_IO=0, _tmpfs.sh on a tmpfs mount;
 * DCAST_TEST_ROOT names the folder to work under (default /tmp). */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "consumer_harness.h"
#include "dcast_common.h"
#include "deltacast/safetensors.h"

#define BUDGET (16u << 20) /* a quarter holds the 3 MiB chunks of m_blocks */
#define ALIGN 4096u

static char root[4096];

static const char *dir_for(const char *name)
{
	static char path[4200];
	snprintf(path, sizeof(path), "%s/%s", root, name);
	return path;
}

/* Does the folder take an O_DIRECT write of one aligned page (and does
 * the environment leave O_DIRECT on)?  What the consumer should find. */
static int direct_expected(const char *dir)
{
	const char *env = getenv("DELTACAST_DIRECT_IO");
	char path[4200];
	void *page = NULL;
	int fd, ok = 0;

	if (env && !strcmp(env, "0"))
		return 0;
	snprintf(path, sizeof(path), "%s/direct.probe", dir);
	fd = open(path, O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
	if (fd >= 0 && posix_memalign(&page, ALIGN, ALIGN) == 0) {
		memset(page, 0, ALIGN);
		ok = pwrite(fd, page, ALIGN, 0) == (ssize_t)ALIGN;
	}
	free(page);
	if (fd >= 0)
		close(fd);
	unlink(path);
	return ok;
}

/* DIR/model.safetensors: its data section starts at a multiple of 4096,
 * and it holds version v of m bit-exact. */
static void check_file(const char *dir, const h_model *m, uint64_t v)
{
	char path[4300];
	dcast_st_file *f = NULL;
	size_t hdr = 0;

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	REQUIRE(dcast_st_open(path, &f) == 0);
	dcast_st_header_bytes(f, &hdr);
	CHECK(hdr % ALIGN == 0);
	for (int t = 0; t < H_TENSORS; t++) {
		const dcast_st_tensor *s = dcast_st_find(f, m->name[t]);
		CHECK(s && s->nbytes == m->bytes[t] && !memcmp(s->data, m->snap[v][t], m->bytes[t]));
	}
	dcast_st_close(&f);
}

static int exists(void *path)
{
	return access(path, F_OK) == 0;
}

/* Until dir's model.safetensors exists, at most 10 s: the anchor's seal,
 * on the fold thread after its apply, once every write of its file is
 * done (they run behind its COMMIT). */
static int sealed(const char *dir)
{
	char p[4300];

	if (snprintf(p, sizeof(p), "%.4096s/model.safetensors", dir) >= (int)sizeof(p))
		return 0;
	return tp_wait_until(10000, exists, p);
}

/* Publish m as anchor 1, take it in place, restart, take delta 2. */
static void run_model(const h_broker *b, const char *name, h_model *m, int direct)
{
	dcast_producer *p = NULL;
	dcast_consumer *c = NULL;
	dcast_consumer_stats st;
	h_seen s = {0};

	REQUIRE(h_producer_open(b, name, m, &p) == 0);
	REQUIRE(h_publish(p, m, 1, 100) == 0);
	REQUIRE(dcast_consumer_open(b->consumers, name, dir_for(name), BUDGET, NULL, &c) == 0);
	CHECK(h_drive(c, m, 1, &s) == 0 && h_equal(c, m, 1));
	CHECK(sealed(dir_for(name)));
	dcast_consumer_stats_get(c, &st);
	CHECK(st.anchor == 1 && st.spilled_chunks == 0); /* in place */
	CHECK(direct ? st.direct_write_bytes > 0 : st.direct_write_bytes == 0);
	CHECK(st.direct_write_bytes % ALIGN == 0 && st.direct_write_bytes <= st.log_write_bytes);
	CHECK(st.direct_write_bytes < h_model_bytes(m)); /* heads and tails: chunks start inside pages */
	fprintf(stderr, "%s: %llu of %llu bytes written direct\n", name,
		(unsigned long long)st.direct_write_bytes, (unsigned long long)h_model_bytes(m));
	dcast_consumer_close(&c);
	check_file(dir_for(name), m, 1);

	REQUIRE(h_publish(p, m, 2, 100) == 0);
	REQUIRE(dcast_consumer_open(b->consumers, name, dir_for(name), BUDGET, NULL, &c) == 0);
	CHECK(dcast_consumer_version(c) == 1 && h_equal(c, m, 1)); /* loaded from its file */
	CHECK(h_drive(c, m, 2, &s) == 0 && h_equal(c, m, 2));
	CHECK(s.errors == 0 && s.apply_failures == 0);
	dcast_consumer_close(&c);
	dcast_producer_close(&p);
	h_model_free(m);
}

int main(void)
{
	static const uint64_t odd_rows[3] = {2, 61, 67}, odd_cols[3] = {1001, 2999, 3001};
	static const uint64_t mis_rows[3] = {1, 64, 33}, mis_cols[3] = {1001, 1024, 3001};
	static const uint64_t big_rows[3] = {1100, 700, 3}, big_cols[3] = {1024, 1024, 1001};
	static const char *const names[H_TENSORS] = {"a.w", "b.f32", "c.b"};
	const char *base = getenv("DCAST_TEST_ROOT");
	h_broker b;
	h_model m;
	int direct;

	snprintf(root, sizeof(root), "%s/dcast-direct-XXXXXX", base && *base ? base : "/tmp");
	REQUIRE(mkdtemp(root));
	direct = direct_expected(root);
	fprintf(stderr, "O_DIRECT %s in %s\n", direct ? "expected" : "not expected", root);
	h_range_elems = 50001; /* chunk ranges start inside pages of the file */
	REQUIRE(h_broker_start_args(&b, NULL) == 0);
	h_model_init(&m, 21, 2);
	run_model(&b, "m_paged", &m, direct);
	h_model_shaped(&m, 22, names, odd_rows, odd_cols); /* offsets 0, 4004, 735760 */
	run_model(&b, "m_odd", &m, direct);
	h_model_shaped(&m, 23, names, mis_rows, mis_cols); /* the f32 tensor at 2002 */
	run_model(&b, "m_misaligned", &m, direct);
	h_range_elems = 786432; /* 1.5 MiB of bf16: blocks whole in a chunk, and across two */
	h_model_shaped(&m, 24, names, big_rows, big_cols);
	run_model(&b, "m_blocks", &m, direct);
	h_broker_stop(&b);
	check_remove_dir(root);
	return check_done("test_consumer_direct");
}
