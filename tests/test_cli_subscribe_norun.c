/* deltacast subscribe --until 2 against a broker whose WELCOME names no run
 * (WELCOME.run is optional and 0 means none, as a relay says until its
 * upstream names one; an absent key decodes the same): subscribe exits 0
 * once version 2 is applied.  It applied version 2 and then waited for a
 * run that never came, still running 25 s later.  The broker is a ROUTER
 * socket in this test, speaking the wire format itself (it can send run 0);
 * subscribe is the real program. */
#include <stdint.h>
#include "check.h"
#include "dcast_wire.h"
#include "deltacast/codec.h"
#include "proc.h"

#define N 64
#define MODEL "norun"
#define DEADLINE_MS 20000

static void *router;

static void send_to(const zmq_msg_t *rid, dcast_msg *m, const void *payload, size_t len)
{
	zmq_msg_t p;

	REQUIRE(zmq_msg_init_size(&p, len) == 0);
	if (len)
		memcpy(zmq_msg_data(&p), payload, len);
	REQUIRE(dcast_wire_send(router, zmq_msg_data((zmq_msg_t *)rid), zmq_msg_size((zmq_msg_t *)rid), m,
				len ? &p : NULL, 0) == 0);
	if (!len)
		zmq_msg_close(&p);
}

/* WELCOME with run 0 and version 2, the MANIFEST, and anchor 2 (one CHUNK
 * and its COMMIT) unless the consumer has it already. */
static void serve(const zmq_msg_t *rid, uint64_t have)
{
	dcast_tensor_desc t = {.name = "w", .dtype = DCAST_DTYPE_BF16, .ndim = 1, .shape = {N}};
	dcast_range_digest d = {0, 0, N, 0};
	uint16_t w[N];
	dcast_msg m;

	for (int i = 0; i < N; i++)
		w[i] = (uint16_t)(i * 3 + 1);
	dcast_msg_init(&m, DCAST_MSG_WELCOME);
	strcpy(m.u.welcome.model, MODEL);
	m.u.welcome.version = m.u.welcome.anchor_version = 2;
	m.u.welcome.heartbeat_ms = 60000;
	m.u.welcome.run = 0;
	send_to(rid, &m, NULL, 0);
	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	strcpy(m.u.manifest.model, MODEL);
	m.u.manifest.n_tensors = 1;
	m.u.manifest.tensors = &t;
	send_to(rid, &m, NULL, 0);
	if (have == 2)
		return;
	dcast_msg_init(&m, DCAST_MSG_CHUNK);
	strcpy(m.u.chunk.model, MODEL);
	m.u.chunk.version = 2;
	m.u.chunk.anchor = 1;
	m.u.chunk.count = N, m.u.chunk.elem_size = 2, m.u.chunk.changed = N;
	m.u.chunk.encoding = DCAST_ENC_DENSE, m.u.chunk.payload_bytes = N * 2;
	dcast_chunk_seal(&m.u.chunk, w);
	send_to(rid, &m, w, N * 2);
	REQUIRE(dcast_ldigest(0, 0, w, N, 2, &d.digest) == 0);
	dcast_msg_init(&m, DCAST_MSG_COMMIT);
	strcpy(m.u.commit.model, MODEL);
	m.u.commit.version = 2;
	m.u.commit.anchor = 1, m.u.commit.chunks = 1, m.u.commit.bytes = N * 2;
	m.u.commit.n_digests = 1;
	m.u.commit.digests = &d;
	send_to(rid, &m, NULL, 0);
}

/* Answer every HELLO until the child exits or the deadline passes; the
 * child's wait status, or -1 if it was still running. */
static int broker_until_exit(pid_t pid)
{
	long end = tp_now_ms() + DEADLINE_MS;
	int st;

	while (tp_now_ms() < end) {
		zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
		dcast_wire_in in;

		if (waitpid(pid, &st, WNOHANG) == pid) {
			tp_untrack(pid);
			return st;
		}
		if (zmq_poll(&it, 1, 100) <= 0 || dcast_wire_recv(router, 1, &in, 0))
			continue;
		if (in.msg.type == DCAST_MSG_HELLO)
			serve(&in.rid, in.msg.u.hello.have_version);
		dcast_wire_in_close(&in);
	}
	return -1;
}

int main(void)
{
	char dir[] = "/tmp/dcast-test-norun-XXXXXX", ep[128], bin[512], out_path[600], line[256];
	size_t len = sizeof(ep);
	int out_fd, st, seen = 0;
	void *ctx;
	FILE *f;

	tp_install();
	REQUIRE(mkdtemp(dir));
	REQUIRE((ctx = zmq_ctx_new()) && (router = zmq_socket(ctx, ZMQ_ROUTER)));
	REQUIRE(zmq_bind(router, "tcp://127.0.0.1:*") == 0);
	REQUIRE(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len) == 0);
	snprintf(bin, sizeof(bin), "%s/deltacast", tp_build());
	snprintf(out_path, sizeof(out_path), "%s/out", dir);
	REQUIRE((out_fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) >= 0);
	char *argv[] = {bin, "subscribe", "--broker", ep, "--model", MODEL, "--dir", dir, "--until", "2", NULL};
	pid_t pid = tp_spawn(argv, out_fd, -1);
	close(out_fd);
	REQUIRE(pid > 0);
	st = broker_until_exit(pid);
	if (st == -1)
		fprintf(stderr, "subscribe --until 2 still running after %d ms\n", DEADLINE_MS);
	CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	REQUIRE((f = fopen(out_path, "r")));
	while (fgets(line, sizeof(line), f))
		seen |= !strncmp(line, "version 2 anchor ", 17);
	fclose(f);
	CHECK(seen);
	zmq_close(router);
	zmq_ctx_term(ctx);
	check_remove_dir(dir);
	return check_done("test_cli_subscribe_norun");
}
