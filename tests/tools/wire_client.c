/* wire_client: a test producer part or consumer speaking the wire protocol
 * directly (dcast_wire_* and the CPU codec), for the broker tests.
 *
 * The model is synthetic and deterministic: T BF16 tensors of E elements;
 * state(0) is seeded noise and state(v) changes about density_ppm of the
 * elements of state(v-1).  Any process can recompute state(v), so a consumer
 * checks its result bit-exact against the source without sharing memory.
 *
 *   wire_client produce ENDPOINT MODEL [--part P --parts N] --versions V
 *                       [--pause-at V]      send half of V's chunks, then hang
 *                       [--hold-at V --hold-file F] send half of V's chunks,
 *                                           then wait (heartbeats going on)
 *                                           until file F exists, and go on
 *                       [--bad-digest-at V] V's COMMIT carries a wrong digest
 *                       [--anchor-at V]     V goes as an anchor (a producer
 *                                           that lost its baseline)
 *                       [--bad-payload-at V] V's first chunk does not decode (its
 *                                           checksum holds)
 *                       [--wait-error 1]    after the last version, wait for an
 *                                           ERROR (its line, exit 1) until --timeout-ms
 *   wire_client consume ENDPOINT MODEL --until V [--window BYTES]
 *                       [--state FILE]      resume from / save to FILE
 *                       [--stats FILE]      progress after every version and
 *                                           chunk: applied=V ... open=W
 *                                           open_chunks=N (W: the version being
 *                                           staged, -1 none; N its chunks so far)
 *                       [--exit-after K]    _exit after K versions (a crash)
 *   wire_client receive ENDPOINT MODEL --until V [--window BYTES]
 *                       only receive (`make bench-fanout`): count CHUNK
 *                       payload bytes, return their credit, and at the
 *                       COMMIT of V or later print "received V chunks C
 *                       bytes B t_ns T cpu_ns U" (T: CLOCK_REALTIME ns;
 *                       U: this process's CPU ns so far) and exit
 *                       [--bulk 1]          HELLO x-bulk: take an anchor
 *                                           over the broker's --bulk port
 *                                           (BULK); on a failed transfer
 *                                           print "bulk failed: WHY" and
 *                                           re-join without x-bulk
 *                       [--bulk-stop-after K] close the bulk connection
 *                                           after K frames
 *                       [--bulk-bad-token 1] send a token never offered
 *                       [--bulk-hold-file F] after the first frame print
 *                                           "bulk holding" and read
 *                                           nothing more (no heartbeat
 *                                           either) until F exists
 *                       [--verify 1]        check each bulk CHUNK's checksum
 * Common: --tensors T --elems E --chunk-elems C --density-ppm D --seed S
 *         --timeout-ms MS; --server-key KEY --secret FILE: a CURVE client
 *         (the broker's Z85 public key, its own `deltacast keygen` secret).
 * Exit 0 ok, 1 failure (a line on stderr says why). */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "deltacast/codec.h"
#include "dcast_bytes.h"
#include "dcast_common.h"
#include "dcast_curve.h"
#include "dcast_wire.h"

#define MAX_T 16

static struct opts {
	const char *mode, *endpoint, *model, *state_file, *stats_file;
	const char *server_key, *secret_file; /* CURVE client: broker's public key, own key file */
	const char *hold_file;
	uint32_t part, parts, tensors;
	uint64_t elems, chunk_elems, density_ppm, seed, versions, pause_at, until, bad_digest_at;
	uint64_t anchor_at;
	uint64_t bad_payload_at, hold_at;
	int wait_error, bulk, bulk_bad_token, verify;
	uint64_t bulk_stop_after;
	const char *bulk_hold_file;
	uint64_t window, exit_after, timeout_ms;
} o = {.parts = 1, .tensors = 3, .elems = 65536, .chunk_elems = 16384,
       .density_ppm = 20000, .seed = 1, .window = 1 << 20, .timeout_ms = 50000};

static uint16_t *state[MAX_T], *work[MAX_T];

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "wire_client %s %s: ", o.mode, o.model ? o.model : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (last error: %s)\n", dcast_last_error());
	exit(1);
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void hb_due(void);

/* state(0); heartbeats go on while it is made (a large model under the
 * sanitizers takes longer than a short --heartbeat-ms allows). */
static void state_init(uint16_t **t)
{
	for (uint32_t k = 0; k < o.tensors; k++)
		for (uint64_t i = 0; i < o.elems; i++) {
			if (!(i & 0xfffff))
				hb_due();
			t[k][i] = (uint16_t)mix(o.seed ^ ((uint64_t)k << 40) ^ i);
		}
}

static void state_step(uint16_t **t, uint64_t v)
{
	for (uint32_t k = 0; k < o.tensors; k++)
		for (uint64_t i = 0; i < o.elems; i++) {
			uint64_t h = mix(mix(o.seed * 31 + v) ^ ((uint64_t)k << 48) ^ i);

			if (!(i & 0xfffff))
				hb_due();
			if (h % 1000000 < o.density_ppm)
				t[k][i] = (uint16_t)(h >> 40);
		}
}

static void state_at(uint16_t **t, uint64_t v)
{
	state_init(t);
	for (uint64_t s = 1; s <= v && v != DCAST_VERSION_NONE; s++)
		state_step(t, s);
}

static void alloc_state(void)
{
	if (o.tensors > MAX_T || !o.elems)
		die("bad --tensors/--elems");
	for (uint32_t k = 0; k < o.tensors; k++) {
		state[k] = calloc(o.elems, 2);
		work[k] = calloc(o.elems, 2);
		if (!state[k] || !work[k])
			die("out of memory");
	}
}

static void *connect_dealer(void **ctx)
{
	void *s;

	*ctx = zmq_ctx_new();
	s = zmq_socket(*ctx, ZMQ_DEALER);
	if (s && o.server_key && dcast_curve_client_setup(s, o.server_key, o.secret_file))
		die("CURVE");
	if (!s || dcast_wire_socket_opts(s) || zmq_connect(s, o.endpoint))
		die("connect %s: %s", o.endpoint, zmq_strerror(errno));
	return s;
}

static void send_msg(void *s, const dcast_msg *m, zmq_msg_t *payload)
{
	if (dcast_wire_send(s, NULL, 0, m, payload, 0))
		die("send %s", dcast_msg_type_name((int)m->type));
}

static void send_simple(void *s, int type, uint64_t a)
{
	dcast_msg m;

	dcast_msg_init(&m, type);
	if (type == DCAST_MSG_CREDIT)
		m.u.credit.bytes = a;
	if (type == DCAST_MSG_HEARTBEAT)
		m.u.heartbeat.time_ms = dcast_now_ms();
	send_msg(s, &m, NULL);
}

static void send_hello(void *s, int role, uint64_t have)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HELLO);
	m.u.hello.role = (uint32_t)role;
	snprintf(m.u.hello.model, sizeof(m.u.hello.model), "%s", o.model);
	m.u.hello.part = o.part;
	m.u.hello.parts = o.parts;
	m.u.hello.have_version = have;
	m.u.hello.window_bytes = role == DCAST_ROLE_CONSUMER ? o.window : 0;
	m.u.hello.bulk = role == DCAST_ROLE_CONSUMER && o.bulk;
	snprintf(m.u.hello.client, sizeof(m.u.hello.client), "wire_client-%d", (int)getpid());
	send_msg(s, &m, NULL);
}

/* Receive one message within the overall deadline, sending a HEARTBEAT
 * every 300 ms of waiting.  Returns 1 with a message, 0 when wait_ms
 * passed without one; dies on a bad message or past the deadline. */
static uint64_t deadline_ms, last_hb_ms;

/* The producer's socket once joined: long computations (a version's
 * state, its digests; slow under the sanitizers) heartbeat on it every
 * 300 ms, as the producer library's thread does, so that a broker with a
 * short --heartbeat-ms does not drop a producer that is only busy. */
static void *hb_sock;
static void hb_due(void)
{
	if (hb_sock && dcast_now_ms() - last_hb_ms >= 300) {
		send_simple(hb_sock, DCAST_MSG_HEARTBEAT, 0);
		last_hb_ms = dcast_now_ms();
	}
}
static int recv_within(void *s, dcast_wire_in *in, uint64_t wait_ms)
{
	for (uint64_t start = dcast_now_ms();;) {
		zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
		uint64_t now = dcast_now_ms();
		int rc;

		if (now > deadline_ms)
			die("timed out after %llu ms", (unsigned long long)o.timeout_ms);
		if (now - start >= wait_ms)
			return 0;
		if (now - last_hb_ms >= 300) {
			send_simple(s, DCAST_MSG_HEARTBEAT, 0);
			last_hb_ms = now;
		}
		if (zmq_poll(&it, 1, 100) <= 0)
			continue;
		rc = dcast_wire_recv(s, 0, in, 0);
		if (!rc)
			return 1;
		dcast_wire_in_close(in);
		die("received a bad message: %s", dcast_errname(rc));
	}
}

static void recv_msg(void *s, dcast_wire_in *in)
{
	recv_within(s, in, UINT64_MAX);
}

static void send_manifest(void *s)
{
	dcast_tensor_desc td[MAX_T];
	dcast_msg m;

	memset(td, 0, sizeof(td));
	for (uint32_t k = 0; k < o.tensors; k++) {
		snprintf(td[k].name, sizeof(td[k].name), "layer%u.weight", k);
		td[k].dtype = DCAST_DTYPE_BF16;
		td[k].ndim = 1;
		td[k].shape[0] = o.elems;
	}
	dcast_msg_init(&m, DCAST_MSG_MANIFEST);
	snprintf(m.u.manifest.model, sizeof(m.u.manifest.model), "%s", o.model);
	m.u.manifest.n_tensors = o.tensors;
	m.u.manifest.tensors = td;
	send_msg(s, &m, NULL);
}

/* ---- producer ---- */

struct prod {
	void *s;
	uint64_t credit, newest;
	int need_anchor;
};

/* Handle one message while waiting; returns its type. */
static int prod_pump(struct prod *p, uint64_t want_ack)
{
	dcast_wire_in in;
	int type;

	recv_msg(p->s, &in);
	type = (int)in.msg.type;
	if (type == DCAST_MSG_CREDIT)
		p->credit += in.msg.u.credit.bytes;
	if (type == DCAST_MSG_WELCOME) {
		p->newest = in.msg.u.welcome.version;
		p->need_anchor = (int)in.msg.u.welcome.need_anchor;
	}
	if (type == DCAST_MSG_ERROR) { /* "ERROR CODE[ version V]: text", V when the ERROR names one */
		char ver[32] = "";
		if (in.msg.u.error.version != DCAST_VERSION_NONE)
			snprintf(ver, sizeof(ver), " version %llu", (unsigned long long)in.msg.u.error.version);
		fprintf(stderr, "producer part %u: ERROR %s%s: %s\n", o.part, dcast_errname((int)in.msg.u.error.code),
			ver, in.msg.u.error.text);
		exit(in.msg.u.error.code == DCAST_EABORTED ? 3 : 1);
	}
	if (type == DCAST_MSG_ACK && in.msg.u.ack.version != want_ack)
		type = DCAST_MSG_HEARTBEAT;
	dcast_wire_in_close(&in);
	return type;
}

static void prod_chunk(struct prod *p, dcast_msg *hm, const void *buf)
{
	zmq_msg_t pl;

	while (p->credit < hm->u.chunk.payload_bytes)
		prod_pump(p, DCAST_VERSION_NONE);
	p->credit -= hm->u.chunk.payload_bytes;
	zmq_msg_init_size(&pl, hm->u.chunk.payload_bytes);
	memcpy(zmq_msg_data(&pl), buf, hm->u.chunk.payload_bytes);
	send_msg(p->s, hm, &pl);
}

static void slice(uint64_t *lo, uint64_t *hi)
{
	*lo = o.elems * o.part / o.parts;
	*hi = o.elems * (o.part + 1) / o.parts;
}

/* --hold-at: half of `v` is sent; heartbeats go on until --hold-file exists. */
static void hold(uint64_t v)
{
	fprintf(stderr, "producer part %u: holding inside version %llu\n", o.part, (unsigned long long)v);
	while (access(o.hold_file, F_OK)) {
		hb_due();
		usleep(20000);
	}
	fprintf(stderr, "producer part %u: going on with version %llu\n", o.part, (unsigned long long)v);
}

static void prod_version(struct prod *p, uint64_t v, int anchor)
{
	size_t cap = dcast_codec_bound(o.chunk_elems, 2);
	uint8_t *out = malloc(cap);
	dcast_range_digest dg[MAX_T];
	uint64_t lo, hi, bytes = 0;
	uint32_t seq = 0, total = 0;
	dcast_msg hm, cm;

	slice(&lo, &hi);
	for (uint32_t k = 0; k < o.tensors; k++)
		total += (uint32_t)((hi - lo + o.chunk_elems - 1) / o.chunk_elems);
	state_step(work, v); /* work = state(v); state = state(v-1) baseline */
	for (uint32_t k = 0; k < o.tensors; k++)
		for (uint64_t st = lo; st < hi; st += o.chunk_elems) {
			uint64_t n = hi - st < o.chunk_elems ? hi - st : o.chunk_elems;
			dcast_chunk_info info;
			int bad = !anchor && o.bad_payload_at == v && !seq;

			if (dcast_codec_encode(work[k] + st, anchor ? NULL : state[k] + st, n, 2,
					       bad ? DCAST_ENC_IDX32 : -1, DCAST_ENCODE_UPDATE_BASE, out,
					       cap, &info))
				die("encode");
			if (!anchor && !info.changed)
				continue;
			if (bad) /* a position past the range, under a checksum that holds */
				memset(out, 0xff, 4);
			if (o.pause_at == v && seq >= total / 2) {
				fprintf(stderr, "producer part %u: pausing inside version %llu\n", o.part,
					(unsigned long long)v);
				for (;;)
					pause();
			}
			if (o.hold_at == v && seq == total / 2)
				hold(v);
			dcast_msg_init(&hm, DCAST_MSG_CHUNK);
			snprintf(hm.u.chunk.model, sizeof(hm.u.chunk.model), "%s", o.model);
			hm.u.chunk.version = v;
			hm.u.chunk.base_version = anchor ? DCAST_VERSION_NONE : v - 1;
			hm.u.chunk.anchor = (uint32_t)anchor;
			hm.u.chunk.part = o.part;
			hm.u.chunk.seq = seq++;
			hm.u.chunk.tensor = k;
			hm.u.chunk.start = st;
			hm.u.chunk.count = n;
			hm.u.chunk.elem_size = 2;
			hm.u.chunk.encoding = info.encoding;
			hm.u.chunk.changed = info.changed;
			hm.u.chunk.payload_bytes = info.payload_bytes;
			dcast_chunk_seal(&hm.u.chunk, out);
			hb_due();
			prod_chunk(p, &hm, out);
			bytes += info.payload_bytes;
		}
	for (uint32_t k = 0; k < o.tensors; k++) {
		memcpy(state[k] + lo, work[k] + lo, (hi - lo) * 2);
		dg[k] = (dcast_range_digest){k, lo, hi - lo, 0};
		hb_due();
		if (dcast_ldigest(k, lo, work[k] + lo, hi - lo, 2, &dg[k].digest))
			die("digest: %s", dcast_last_error());
	}
	dg[0].digest ^= o.bad_digest_at == v; /* a producer bug the broker's fold must catch */
	dcast_msg_init(&cm, DCAST_MSG_COMMIT);
	snprintf(cm.u.commit.model, sizeof(cm.u.commit.model), "%s", o.model);
	cm.u.commit.version = v;
	cm.u.commit.base_version = anchor ? DCAST_VERSION_NONE : v - 1;
	cm.u.commit.anchor = (uint32_t)anchor;
	cm.u.commit.part = o.part;
	cm.u.commit.parts = o.parts;
	cm.u.commit.chunks = seq;
	cm.u.commit.bytes = bytes;
	cm.u.commit.n_digests = o.tensors;
	cm.u.commit.digests = dg;
	send_msg(p->s, &cm, NULL);
	while (prod_pump(p, v) != DCAST_MSG_ACK)
		;
	free(out);
}

static int produce(void)
{
	struct prod p = {.newest = DCAST_VERSION_NONE};
	void *ctx;
	uint64_t v0;
	int anchor;

	p.s = connect_dealer(&ctx);
	send_hello(p.s, DCAST_ROLE_PRODUCER, DCAST_VERSION_NONE);
	while (prod_pump(&p, DCAST_VERSION_NONE) != DCAST_MSG_WELCOME)
		;
	hb_sock = p.s;
	send_manifest(p.s);
	v0 = p.newest == DCAST_VERSION_NONE ? 1 : p.newest + 1;
	anchor = p.need_anchor || p.newest == DCAST_VERSION_NONE;
	p.need_anchor = 0;
	state_at(state, v0 - 1);
	state_at(work, v0 - 1);
	for (uint64_t v = v0; v <= o.versions; v++) {
		prod_version(&p, v, anchor || o.anchor_at == v);
		anchor = p.need_anchor; /* a WELCOME during v may ask for one */
		p.need_anchor = 0;
	}
	fprintf(stderr, "producer part %u/%u: published versions %llu..%llu\n", o.part, o.parts,
		(unsigned long long)v0, (unsigned long long)o.versions);
	while (o.wait_error) /* the ERROR exits; the deadline dies */
		prod_pump(&p, DCAST_VERSION_NONE);
	send_simple(p.s, DCAST_MSG_BYE, 0);
	zmq_close(p.s);
	zmq_ctx_term(ctx);
	return 0;
}

/* ---- consumer ---- */

struct cons {
	void *s;
	uint64_t applied, open;  /* open: version being staged, NONE if none */
	int open_anchor;
	uint64_t chunks, bytes, open_chunks, open_bytes;
	uint64_t versions, anchors, run_versions;
	int welcomed;     /* 0: our HELLO is unanswered, what arrives is stale */
	uint64_t hello_ms; /* when it was sent; re-sent after HELLO_RETRY_MS */
};

static void state_save(const struct cons *c)
{
	char tmp[4096];
	FILE *f;

	if (!o.state_file)
		return;
	snprintf(tmp, sizeof(tmp), "%s.tmp", o.state_file);
	if (!(f = fopen(tmp, "wb")))
		die("open %s: %s", tmp, strerror(errno));
	fwrite(&c->applied, 8, 1, f);
	for (uint32_t k = 0; k < o.tensors; k++)
		fwrite(state[k], 2, o.elems, f);
	if (fclose(f) || rename(tmp, o.state_file))
		die("write %s", o.state_file);
}

static void state_load(struct cons *c)
{
	FILE *f;
	int ok = 1;

	c->applied = DCAST_VERSION_NONE;
	if (!o.state_file || !(f = fopen(o.state_file, "rb")))
		return;
	ok = fread(&c->applied, 8, 1, f) == 1;
	for (uint32_t k = 0; ok && k < o.tensors; k++)
		ok = fread(state[k], 2, o.elems, f) == o.elems;
	fclose(f);
	if (!ok)
		die("%s: short file", o.state_file);
}

static void stats_write(const struct cons *c)
{
	FILE *f;
	char tmp[4096];

	if (!o.stats_file)
		return;
	snprintf(tmp, sizeof(tmp), "%s.tmp", o.stats_file);
	if (!(f = fopen(tmp, "w")))
		die("open %s", tmp);
	fprintf(f, "applied=%lld versions=%llu anchors=%llu chunks=%llu bytes=%llu open=%lld "
		"open_chunks=%llu\n", (long long)c->applied, (unsigned long long)c->versions,
		(unsigned long long)c->anchors, (unsigned long long)c->chunks,
		(unsigned long long)c->bytes, (long long)c->open,
		(unsigned long long)(c->open == DCAST_VERSION_NONE ? 0 : c->open_chunks));
	fclose(f);
	rename(tmp, o.stats_file);
}

/* A HELLO not answered by a WELCOME in this time (refused, or the WELCOME
 * dropped at a full queue) is sent again. */
#define HELLO_RETRY_MS 1000

static void cons_hello(struct cons *c)
{
	c->open = DCAST_VERSION_NONE;
	c->welcomed = 0;
	c->hello_ms = dcast_now_ms();
	send_hello(c->s, DCAST_ROLE_CONSUMER, c->applied);
	stats_write(c);
}

/* One HELLO at a time: while one is out, what arrives is the old stream's
 * or the answers to its stale messages, and its WELCOME (or the retry)
 * starts over anyway. */
static void cons_rejoin(struct cons *c, const char *why)
{
	if (!c->welcomed)
		return;
	fprintf(stderr, "consumer: re-join at %lld: %s\n", (long long)c->applied, why);
	cons_hello(c);
}

static void cons_idle(struct cons *c)
{
	if (!c->welcomed && dcast_now_ms() - c->hello_ms >= HELLO_RETRY_MS) {
		fprintf(stderr, "consumer: no WELCOME in %d ms; HELLO again\n", HELLO_RETRY_MS);
		cons_hello(c);
	}
}

static void cons_open(struct cons *c, uint64_t version, int anchor)
{
	c->open = version;
	c->open_anchor = anchor;
	c->open_chunks = c->open_bytes = 0;
	for (uint32_t k = 0; k < o.tensors; k++)
		memcpy(work[k], state[k], o.elems * 2);
}

static void cons_manifest(const dcast_manifest *m)
{
	if (m->n_tensors != o.tensors)
		die("MANIFEST has %u tensors, expected %u", m->n_tensors, o.tensors);
	for (uint32_t k = 0; k < o.tensors; k++)
		if (m->tensors[k].dtype != DCAST_DTYPE_BF16 || dcast_tensor_elems(&m->tensors[k]) != o.elems)
			die("MANIFEST tensor %u: unexpected dtype/shape", k);
}

static void cons_chunk(struct cons *c, dcast_wire_in *in)
{
	const dcast_chunk *h = &in->msg.u.chunk;
	const void *pl = in->has_payload ? zmq_msg_data(&in->payload) : "";
	dcast_chunk_info info = {h->encoding, h->elem_size, h->count, h->changed, h->payload_bytes};

	if (c->open != h->version) {
		if (!h->anchor && h->base_version != c->applied) {
			cons_rejoin(c, "delta base is not the applied version");
			return;
		}
		cons_open(c, h->version, (int)h->anchor);
	}
	if (dcast_chunk_verify(h, pl))
		die("chunk checksum");
	if (h->tensor >= o.tensors || h->start + h->count > o.elems || h->elem_size != 2)
		die("chunk range outside the model");
	if (dcast_codec_apply(&info, pl, work[h->tensor] + h->start, NULL))
		die("apply v%llu", (unsigned long long)h->version);
	c->open_chunks++;
	c->open_bytes += h->payload_bytes;
	c->chunks++;
	c->bytes += h->payload_bytes;
	if (h->payload_bytes)
		send_simple(c->s, DCAST_MSG_CREDIT, h->payload_bytes);
	stats_write(c);
}

/* Dies unless COMMIT m counts the chunks and bytes that arrived. */
static void check_counts(const dcast_commit *m, uint64_t chunks, uint64_t bytes)
{
	if (m->chunks != chunks || m->bytes != bytes)
		die("COMMIT %llu: %u chunks/%llu bytes, received %llu/%llu",
		    (unsigned long long)m->version, m->chunks, (unsigned long long)m->bytes,
		    (unsigned long long)chunks, (unsigned long long)bytes);
}

static void cons_commit(struct cons *c, const dcast_commit *m)
{
	dcast_msg a;

	if (m->version != c->open)
		die("COMMIT %llu while staging %lld", (unsigned long long)m->version, (long long)c->open);
	check_counts(m, c->open_chunks, c->open_bytes);
	for (uint32_t i = 0; i < m->n_digests; i++) {
		const dcast_range_digest *d = &m->digests[i];

		uint64_t got = 0;
		if (d->tensor >= o.tensors || d->start + d->count > o.elems ||
		    dcast_ldigest(d->tensor, d->start, work[d->tensor] + d->start, d->count, 2, &got) ||
		    got != d->digest)
			die("COMMIT %llu: digest %u differs", (unsigned long long)m->version, i);
	}
	for (uint32_t k = 0; k < o.tensors; k++)
		memcpy(state[k], work[k], o.elems * 2);
	c->applied = m->version;
	c->open = DCAST_VERSION_NONE;
	c->versions++;
	c->run_versions++;
	c->anchors += m->anchor;
	dcast_msg_init(&a, DCAST_MSG_ACK);
	snprintf(a.u.ack.model, sizeof(a.u.ack.model), "%s", o.model);
	a.u.ack.version = m->version;
	send_msg(c->s, &a, NULL);
	state_save(c);
	stats_write(c);
	if (o.exit_after && c->run_versions >= o.exit_after) {
		fprintf(stderr, "consumer: exiting (crash) after version %llu\n",
			(unsigned long long)c->applied);
		_exit(0);
	}
}

static void cons_msg(struct cons *c, dcast_wire_in *in)
{
	const dcast_commit *cm = &in->msg.u.commit;

	if (!c->welcomed && (in->msg.type == DCAST_MSG_CHUNK || in->msg.type == DCAST_MSG_COMMIT))
		return;
	switch (in->msg.type) {
	case DCAST_MSG_WELCOME: /* a stream starts: whatever was being staged is gone */
		c->welcomed = 1;
		c->open = DCAST_VERSION_NONE;
		break;
	case DCAST_MSG_MANIFEST:
		cons_manifest(&in->msg.u.manifest);
		break;
	case DCAST_MSG_CHUNK:
		cons_chunk(c, in);
		break;
	case DCAST_MSG_COMMIT:
		if (c->open == DCAST_VERSION_NONE && cm->chunks)
			break; /* the tail of a version abandoned by a re-join */
		if (c->open == DCAST_VERSION_NONE && !cm->anchor && cm->base_version != c->applied) {
			cons_rejoin(c, "empty delta on another base");
			break;
		}
		if (c->open == DCAST_VERSION_NONE)
			cons_open(c, cm->version, (int)cm->anchor);
		cons_commit(c, cm);
		break;
	case DCAST_MSG_ERROR:
		cons_rejoin(c, in->msg.u.error.text);
		break;
	default:
		break;
	}
}

static int consume(void)
{
	struct cons c = {.open = DCAST_VERSION_NONE};
	void *ctx;

	state_load(&c);
	c.s = connect_dealer(&ctx);
	cons_hello(&c);
	while (c.applied == DCAST_VERSION_NONE || c.applied < o.until) {
		dcast_wire_in in;

		if (!recv_within(c.s, &in, 250)) {
			cons_idle(&c);
			continue;
		}
		cons_msg(&c, &in);
		dcast_wire_in_close(&in);
	}
	state_at(work, c.applied);
	for (uint32_t k = 0; k < o.tensors; k++)
		if (memcmp(work[k], state[k], o.elems * 2))
			die("tensor %u differs from the source at version %llu", k,
			    (unsigned long long)c.applied);
	printf("consumer: applied=%llu versions=%llu anchors=%llu chunks=%llu bytes=%llu bit-exact\n",
	       (unsigned long long)c.applied, (unsigned long long)c.versions,
	       (unsigned long long)c.anchors, (unsigned long long)c.chunks,
	       (unsigned long long)c.bytes);
	send_simple(c.s, DCAST_MSG_BYE, 0);
	zmq_close(c.s);
	zmq_ctx_term(ctx);
	return 0;
}

/* ---- receiver: a consumer that only counts what arrives ---- */

/* Count one chunk, give its credit back. */
static void recv_chunk(struct cons *c, const dcast_chunk *h)
{
	c->open_chunks++;
	c->open_bytes += h->payload_bytes;
	if (h->payload_bytes)
		send_simple(c->s, DCAST_MSG_CREDIT, h->payload_bytes);
}

/* A COMMIT: 1 (and the "received" line) when it closes version --until or
 * a later one with every chunk counted; 0 to go on counting afresh. */
static int recv_commit(struct cons *c, const dcast_commit *m)
{
	uint64_t t = dcast_wall_ns(), chunks = c->open_chunks, bytes = c->open_bytes;
	struct timespec cpu;

	c->open_chunks = c->open_bytes = 0;
	if (m->version < o.until)
		return 0;
	check_counts(m, chunks, bytes);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
	printf("received %llu chunks %llu bytes %llu t_ns %llu cpu_ns %llu\n", (unsigned long long)m->version,
	       (unsigned long long)chunks, (unsigned long long)bytes, (unsigned long long)t,
	       (unsigned long long)cpu.tv_sec * 1000000000u + (unsigned long long)cpu.tv_nsec);
	fflush(stdout);
	return 1;
}

/* ---- the receiver's bulk transfer (docs/protocol.md, "Bulk anchors") ---- */

struct bulk {
	int fd;
	void *s;           /* the ZeroMQ socket, heartbeated while reading */
	uint8_t *buf;      /* a frame's header, then its payload */
	size_t cap;
};

/* Read exactly n bytes into dst: 0, or -1 at EOF or an error (errno, or
 * 0 for EOF).  Heartbeats on ZeroMQ every 300 ms meanwhile. */
static int bulk_read(struct bulk *k, void *dst, size_t n)
{
	for (size_t got = 0; got < n;) {
		struct pollfd pfd = {k->fd, POLLIN, 0};
		ssize_t r;

		if (dcast_now_ms() > deadline_ms)
			die("timed out after %llu ms (bulk)", (unsigned long long)o.timeout_ms);
		if (dcast_now_ms() - last_hb_ms >= 300) {
			send_simple(k->s, DCAST_MSG_HEARTBEAT, 0);
			last_hb_ms = dcast_now_ms();
		}
		r = recv(k->fd, (uint8_t *)dst + got, n - got, MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			poll(&pfd, 1, 100);
			continue;
		}
		if (r <= 0) {
			errno = r ? errno : 0;
			return -1;
		}
		got += (size_t)r;
	}
	return 0;
}

static int bulk_connect(const dcast_bulk *b, uint64_t token)
{
	char host[256];
	const char *h = strstr(o.endpoint, "://"), *colon = strrchr(o.endpoint, ':');
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)b->port)};
	uint8_t hello[16] = {'D', 'C', 'B', '1'};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	h = h ? h + 3 : o.endpoint;
	snprintf(host, sizeof(host), "%.*s", colon > h ? (int)(colon - h) : 0, h);
	if (fd < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		die("bulk: endpoint host \"%s\" is not an IPv4 address", host);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		die("bulk: connect %s:%u: %s", host, b->port, strerror(errno));
	dcast_put_le64(hello + 8, token);
	if (send(fd, hello, sizeof(hello), MSG_NOSIGNAL) != (ssize_t)sizeof(hello))
		die("bulk: send: %s", strerror(errno));
	return fd;
}

/* One frame into m (its payload in k->buf): 0, or -1 with *why set. */
static int bulk_frame(struct bulk *k, const dcast_bulk *b, dcast_msg *m, const char **why)
{
	uint8_t pre[12];
	uint32_t hl;
	uint64_t pl;

	if (bulk_read(k, pre, sizeof(pre)))
		return *why = errno ? strerror(errno) : "the connection ended before the COMMIT", -1;
	hl = dcast_get_le32(pre), pl = dcast_get_le64(pre + 4);
	if (!hl || hl > DCAST_MAX_HEADER_BYTES || pl > DCAST_MAX_CHUNK_BYTES)
		return *why = "a frame prefix out of range", -1;
	if (hl + pl > k->cap && !(k->buf = realloc(k->buf, k->cap = hl + pl)))
		die("out of memory");
	if (bulk_read(k, k->buf, hl + pl))
		return *why = "the connection ended inside a frame", -1;
	if (dcast_msg_decode(k->buf, hl, m) || dcast_msg_check_payload(m, pl))
		return *why = dcast_last_error(), -1;
	if ((m->type != DCAST_MSG_CHUNK && m->type != DCAST_MSG_COMMIT) ||
	    (m->type == DCAST_MSG_CHUNK ? m->u.chunk.version : m->u.commit.version) != b->version)
		return dcast_msg_free(m), *why = "a frame other than the version's CHUNK or COMMIT", -1;
	if (o.verify && m->type == DCAST_MSG_CHUNK && dcast_chunk_verify(&m->u.chunk, k->buf + hl))
		return dcast_msg_free(m), *why = dcast_last_error(), -1;
	return 0;
}

/* --bulk-hold-file: nothing read until the file exists (a receiver
 * that stops taking bytes mid-transfer, as a stalled or stopped one). */
static void bulk_hold(const char *file)
{
	fprintf(stderr, "bulk holding\n");
	while (access(file, F_OK))
		poll(NULL, 0, 10);
}

/* Take version b over the bulk port: 1 when it is --until's (done), 0 to
 * go on; a failed transfer re-joins without x-bulk. */
static int recv_bulk(struct cons *c, const dcast_bulk *b)
{
	struct bulk k = {.fd = bulk_connect(b, o.bulk_bad_token ? ~b->token : b->token), .s = c->s};
	const char *why = NULL;
	int done = -1;

	c->open_chunks = c->open_bytes = 0;
	for (uint64_t n = 0; done < 0; n++) {
		dcast_msg m;

		if (o.bulk_hold_file && n == 1)
			bulk_hold(o.bulk_hold_file);
		if (o.bulk_stop_after && n == o.bulk_stop_after) {
			why = "--bulk-stop-after";
			break;
		}
		if (bulk_frame(&k, b, &m, &why))
			break;
		if (m.type == DCAST_MSG_COMMIT)
			done = recv_commit(c, &m.u.commit);
		else
			c->open_chunks++, c->open_bytes += m.u.chunk.payload_bytes;
		dcast_msg_free(&m);
	}
	close(k.fd);
	free(k.buf);
	if (done >= 0)
		return done;
	fprintf(stderr, "bulk failed: %s\n", why);
	o.bulk = 0;
	cons_hello(c);
	return 0;
}

/* One message to the receiver: 1 once it is done. */
static int recv_one(struct cons *c, dcast_wire_in *in)
{
	switch (in->msg.type) {
	case DCAST_MSG_WELCOME:
		c->welcomed = 1;
		c->open_chunks = c->open_bytes = 0;
		return 0;
	case DCAST_MSG_CHUNK:
		if (c->welcomed)
			recv_chunk(c, &in->msg.u.chunk);
		return 0;
	case DCAST_MSG_COMMIT:
		return c->welcomed && recv_commit(c, &in->msg.u.commit);
	case DCAST_MSG_BULK:
		return c->welcomed && recv_bulk(c, &in->msg.u.bulk);
	case DCAST_MSG_ERROR:
		die("ERROR from the broker: %s", in->msg.u.error.text);
	default:
		return 0;
	}
}

static int receive(void)
{
	struct cons c = {.open = DCAST_VERSION_NONE, .applied = DCAST_VERSION_NONE};
	void *ctx;
	int done = 0;

	c.s = connect_dealer(&ctx);
	cons_hello(&c);
	while (!done) {
		dcast_wire_in in;

		if (!recv_within(c.s, &in, 250)) {
			cons_idle(&c);
			continue;
		}
		done = recv_one(&c, &in);
		dcast_wire_in_close(&in);
	}
	send_simple(c.s, DCAST_MSG_BYE, 0);
	zmq_close(c.s);
	zmq_ctx_term(ctx);
	return 0;
}

static uint64_t num(const char *s)
{
	char *e;
	unsigned long long v = strtoull(s, &e, 10);

	if (!*s || *e)
		die("not a number: %s", s);
	return v;
}

static void parse(int argc, char **argv)
{
	if (argc < 4)
		die("usage: wire_client produce|consume|receive ENDPOINT MODEL [options]");
	o.mode = argv[1];
	o.endpoint = argv[2];
	o.model = argv[3];
	for (int i = 4; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];

		if (!strcmp(k, "--part")) o.part = (uint32_t)num(v);
		else if (!strcmp(k, "--parts")) o.parts = (uint32_t)num(v);
		else if (!strcmp(k, "--tensors")) o.tensors = (uint32_t)num(v);
		else if (!strcmp(k, "--elems")) o.elems = num(v);
		else if (!strcmp(k, "--chunk-elems")) o.chunk_elems = num(v);
		else if (!strcmp(k, "--density-ppm")) o.density_ppm = num(v);
		else if (!strcmp(k, "--seed")) o.seed = num(v);
		else if (!strcmp(k, "--versions")) o.versions = num(v);
		else if (!strcmp(k, "--pause-at")) o.pause_at = num(v);
		else if (!strcmp(k, "--hold-at")) o.hold_at = num(v);
		else if (!strcmp(k, "--hold-file")) o.hold_file = v;
		else if (!strcmp(k, "--bad-digest-at")) o.bad_digest_at = num(v);
		else if (!strcmp(k, "--anchor-at")) o.anchor_at = num(v);
		else if (!strcmp(k, "--wait-error")) o.wait_error = num(v) != 0;
		else if (!strcmp(k, "--bad-payload-at")) o.bad_payload_at = num(v);
		else if (!strcmp(k, "--until")) o.until = num(v);
		else if (!strcmp(k, "--window")) o.window = num(v);
		else if (!strcmp(k, "--exit-after")) o.exit_after = num(v);
		else if (!strcmp(k, "--timeout-ms")) o.timeout_ms = num(v);
		else if (!strcmp(k, "--state")) o.state_file = v;
		else if (!strcmp(k, "--stats")) o.stats_file = v;
		else if (!strcmp(k, "--server-key")) o.server_key = v;
		else if (!strcmp(k, "--secret")) o.secret_file = v;
		else if (!strcmp(k, "--bulk")) o.bulk = num(v) != 0;
		else if (!strcmp(k, "--bulk-stop-after")) o.bulk_stop_after = num(v);
		else if (!strcmp(k, "--bulk-hold-file")) o.bulk_hold_file = v;
		else if (!strcmp(k, "--bulk-bad-token")) o.bulk_bad_token = num(v) != 0;
		else if (!strcmp(k, "--verify")) o.verify = num(v) != 0;
		else die("unknown option %s", k);
	}
	if (o.hold_at && !o.hold_file)
		die("--hold-at needs --hold-file FILE");
	if (!o.server_key != !o.secret_file)
		die("--server-key KEY and --secret FILE go together (CURVE)");
}

int main(int argc, char **argv)
{
	parse(argc, argv);
	deadline_ms = dcast_now_ms() + o.timeout_ms;
	if (!strcmp(o.mode, "receive"))
		return receive();
	alloc_state();
	if (!strcmp(o.mode, "produce"))
		return produce();
	if (!strcmp(o.mode, "consume"))
		return consume();
	die("unknown mode %s", o.mode);
}
