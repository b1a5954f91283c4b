/* The producer tests' harness (tests/producer_harness.h, which documents
 * each function): a broker in the test's directory, the producer_reader
 * tool, seeded test data. */
#include "../producer_harness.h"

void harness_init(void)
{
	tp_install();
	alarm(55); /* every test finishes in < 60 s, even if stuck */
}

int harness_broker_start(harness_broker *b, const char *dir)
{
	b->pport = b->cport = 0;
	snprintf(b->log, sizeof(b->log), "%s/broker.log", dir);
	return tp_broker_start(b);
}

int harness_read(const harness_broker *b, const char *model, uint64_t until, const char *out)
{
	char exe[512], v[32];
	pid_t pid;
	int st = 0;

	snprintf(exe, sizeof(exe), "%s/tools/producer_reader", tp_build());
	snprintf(v, sizeof(v), "%llu", (unsigned long long)until);
	if ((pid = fork()) == 0) {
		execl(exe, exe, "--endpoint", b->consumers, "--model", model, "--until", v, "--out",
		      out, "--timeout-ms", "20000", (char *)NULL);
		_exit(127);
	}
	tp_track(pid);
	waitpid(pid, &st, 0);
	tp_untrack(pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

dcast_producer *harness_open_w(const char *ep, const char *model, const dcast_producer_opts *o, uint16_t *w,
			       uint64_t n)
{
	uint64_t shape[1] = {n};
	dcast_producer *p = NULL;

	REQUIRE(dcast_producer_open(ep, model, 0, 1, o, &p) == 0);
	REQUIRE(dcast_producer_register(p, "w", DCAST_DTYPE_BF16, 1, shape, w, DCAST_MEM_HOST, 0, n) == 0);
	return p;
}

int harness_publish(dcast_producer *p, uint64_t v)
{
	int rc = dcast_producer_publish(p, v);

	return rc ? rc : dcast_producer_wait(p, v, 20000);
}

uint64_t harness_rand(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

int harness_same_as_file(const char *path, const char *name, const void *data, size_t bytes)
{
	dcast_st_file *f = NULL;
	const dcast_st_tensor *t;
	int ok;

	if (dcast_st_open(path, &f))
		return 0;
	t = dcast_st_find(f, name);
	ok = t && t->nbytes == bytes && !memcmp(t->data, data, bytes);
	dcast_st_close(&f);
	return ok;
}

void harness_perturb(uint16_t *x, uint64_t n, uint64_t per_million, uint64_t *seed)
{
	for (uint64_t i = 0; i < n; i++)
		if (harness_rand(seed) % 1000000 < per_million)
			x[i] = (uint16_t)(x[i] + 1 + (harness_rand(seed) & 3));
}

void harness_fill(uint16_t *x, uint64_t n, uint64_t *seed)
{
	for (uint64_t i = 0; i < n; i++)
		x[i] = (uint16_t)(0x3c00 + (harness_rand(seed) & 0x3ff)); /* bf16 in [2^-7, ~2^-6] */
}
