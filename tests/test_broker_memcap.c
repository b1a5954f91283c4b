/* Broker: the memory caps count what a message costs in memory, not its
 * payload.  4,000,000 one-byte chunks took a broker with
 * --max-pending-bytes 8M to 1.5 GiB, and versions of a few payload bytes
 * with the maximum digest count to 2.4 GiB, with no refusal.  Here, with
 * small caps: one-byte chunks are refused once the open version's real
 * memory passes --max-pending-bytes; a COMMIT whose digests alone pass it
 * is refused; and digest-heavy versions count against --retain-bytes (the
 * broker asks for an anchor and refuses the next delta).  Real broker. */
#include "broker_harness.h"

#define PENDING_CAP "2097152"  /* 2 MiB */
#define RETAIN_CAP "4194304"   /* 4 MiB */
#define TINY_CHUNKS 4000       /* 4000 payload bytes, about 3.5 MiB in memory */
#define ELEMS 4096

static char dir[] = "/tmp/dcast-memcap.XXXXXX";

static int send_msg(struct h_client *c, dcast_msg *m, const void *payload, size_t len)
{
	zmq_msg_t pl;

	if (!payload)
		return h_send(c, m, NULL);
	REQUIRE(zmq_msg_init_size(&pl, len) == 0);
	memcpy(zmq_msg_data(&pl), payload, len);
	return h_send(c, m, &pl);
}

static void join(struct h_client *p, const char *model)
{
	dcast_tensor_desc td;
	dcast_msg m;

	h_hello(p, DCAST_ROLE_PRODUCER, DCAST_VERSION_NONE);
	REQUIRE(h_pump(p, 0, h_done_welcomed, 50));
	memset(&td, 0, sizeof(td));
	strcpy(td.name, "w");
	td.dtype = DCAST_DTYPE_U8;
	td.ndim = 1;
	td.shape[0] = ELEMS;
	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	snprintf(m.u.manifest.model, sizeof(m.u.manifest.model), "%s", model);
	m.u.manifest.n_tensors = 1;
	m.u.manifest.tensors = &td;
	REQUIRE(send_msg(p, &m, NULL, 0) == 0);
}

/* A sealed CHUNK of `count` U8 elements from `start`: dense, or for a
 * delta an idx32 range with nothing changed (no payload). */
static void chunk(struct h_client *p, uint64_t version, int anchor, uint32_t seq,
		  uint64_t start, uint64_t count, const uint8_t *data)
{
	dcast_msg m;
	dcast_chunk *c = &m.u.chunk;

	dcast_msg_init(&m, DCAST_MSG_CHUNK);
	snprintf(c->model, sizeof(c->model), "%s", p->model);
	c->version = version;
	c->base_version = anchor ? DCAST_VERSION_NONE : version - 1;
	c->anchor = (uint32_t)anchor;
	c->seq = seq;
	c->start = start;
	c->count = count;
	c->elem_size = 1;
	c->encoding = anchor ? DCAST_ENC_DENSE : DCAST_ENC_IDX32;
	c->changed = anchor ? count : 0;
	c->payload_bytes = anchor ? count : 0;
	dcast_chunk_seal(c, anchor ? (const void *)data : "");
	REQUIRE(send_msg(p, &m, anchor ? data : NULL, c->payload_bytes) == 0);
}

/* COMMIT of one chunk with n_digests entries: the first holds the tensor
 * (its value is not checked: this broker does not fold), the others are
 * empty ranges (digest 0 is right for them), so only their number matters. */
static void commit(struct h_client *p, uint64_t version, int anchor, uint64_t bytes,
		   uint32_t n_digests)
{
	dcast_range_digest *dg = calloc(n_digests ? n_digests : 1, sizeof(*dg));
	dcast_msg m;

	REQUIRE(dg);
	dg[0].count = ELEMS;
	dcast_msg_init(&m, DCAST_MSG_COMMIT);
	snprintf(m.u.commit.model, sizeof(m.u.commit.model), "%s", p->model);
	m.u.commit.version = version;
	m.u.commit.base_version = anchor ? DCAST_VERSION_NONE : version - 1;
	m.u.commit.anchor = (uint32_t)anchor;
	m.u.commit.chunks = 1;
	m.u.commit.bytes = bytes;
	m.u.commit.n_digests = n_digests;
	m.u.commit.digests = dg;
	REQUIRE(send_msg(p, &m, NULL, 0) == 0);
	free(dg);
}

/* The next ERROR's code (0 after 3 s of silence); prints it. */
static uint32_t next_error(struct h_client *p, char *text, size_t n)
{
	for (int idle = 0; idle < 30;) {
		dcast_wire_in in;
		uint32_t code = 0;

		if (dcast_wire_recv(p->sock, 0, &in, 0)) {
			idle++;
			dcast_wire_in_close(&in);
			continue;
		}
		h_producer_handle(p, &in);
		if (in.msg.type == DCAST_MSG_ERROR) {
			code = in.msg.u.error.code;
			snprintf(text, n, "%s", in.msg.u.error.text);
			printf("  ERROR %s: %s\n", dcast_errname((int)code), text);
		}
		dcast_wire_in_close(&in);
		if (code)
			return code;
	}
	return 0;
}

/* The per-chunk cost docs/operations.md ("What the caps count") states:
 * the number before "bytes (two slots"; 0 if the file or phrase is gone. */
static unsigned long doc_chunk_bytes(void)
{
	static char doc[1 << 17];
	FILE *f = fopen("docs/operations.md", "r");
	size_t n = f ? fread(doc, 1, sizeof(doc) - 1, f) : 0;
	char *at;

	if (f)
		fclose(f);
	doc[n] = '\0';
	if (!(at = strstr(doc, " bytes (two slots")))
		return 0;
	while (at > doc && at[-1] >= '0' && at[-1] <= '9')
		at--;
	return strtoul(at, NULL, 10);
}

/* The refusal names the cost of a chunk ("N bytes a chunk"), and the
 * operator's page says the same number. */
static void check_chunk_cost(const char *text)
{
	const char *at = strstr(text, " bytes a chunk");
	unsigned long doc = doc_chunk_bytes();

	REQUIRE(at);
	while (at > text && at[-1] >= '0' && at[-1] <= '9')
		at--;
	printf("  a chunk costs %lu bytes; docs/operations.md says %lu\n", strtoul(at, NULL, 10), doc);
	CHECK(doc && strtoul(at, NULL, 10) == doc);
}

/* 4000 one-byte chunks: 4000 payload bytes, far more memory. */
static void tiny_chunks(struct h_client *p)
{
	uint8_t one = 7;
	char text[DCAST_MAX_TEXT + 1] = "";
	uint32_t code;
	int refused = 0;

	printf("%d one-byte chunks against --max-pending-bytes %s:\n", TINY_CHUNKS, PENDING_CAP);
	join(p, "tiny");
	for (uint32_t i = 0; i < TINY_CHUNKS; i++)
		chunk(p, 1, 1, i, i, 1, &one);
	while (!refused && (code = next_error(p, text, sizeof(text))))
		refused = code == DCAST_ETOO_LARGE && strstr(text, "--max-pending-bytes " PENDING_CAP);
	CHECK(refused);
	check_chunk_cost(text);
}

/* A COMMIT of 100000 digests (3.2 MB held) against a 2 MiB cap. */
static void heavy_commit(struct h_client *p)
{
	char text[DCAST_MAX_TEXT + 1] = "";
	uint8_t data[ELEMS] = {1};

	printf("a COMMIT of 100000 digests against --max-pending-bytes %s:\n", PENDING_CAP);
	join(p, "digests");
	chunk(p, 1, 1, 0, 0, ELEMS, data);
	commit(p, 1, 1, ELEMS, 100000);
	CHECK_ERR((int)next_error(p, text, sizeof(text)), DCAST_EABORTED);
	CHECK_ERR((int)next_error(p, text, sizeof(text)), DCAST_ETOO_LARGE);
	CHECK(strstr(text, "COMMIT's digests") && strstr(text, "--max-pending-bytes " PENDING_CAP));
}

/* Versions of 40000 digests each (about 2.7 MB in memory with their COMMIT
 * frame, 4096 payload bytes): the second passes --retain-bytes 4 MiB, so
 * the broker asks for an anchor and refuses the third, a delta. */
static void heavy_log(struct h_client *p)
{
	char text[DCAST_MAX_TEXT + 1] = "";
	uint8_t data[ELEMS] = {2};

	printf("versions of 40000 digests against --retain-bytes %s:\n", RETAIN_CAP);
	join(p, "retain");
	chunk(p, 1, 1, 0, 0, ELEMS, data);
	commit(p, 1, 1, ELEMS, 40000);
	h_want = 1;
	CHECK(h_pump(p, 0, h_done_acked, 50));
	chunk(p, 2, 0, 0, 0, ELEMS, NULL);
	commit(p, 2, 0, 0, 40000);
	h_want = 2;
	CHECK(h_pump(p, 0, h_done_acked, 50));
	chunk(p, 3, 0, 0, 0, ELEMS, NULL);
	CHECK_ERR((int)next_error(p, text, sizeof(text)), DCAST_EVERSION);
	CHECK(strstr(text, "must be an anchor") != NULL);
}

int main(void)
{
	tp_broker br = {0};
	struct h_client *p = calloc(3, sizeof(*p));
	const char *models[] = {"tiny", "digests", "retain"};

	REQUIRE(p && mkdtemp(dir));
	h_init();
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	br.extra[br.n_extra++] = "--max-pending-bytes";
	br.extra[br.n_extra++] = PENDING_CAP;
	br.extra[br.n_extra++] = "--retain-bytes";
	br.extra[br.n_extra++] = RETAIN_CAP;
	br.extra[br.n_extra++] = "--anchor-fraction";
	br.extra[br.n_extra++] = "0";
	REQUIRE(h_broker_start(&br) == 0);
	for (int i = 0; i < 3; i++)
		h_client_open(&p[i], br.pport, models[i]);
	tiny_chunks(&p[0]);
	heavy_commit(&p[1]);
	heavy_log(&p[2]);
	for (int i = 0; i < 3; i++)
		h_client_close(&p[i]);
	free(p);
	return h_finish(&br, dir, "test_broker_memcap");
}
