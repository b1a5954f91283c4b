/* Broker: malformed messages (garbage, wrong proto, bad fields, unknown
 * keys, extra frames, wrong payload size, bad checksum, a range outside the
 * manifest, messages before HELLO) each get an ERROR with the right code
 * while a good consumer and producer on the same broker go on to finish
 * bit-exact.  Real broker process over loopback. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>
#include "check.h"
#include "chunk_fit_cases.h"
#include "proc.h"
#include "deltacast/codec.h"
#include "dcast_common.h"
#include "dcast_wire.h"

static pid_t client_pid[2] = {-1, -1};
static char dir[64] = "/tmp/dcast-malformed.XXXXXX", prod_ep[64], cons_ep[64];
static const char *build;
static tp_broker br;

/* Run argv with stderr appended to log_path; the child is tracked (proc.h). */
static pid_t spawn(char *const argv[], const char *log_path)
{
	int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	pid_t pid = fd >= 0 ? tp_spawn(argv, -1, fd) : -1;

	if (fd >= 0)
		close(fd);
	return pid;
}

/* The broker on ports it picks (tests/proc.h), a 64 KiB producer window. */
static int start_broker(void)
{
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	br.extra[br.n_extra++] = "--producer-window-bytes";
	br.extra[br.n_extra++] = "65536";
	if (tp_broker_start(&br))
		return -1;
	snprintf(prod_ep, sizeof(prod_ep), "%s", br.producers);
	snprintf(cons_ep, sizeof(cons_ep), "%s", br.consumers);
	return 0;
}

static void *dealer(void *ctx, const char *ep)
{
	void *s = zmq_socket(ctx, ZMQ_DEALER);

	REQUIRE(s && !dcast_wire_socket_opts(s) && !zmq_connect(s, ep));
	return s;
}

/* The next message, polling 100 ms at a time from the caller's budget of
 * *rounds: 0 with *in (the caller closes it), -1 when the budget ran out. */
static int next_msg(void *s, dcast_wire_in *in, int *rounds)
{
	while ((*rounds)-- > 0) {
		zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};

		if (zmq_poll(&it, 1, 100) <= 0)
			continue;
		if (dcast_wire_recv(s, 0, in, 0) == 0)
			return 0;
		dcast_wire_in_close(in);
	}
	return -1;
}

/* Wait for the next message other than HEARTBEAT and CREDIT; return its
 * ERROR code (0 if not an ERROR, -1 if none came) and its text. */
static int next_error_text(void *s, char *text, size_t n)
{
	dcast_wire_in in;
	int rounds = 50, code = -1;

	while (code < 0 && next_msg(s, &in, &rounds) == 0) {
		if (in.msg.type == DCAST_MSG_ERROR) {
			code = (int)in.msg.u.error.code;
			snprintf(text, n, "%s", in.msg.u.error.text);
			printf("  ERROR %s: %s\n", dcast_errname(code), in.msg.u.error.text);
		} else if (in.msg.type != DCAST_MSG_HEARTBEAT && in.msg.type != DCAST_MSG_CREDIT) {
			code = 0;
		}
		dcast_wire_in_close(&in);
	}
	return code;
}

/* need_anchor of the next WELCOME (other messages skipped), -1 when none
 * came. */
static int next_need_anchor(void *s)
{
	dcast_wire_in in;
	int rounds = 50, got = -1;

	while (got < 0 && next_msg(s, &in, &rounds) == 0) {
		if (in.msg.type == DCAST_MSG_WELCOME)
			got = (int)in.msg.u.welcome.need_anchor;
		dcast_wire_in_close(&in);
	}
	return got;
}

static int next_error(void *s)
{
	char text[DCAST_MAX_TEXT + 1];

	return next_error_text(s, text, sizeof(text));
}

static void send_frames(void *s, const void *a, size_t al, const void *b, size_t bl,
			const void *c, size_t cl)
{
	zmq_send(s, a, al, b ? ZMQ_SNDMORE : 0);
	if (b)
		zmq_send(s, b, bl, c ? ZMQ_SNDMORE : 0);
	if (c)
		zmq_send(s, c, cl, 0);
}

static void send_msg(void *s, dcast_msg *m, const void *payload, size_t len)
{
	void *hdr;
	size_t hl;

	REQUIRE(dcast_msg_encode(m, &hdr, &hl) == 0);
	send_frames(s, hdr, hl, payload, len, NULL, 0);
	free(hdr);
}

/* Seal m's header and payload (16 bytes) with their checksum. */
static void seal(dcast_msg *m, const uint8_t *payload)
{
	m->u.chunk.checksum = dcast_chunk_checksum(&m->u.chunk, dcast_checksum(payload, 16));
}

static void chunk_msg(dcast_msg *m, uint32_t tensor, uint64_t payload_bytes, const uint8_t *payload)
{
	dcast_msg_init(m, DCAST_MSG_CHUNK);
	strcpy(m->u.chunk.model, "bad");
	m->u.chunk.version = 1;
	m->u.chunk.anchor = 1;
	m->u.chunk.tensor = tensor;
	m->u.chunk.count = 8;
	m->u.chunk.elem_size = 2;
	m->u.chunk.payload_bytes = payload_bytes;
	if (payload)
		seal(m, payload);
}

static void producer_join_model(void *p, const char *model)
{
	dcast_tensor_desc td;
	dcast_msg m;

	chunk_fit_manifest(&m, &td, model);
	send_msg(p, &m, NULL, 0);
}

/* Each CHUNK that does not fit the manifest, refused with the code the
 * consumer gives it too (tests/chunk_fit_cases.h); none opens a version. */
static void chunk_fit_refusals(void *p)
{
	char text[DCAST_MAX_TEXT + 1];

	for (unsigned i = 0; i < chunk_fit_n_cases; i++) {
		const chunk_fit_case *k = &chunk_fit_cases[i];
		const void *payload;
		dcast_msg m;

		chunk_fit_chunk(&m, k, "bad", 1, &payload);
		send_msg(p, &m, payload, m.u.chunk.payload_bytes);
		printf(" %s:\n", k->what);
		CHECK_ERR(next_error_text(p, text, sizeof(text)), k->code);
		CHECK(strstr(text, k->named) != NULL);
	}
}

static void producer_join(void *p)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HELLO);
	strcpy(m.u.hello.model, "bad");
	send_msg(p, &m, NULL, 0);
	CHECK(next_error(p) == 0); /* WELCOME */
	producer_join_model(p, "bad");
}

static void bad_producer_messages(void *p)
{
	static const uint8_t proto3[] = {0x82, 0xa5, 'p', 'r', 'o', 't', 'o', 0x03,
					 0xa4, 't', 'y', 'p', 'e', 0xa5, 'H', 'E', 'L', 'L', 'O'};
	static const uint8_t parts0[] = {0x85, 0xa5, 'p', 'r', 'o', 't', 'o', 0x02, 0xa4, 't', 'y', 'p', 'e',
		0xa5, 'H', 'E', 'L', 'L', 'O', 0xa4, 'r', 'o', 'l', 'e', 0xa8, 'p', 'r', 'o', 'd', 'u', 'c', 'e', 'r',
		0xa5, 'm', 'o', 'd', 'e', 'l', 0xa1, 'x', 0xa5, 'p', 'a', 'r', 't', 's', 0x00};
	static const uint8_t unknown[] = {0x85, 0xa5, 'p', 'r', 'o', 't', 'o', 0x02, 0xa4, 't', 'y', 'p', 'e',
		0xa5, 'H', 'E', 'L', 'L', 'O', 0xa4, 'r', 'o', 'l', 'e', 0xa8, 'p', 'r', 'o', 'd', 'u', 'c', 'e', 'r',
		0xa5, 'm', 'o', 'd', 'e', 'l', 0xa1, 'x', 0xa3, 'z', 'z', 'z', 0x00};
	uint8_t payload[16] = {1, 2, 3};
	dcast_msg m;

	printf("producer endpoint:\n");
	send_frames(p, "garbage!", 8, NULL, 0, NULL, 0);
	CHECK_ERR(next_error(p), DCAST_EMALFORMED);
	send_frames(p, proto3, sizeof(proto3), NULL, 0, NULL, 0);
	CHECK_ERR(next_error(p), DCAST_EPROTO_VERSION);
	send_frames(p, parts0, sizeof(parts0), NULL, 0, NULL, 0);
	CHECK_ERR(next_error(p), DCAST_EFIELD_RANGE);
	send_frames(p, unknown, sizeof(unknown), NULL, 0, NULL, 0);
	CHECK_ERR(next_error(p), DCAST_EFIELD_UNKNOWN);
	send_frames(p, "a", 1, "b", 1, "c", 1);
	CHECK_ERR(next_error(p), DCAST_EMALFORMED);
	chunk_msg(&m, 0, 16, payload);
	send_msg(p, &m, payload, 16);
	CHECK_ERR(next_error(p), DCAST_ESTATE); /* before HELLO */
	producer_join(p);
	chunk_msg(&m, 0, 16, payload);
	send_msg(p, &m, payload, 10);
	CHECK_ERR(next_error(p), DCAST_EPAYLOAD_SIZE);
	chunk_msg(&m, 0, 16, payload);
	m.u.chunk.checksum = 12345;
	send_msg(p, &m, payload, 16);
	CHECK_ERR(next_error(p), DCAST_ECHECKSUM);
	chunk_msg(&m, 0, 16, payload);
	m.u.chunk.start = 8; /* placement changed after sealing, still inside the tensor */
	send_msg(p, &m, payload, 16);
	CHECK_ERR(next_error(p), DCAST_ECHECKSUM);
	chunk_fit_refusals(p);
	/* A good chunk opens version 1; a bad one then drops it for every part. */
	chunk_msg(&m, 0, 16, payload);
	send_msg(p, &m, payload, 16);
	m.u.chunk.seq = 1;
	m.u.chunk.checksum ^= 1;
	send_msg(p, &m, payload, 16);
	CHECK_ERR(next_error(p), DCAST_EABORTED);
	CHECK_ERR(next_error(p), DCAST_ECHECKSUM);
	dcast_msg_init(&m, DCAST_MSG_ACK);
	strcpy(m.u.ack.model, "bad");
	send_msg(p, &m, NULL, 0);
	CHECK_ERR(next_error(p), DCAST_EMSG_TYPE);
}

/* A COMMIT whose digests hold the tensor whole (their values are not
 * checked: this broker does not fold). */
static void commit_msg(dcast_msg *m, uint64_t version, int anchor, uint32_t chunks, uint64_t bytes)
{
	static dcast_range_digest whole = {0, 0, CFC_ELEMS, 0};

	dcast_msg_init(m, DCAST_MSG_COMMIT);
	m->u.commit.n_digests = 1, m->u.commit.digests = &whole;
	strcpy(m->u.commit.model, "bad");
	m->u.commit.version = version;
	m->u.commit.anchor = (uint32_t)anchor;
	m->u.commit.base_version = anchor ? DCAST_VERSION_NONE : version - 1;
	m->u.commit.parts = 1;
	m->u.commit.chunks = chunks;
	m->u.commit.bytes = bytes;
}

/* Once the model has a committed version, a delta CHUNK that says
 * payload_bytes 0 and comes without a payload frame (a valid empty
 * payload) is taken like any other: it aborted the broker in a libzmq
 * assertion (zmq_msg_data of a payload that was never received). */
static void empty_payload_without_frame(void *p)
{
	uint8_t dense[128];
	dcast_msg m;

	printf("delta chunk with payload_bytes 0 and no payload frame:\n");
	for (int i = 0; i < 128; i++)
		dense[i] = (uint8_t)i;
	chunk_msg(&m, 0, 128, dense);
	m.u.chunk.count = 64;
	dcast_chunk_seal(&m.u.chunk, dense);
	send_msg(p, &m, dense, 128);
	commit_msg(&m, 1, 1, 1, 128);
	send_msg(p, &m, NULL, 0);
	CHECK(next_error(p) == 0); /* ACK of the anchor */
	chunk_msg(&m, 0, 0, NULL);
	m.u.chunk.version = 2;
	m.u.chunk.base_version = 1;
	m.u.chunk.anchor = 0;
	m.u.chunk.encoding = DCAST_ENC_IDX32;
	dcast_chunk_seal(&m.u.chunk, "");
	send_msg(p, &m, NULL, 0);
	commit_msg(&m, 2, 0, 1, 0);
	send_msg(p, &m, NULL, 0);
	CHECK(next_error(p) == 0); /* the broker is alive and ACKs version 2 */
}

/* A delta whose COMMIT holds a digest of only half of what its chunk
 * writes: no consumer could check the rest, and each that verifies would
 * refuse the version.  Refused at its COMMIT (DCAST_ECORRUPT, naming the
 * first element left out), not ACKed. */
static void unheld_chunk(void *p)
{
	dcast_range_digest half = {0, 0, CFC_ELEMS / 2, 0};
	char text[DCAST_MAX_TEXT + 1] = "";
	uint8_t dense[CFC_ELEMS * 2] = {9};
	dcast_msg m;

	printf("a delta whose COMMIT holds no digest for half of its chunk:\n");
	chunk_msg(&m, 0, sizeof(dense), dense);
	m.u.chunk.version = 3, m.u.chunk.base_version = 2, m.u.chunk.anchor = 0;
	m.u.chunk.count = m.u.chunk.changed = CFC_ELEMS;
	dcast_chunk_seal(&m.u.chunk, dense);
	send_msg(p, &m, dense, sizeof(dense));
	commit_msg(&m, 3, 0, 1, sizeof(dense));
	m.u.commit.digests = &half;
	send_msg(p, &m, NULL, 0);
	CHECK_ERR(next_error(p), DCAST_EABORTED);
	CHECK_ERR(next_error_text(p, text, sizeof(text)), DCAST_ECORRUPT);
	CHECK(strstr(text, "no range holds element 32 of tensor") != NULL);
}

/* An anchor must carry every element of its manifest: an empty one (a
 * COMMIT of 0 chunks) or one with half a tensor is refused, and the log
 * keeps serving the last good version (it replaced the log, and no fresh
 * consumer could ever obtain weights again). */
static void incomplete_anchors(void *p)
{
	uint8_t half[64] = {7};
	dcast_msg m;

	printf("incomplete anchors:\n");
	commit_msg(&m, 3, 1, 0, 0);
	send_msg(p, &m, NULL, 0);
	CHECK_ERR(next_error(p), DCAST_EABORTED); /* to every part */
	CHECK_ERR(next_error(p), DCAST_ECORRUPT);
	chunk_msg(&m, 0, 64, half);
	m.u.chunk.version = 3;
	m.u.chunk.count = 32;
	dcast_chunk_seal(&m.u.chunk, half);
	send_msg(p, &m, half, 64);
	commit_msg(&m, 3, 1, 1, 64);
	send_msg(p, &m, NULL, 0);
	CHECK_ERR(next_error(p), DCAST_EABORTED);
	CHECK_ERR(next_error(p), DCAST_ECORRUPT);
}

/* Credit is enforced: one 128 KiB chunk against the
 * 64 KiB window (--producer-window-bytes) is refused, not stored. */
static void over_credit(void *p)
{
	static uint8_t big[131072];
	dcast_tensor_desc td;
	dcast_msg m;

	printf("chunk beyond the producer's credit:\n");
	dcast_msg_init(&m, DCAST_MSG_HELLO);
	strcpy(m.u.hello.model, "big");
	send_msg(p, &m, NULL, 0);
	CHECK(next_error(p) == 0); /* WELCOME */
	memset(&td, 0, sizeof(td));
	strcpy(td.name, "w");
	td.dtype = DCAST_DTYPE_BF16;
	td.ndim = 1;
	td.shape[0] = 65536;
	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	strcpy(m.u.manifest.model, "big");
	m.u.manifest.n_tensors = 1;
	m.u.manifest.tensors = &td;
	send_msg(p, &m, NULL, 0);
	chunk_msg(&m, 0, sizeof(big), big);
	strcpy(m.u.chunk.model, "big");
	m.u.chunk.count = 65536;
	dcast_chunk_seal(&m.u.chunk, big);
	send_msg(p, &m, big, sizeof(big));
	CHECK_ERR(next_error(p), DCAST_EBUSY);
}

/* The bytes of the next CREDIT within 2 s (0: none came), other messages
 * passed over. */
static uint64_t next_credit(void *s)
{
	dcast_wire_in in;
	int rounds = 20;
	uint64_t bytes = 0;

	while (!bytes && next_msg(s, &in, &rounds) == 0) {
		if (in.msg.type == DCAST_MSG_CREDIT)
			bytes = in.msg.u.credit.bytes;
		dcast_wire_in_close(&in);
	}
	return bytes;
}

/* HELLO and MANIFEST for model as part 0 of 1; returns the window (the
 * CREDIT after the WELCOME). */
static uint64_t producer_join_window(void *p, const char *model)
{
	uint64_t window;
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HELLO);
	snprintf(m.u.hello.model, sizeof(m.u.hello.model), "%s", model);
	send_msg(p, &m, NULL, 0);
	window = next_credit(p);
	producer_join_model(p, model);
	return window;
}

/* A refused CHUNK's bytes are granted back, as a stored one's are: else
 * each refusal shrinks the producer's window for good. */
static void refused_credit_back(void *p)
{
	uint8_t payload[16] = {4, 5, 6};
	dcast_msg m;

	printf("a refused chunk's credit comes back:\n");
	CHECK(producer_join_window(p, "crd") > 16);
	for (int i = 0; i < 2; i++) {
		chunk_msg(&m, 0, 16, payload);
		strcpy(m.u.chunk.model, "crd");
		seal(&m, payload);
		m.u.chunk.checksum ^= 1;
		send_msg(p, &m, payload, 16);
		CHECK(next_credit(p) == 16);
	}
}

/* A manifest change sends every producer of the model a WELCOME again,
 * but no CREDIT: the window is granted once, after HELLO, and the
 * producer's count of its credit runs on.  (A second window here let a
 * producer count more credit than the broker had granted.)  An ACK from
 * the producer, refused, marks the end of the broker's answers. */
static void manifest_change_keeps_credit(void *p)
{
	dcast_tensor_desc td;
	dcast_msg m;
	int welcomes = 0, credits = 0, code = 0, rounds = 50;
	dcast_wire_in in;

	printf("a manifest change grants no second window:\n");
	CHECK(producer_join_window(p, "mfc") > 0);
	chunk_fit_manifest(&m, &td, "mfc");
	td.shape[0] *= 2;
	send_msg(p, &m, NULL, 0);
	dcast_msg_init(&m, DCAST_MSG_ACK);
	strcpy(m.u.ack.model, "mfc");
	send_msg(p, &m, NULL, 0);
	while (!code && next_msg(p, &in, &rounds) == 0) {
		welcomes += in.msg.type == DCAST_MSG_WELCOME;
		credits += in.msg.type == DCAST_MSG_CREDIT;
		code = in.msg.type == DCAST_MSG_ERROR ? (int)in.msg.u.error.code : 0;
		dcast_wire_in_close(&in);
	}
	CHECK_ERR(code, DCAST_EMSG_TYPE);
	CHECK(welcomes == 1);
	CHECK(credits == 0);
}

/* A peer whose only traffic for 4 s (4 heartbeats) is refused is not
 * silent: it keeps its session. */
static void refused_is_not_silence(void *c)
{
	dcast_msg m;

	printf("refused messages are traffic:\n");
	dcast_msg_init(&m, DCAST_MSG_HELLO);
	m.u.hello.role = DCAST_ROLE_CONSUMER;
	strcpy(m.u.hello.model, "nomodel");
	send_msg(c, &m, NULL, 0);
	CHECK(next_error(c) == 0); /* WELCOME: the model does not exist, nothing streams */
	for (int i = 0; i < 8; i++) {
		send_frames(c, "\xc1", 1, NULL, 0, NULL, 0);
		CHECK_ERR(next_error(c), DCAST_EMALFORMED);
		usleep(500000); /* the scenario: time passes with nothing else sent */
	}
	dcast_msg_init(&m, DCAST_MSG_ACK);
	strcpy(m.u.ack.model, "other");
	send_msg(c, &m, NULL, 0);
	CHECK_ERR(next_error(c), DCAST_EFIELD_RANGE); /* known: DCAST_ESTATE had it been dropped */
}

/* The client port of the one connection to the producer endpoint that is
 * not among before[0..n) (the ports before it was made); -1 if not one. */
static int new_client_port(const int *before, int n)
{
	int now[64], k = tp_tcp_clients(br.pport, now, 64), found = -1;

	for (int i = 0; i < k; i++) {
		int old = 0;
		for (int j = 0; j < n; j++)
			old |= now[i] == before[j];
		if (!old && found >= 0)
			return -1;
		if (!old)
			found = now[i];
	}
	return found;
}

/* Ready: the broker has closed its end of the connection from client port
 * *arg (its ZeroMQ has seen the connection end). */
static int broker_closed(void *arg)
{
	return !tp_tcp_server_open(br.pport, *(int *)arg);
}

/* Found by tests/tools/fuzz_broker: a refusal that drops the open version
 * tells every producer of the model; when one of them had gone (its socket
 * closed, not yet timed out) the failed send replaced the reason, and the
 * refused producer got ERROR DCAST_ECORRUPT "send routing id: Host
 * unreachable" instead of what was wrong with its COMMIT. */
static void reason_survives_failed_send(void *ctx)
{
	int before[64], n = tp_tcp_clients(br.pport, before, 64), port;
	void *p, *gone = dealer(ctx, prod_ep);
	uint8_t dense[128] = {5};
	char text[DCAST_MAX_TEXT + 1] = "";
	dcast_msg m;

	printf("the refusal's reason survives a send to a producer that is gone:\n");
	dcast_msg_init(&m, DCAST_MSG_HELLO);
	strcpy(m.u.hello.model, "gone");
	m.u.hello.part = 1;
	m.u.hello.parts = 2;
	send_msg(gone, &m, NULL, 0);
	CHECK(next_error(gone) == 0); /* WELCOME */
	REQUIRE((port = new_client_port(before, n)) > 0 && tp_tcp_server_open(br.pport, port));
	zmq_close(gone);
	REQUIRE(tp_wait_until(5000, broker_closed, &port)); /* the broker sees the connection end */
	p = dealer(ctx, prod_ep);
	dcast_msg_init(&m, DCAST_MSG_HELLO);
	strcpy(m.u.hello.model, "gone");
	send_msg(p, &m, NULL, 0);
	CHECK(next_error(p) == 0);
	producer_join_model(p, "gone");
	chunk_msg(&m, 0, 128, dense);
	strcpy(m.u.chunk.model, "gone");
	m.u.chunk.count = 64;
	dcast_chunk_seal(&m.u.chunk, dense);
	send_msg(p, &m, dense, 128);
	commit_msg(&m, 1, 1, 2, 128); /* says 2 chunks: 1 came */
	strcpy(m.u.commit.model, "gone");
	send_msg(p, &m, NULL, 0);
	CHECK_ERR(next_error(p), DCAST_EABORTED);
	CHECK_ERR(next_error_text(p, text, sizeof(text)), DCAST_ECORRUPT);
	CHECK(strstr(text, "COMMIT says 2 chunks") != NULL);
	zmq_close(p);
}

static void bad_consumer_messages(void *c)
{
	dcast_msg m;

	printf("consumer endpoint:\n");
	send_frames(c, "\xc1", 1, NULL, 0, NULL, 0);
	CHECK_ERR(next_error(c), DCAST_EMALFORMED);
	dcast_msg_init(&m, DCAST_MSG_CREDIT);
	m.u.credit.bytes = 10;
	send_msg(c, &m, NULL, 0);
	CHECK_ERR(next_error(c), DCAST_ESTATE);
	dcast_msg_init(&m, DCAST_MSG_HELLO);
	strcpy(m.u.hello.model, "bad");
	send_msg(c, &m, NULL, 0); /* role producer on the consumer endpoint */
	CHECK_ERR(next_error(c), DCAST_EFIELD_RANGE);
}

/* The schema vector schema/vectors/NAME.msgpack, sent as a header frame. */
static void send_vector(void *s, const char *name)
{
	static char buf[4096];
	char path[256];
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "schema/vectors/%s.msgpack", name);
	REQUIRE((f = fopen(path, "rb")));
	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	send_frames(s, buf, n, NULL, 0, NULL, 0);
}

/* The codes docs/protocol.md ("Error codes", "Order of checks") gives for
 * refusals a peer written from it needs to know: all found as the header
 * is decoded, before the connection's state is looked at (x has sent no
 * HELLO), then one found against the open version. */
static void documented_codes(void *ctx)
{
	static const char big_name[] = "\x82\xa5proto\x02\xa4type"; /* then a 16 MiB str */
	uint8_t payload[16] = {0};
	dcast_tensor_desc td = {.name = "w", .dtype = DCAST_DTYPE_BF16, .ndim = 1, .shape = {64}, .grid = {2}};
	void *x = dealer(ctx, prod_ep), *q0 = dealer(ctx, prod_ep), *q1 = dealer(ctx, prod_ep);
	char text[DCAST_MAX_TEXT + 1], *hdr, *grid;
	size_t hl;
	dcast_msg m;

	printf("documented codes:\n");
	send_vector(x, "bad_chunk_delta_no_base");
	CHECK_ERR(next_error(x), DCAST_EFIELD_MISSING);
	send_vector(x, "bad_chunk_dense_size");
	CHECK_ERR(next_error(x), DCAST_EFIELD_RANGE);
	dcast_msg_init(&m, DCAST_MSG_HELLO);
	strcpy(m.u.hello.model, "two");
	send_msg(x, &m, payload, sizeof(payload)); /* a payload frame on HELLO */
	CHECK_ERR(next_error_text(x, text, sizeof(text)), DCAST_EPAYLOAD_SIZE);
	CHECK(strstr(text, "HELLO: payload frame of 16 bytes") != NULL);
	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	strcpy(m.u.manifest.model, "two");
	m.u.manifest.n_tensors = 1, m.u.manifest.tensors = &td;
	REQUIRE(dcast_msg_encode(&m, (void **)&hdr, &hl) == 0);
	REQUIRE((grid = memmem(hdr, hl, "grid\x91\x02", 6)));
	grid[5] = 3; /* 3 tiles do not divide 64 */
	send_frames(x, hdr, hl, NULL, 0, NULL, 0);
	free(hdr);
	CHECK_ERR(next_error_text(x, text, sizeof(text)), DCAST_EFIELD_RANGE);
	CHECK(strstr(text, "grid[0]: 3 tiles do not divide") != NULL);
	REQUIRE((hdr = malloc(DCAST_MAX_HEADER_BYTES + 64)));
	memcpy(hdr, big_name, sizeof(big_name) - 1); /* a header over DCAST_MAX_HEADER_BYTES */
	memset(hdr + sizeof(big_name) - 1, 'x', DCAST_MAX_HEADER_BYTES + 1);
	send_frames(x, hdr, sizeof(big_name) - 1 + DCAST_MAX_HEADER_BYTES + 1, NULL, 0, NULL, 0);
	free(hdr);
	CHECK_ERR(next_error_text(x, text, sizeof(text)), DCAST_ETOO_LARGE);
	CHECK(strstr(text, "DCAST_MAX_HEADER_BYTES") != NULL);
	for (uint32_t part = 0; part < 2; part++) { /* parts of one version disagree on anchor */
		void *q = part ? q1 : q0;
		dcast_msg_init(&m, DCAST_MSG_HELLO);
		strcpy(m.u.hello.model, "two");
		m.u.hello.part = part, m.u.hello.parts = 2;
		send_msg(q, &m, NULL, 0);
		CHECK(next_error(q) == 0); /* WELCOME */
		td.grid[0] = 0;
		send_msg(q, &(dcast_msg){.type = DCAST_MSG_MANIFEST,
					 .u.manifest = {.model = "two", .n_tensors = 1, .tensors = &td}}, NULL, 0);
		chunk_msg(&m, 0, 16, payload);
		strcpy(m.u.chunk.model, "two");
		m.u.chunk.part = part;
		m.u.chunk.start = part * 8;
		if (part) /* a delta of version 1 while part 0 sends it as an anchor */
			m.u.chunk.anchor = 0, m.u.chunk.base_version = 0, m.u.chunk.encoding = DCAST_ENC_IDX32,
			m.u.chunk.payload_bytes = 0;
		dcast_chunk_seal(&m.u.chunk, payload);
		send_msg(q, &m, part ? NULL : payload, part ? 0 : 16);
		/* part 0's anchor taken (its credit back) before part 1's delta
		 * goes: the two connections are not ordered between them */
		for (int k = 0; !part && k < 3 && next_credit(q) != 16; k++)
			;
	}
	/* their baselines went apart: the version is dropped (to every part),
	 * and every part is asked for an anchor, or they would disagree for
	 * ever; then part 1 hears its refusal */
	CHECK_ERR(next_error_text(q1, text, sizeof(text)), DCAST_EABORTED);
	CHECK(strstr(text, "parts disagree on anchor") != NULL);
	CHECK(strstr(text, "every part sends an anchor next") != NULL);
	CHECK(next_need_anchor(q1) == 1);
	CHECK_ERR(next_error_text(q1, text, sizeof(text)), DCAST_EVERSION);
	CHECK(strstr(text, "parts disagree on anchor") != NULL);
	CHECK(next_need_anchor(q0) == 1);
	zmq_close(x), zmq_close(q0), zmq_close(q1);
}

/* {"proto": 2, "type": "CREDIT", "bytes": 10, "model": MODEL}, built by
 * hand as a peer written from docs/protocol.md would (MODEL < 32 bytes). */
static size_t raw_credit(uint8_t *out, const char *model)
{
	static const uint8_t head[] = {0x84, 0xa5, 'p', 'r', 'o', 't', 'o', 0x02, 0xa4, 't', 'y', 'p', 'e',
		0xa6, 'C', 'R', 'E', 'D', 'I', 'T', 0xa5, 'b', 'y', 't', 'e', 's', 0x0a,
		0xa5, 'm', 'o', 'd', 'e', 'l'};
	size_t n = strlen(model);

	memcpy(out, head, sizeof(head));
	out[sizeof(head)] = (uint8_t)(0xa0 | n);
	memcpy(out + sizeof(head) + 1, model, n);
	return sizeof(head) + 1 + n;
}

/* CREDIT's optional `model` (docs/protocol.md, CREDIT) is taken when it
 * names the HELLO's model, and refused (DCAST_EFIELD_RANGE) when it names
 * another; it was refused as an unknown field whatever it said. */
static void credit_with_model(void *c)
{
	char text[DCAST_MAX_TEXT + 1];
	uint8_t raw[64];
	dcast_msg m;

	printf("CREDIT with its model:\n");
	dcast_msg_init(&m, DCAST_MSG_HELLO);
	m.u.hello.role = DCAST_ROLE_CONSUMER;
	strcpy(m.u.hello.model, "nomodel");
	send_msg(c, &m, NULL, 0);
	CHECK(next_error(c) == 0); /* WELCOME: the model does not exist, nothing streams */
	send_frames(c, raw, raw_credit(raw, "nomodel"), NULL, 0, NULL, 0);
	dcast_msg_init(&m, DCAST_MSG_ACK);
	strcpy(m.u.ack.model, "zz");
	send_msg(c, &m, NULL, 0); /* refused: the first ERROR must be this one */
	CHECK_ERR(next_error_text(c, text, sizeof(text)), DCAST_EFIELD_RANGE);
	CHECK(strstr(text, "ACK.model") != NULL);
	send_frames(c, raw, raw_credit(raw, "zz"), NULL, 0, NULL, 0);
	CHECK_ERR(next_error_text(c, text, sizeof(text)), DCAST_EFIELD_RANGE);
	CHECK(strstr(text, "CREDIT.model") != NULL);
}

/* A peer that never said HELLO sends FLOOD chunks, as a dropped producer's
 * in-flight chunks arrive: each gets its ERROR, but the broker's log keeps
 * to BROKER_REFUSE_LOG_MAX (20) refusal lines a second and then says how
 * many it left out.  `since`: when the test's first refusal was sent. */
#define FLOOD 400
static void refusal_flood(void *f, uint64_t since)
{
	char log_path[128];
	uint8_t payload[16] = {1, 2, 3};
	dcast_msg m;
	int errors = 0;

	printf("flood of %d chunks before HELLO:\n", FLOOD);
	for (int i = 0; i < FLOOD; i++) {
		chunk_msg(&m, 0, 16, payload);
		m.u.chunk.seq = (uint32_t)i;
		send_msg(f, &m, payload, 16);
	}
	for (int i = 0; i < FLOOD; i++)
		errors += next_error(f) == DCAST_ESTATE;
	CHECK(errors == FLOOD);
	snprintf(log_path, sizeof(log_path), "%s/broker.log", dir);
	/* the window closes on a timer turn, which logs the summary */
	CHECK(tp_wait_log(log_path, "more refused messages not logged", 1, 5000));
	int lines = check_count_in_file(log_path, "refused a message");
	uint64_t secs = (dcast_now_ms() - since) / 1000 + 1;
	printf("  %d refusal lines in %llu s\n", lines, (unsigned long long)secs);
	CHECK(lines <= 20 * (int)secs);
}

static int run_client(int i, const char *mode, const char *ep)
{
	char bin[512], log_path[128];
	char *argv[] = {bin, (char *)mode, (char *)ep, "good", i ? "--versions" : "--until", "5", NULL};
	int st;

	snprintf(bin, sizeof(bin), "%s/tools/wire_client", build);
	snprintf(log_path, sizeof(log_path), "%s/client%d.log", dir, i);
	client_pid[i] = spawn(argv, log_path);
	return client_pid[i] > 0 ? 0 : -1;
	(void)st;
}

static int wait_client(int i)
{
	int st = 0;

	waitpid(client_pid[i], &st, 0);
	tp_untrack(client_pid[i]);
	client_pid[i] = -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

int main(void)
{
	void *ctx, *p, *c, *f;
	uint64_t since;
	int st = 0;

	if (!(build = getenv("DELTACAST_BUILD")))
		build = "build";
	REQUIRE(mkdtemp(dir));
	tp_install();
	REQUIRE(start_broker() == 0);
	REQUIRE(run_client(0, "consume", cons_ep) == 0); /* a good consumer, live throughout */
	ctx = zmq_ctx_new();
	p = dealer(ctx, prod_ep);
	c = dealer(ctx, cons_ep);
	since = dcast_now_ms();
	bad_producer_messages(p);
	empty_payload_without_frame(p);
	unheld_chunk(p);
	incomplete_anchors(p);
	bad_consumer_messages(c);
	credit_with_model(c);
	documented_codes(ctx);
	f = dealer(ctx, prod_ep);
	refusal_flood(f, since);
	void *o = dealer(ctx, prod_ep), *q = dealer(ctx, cons_ep);
	over_credit(o);
	void *r = dealer(ctx, prod_ep);
	refused_credit_back(r);
	zmq_close(r);
	void *mc = dealer(ctx, prod_ep);
	manifest_change_keeps_credit(mc);
	zmq_close(mc);
	refused_is_not_silence(q);
	reason_survives_failed_send(ctx);
	zmq_close(o);
	zmq_close(q);
	REQUIRE(run_client(1, "produce", prod_ep) == 0);
	CHECK(wait_client(1) == 0);
	CHECK(wait_client(0) == 0);
	zmq_close(p);
	zmq_close(c);
	zmq_close(f);
	zmq_ctx_term(ctx);
	tp_broker_kill(&br, SIGTERM);
	st = br.exit_status;
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	return check_done("test_broker_malformed");
}
