/* A consumer process (`deltacast subscribe`) SIGKILLed in the middle of a
 * version restarts from its directory at the last whole version without
 * downloading the anchor again (its received-bytes count says so), cuts a
 * torn record at the tail of its log, and keeps DIR/model.safetensors equal
 * to the newest version.  Its peak memory while receiving an anchor 40
 * times its staging budget stays near model + budget: the anchor is never
 * held whole in memory.
 *
 * Folds (fold_case): a 32 MB model's deltas folded from the disk keep the
 * directory's allocated bytes (st_blocks, sampled while the fold runs and
 * at each piece, held there by test fault foldpiece before the piece is
 * punched out of the anchor file) at most 1.25 models plus the record
 * log.  A subscriber killed -9 in a later fold, its anchor file punched
 * halfway, finishes the fold at its next open: it loads the newest
 * version without the anchor again, and its file ends bit-exact.  One
 * whose anchor file's header has a tensor's name damaged meanwhile drops
 * the checkpoint (the fold's progress record holds the tensor table it
 * began with) and takes the anchor again: it once finished the fold under
 * the damaged name and reported that version as loaded. */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sys/stat.h>
#include "check.h"
#include "consumer_harness.h"
#include "deltacast/safetensors.h"

#define BUDGET (1u << 20)

static char root[] = "/tmp/dcast-consumer-kill-XXXXXX";

typedef struct sub_proc {
	pid_t pid;
	int out;        /* read end of its stdout */
	char buf[8192];
	size_t len;
} sub_proc;

/* `deltacast subscribe` of model (to version until, folding every
 * fold_every versions, where not NULL). */
static int sub_start_model(sub_proc *s, const h_broker *b, const char *model, const char *dir, const char *until,
			   const char *fold_every)
{
	char bin[512];
	int fds[2];

	snprintf(bin, sizeof(bin), "%s/deltacast", tp_build());
	char *argv[] = {bin, "subscribe", "--broker", (char *)b->consumers, "--model", (char *)model,
			"--dir", (char *)dir, "--budget", "1048576", "--fold-every", (char *)(fold_every ? fold_every : "0"),
			until ? "--until" : NULL, (char *)until, NULL};
	if (pipe(fds))
		return -1;
	s->pid = tp_spawn(argv, fds[1], -1);
	close(fds[1]);
	s->out = fds[0];
	s->len = 0;
	return s->pid > 0 ? 0 : -1;
}

static int sub_start(sub_proc *s, const h_broker *b, const char *dir, const char *until)
{
	return sub_start_model(s, b, "m_kill", dir, until, NULL);
}

/* Next stdout line starting with `prefix` (into line), waiting at most ~30 s. */
static int sub_line(sub_proc *s, const char *prefix, char *line, size_t cap)
{
	for (int i = 0; i < 300; i++) {
		char *nl;
		while ((nl = memchr(s->buf, '\n', s->len))) {
			size_t n = (size_t)(nl - s->buf) + 1;
			int hit = !strncmp(s->buf, prefix, strlen(prefix));
			if (hit)
				snprintf(line, cap, "%.*s", (int)(n - 1), s->buf);
			memmove(s->buf, s->buf + n, s->len - n);
			s->len -= n;
			if (hit)
				return 0;
		}
		struct pollfd p = {s->out, POLLIN, 0};
		if (poll(&p, 1, 100) > 0) {
			ssize_t r = read(s->out, s->buf + s->len, sizeof(s->buf) - 1 - s->len);
			if (r <= 0)
				return -1;
			s->len += (size_t)r;
		}
	}
	return -1;
}

static uint64_t vm_hwm_bytes(pid_t pid)
{
	char path[64], line[256];
	uint64_t kb = 0;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %" SCNu64, &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb * 1024;
}

static void sub_kill(sub_proc *s)
{
	kill(s->pid, SIGKILL);
	waitpid(s->pid, NULL, 0);
	tp_untrack(s->pid);
	close(s->out);
}

/* Append half a record header to the newest record file, or create a torn
 * file for the next version: the tail a crash in the middle of a write leaves. */
static void tear_tail(const char *dir, uint64_t next)
{
	char path[512];
	unsigned char junk[40];
	memset(junk, 0x5a, sizeof(junk));
	snprintf(path, sizeof(path), "%s/model.dlog/%020" PRIu64 ".rec", dir, next);
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
	REQUIRE(fd >= 0);
	REQUIRE(write(fd, junk, sizeof(junk)) == (ssize_t)sizeof(junk));
	close(fd);
}

static int file_equals(const char *path, const h_model *m, uint64_t v)
{
	dcast_st_file *f = NULL;
	char vs[32];
	int ok = dcast_st_open(path, &f) == 0;
	for (int t = 0; ok && t < H_TENSORS; t++) {
		const dcast_st_tensor *s = dcast_st_find(f, m->name[t]);
		ok = s && s->nbytes == m->bytes[t] && !memcmp(s->data, m->snap[v][t], m->bytes[t]);
	}
	snprintf(vs, sizeof(vs), "%" PRIu64, v);
	ok = ok && !strcmp(dcast_st_metadata_get(f, "deltacast.version"), vs);
	dcast_st_close(&f);
	return ok;
}

/* Allocated bytes (st_blocks) of dir's files and of its record log's,
 * the log's into *log. */
static uint64_t dir_blocks(const char *dir, uint64_t *log)
{
	char path[600];
	uint64_t n[2] = {0, 0};

	for (int k = 0; k < 2; k++) {
		snprintf(path, sizeof(path), k ? "%s/model.dlog" : "%s", dir);
		DIR *d = opendir(path);
		struct dirent *e;
		struct stat st;
		while (d && (e = readdir(d)))
			if (fstatat(dirfd(d), e->d_name, &st, 0) == 0 && S_ISREG(st.st_mode))
				n[k] += (uint64_t)st.st_blocks * 512;
		if (d)
			closedir(d);
	}
	*log = n[1];
	return n[0] + n[1];
}

/* The sequence number of a fold's progress record in dir (its newer slot),
 * 0 when there is none. */
static uint64_t fold_seq(const char *dir)
{
	char path[600];
	uint64_t slot[2][6] = {{0}}; /* magic, seq, have, target, done, sum */

	snprintf(path, sizeof(path), "%s/model.safetensors.fold.state", dir);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	for (int k = 0; k < 2; k++)
		if (pread(fd, slot[k], sizeof(slot[k]), k * 512) != (ssize_t)sizeof(slot[k]))
			slot[k][1] = 0;
	close(fd);
	return slot[0][1] > slot[1][1] ? slot[0][1] : slot[1][1];
}

/* The most the directory held beyond its record log, sampled until the
 * anchor file holds version v and no fold's file is left, releasing the
 * fold at each piece (hold: foldpiece's pipe) after sampling it there;
 * stop_seq > 0: return once the progress record reaches it instead.
 * UINT64_MAX when that did not happen within ~60 s. */
static uint64_t fold_peak(const char *dir, int hold, uint64_t v, uint64_t stop_seq, uint64_t *pieces)
{
	char fold[600];
	uint64_t peak = 0, log, seen = 0;

	snprintf(fold, sizeof(fold), "%s/model.safetensors.fold", dir);
	for (int i = 0; i < 60000; i++) {
		uint64_t all = dir_blocks(dir, &log), seq = fold_seq(dir);
		peak = all - log > peak ? all - log : peak;
		if (stop_seq && seq >= stop_seq)
			return peak;
		if (!stop_seq && h_file_version(dir) == v && access(fold, F_OK) != 0)
			return peak;
		if (seq > seen && seq > 1) { /* held before its punch: sampled above */
			seen = seq, ++*pieces;
			REQUIRE(write(hold, "g", 1) == 1);
		}
		poll(NULL, 0, 1);
	}
	return UINT64_MAX;
}

/* Can the file system under dir punch holes (a fold's bound needs it)? */
static int can_punch(const char *dir)
{
	char path[600], block[8192] = {1};
	int fd, ok;

	snprintf(path, sizeof(path), "%s/punch-probe", dir);
	REQUIRE((fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644)) >= 0);
	ok = write(fd, block, sizeof(block)) == (ssize_t)sizeof(block) &&
	     fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 4096) == 0;
	close(fd);
	unlink(path);
	return ok;
}

/* A subscriber of m_fold in dir folding every 3 versions, held at each
 * piece of a fold (test fault foldpiece); *hold: the pipe's write end. */
static void sub_held(sub_proc *s, const h_broker *b, const char *dir, int *hold)
{
	int fds[2];
	char env[64];

	REQUIRE(pipe(fds) == 0);
	snprintf(env, sizeof(env), "foldpiece:%d", fds[0]);
	setenv("DELTACAST_CONSUMER_FAULT", env, 1);
	REQUIRE(sub_start_model(s, b, "m_fold", dir, NULL, "3") == 0);
	unsetenv("DELTACAST_CONSUMER_FAULT");
	close(fds[0]);
	*hold = fds[1];
}

/* Versions from..to (three deltas) published to a held subscriber, whose
 * fold to `to` is killed -9 at its second piece, the first punched out of
 * the anchor file. */
static void kill_in_fold(sub_proc *s, int hold, dcast_producer *p, h_model *m, const char *dir, uint64_t from,
			 uint64_t to)
{
	char line[512], want[32];
	uint64_t pieces = 0;

	for (uint64_t v = from; v <= to; v++)
		REQUIRE(h_publish(p, m, v, 100) == 0);
	snprintf(want, sizeof(want), "version %" PRIu64 " ", to);
	CHECK(sub_line(s, want, line, sizeof(line)) == 0);
	CHECK(fold_peak(dir, hold, to, 3, &pieces) != UINT64_MAX);
	sub_kill(s);
	close(hold);
}

/* A subscriber restarted to version `until`: its first line (into line),
 * the bytes it received for `until`; it must exit 0. */
static uint64_t sub_restart(const h_broker *b, const char *dir, uint64_t until, char *line, size_t cap)
{
	char vs[32], want[32], next[512];
	uint64_t received = UINT64_MAX;
	int status = -1;
	sub_proc s;

	snprintf(vs, sizeof(vs), "%" PRIu64, until);
	snprintf(want, sizeof(want), "version %" PRIu64 " ", until);
	REQUIRE(sub_start_model(&s, b, "m_fold", dir, vs, "3") == 0);
	CHECK(sub_line(&s, "", line, cap) == 0);
	if (strncmp(line, want, strlen(want)))
		CHECK(sub_line(&s, want, next, sizeof(next)) == 0);
	else
		snprintf(next, sizeof(next), "%s", line);
	CHECK(sscanf(next, "version %*u delta bytes %*u stage_ms %*f apply_ms %*f received %" SCNu64, &received) == 1);
	CHECK(waitpid(s.pid, &status, 0) == s.pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	tp_untrack(s.pid);
	close(s.out);
	return received;
}

/* One bit of the first tensor's name in the header of the safetensors
 * file at path flipped: the name stays printable, the JSON well formed. */
static void flip_first_name(const char *path)
{
	dcast_st_file *f = NULL;
	const unsigned char *hdr;
	const dcast_st_tensor *t;
	char quoted[300];
	size_t len;

	REQUIRE(dcast_st_open(path, &f) == 0 && (t = dcast_st_tensor_at(f, 0)));
	snprintf(quoted, sizeof(quoted), "\"%s\"", t->name);
	hdr = dcast_st_header_bytes(f, &len);
	const unsigned char *at = memmem(hdr, len, quoted, strlen(quoted));
	REQUIRE(at && strlen(t->name) >= 2);
	long off = (long)(at - hdr) + 2; /* the name's second character */
	dcast_st_close(&f);
	h_flip_byte(path, off, SEEK_SET, 0x01);
}

/* A 32 MB model folded from the disk by a subscriber (every 3 versions):
 * the directory's peak; a kill in the next fold and the restart, which
 * finishes it; a kill in a third, the anchor file's unpunched tail then
 * damaged: the restart's fold refuses it (the target's COMMIT digests),
 * and the checkpoint is dropped, not loaded torn. */
static void fold_case(const h_broker *b, const char *dir)
{
	dcast_producer *p = NULL;
	sub_proc s;
	h_model m;
	int hold;
	char line[512], path[600];
	uint64_t pieces = 0, peak, model;

	h_model_init(&m, 11, 24);
	model = h_model_bytes(&m);
	REQUIRE(h_producer_open(b, "m_fold", &m, &p) == 0);
	for (uint64_t v = 1; v <= 3; v++)
		REQUIRE(h_publish(p, &m, v, 100) == 0);
	sub_held(&s, b, dir, &hold);
	CHECK(sub_line(&s, "version 3 ", line, sizeof(line)) == 0);
	REQUIRE(h_publish(p, &m, 4, 100) == 0); /* deltas 2..4: the fold to version 4 */
	peak = fold_peak(dir, hold, 4, 0, &pieces);
	fprintf(stderr, "fold: directory peak %" PRIu64 " bytes beyond its record log for a %" PRIu64
		"-byte model (%.3fx), %" PRIu64 " pieces\n", peak, model, (double)peak / (double)model, pieces);
	CHECK(peak != UINT64_MAX && peak <= model + model / 4);
	CHECK(pieces >= 4);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	CHECK(file_equals(path, &m, 4));

	kill_in_fold(&s, hold, p, &m, dir, 5, 7);
	CHECK(h_file_version(dir) == 4 && !file_equals(path, &m, 4)); /* punched: torn as it is */
	REQUIRE(h_publish(p, &m, 8, 100) == 0);
	CHECK(sub_restart(b, dir, 8, line, sizeof(line)) < model / 2); /* no anchor again */
	CHECK(!strncmp(line, "loaded version 7 ", 17));
	CHECK(file_equals(path, &m, 8));

	sub_held(&s, b, dir, &hold);
	kill_in_fold(&s, hold, p, &m, dir, 9, 11);
	for (long k = 1; k <= 4; k++) /* in the tail not punched yet; not all of them rewritten by 9..11 */
		h_flip_byte(path, -k * 100003, SEEK_END, 0x40);
	REQUIRE(h_publish(p, &m, 12, 100) == 0);
	CHECK(sub_restart(b, dir, 12, line, sizeof(line)) > model / 2); /* the anchor again */
	CHECK(strncmp(line, "loaded ", 7) != 0); /* nothing loaded: the versions from the broker's anchor */
	CHECK(file_equals(path, &m, 12));

	sub_held(&s, b, dir, &hold); /* a fold killed, then a tensor's name damaged in the header */
	kill_in_fold(&s, hold, p, &m, dir, 13, 15);
	flip_first_name(path);
	REQUIRE(h_publish(p, &m, 16, 100) == 0);
	CHECK(sub_restart(b, dir, 16, line, sizeof(line)) > model / 2); /* the anchor again */
	CHECK(strncmp(line, "loaded ", 7) != 0); /* not version 15 under the damaged name */
	CHECK(file_equals(path, &m, 16));
	dcast_producer_close(&p);
	h_model_free(&m);
}

int main(void)
{
	h_broker b;
	h_model m;
	dcast_producer *p = NULL;
	sub_proc s;
	char line[512], dir[300], path[400];
	uint64_t loaded = 0, received = UINT64_MAX, hwm, v5 = 0;

	REQUIRE(mkdtemp(root));
	snprintf(dir, sizeof(dir), "%s/worker", root);
	REQUIRE(h_broker_start_args(&b, NULL) == 0);
	h_model_init(&m, 7, 32);
	REQUIRE(h_model_bytes(&m) > 40 * (uint64_t)BUDGET);
	REQUIRE(h_producer_open(&b, "m_kill", &m, &p) == 0);
	for (uint64_t v = 1; v <= 3; v++)
		REQUIRE(h_publish(p, &m, v, 100) == 0);

	REQUIRE(sub_start(&s, &b, dir, NULL) == 0);
	CHECK(sub_line(&s, "version 3 ", line, sizeof(line)) == 0);
	hwm = vm_hwm_bytes(s.pid);
	fprintf(stderr, "subscriber peak RSS %" PRIu64 " bytes for a %" PRIu64 "-byte model, budget %u\n",
		hwm, h_model_bytes(&m), BUDGET);
#ifndef __SANITIZE_ADDRESS__ /* ASan's shadow and quarantine inflate RSS */
	CHECK(hwm > 0 && hwm < h_model_bytes(&m) + BUDGET + (16u << 20));
#endif

	/* A dense-ish version 4, killed while it streams (or just after). */
	REQUIRE(h_publish(p, &m, 4, 3) == 0);
	sub_kill(&s);
	tear_tail(dir, 4);
	tear_tail(dir, 5);

	REQUIRE(h_publish(p, &m, 5, 100) == 0);
	REQUIRE(sub_start(&s, &b, dir, "5") == 0);
	CHECK(sub_line(&s, "loaded version ", line, sizeof(line)) == 0);
	CHECK(sscanf(line, "loaded version %" SCNu64, &loaded) == 1 && (loaded == 3 || loaded == 4));
	CHECK(sub_line(&s, "version 5 ", line, sizeof(line)) == 0);
	CHECK(sscanf(line, "version %" SCNu64 " delta bytes %*u stage_ms %*f apply_ms %*f received %" SCNu64,
		     &v5, &received) == 2 && v5 == 5);
	fprintf(stderr, "restart: loaded %" PRIu64 ", received %" PRIu64 " bytes (model %" PRIu64 ")\n",
		loaded, received, h_model_bytes(&m));
	CHECK(received < h_model_bytes(&m) / 2); /* no anchor again */
	int status = -1;
	CHECK(waitpid(s.pid, &status, 0) == s.pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	tp_untrack(s.pid);
	close(s.out);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	CHECK(file_equals(path, &m, 5));

	dcast_producer_close(&p);
	h_model_free(&m);
	int punch = can_punch(root);
	snprintf(dir, sizeof(dir), "%s/folder", root);
	if (punch)
		fold_case(&b, dir);
	h_broker_stop(&b);
	check_remove_dir(root);
	return punch ? check_done("test_consumer_kill") :
	       check_skip("test_consumer_kill", "the folds' cases: /tmp cannot punch holes (FALLOC_FL_PUNCH_HOLE)");
}
