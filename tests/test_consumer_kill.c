/* A consumer process (`deltacast subscribe`) SIGKILLed in the middle of a
 * version restarts from its directory at the last whole version without
 * downloading the anchor again (its received-bytes count says so), cuts a
 * torn record at the tail of its log, and keeps DIR/model.safetensors equal
 * to the newest version.  Its peak memory while receiving an anchor 40
 * times its staging budget stays near model + budget: the anchor is never
 * held whole in memory. */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
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

static int sub_start(sub_proc *s, const h_broker *b, const char *dir, const char *until)
{
	char bin[512];
	int fds[2];

	snprintf(bin, sizeof(bin), "%s/deltacast", tp_build());
	char *argv[] = {bin, "subscribe", "--broker", (char *)b->consumers, "--model", "m_kill",
			"--dir", (char *)dir, "--budget", "1048576", until ? "--until" : NULL,
			(char *)until, NULL};
	if (pipe(fds))
		return -1;
	s->pid = tp_spawn(argv, fds[1], -1);
	close(fds[1]);
	s->out = fds[0];
	s->len = 0;
	return s->pid > 0 ? 0 : -1;
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
	int ok = dcast_st_open(path, &f) == 0;
	for (int t = 0; ok && t < H_TENSORS; t++) {
		const dcast_st_tensor *s = dcast_st_find(f, m->name[t]);
		ok = s && s->nbytes == m->bytes[t] && !memcmp(s->data, m->snap[v][t], m->bytes[t]);
	}
	ok = ok && !strcmp(dcast_st_metadata_get(f, "deltacast.version"), "5");
	dcast_st_close(&f);
	return ok;
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
	h_broker_stop(&b);
	check_remove_dir(root);
	return check_done("test_consumer_kill");
}
