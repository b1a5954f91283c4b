/* fuzz_consumer: a live, seeded fuzzer of the consumer library against a
 * broker that lies.  A fake broker (a ROUTER socket speaking the wire
 * format, on a thread of its own) answers each HELLO of a real consumer in
 * this process with WELCOME, MANIFEST (one of its two tensors tiled in
 * two rounds of three: held in wire order, written to the checkpoint in
 * natural order) and the versions after the one the
 * HELLO names (anchor 1 then deltas, or sometimes an anchor of a later
 * version), made by the real codec with real digests, and damages them:
 * messages dropped, repeated, held back one place; CHUNK and COMMIT fields
 * changed (versions, bases, tensor, range, element size, encoding, counts,
 * digests), usually sealed again so that the checksum holds and the lie
 * goes deeper; payload bits flipped, payloads cut; header bytes flipped
 * after encoding; HEARTBEAT, ERROR, WELCOME and other MANIFESTs (some
 * with a grid the consumer refuses) dropped in.
 * The driver (the main thread) applies every READY version and checks the
 * tensors against that version's truth, bit for bit.  In a third of the
 * rounds the driver applies nothing for the first half of the damaged
 * stream, and then the fake broker serves a new run of the model (other
 * weights, the same tensors): a version of the first run applied as the
 * new run's fails the round.
 *
 * Each round: a fresh directory, a damaged stream for --dirty-ms; then the
 * consumer is closed and opened again on its directory (what it loads must
 * be a true version) and served cleanly: it must reach the newest version
 * within 20 s.  A crash, a sanitizer report, a tensor that is not its
 * version's, an open that fails, or no convergence fails the run, naming
 * the seed and round (--seed S --start-round R replays it).
 *
 * --bulk 1: the fake broker also listens for bulk connections, and an
 * anchor served first to a HELLO that says x-bulk goes as BULK (its
 * counts now and then wrong) and then over the consumer's TCP connection,
 * frame by frame (docs/protocol.md, "Bulk anchors"), damaged as the
 * ZeroMQ stream is: frames dropped, repeated, lied in and sealed again,
 * a byte flipped anywhere in a frame, a HEARTBEAT frame dropped in, or
 * the connection cut inside a frame.  The consumer's later versions come
 * over ZeroMQ as before.
 *
 * --relay N (1 to 4): the lying broker is the upstream of a chain of N
 * real relays (deltacast-broker --upstream, from $DELTACAST_BUILD, with
 * --bulk when --bulk 1 is given), each joining the one before, and the
 * consumer joins the last: the first relay takes the damage (its intake
 * checks, its bulk reader, its fold and poison, its run switch), the
 * others and the consumer what it passes on.  In half the rounds the
 * relays keep data dirs and one of them is stopped and started again on
 * its data dir and endpoint half-way through the damaged stream (the
 * consumer closed and opened again), so that it restores what it logged
 * of the lies.  Each relay must stay up, exit 0 on SIGTERM and log no
 * sanitizer report; the clean phase serves the consumer through a fresh
 * chain.
 *
 * --curve 1 (with --relay N): the fake broker is a CURVE server, and the
 * first relay its CURVE client (--upstream-curve-secret and
 * --upstream-server-key; no bulk from the upstream then).  In a fifth of
 * the rounds its dirty phase gives the relay a wrong server key: the
 * relay must say the upstream refuses it, pass nothing on and stay up.
 *
 *   fuzz_consumer [--seed S] [--seconds T] [--rounds N] [--start-round R]
 *                 [--dirty-ms M] [--dir DIR] [--bulk 1] [--relay N] [--curve 1]
 * Exit 0 when every round passed; 1 otherwise. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>
#include "deltacast/codec.h"
#include "deltacast/consumer.h"
#include "dcast_bulkrx.h"
#include "dcast_bytes.h"
#include "dcast_common.h"
#include "dcast_wire.h"
#include "../proc.h" /* tp_broker_try, tp_wait_log: the tools link tests/support */

#define MODEL "fz"
#define VERSIONS 6
#define RANGE 2048
#define N_T 2
#define MAX_MSGS 64

static const char *const t_name[N_T] = {"a", "b"};
static uint32_t a_grid[2]; /* tensor a, shape [3, 2000]: tiled {1, 2} or {3, 1} in some rounds */
static const uint64_t t_elems[N_T] = {6000, 1000};
static const unsigned t_es[N_T] = {2, 4};

static struct opts {
	uint64_t seed, seconds, rounds, start_round, dirty_ms, bulk, relay, curve;
	const char *dir;
} o = {.seed = 1, .seconds = 30, .rounds = UINT64_MAX, .dirty_ms = 1500, .dir = "/tmp"};

/* ---- a seeded random stream per round ---- */

typedef struct rng {
	uint64_t s;
} rng;

static uint64_t rnd(rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int pct(rng *r, unsigned p)
{
	return rnd(r) % 100 < p;
}

/* ---- the truth: every version's tensors ---- */

/* Two runs' truths: a round serves run 0, and in some rounds run 1 (other
 * weights, the same tensors) from half-way through its damaged stream, a
 * model started over while the consumer holds READY versions.  truth and
 * run_id are the run served now. */
static unsigned char *truths[2][VERSIONS + 1][N_T];
static uint64_t run_ids[2];
static unsigned char *(*truth)[N_T] = truths[0];
static uint64_t run_id;

static void serve_run(int k)
{
	truth = truths[k];
	run_id = run_ids[k];
}

static void truth_make(rng *r, int k)
{
	serve_run(k);
	for (int t = 0; t < N_T; t++) {
		size_t bytes = t_elems[t] * t_es[t];
		for (int v = 1; v <= VERSIONS; v++) {
			free(truth[v][t]);
			truth[v][t] = malloc(bytes);
			if (v == 1)
				for (size_t i = 0; i < bytes; i++)
					truth[v][t][i] = (unsigned char)rnd(r);
			else
				memcpy(truth[v][t], truth[v - 1][t], bytes);
			for (uint64_t k = 0; v > 1 && k < t_elems[t] / 30; k++)
				truth[v][t][(rnd(r) % t_elems[t]) * t_es[t]] ^= (unsigned char)(1 + rnd(r) % 7);
		}
	}
	run_id = run_ids[k] = rnd(r) | 1;
}

static void grid_make(rng *r)
{
	switch (rnd(r) % 3) {
	case 0: a_grid[0] = a_grid[1] = 0; break;
	case 1: a_grid[0] = 1, a_grid[1] = 2; break;
	default: a_grid[0] = 3, a_grid[1] = 1; break;
	}
}

/* ---- the fake broker ---- */

typedef struct outmsg {
	dcast_msg m;
	unsigned char *payload;
	size_t len;
	dcast_range_digest dig[8];
} outmsg;

static struct broker {
	void *ctx, *router;
	char ep[128];
	pthread_t thread;
	pthread_mutex_t lock; /* truth, round state */
	atomic_int stop;
	int clean;            /* serve without damage */
	int rewelcome;        /* the run changed: WELCOME the last client again */
	zmq_msg_t last_rid;   /* the last HELLO's routing id (has_last) */
	int has_last;
	rng r;                /* the broker's damage, per round */
	uint64_t sent, damaged;
	int bulk_fd;          /* --bulk 1: the bulk listener */
	char pub[41], wrong[41]; /* --curve 1: its public key, and one it does not hold */
	char relay_secret[600]; /* --curve 1: the first relay's secret key file */
	unsigned bulk_port;
	uint64_t bulk_served, bulk_frames;
} B;

static void send_frames(const void *rid, size_t rid_len, const void *hdr, size_t hdr_len, const void *pl,
			size_t pl_len, int has_pl)
{
	zmq_send(B.router, rid, rid_len, ZMQ_SNDMORE);
	zmq_send(B.router, hdr, hdr_len, has_pl ? ZMQ_SNDMORE : 0);
	if (has_pl)
		zmq_send(B.router, pl, pl_len, 0);
}

/* Encode and send; a header byte flipped after encoding when `flip`.  The
 * encoder refuses what does not validate: that message is not sent. */
static void send_out(const zmq_msg_t *rid, const outmsg *x, int flip)
{
	void *buf;
	size_t len;

	if (dcast_msg_encode(&x->m, &buf, &len))
		return;
	if (flip && len)
		((unsigned char *)buf)[rnd(&B.r) % len] ^= (unsigned char)(1u << (rnd(&B.r) % 8));
	send_frames(zmq_msg_data((zmq_msg_t *)rid), zmq_msg_size((zmq_msg_t *)rid), buf, len, x->payload,
		    x->len, x->m.type == DCAST_MSG_CHUNK);
	free(buf);
	B.sent++;
}

static void chunk_lie(outmsg *x)
{
	dcast_chunk *c = &x->m.u.chunk;

	switch (rnd(&B.r) % 10) {
	case 0: c->version += rnd(&B.r) % 2 ? 1 : (uint64_t)-1; break;
	case 1: c->base_version += rnd(&B.r) % 3 - 1; break;
	case 2: c->tensor = (uint32_t)(rnd(&B.r) % 3); break;
	case 3: c->start += rnd(&B.r) % 2 ? rnd(&B.r) % 64 : RANGE; break;
	case 4: c->count = rnd(&B.r) % 2 ? c->count + 1 : c->count / 2; break;
	case 5: c->elem_size = 1u << (rnd(&B.r) % 3); break;
	case 6: c->encoding = (uint32_t)(rnd(&B.r) % 5); break;
	case 7: c->changed = rnd(&B.r) % (c->count + 2); break;
	case 8: c->anchor ^= 1; break;
	default: c->seq += 1 + (uint32_t)(rnd(&B.r) % 3); break;
	}
	if (pct(&B.r, 70))
		dcast_chunk_seal(c, x->payload);
}

static void commit_lie(outmsg *x)
{
	dcast_commit *c = &x->m.u.commit;
	dcast_range_digest *d = c->n_digests ? &c->digests[rnd(&B.r) % c->n_digests] : NULL;

	switch (rnd(&B.r) % 7) {
	case 0: c->chunks += rnd(&B.r) % 2 ? 1 : (uint32_t)-1; break;
	case 1: c->bytes += rnd(&B.r) % 3 - 1; break;
	case 2: if (d) d->digest ^= 1ull << (rnd(&B.r) % 64); break;
	case 3: if (d) d->start += 1 + rnd(&B.r) % 8; break;
	case 4: c->n_digests -= c->n_digests ? 1 : 0; break;
	case 5: c->version += rnd(&B.r) % 2 ? 1 : (uint64_t)-1; break;
	default: c->anchor ^= 1; break;
	}
}

/* A message that the stream never holds, dropped in. */
static void intrude(const zmq_msg_t *rid)
{
	dcast_tensor_desc t = {.name = "a", .dtype = DCAST_DTYPE_BF16, .ndim = 1, .shape = {1 + rnd(&B.r) % 9000}};
	outmsg x = {0};

	switch (rnd(&B.r) % 4) {
	case 0: dcast_msg_init(&x.m, DCAST_MSG_HEARTBEAT); break;
	case 1:
		dcast_msg_init(&x.m, DCAST_MSG_ERROR);
		x.m.u.error.code = (int)(1 + rnd(&B.r) % 40);
		snprintf(x.m.u.error.text, sizeof(x.m.u.error.text), "fuzz");
		break;
	case 2:
		dcast_msg_init(&x.m, DCAST_MSG_WELCOME);
		snprintf(x.m.u.welcome.model, sizeof(x.m.u.welcome.model), MODEL);
		x.m.u.welcome.version = x.m.u.welcome.anchor_version = rnd(&B.r) % (VERSIONS + 2);
		x.m.u.welcome.heartbeat_ms = 60000;
		x.m.u.welcome.run = rnd(&B.r) % 2 ? run_id : rnd(&B.r);
		break;
	default:
		if (rnd(&B.r) % 2) { /* a grid the consumer refuses: 0, too long, or not dividing */
			t.grid[0] = (uint32_t)(rnd(&B.r) % 4);
			t.grid[1] = (uint32_t)(rnd(&B.r) % 3);
		}
		dcast_msg_init(&x.m, DCAST_MSG_MANIFEST);
		snprintf(x.m.u.manifest.model, sizeof(x.m.u.manifest.model), MODEL);
		x.m.u.manifest.n_tensors = 1;
		x.m.u.manifest.tensors = &t;
		break;
	}
	send_out(rid, &x, 0);
}

/* Send x damaged (counted); 1 when it is to be held back one place. */
static int send_damaged(const zmq_msg_t *rid, outmsg *x)
{
	unsigned what = (unsigned)(rnd(&B.r) % 8);

	B.damaged++;
	if (what == 0)
		return 0; /* dropped */
	if (what == 1 && x->len) {
		x->payload[rnd(&B.r) % x->len] ^= (unsigned char)(1u << (rnd(&B.r) % 8));
		if (x->m.type == DCAST_MSG_CHUNK && pct(&B.r, 50))
			dcast_chunk_seal(&x->m.u.chunk, x->payload);
	}
	if (what == 2 && x->len)
		x->len = rnd(&B.r) % x->len; /* cut */
	if (what == 3)
		x->m.type == DCAST_MSG_CHUNK ? chunk_lie(x) : commit_lie(x);
	if (what == 4)
		return 1;
	send_out(rid, x, what == 5);
	if (what == 6)
		send_out(rid, x, 0); /* repeated */
	if (what == 7)
		intrude(rid);
	return 0;
}

/* ---- building a version's messages ---- */

static void chunk_msg(outmsg *x, uint64_t v, int anchor, int t, uint64_t start, uint64_t n, uint32_t seq,
		      uint64_t *bytes)
{
	size_t cap = dcast_codec_bound(n, t_es[t]);
	const unsigned char *cur = truth[v][t] + start * t_es[t];
	dcast_chunk_info info;
	int force = rnd(&B.r) % 2 ? -1 : (int)(1 + rnd(&B.r) % 3);

	x->payload = malloc(cap);
	if (dcast_codec_encode(cur, anchor ? NULL : truth[v - 1][t] + start * t_es[t], n, t_es[t],
			       anchor ? -1 : force, 0, x->payload, cap, &info) &&
	    dcast_codec_encode(cur, truth[v - 1][t] + start * t_es[t], n, t_es[t], -1, 0, x->payload, cap, &info))
		abort();
	x->len = info.payload_bytes;
	dcast_msg_init(&x->m, DCAST_MSG_CHUNK);
	dcast_chunk *c = &x->m.u.chunk;
	snprintf(c->model, sizeof(c->model), MODEL);
	c->version = v, c->base_version = anchor ? DCAST_VERSION_NONE : v - 1, c->anchor = (uint32_t)anchor;
	c->seq = seq, c->tensor = (uint32_t)t, c->start = start, c->count = n, c->elem_size = t_es[t];
	c->encoding = info.encoding, c->changed = info.changed, c->payload_bytes = info.payload_bytes;
	dcast_chunk_seal(c, x->payload);
	*bytes += info.payload_bytes;
}

/* Version v's CHUNKs (ranges a delta leaves unchanged skipped) and COMMIT
 * into x[]; returns how many. */
static unsigned version_msgs(outmsg *x, uint64_t v, int anchor)
{
	unsigned n = 0, k = 0;
	uint64_t bytes = 0;
	outmsg *commit;

	for (int t = 0; t < N_T; t++)
		for (uint64_t s = 0; s < t_elems[t]; s += RANGE) {
			uint64_t len = t_elems[t] - s < RANGE ? t_elems[t] - s : RANGE;
			if (anchor || memcmp(truth[v][t] + s * t_es[t], truth[v - 1][t] + s * t_es[t], len * t_es[t])) {
				chunk_msg(&x[n], v, anchor, t, s, len, n, &bytes);
				n++;
			}
		}
	commit = &x[n];
	memset(commit, 0, sizeof(*commit));
	dcast_msg_init(&commit->m, DCAST_MSG_COMMIT);
	dcast_commit *c = &commit->m.u.commit;
	snprintf(c->model, sizeof(c->model), MODEL);
	c->version = v, c->base_version = anchor ? DCAST_VERSION_NONE : v - 1, c->anchor = (uint32_t)anchor;
	c->parts = 1, c->chunks = n, c->bytes = bytes, c->digests = commit->dig;
	for (int t = 0; t < N_T; t++)
		for (uint64_t s = 0; s < t_elems[t]; s += RANGE, k++) {
			uint64_t len = t_elems[t] - s < RANGE ? t_elems[t] - s : RANGE;
			commit->dig[k] = (dcast_range_digest){(uint32_t)t, s, len, 0};
			dcast_ldigest((uint32_t)t, s, truth[v][t] + s * t_es[t], len, t_es[t], &commit->dig[k].digest);
		}
	c->n_digests = k;
	return n + 1;
}

static void welcome(const zmq_msg_t *rid)
{
	dcast_tensor_desc t[N_T] = {0};
	outmsg x = {0};

	dcast_msg_init(&x.m, DCAST_MSG_WELCOME);
	snprintf(x.m.u.welcome.model, sizeof(x.m.u.welcome.model), MODEL);
	x.m.u.welcome.version = VERSIONS, x.m.u.welcome.anchor_version = 1;
	x.m.u.welcome.heartbeat_ms = 60000, x.m.u.welcome.run = run_id;
	send_out(rid, &x, 0);
	for (int i = 0; i < N_T; i++) {
		snprintf(t[i].name, sizeof(t[i].name), "%s", t_name[i]);
		t[i].dtype = t_es[i] == 2 ? DCAST_DTYPE_BF16 : DCAST_DTYPE_F32;
		t[i].ndim = 1, t[i].shape[0] = t_elems[i];
	}
	t[0].ndim = 2, t[0].shape[0] = 3, t[0].shape[1] = t_elems[0] / 3; /* its elements in wire order */
	t[0].grid[0] = a_grid[0], t[0].grid[1] = a_grid[1];
	dcast_msg_init(&x.m, DCAST_MSG_MANIFEST);
	snprintf(x.m.u.manifest.model, sizeof(x.m.u.manifest.model), MODEL);
	x.m.u.manifest.n_tensors = N_T, x.m.u.manifest.tensors = t;
	send_out(rid, &x, 0);
}

/* ---- the bulk side (--bulk 1) ---- */

/* The connection that opens with `token`, accepted within 3 s; -1 when
 * none came.  Others (a consumer of an earlier offer) are closed. */
static int bulk_accept(uint64_t token)
{
	uint64_t end = dcast_now_ms() + 3000;
	struct timeval tv = {.tv_sec = 1};

	while (dcast_now_ms() < end) {
		struct pollfd p = {B.bulk_fd, POLLIN, 0};
		unsigned char open[DCAST_BULK_OPENING]; /* "DCB1", 4 zero bytes, the token */
		int fd;

		if (poll(&p, 1, 100) <= 0 || (fd = accept(B.bulk_fd, NULL, NULL)) < 0)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		if (recv(fd, open, sizeof(open), MSG_WAITALL) == (ssize_t)sizeof(open) &&
		    dcast_get_le64(open + 8) == token)
			return fd;
		close(fd);
	}
	return -1;
}

/* x as a bulk frame (prefix, header, payload), a byte of it flipped when
 * `flip`, only its first `cut` bytes when cut is below its length. */
static void frame_write(int fd, const outmsg *x, int flip, size_t cut)
{
	size_t pl = x->m.type == DCAST_MSG_CHUNK ? x->len : 0, len, n;
	unsigned char *f;
	void *hdr;

	if (dcast_msg_encode(&x->m, &hdr, &len))
		return;
	n = DCAST_BULK_PREFIX + len + pl;
	f = malloc(n);
	dcast_put_le32(f, (uint32_t)len);
	dcast_put_le64(f + 4, pl);
	memcpy(f + DCAST_BULK_PREFIX, hdr, len);
	if (pl)
		memcpy(f + DCAST_BULK_PREFIX + len, x->payload, pl);
	if (flip)
		f[rnd(&B.r) % n] ^= (unsigned char)(1u << (rnd(&B.r) % 8));
	send(fd, f, cut < n ? cut : n, MSG_NOSIGNAL);
	free(f);
	free(hdr);
	B.bulk_frames++;
}

/* One frame of a version sent over bulk, damaged now and then (pct p);
 * 0 when the connection is cut. */
static int bulk_frame(int fd, outmsg *x, unsigned p)
{
	outmsg beat = {0};

	if (!pct(&B.r, p)) {
		frame_write(fd, x, 0, SIZE_MAX);
		return 1;
	}
	B.damaged++;
	switch (rnd(&B.r) % 6) {
	case 0: return 1; /* dropped */
	case 1: frame_write(fd, x, 1, SIZE_MAX); return 1;
	case 2: frame_write(fd, x, 0, rnd(&B.r) % (DCAST_BULK_PREFIX + 64 + x->len)); return 0;
	case 3:
		x->m.type == DCAST_MSG_CHUNK ? chunk_lie(x) : commit_lie(x);
		frame_write(fd, x, 0, SIZE_MAX);
		return 1;
	case 4: frame_write(fd, x, 0, SIZE_MAX); frame_write(fd, x, 0, SIZE_MAX); return 1;
	default:
		dcast_msg_init(&beat.m, DCAST_MSG_HEARTBEAT);
		frame_write(fd, &beat, 0, SIZE_MAX);
		frame_write(fd, x, 0, SIZE_MAX);
		return 1;
	}
}

/* Version v's n messages (its CHUNKs, then its COMMIT) as BULK and then
 * over the consumer's bulk connection. */
static void bulk_serve(const zmq_msg_t *rid, outmsg *x, unsigned n, uint64_t v, unsigned p)
{
	outmsg b = {0};
	dcast_bulk *m = &b.m.u.bulk;
	int fd;

	dcast_msg_init(&b.m, DCAST_MSG_BULK);
	snprintf(m->model, sizeof(m->model), MODEL);
	m->version = v, m->port = B.bulk_port, m->token = rnd(&B.r) | 1, m->chunks = n - 1;
	for (unsigned i = 0; i + 1 < n; i++)
		m->bytes += x[i].len;
	if (pct(&B.r, p / 2))
		rnd(&B.r) % 2 ? (m->chunks += 1) : (m->bytes -= 1);
	send_out(rid, &b, 0);
	if ((fd = bulk_accept(m->token)) < 0)
		return;
	B.bulk_served++;
	for (unsigned i = 0; i < n && bulk_frame(fd, &x[i], p); i++)
		;
	shutdown(fd, SHUT_WR);
	close(fd);
}

/* Versions after `have` (an anchor first when have is none, or now and
 * then an anchor of a later version), damaged unless B.clean; with --bulk
 * 1 an anchor served first to a HELLO that asks for bulk goes over bulk. */
static void serve(const zmq_msg_t *rid, uint64_t have, int bulk)
{
	outmsg x[MAX_MSGS];
	uint64_t from = have == DCAST_VERSION_NONE || have >= VERSIONS ? 1 : have + 1;
	int anchor_at = have == DCAST_VERSION_NONE || have >= VERSIONS ? 1 : 0;
	unsigned p = B.clean ? 0 : (unsigned)(2 + rnd(&B.r) % 20);

	if (!anchor_at && pct(&B.r, 15))
		anchor_at = (int)(from + rnd(&B.r) % (VERSIONS - from + 1)), from = (uint64_t)anchor_at;
	welcome(rid);
	for (uint64_t v = from; v <= VERSIONS; v++) {
		unsigned n = version_msgs(x, v, v == (uint64_t)anchor_at);
		int hold = -1, over_bulk = o.bulk && bulk && v == from && v == (uint64_t)anchor_at;

		if (over_bulk)
			bulk_serve(rid, x, n, v, p);
		for (unsigned i = 0; i < n && !over_bulk; i++) {
			if (pct(&B.r, p) ? send_damaged(rid, &x[i]) : (send_out(rid, &x[i], 0), 0)) {
				hold = (int)i;
				continue;
			}
			if (hold >= 0)
				send_out(rid, &x[hold], 0), hold = -1;
		}
		if (hold >= 0)
			send_out(rid, &x[hold], 0);
		for (unsigned i = 0; i < n; i++)
			free(x[i].payload);
	}
}

/* in, a HELLO, takes the routing id and fields of the last of the HELLOs
 * already waiting (other messages are read and dropped), as a broker's
 * session ends at its client's next HELLO: a relay that says HELLO again
 * at each bad message would otherwise be served every stream it left, and
 * with --bulk 1 each BULK would wait for a connection that never comes. */
static void newest_hello(dcast_wire_in *in)
{
	for (;;) {
		dcast_wire_in next;
		int rc = dcast_wire_recv(B.router, 1, &next, ZMQ_DONTWAIT);

		if (rc == 0 && next.msg.type == DCAST_MSG_HELLO && !zmq_msg_move(&in->rid, &next.rid))
			in->msg.u.hello = next.msg.u.hello;
		dcast_wire_in_close(&next);
		if (rc == DCAST_EBUSY || rc == DCAST_EZMQ)
			return;
	}
}

static void *broker_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&B.stop)) {
		zmq_pollitem_t it = {B.router, 0, ZMQ_POLLIN, 0};
		dcast_wire_in in;

		pthread_mutex_lock(&B.lock);
		if (B.rewelcome && B.has_last) /* as a broker that starts the model over does */
			welcome(&B.last_rid);
		B.rewelcome = 0;
		pthread_mutex_unlock(&B.lock);
		if (zmq_poll(&it, 1, 20) <= 0)
			continue;
		if (dcast_wire_recv(B.router, 1, &in, ZMQ_DONTWAIT) == 0 && in.msg.type == DCAST_MSG_HELLO) {
			newest_hello(&in);
			pthread_mutex_lock(&B.lock);
			if (B.has_last)
				zmq_msg_close(&B.last_rid);
			zmq_msg_init(&B.last_rid);
			B.has_last = zmq_msg_copy(&B.last_rid, &in.rid) == 0;
			serve(&in.rid, in.msg.u.hello.have_version, in.msg.u.hello.bulk);
			pthread_mutex_unlock(&B.lock);
		}
		dcast_wire_in_close(&in);
	}
	return NULL;
}

/* ---- the driver ---- */

/* ---- the relays (--relay N) ---- */

#define MAX_RELAYS 4

/* Relay i joins relay i - 1 (relay 0 the fake broker); the consumer
 * joins the last.  Started and watched as tests/proc.h starts brokers. */
static struct relay {
	tp_broker b;          /* b.pid 0: none running; b.consumers its endpoint */
	char data[600];
} R[MAX_RELAYS];
static uint64_t relay_starts, wrong_keys;
static int wrong_key; /* --curve 1: this dirty phase's first relay has a wrong server key */

/* The endpoint a consumer joins: the last relay's, or the fake broker's. */
static const char *endpoint(void)
{
	return o.relay ? R[o.relay - 1].b.consumers : B.ep;
}

/* The relays' LeakSanitizer (SAN builds) skips what libzmq leaks, as
 * tests/support/proc.c says for the tools: a file of suppressions at path,
 * named in the LSAN_OPTIONS every relay inherits, after what the caller
 * gave. */
static void relays_lsan(const char *path)
{
	const char *was = getenv("LSAN_OPTIONS");
	char opts[1400];
	FILE *f = fopen(path, "w");

	if (!f)
		return;
	fputs("leak:libzmq.so.5\n", f);
	fclose(f);
	snprintf(opts, sizeof(opts), "%s%ssuppressions=%s", was ? was : "", was && *was ? ":" : "", path);
	setenv("LSAN_OPTIONS", opts, 1);
}

/* Relay i of the fake broker's chain, its files under rdir (with `data`,
 * its log of versions in rdir/relayI-data), its stderr in
 * rdir/relayI.N.log; with `again`, on the ports it had.  0 once it
 * logged its endpoints (tp_broker_try), -1 (said) when it did not. */
static int relay_start(const char *rdir, int i, int data, int again)
{
	struct relay *x = &R[i];
	const char **a = x->b.extra;
	int n = 0;

	if (!again)
		x->b.pport = x->b.cport = 0;
	snprintf(x->data, sizeof(x->data), "%s/relay%d-data", rdir, i);
	snprintf(x->b.log, sizeof(x->b.log), "%s/relay%d.%" PRIu64 ".log", rdir, i, ++relay_starts);
	a[n++] = "--upstream", a[n++] = i ? R[i - 1].b.consumers : B.ep, a[n++] = "--upstream-model";
	a[n++] = MODEL, a[n++] = "--heartbeat-ms", a[n++] = "500", a[n++] = "--log-level", a[n++] = "info";
	if (o.bulk)
		a[n++] = "--bulk", a[n++] = "127.0.0.1:0";
	if (data)
		a[n++] = "--data-dir", a[n++] = x->data;
	if (o.curve && !i) {
		a[n++] = "--upstream-curve-secret", a[n++] = B.relay_secret;
		a[n++] = "--upstream-server-key", a[n++] = wrong_key ? B.wrong : B.pub;
	}
	x->b.n_extra = n;
	if (!tp_broker_try(&x->b))
		return 0;
	tp_say("relay %d did not start (log %s)", i, x->b.log);
	return -1;
}

/* The relay's end, as a wait status says it. */
static void relay_ended(const struct relay *x, int st, const char *how)
{
	if (WIFSIGNALED(st))
		tp_say("relay %d %s: killed by signal %d (%s; log %s)", (int)(x - R), how, WTERMSIG(st),
		    strsignal(WTERMSIG(st)), x->b.log);
	else
		tp_say("relay %d %s: exit status %d (log %s)", (int)(x - R), how, WEXITSTATUS(st), x->b.log);
}

/* Relay x stopped with SIGTERM; 0 when it was still running, exited 0
 * within 10 s and logged no sanitizer report, else -1 (said). */
static int relay_stop(struct relay *x)
{
	pid_t pid = x->b.pid, got = 0;
	int st = 0, bad = 0;

	if (!pid)
		return 0;
	x->b.pid = 0;
	if (waitpid(pid, &st, WNOHANG) == pid) {
		tp_untrack(pid);
		relay_ended(x, st, "ended before its SIGTERM");
		return -1;
	}
	kill(pid, SIGTERM);
	for (uint64_t end = dcast_now_ms() + 10000; !(got = waitpid(pid, &st, WNOHANG)) && dcast_now_ms() < end;)
		poll(NULL, 0, 10);
	if (!got) {
		tp_say("relay %d did not exit within 10 s of its SIGTERM (log %s)", (int)(x - R), x->b.log);
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		bad = 1;
	} else if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		relay_ended(x, st, "on SIGTERM");
		bad = 1;
	}
	tp_untrack(pid);
	if (tp_wait_log(x->b.log, "Sanitizer", 1, 0) || tp_wait_log(x->b.log, "runtime error:", 1, 0)) {
		tp_say("relay %d logged a sanitizer report (log %s)", (int)(x - R), x->b.log);
		bad = 1;
	}
	return bad ? -1 : 0;
}

/* The chain of --relay N relays, from the fake broker down; 0, or -1
 * (said; those started are left for relays_stop). */
static int relays_start(const char *rdir, int data)
{
	for (int i = 0; i < (int)o.relay; i++)
		if (relay_start(rdir, i, data, 0))
			return -1;
	return 0;
}

/* Every relay stopped, the consumer's side first; 0 when each passed
 * relay_stop. */
static int relays_stop(void)
{
	int bad = 0;

	for (int i = MAX_RELAYS; i-- > 0;)
		bad |= relay_stop(&R[i]) != 0;
	return bad ? -1 : 0;
}

/* The consumer's tensors are version v's truth of run k (v none: nothing
 * to check). */
static int true_in(dcast_consumer *c, int k, uint64_t v)
{
	for (int t = 0; v != DCAST_VERSION_NONE && t < N_T; t++) {
		void *p = NULL;
		if (v > VERSIONS || !truths[k][v][t] || dcast_consumer_tensor(c, t_name[t], &p, NULL, NULL) ||
		    memcmp(p, truths[k][v][t], t_elems[t] * t_es[t]))
			return 0;
	}
	return 1;
}

/* The tensors are version v's truth: of the run the consumer confirmed
 * when it is one of the round's, else of either (a lie's run, or none
 * confirmed yet).  A READY version of run 0 applied as run 1's fails. */
static int true_to(dcast_consumer *c, uint64_t v)
{
	uint64_t run = dcast_consumer_run(c);

	for (int k = 0; k < 2; k++)
		if (run == run_ids[k])
			return true_in(c, k, v);
	return true_in(c, 0, v) || true_in(c, 1, v);
}

/* What c's tensors are, for a failure's line: "run K's version V" for
 * each truth they equal, with the run c confirmed. */
static void truth_name(dcast_consumer *c, char *out, size_t cap)
{
	size_t at = (size_t)snprintf(out, cap, "run %016" PRIx64 " confirmed (the round's: %016" PRIx64
				     " and %016" PRIx64 "); the tensors are", dcast_consumer_run(c), run_ids[0],
				     run_ids[1]);
	int found = 0;

	for (int k = 0; k < 2; k++)
		for (uint64_t v = 1; v <= VERSIONS && at < cap; v++)
			if (true_in(c, k, v) && ++found)
				at += (size_t)snprintf(out + at, cap - at, " run %016" PRIx64 "'s version %" PRIu64,
						       run_ids[k], v);
	if (!found && at < cap)
		snprintf(out + at, cap - at, " no version's of either run");
}

/* Poll for ms and apply nothing: READY versions wait for the caller, as
 * they do for an engine between its pause points. */
static void hold(dcast_consumer *c, uint64_t ms)
{
	for (uint64_t end = dcast_now_ms() + ms; dcast_now_ms() < end;) {
		dcast_event ev;
		dcast_consumer_poll(c, 20, &ev);
	}
}

/* Poll and apply for ms (until `until` is held, when not none); the
 * tensors checked after every apply, refused ones too (those keep the
 * version before, or the last one they applied on the way).  0, or -1
 * when they were not the truth of the version the consumer holds. */
static int drive(dcast_consumer *c, uint64_t ms, uint64_t until)
{
	for (uint64_t end = dcast_now_ms() + ms; dcast_now_ms() < end;) {
		dcast_event ev;
		uint64_t have = dcast_consumer_version(c), r;
		int rc;
		if (until != DCAST_VERSION_NONE && have == until)
			return 0;
		if (dcast_consumer_poll(c, 20, &ev) || (r = dcast_consumer_ready_version(c)) == DCAST_VERSION_NONE)
			continue;
		rc = dcast_consumer_apply(c, r);
		if (!true_to(c, dcast_consumer_version(c))) {
			tp_say("apply of version %" PRIu64 " %s, and the tensors are not version %" PRIu64 "'s", r,
			    rc ? "refused" : "done", dcast_consumer_version(c));
			return -1;
		}
	}
	return 0;
}

static dcast_consumer *open_at(const char *dir, int *bad)
{
	dcast_consumer_opts opts;
	dcast_consumer *c = NULL;

	dcast_consumer_opts_init(&opts);
	opts.heartbeat_ms = 500;
	if (dcast_consumer_open(endpoint(), MODEL, dir, 4u << 20, &opts, &c)) {
		tp_say("open %s: %s", dir, dcast_last_error());
		*bad = 1;
		return NULL;
	}
	if (!true_to(c, dcast_consumer_version(c))) {
		char what[512];
		truth_name(c, what, sizeof(what));
		tp_say("open %s: loaded version %" PRIu64 ", not that version's tensors: %s", dir,
		    dcast_consumer_version(c), what);
		*bad = 1;
	}
	return c;
}

/* The first half of the damaged stream, where a round splits it: held
 * (the run changes after it), or applied and then, with restart (a relay
 * of the chain; -1: none), the consumer closed and that relay stopped and
 * started on its data dir and endpoint, and the consumer opened again.
 * 0, or -1 (said). */
static int first_half(dcast_consumer **c, const char *dir, const char *rdir, int change, int restart)
{
	int bad = 0;

	if (change)
		hold(*c, o.dirty_ms / 2);
	else if (drive(*c, o.dirty_ms / 2, DCAST_VERSION_NONE))
		return -1;
	if (restart < 0)
		return 0;
	dcast_consumer_close(c);
	if (relay_stop(&R[restart]) || relay_start(rdir, restart, 1, 1) || !(*c = open_at(dir, &bad)))
		return -1;
	return bad ? -1 : 0;
}

/* The damaged stream, from a fresh directory.  0, or -1 (said). */
static int dirty(rng *r, const char *dir, const char *rdir)
{
	int change = rnd(r) % 3 == 0; /* run 1 from half-way */
	int restart = o.relay && rnd(r) % 2 ? 0 : -1; /* the relays on data dirs, one started again half-way */
	dcast_consumer *c = NULL;
	int bad = 0;

	pthread_mutex_lock(&B.lock);
	grid_make(r);
	truth_make(r, 1);
	truth_make(r, 0);
	B.r.s = rnd(r), B.clean = 0;
	pthread_mutex_unlock(&B.lock);
	if (restart >= 0 && o.relay > 1)
		restart = (int)(rnd(r) % o.relay);
	wrong_key = o.curve && rnd(r) % 5 == 0;
	wrong_keys += (uint64_t)wrong_key;
	if (o.relay && (mkdir(rdir, 0700) || relays_start(rdir, restart >= 0)))
		return -1;
	if (!(c = open_at(dir, &bad)) || bad ||
	    ((change || restart >= 0) && first_half(&c, dir, rdir, change, restart)))
		bad = 1;
	if (!bad && change) {
		pthread_mutex_lock(&B.lock);
		serve_run(1);
		B.rewelcome = 1;
		pthread_mutex_unlock(&B.lock);
	}
	if (!bad && drive(c, change || restart >= 0 ? o.dirty_ms / 2 : o.dirty_ms, DCAST_VERSION_NONE))
		bad = 1;
	if (!bad && wrong_key && dcast_consumer_version(c) != DCAST_VERSION_NONE) {
		tp_say("the relay, with a wrong server key for its upstream, passed version %" PRIu64 " on",
		    dcast_consumer_version(c));
		bad = 1;
	}
	wrong_key = 0;
	dcast_consumer_close(&c);
	return relays_stop() || bad ? -1 : 0;
}

static int round_run(uint64_t round)
{
	char dir[512], rdir[520], cmd[1100];
	rng r = {o.seed * 0x100000001b3ull + round};
	dcast_consumer *c = NULL;
	int bad;

	snprintf(dir, sizeof(dir), "%s/fuzz_consumer.%d.%" PRIu64, o.dir, (int)getpid(), round);
	snprintf(rdir, sizeof(rdir), "%s.relay", dir);
	bad = dirty(&r, dir, rdir);
	pthread_mutex_lock(&B.lock);
	B.clean = 1;
	pthread_mutex_unlock(&B.lock);
	if (!bad && o.relay && relays_start(rdir, 0))
		bad = 1;
	if (!bad && (c = open_at(dir, &bad)) && !bad && (drive(c, 20000, VERSIONS) || dcast_consumer_version(c) != VERSIONS)) {
		tp_say("served cleanly, the consumer holds version %" PRIu64 " after 20 s, not %d", dcast_consumer_version(c),
		    VERSIONS);
		bad = 1;
	}
	dcast_consumer_close(&c);
	if (relays_stop())
		bad = 1;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", dir, rdir);
	if (!bad && system(cmd) != 0)
		tp_say("could not remove %s", dir);
	return bad;
}

static int parse(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (tp_arg_u64(argc, argv, &i, "--seed", &o.seed) || tp_arg_u64(argc, argv, &i, "--seconds", &o.seconds) ||
		    tp_arg_u64(argc, argv, &i, "--rounds", &o.rounds) ||
		    tp_arg_u64(argc, argv, &i, "--start-round", &o.start_round) ||
		    tp_arg_u64(argc, argv, &i, "--dirty-ms", &o.dirty_ms) || tp_arg_u64(argc, argv, &i, "--bulk", &o.bulk) ||
		    tp_arg_u64(argc, argv, &i, "--relay", &o.relay) || tp_arg_u64(argc, argv, &i, "--curve", &o.curve))
			continue;
		if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
			o.dir = argv[++i];
			continue;
		}
		fprintf(stderr, "usage: fuzz_consumer [--seed S] [--seconds T] [--rounds N] [--start-round R] "
				"[--dirty-ms M] [--dir DIR] [--bulk 1] [--relay N] [--curve 1]\n");
		return -1;
	}
	if (o.curve && !o.relay) {
		fprintf(stderr, "fuzz_consumer: --curve 1 goes with --relay N (the relay is the CURVE client)\n");
		return -1;
	}
	if (o.relay > MAX_RELAYS) {
		fprintf(stderr, "fuzz_consumer: --relay %" PRIu64 ": a chain of at most %d\n", o.relay, MAX_RELAYS);
		return -1;
	}
	return 0;
}

/* --bulk 1: the bulk listener, on a loopback port of its own. */
static int bulk_listen(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);

	B.bulk_fd = -1;
	if (!o.bulk)
		return 0;
	if ((B.bulk_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
	    bind(B.bulk_fd, (struct sockaddr *)&a, sizeof(a)) || listen(B.bulk_fd, 16) ||
	    getsockname(B.bulk_fd, (struct sockaddr *)&a, &len))
		return -1;
	B.bulk_port = ntohs(a.sin_port);
	return 0;
}

/* --curve 1: the fake broker's ROUTER a CURVE server (no ZAP handler:
 * any client key), the relay's secret key in a file of its own. */
static int curve_server(void)
{
	char sec[41], text[64];
	int one = 1;
	FILE *f;

	if (!o.curve)
		return 0;
	snprintf(B.relay_secret, sizeof(B.relay_secret), "%s/fuzz_consumer.%d.relay.secret", o.dir, (int)getpid());
	if (zmq_curve_keypair(B.pub, sec) || zmq_setsockopt(B.router, ZMQ_CURVE_SERVER, &one, sizeof(one)) ||
	    zmq_setsockopt(B.router, ZMQ_CURVE_SECRETKEY, sec, 40) || zmq_curve_keypair(B.wrong, sec) ||
	    zmq_curve_keypair(text, sec) || !(f = fopen(B.relay_secret, "w")))
		return -1;
	fprintf(f, "%s\n", sec);
	return fclose(f);
}

static int broker_start(void)
{
	size_t len = sizeof(B.ep);

	pthread_mutex_init(&B.lock, NULL);
	if (bulk_listen())
		return -1;
	if (!(B.ctx = zmq_ctx_new()) || !(B.router = zmq_socket(B.ctx, ZMQ_ROUTER)) || curve_server() ||
	    zmq_bind(B.router, "tcp://127.0.0.1:*") || zmq_getsockopt(B.router, ZMQ_LAST_ENDPOINT, B.ep, &len))
		return -1;
	return pthread_create(&B.thread, NULL, broker_main, NULL);
}

int main(int argc, char **argv)
{
	uint64_t end, round = 0, failed = 0;
	char lsan[600];

	if (parse(argc, argv) || broker_start())
		return 2;
	snprintf(lsan, sizeof(lsan), "%s/fuzz_consumer.%d.lsan", o.dir, (int)getpid());
	if (o.relay)
		relays_lsan(lsan);
	setenv("DELTACAST_LOG", getenv("DELTACAST_LOG") ? getenv("DELTACAST_LOG") : "error", 0);
	end = dcast_now_ms() + o.seconds * 1000;
	for (round = o.start_round; round < o.start_round + o.rounds && dcast_now_ms() < end && !failed; round++)
		if (round_run(round)) {
			tp_say("fuzz_consumer: FAILED in round %" PRIu64 ": replay with --seed %" PRIu64 " --start-round %"
			    PRIu64 " --rounds 1", round, o.seed, round);
			failed = 1;
		}
	atomic_store(&B.stop, 1);
	pthread_join(B.thread, NULL);
	if (B.has_last)
		zmq_msg_close(&B.last_rid);
	zmq_close(B.router);
	zmq_ctx_term(B.ctx);
	if (o.curve)
		unlink(B.relay_secret);
	if (o.relay)
		unlink(lsan);
	if (o.bulk)
		printf("fuzz_consumer: bulk: %" PRIu64 " transfers served, %" PRIu64 " frames\n", B.bulk_served,
		       B.bulk_frames);
	if (o.relay)
		printf("fuzz_consumer: relay: a chain of %" PRIu64 ", %" PRIu64 " relays started%s, %" PRIu64
		       " rounds with a wrong server key\n", o.relay, relay_starts, o.curve ? " (CURVE upstream)" : "",
		       wrong_keys);
	printf("fuzz_consumer: seed %" PRIu64 ", %" PRIu64 " rounds, %" PRIu64 " messages sent, %" PRIu64
	       " damaged: %s\n", o.seed, round - o.start_round, B.sent, B.damaged, failed ? "FAILED" : "ok");
	return failed ? 1 : 0;
}
