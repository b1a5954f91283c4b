/* fuzz_broker: a seeded, structure-aware mutation tool for a live
 * deltacast-broker.  Each batch opens producer and
 * consumer connections and plays valid conversations (HELLO, MANIFEST,
 * anchor and delta CHUNKs made by the real codec, COMMIT with real digests,
 * CREDIT, ACK, HEARTBEAT, BYE) with mutations: field values at and past
 * their limits, wrong msgpack types, dropped, repeated and unknown keys,
 * wrong models, parts, versions and seq, payload sizes and bytes, raw header
 * bytes, frame counts (header only, payload only, empty frames, three
 * frames), orders (COMMIT first, repeats, drops, HELLO mid-stream, a
 * reconnect mid-version), parts interleaved, many connections at once.
 * Mutated CHUNK headers are usually sealed again (dcast_chunk_seal's
 * checksum), mutated MANIFESTs given their sum again, so that they pass
 * those checks and reach deeper code.
 *
 * After each batch: the broker process is alive, every reply it sent
 * decodes, its VmRSS is under the bound, and (every --check-every batches)
 * a normal producer publishes the next version of model "good" (every
 * fourth as an anchor, which the broker makes a delta for the consumer
 * kept at the version before), and that consumer and a fresh one receive
 * it bit-exact (tests/tools/wire_client).  The
 * batch's random stream depends only on (seed, batch), so a failure names
 * what replays it.
 *
 *   fuzz_broker [--seed S] [--batches N] [--seconds T] [--start-batch B]
 *               [--rss-max-mib M] [--check-every K] [--dir DIR]
 *               [--durable 1] [--bulk 1] [--metrics 1] [--curve 1]
 *               [--attach PID PRODUCERS CONSUMERS]
 * Without --attach it starts $DELTACAST_BUILD/deltacast-broker (default
 * build/) with small caps (and --data-dir DIR/data with --durable 1).
 * --bulk 1 gives that broker --bulk 127.0.0.1:0 (and its unix socket):
 * half the fuzzed consumers then say x-bulk, and each batch adds raw
 * connections to the bulk port and the unix socket that say nothing,
 * send junk, cut the opening short, or open a transfer with a token never
 * offered or one a fuzzed consumer was offered and then read part of it,
 * all of it or none, closing at once or at the batch's end; the good
 * check adds a consumer that takes the anchor over bulk.  --metrics 1
 * gives it --metrics 127.0.0.1:0, and each batch adds connections to that
 * port that stay silent, send junk, a request never finished, one over
 * the size limit, other methods and paths, or a whole GET read in part or
 * not at all; after each batch a GET /metrics must be answered with the
 * page (retried for 3 s: the port serves 16 clients at once, and those
 * the batch closed go on the broker's next turns).  --curve 1 (not with
 * --bulk 1) gives it --curve-secret and key lists (a producer key for any
 * model, one for fz0 only, a consumer key): each fuzzed connection then
 * draws its key (mostly a listed one; a producer key for fz0 alone, the
 * other role's key, an unlisted key, or the wrong server key), and each
 * batch adds raw connections to both ZeroMQ ports that stay silent, send
 * junk, a ZMTP greeting cut short, one with another mechanism, or a CURVE
 * greeting and a HELLO command of any size and bytes; the good pair uses
 * the listed keys.  Exit 0: no crash, RSS in bound, every check passed; 1
 * otherwise (the line says which batch and how to replay). */
#include <errno.h>
#include <msgpack.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>
#include "deltacast/codec.h"
#include "dcast_bulkrx.h"
#include "dcast_bytes.h"
#include "dcast_common.h"
#include "dcast_curve.h"
#include "dcast_wire.h"
#include "../proc.h" /* tp_log_port: the tools link tests/support */

#define MAX_FIELDS 32
#define MAX_STREAMS 96
#define MAX_TENSORS 3
#define MAX_PARTS 3
#define RSS_MAX_MIB 768
#define GOOD_ELEMS "8192"

/* ---- options, figures ---- */

static struct opts {
	uint64_t seed, batches, seconds, start_batch, rss_max_mib, check_every, durable, bulk, metrics, curve;
	unsigned bulk_port, metrics_port;
	const char *dir, *build;
	pid_t pid;
	int attached;
	char prod_ep[128], cons_ep[128];
} o = {.seed = 1, .batches = UINT64_MAX, .seconds = 30, .rss_max_mib = RSS_MAX_MIB,
       .check_every = 1};

static struct figures {
	uint64_t batches, streams, inputs, mutated, send_dropped, replies, undecodable;
	uint64_t errors[DCAST_ERR_COUNT];
	uint64_t checks, good_version, rss_max_kib, rss_start_kib;
	uint64_t offers, bulk_conns, bulk_bytes, metrics_conns, metrics_gets, zmtp_conns, keys_drawn[5];
	uint64_t key_leaks; /* --curve 1: messages to a key the broker must refuse */
} fig;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fflush(stdout);
}

/* ---- random numbers: one stream per (seed, batch) ---- */

static uint64_t rng;

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t rnd(void)
{
	rng += 0x9e3779b97f4a7c15ull;
	return mix64(rng);
}

static uint64_t below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static int chance(unsigned pct)
{
	return below(100) < pct;
}

/* Values at and past the protocol's limits (docs/protocol.md, "Limits"). */
static uint64_t interesting(uint64_t cur)
{
	static const uint64_t v[] = {0, 1, 2, 3, 7, 255, 256, 1024, 4095, 4096, 4097, 65535,
		65536, 65537, (1u << 26) - 1, 1u << 26, (1u << 26) + 1, (1u << 28) + (1u << 20),
		(1u << 28) + (1u << 20) + 1, 262144, 262145, (1ull << 31) - 1, 1ull << 31,
		(1ull << 32) - 1, 1ull << 32, 1ull << 40, (1ull << 40) + 1, (1ull << 48) - 1,
		1ull << 48, (1ull << 48) + 1, 1ull << 62, 1ull << 63, UINT64_MAX - 1, UINT64_MAX};
	uint64_t k = below(sizeof(v) / sizeof(v[0]) + 4);

	if (k < sizeof(v) / sizeof(v[0]))
		return v[k];
	return k == sizeof(v) / sizeof(v[0]) ? cur + 1 : k == sizeof(v) / sizeof(v[0]) + 1 ? cur - 1 : rnd();
}

/* ---- strings: a fixed pool, so fields point at static storage ---- */

static char long_a[1100];

static const char *bad_string(uint32_t *len)
{
	static const char *pool[] = {"fz0", "fz1", "good", "", "\xff\xfe\xfd", "a\0b", "\xed\xa0\x80",
				     "\xc0\x80", "producer", "consumer", "CHUNK", "nomodel"};
	uint64_t k = below(sizeof(pool) / sizeof(pool[0]) + 4);

	if (k < sizeof(pool) / sizeof(pool[0])) {
		*len = k == 5 ? 3 : (uint32_t)strlen(pool[k]);
		return pool[k];
	}
	static const uint32_t lens[] = {255, 256, 1024, 1025};
	*len = lens[k - sizeof(pool) / sizeof(pool[0])];
	return long_a;
}

/* ---- a message as a list of msgpack fields ---- */

enum kind { K_UINT, K_STR, K_NIL, K_BOOL, K_NEG, K_FLOAT, K_BIN, K_ARRAY, K_MAP, K_DEEP,
	    K_TENSORS, K_DIGESTS, K_KINDS };

struct field {
	const char *key;
	int kind;
	uint64_t u;
	const char *s;
	uint32_t slen;
};

enum frames { FR_NORMAL, FR_HDR_ONLY, FR_EMPTY_PAYLOAD, FR_PAYLOAD_ONLY, FR_EMPTY_ONLY,
	      FR_THREE, FR_KINDS };

struct fmsg {
	int type;                 /* dcast_msg_type */
	struct field f[MAX_FIELDS];
	uint32_t nf;
	uint8_t *payload;         /* owned */
	size_t plen;
	int frames, seal, raw;    /* raw: 0 none, else a byte edit of the encoded header */
	dcast_tensor_desc *td;    /* MANIFEST: owned */
	uint32_t ntd;
	dcast_range_digest *dg;   /* COMMIT: owned */
	uint32_t ndg;
};

static struct field *fadd(struct fmsg *m, const char *key, int kind, uint64_t u)
{
	struct field *f = &m->f[m->nf < MAX_FIELDS ? m->nf++ : MAX_FIELDS - 1];

	*f = (struct field){key, kind, u, NULL, 0};
	return f;
}

static void fstr(struct fmsg *m, const char *key, const char *s)
{
	struct field *f = fadd(m, key, K_STR, 0);

	f->s = s;
	f->slen = (uint32_t)strlen(s);
}

static void fver(struct fmsg *m, const char *key, uint64_t v)
{
	fadd(m, key, v == DCAST_VERSION_NONE ? K_NIL : K_UINT, v);
}

static void msg_start(struct fmsg *m, int type)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	fadd(m, "proto", K_UINT, DCAST_PROTO_VERSION);
	fstr(m, "type", dcast_msg_type_name(type));
}

static struct field *ffind(struct fmsg *m, const char *key)
{
	for (uint32_t i = 0; i < m->nf; i++)
		if (!strcmp(m->f[i].key, key))
			return &m->f[i];
	return NULL;
}

static uint64_t fget(struct fmsg *m, const char *key, uint64_t dflt)
{
	struct field *f = ffind(m, key);

	if (!f || (f->kind != K_UINT && f->kind != K_BOOL && f->kind != K_NIL))
		return dflt;
	return f->kind == K_NIL ? DCAST_VERSION_NONE : f->u;
}

static void msg_free(struct fmsg *m)
{
	free(m->payload);
	free(m->td);
	free(m->dg);
	m->payload = NULL;
	m->td = NULL;
	m->dg = NULL;
}

static void *dup_bytes(const void *p, size_t n)
{
	void *q = n ? malloc(n) : NULL;

	if (q)
		memcpy(q, p, n);
	return q;
}

static void msg_copy(struct fmsg *dst, const struct fmsg *src)
{
	*dst = *src;
	dst->payload = dup_bytes(src->payload, src->plen);
	dst->td = dup_bytes(src->td, src->ntd * sizeof(*src->td));
	dst->dg = dup_bytes(src->dg, (size_t)src->ndg * sizeof(*src->dg));
	if ((src->plen && !dst->payload) || (src->ntd && !dst->td) || (src->ndg && !dst->dg)) {
		dst->plen = dst->ntd = dst->ndg = 0; /* out of memory: an empty one */
		msg_free(dst);
	}
}

/* A MANIFEST's sum again from the model and tensors it now holds. */
static void manifest_seal(struct fmsg *m)
{
	struct field *sum = ffind(m, "sum"), *model = ffind(m, "model");
	dcast_manifest mf = {.n_tensors = m->ntd, .tensors = m->td};

	if (!sum || sum->kind != K_UINT || !model || model->kind != K_STR || model->slen > DCAST_MAX_NAME)
		return;
	memcpy(mf.model, model->s, model->slen);
	sum->u = dcast_manifest_sum(&mf);
}

/* Seal a CHUNK (or a MANIFEST) again from the values its fields now hold. */
static void msg_seal(struct fmsg *m)
{
	struct field *cs = ffind(m, "checksum");
	dcast_chunk c;

	if (m->type == DCAST_MSG_MANIFEST)
		manifest_seal(m);
	if (m->type != DCAST_MSG_CHUNK || !cs || cs->kind != K_UINT)
		return;
	memset(&c, 0, sizeof(c));
	c.version = fget(m, "version", 0);
	c.base_version = fget(m, "base_version", DCAST_VERSION_NONE);
	c.anchor = (uint32_t)fget(m, "anchor", 0);
	c.tensor = (uint32_t)fget(m, "tensor", 0);
	c.start = fget(m, "start", 0);
	c.count = fget(m, "count", 0);
	c.elem_size = (uint32_t)fget(m, "elem_size", 0);
	c.encoding = (uint32_t)fget(m, "encoding", 0);
	c.changed = fget(m, "changed", 0);
	c.payload_bytes = fget(m, "payload_bytes", 0);
	cs->u = dcast_chunk_checksum(&c, dcast_checksum(m->payload ? (void *)m->payload : "", m->plen));
}

/* ---- encoding with msgpack-c, any types ---- */

static void pack_str(msgpack_packer *pk, const char *s, size_t n)
{
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

static void pack_tensors(msgpack_packer *pk, const struct fmsg *m)
{
	msgpack_pack_array(pk, m->ntd);
	for (uint32_t i = 0; i < m->ntd; i++) {
		const dcast_tensor_desc *t = &m->td[i];

		msgpack_pack_map(pk, 3);
		pack_str(pk, "name", 4);
		pack_str(pk, t->name, strlen(t->name));
		pack_str(pk, "dtype", 5);
		pack_str(pk, dcast_dtype_name((int)t->dtype), strlen(dcast_dtype_name((int)t->dtype)));
		pack_str(pk, "shape", 5);
		msgpack_pack_array(pk, t->ndim);
		for (uint32_t d = 0; d < t->ndim; d++)
			msgpack_pack_uint64(pk, d < DCAST_MAX_DIMS ? t->shape[d] : 1);
	}
}

static void pack_digests(msgpack_packer *pk, const struct fmsg *m)
{
	msgpack_pack_array(pk, m->ndg);
	for (uint32_t i = 0; i < m->ndg; i++) {
		const dcast_range_digest *d = &m->dg[i];

		msgpack_pack_map(pk, 4);
		pack_str(pk, "tensor", 6);
		msgpack_pack_uint64(pk, d->tensor);
		pack_str(pk, "start", 5);
		msgpack_pack_uint64(pk, d->start);
		pack_str(pk, "count", 5);
		msgpack_pack_uint64(pk, d->count);
		pack_str(pk, "digest", 6);
		msgpack_pack_uint64(pk, d->digest);
	}
}

static void pack_value(msgpack_packer *pk, const struct fmsg *m, const struct field *f)
{
	switch (f->kind) {
	case K_UINT: msgpack_pack_uint64(pk, f->u); break;
	case K_STR: pack_str(pk, f->s, f->slen); break;
	case K_NIL: msgpack_pack_nil(pk); break;
	case K_BOOL: f->u ? msgpack_pack_true(pk) : msgpack_pack_false(pk); break;
	case K_NEG: msgpack_pack_int64(pk, -(int64_t)(f->u >> 1) - 1); break;
	case K_FLOAT: msgpack_pack_double(pk, (double)f->u / 3.0); break;
	case K_BIN: msgpack_pack_bin(pk, f->slen); msgpack_pack_bin_body(pk, f->s, f->slen); break;
	case K_ARRAY:
		msgpack_pack_array(pk, f->u % 9);
		for (uint64_t i = 0; i < f->u % 9; i++)
			msgpack_pack_uint64(pk, i);
		break;
	case K_MAP: msgpack_pack_map(pk, 0); break;
	case K_DEEP:
		for (int i = 0; i < 8; i++)
			msgpack_pack_array(pk, 1);
		msgpack_pack_nil(pk);
		break;
	case K_TENSORS: pack_tensors(pk, m); break;
	case K_DIGESTS: pack_digests(pk, m); break;
	}
}

static void raw_edit(msgpack_sbuffer *sb)
{
	size_t at = below(sb->size ? sb->size : 1);

	if (!sb->size)
		return;
	switch (below(4)) {
	case 0: sb->data[at] ^= (char)(1u << below(8)); break;
	case 1: sb->size = at; break;                         /* truncated */
	case 2: sb->data[at] = (char)rnd(); break;
	default: sb->data[at] = (char)0xc1; break;            /* never-used byte */
	}
}

static void msg_encode(struct fmsg *m, msgpack_sbuffer *sb)
{
	msgpack_packer pk;

	if (m->seal)
		msg_seal(m);
	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, m->nf);
	for (uint32_t i = 0; i < m->nf; i++) {
		pack_str(&pk, m->f[i].key, strlen(m->f[i].key));
		pack_value(&pk, m, &m->f[i]);
	}
	if (m->raw)
		raw_edit(sb);
}

/* ---- sending with any frame layout ---- */

static int send_frame(void *s, const void *p, size_t n, int more)
{
	if (zmq_send(s, p, n, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) >= 0)
		return 0;
	fig.send_dropped++;
	return -1;
}

static void msg_send(void *s, struct fmsg *m)
{
	msgpack_sbuffer sb;
	const void *pl = m->payload ? (void *)m->payload : "";
	int with_pl = m->type == DCAST_MSG_CHUNK || m->plen;

	msg_encode(m, &sb);
	fig.inputs++;
	switch (m->frames) {
	case FR_HDR_ONLY: send_frame(s, sb.data, sb.size, 0); break;
	case FR_EMPTY_PAYLOAD: if (!send_frame(s, sb.data, sb.size, 1)) send_frame(s, "", 0, 0); break;
	case FR_PAYLOAD_ONLY: send_frame(s, pl, m->plen, 0); break;
	case FR_EMPTY_ONLY: send_frame(s, "", 0, 0); break;
	case FR_THREE:
		if (!send_frame(s, sb.data, sb.size, 1) && !send_frame(s, pl, m->plen, 1))
			send_frame(s, "x", 1, 0);
		break;
	default:
		if (!send_frame(s, sb.data, sb.size, with_pl) && with_pl)
			send_frame(s, pl, m->plen, 0);
	}
	msgpack_sbuffer_destroy(&sb);
}

/* ---- mutations of one message ---- */

static struct field *any_field(struct fmsg *m)
{
	return m->nf ? &m->f[below(m->nf)] : NULL;
}

static void mut_digests(struct fmsg *m)
{
	static const uint32_t counts[] = {0, 1, 4096, 262144, 262145};
	uint32_t n = counts[below(5)];
	dcast_range_digest *dg;

	if (m->ndg && chance(50)) { /* a wrong range or value */
		dcast_range_digest *d = &m->dg[below(m->ndg)];
		uint64_t *which[] = {&d->start, &d->count, &d->digest};
		*which[below(3)] = interesting(d->count);
		d->tensor = chance(20) ? (uint32_t)interesting(d->tensor) : d->tensor;
		return;
	}
	if (!(dg = calloc(n ? n : 1, sizeof(*dg))))
		return;
	for (uint32_t i = 0; i < n; i++)
		dg[i] = (dcast_range_digest){0, 0, 0, 0}; /* empty ranges, digest 0: all valid */
	free(m->dg);
	m->dg = dg;
	m->ndg = n;
}

static void mut_tensors(struct fmsg *m)
{
	dcast_tensor_desc *t;

	if (!m->ntd)
		return;
	t = &m->td[below(m->ntd)];
	switch (below(7)) {
	case 0: t->dtype = (uint32_t)below(DCAST_DTYPE_COUNT + 2); break;
	case 5: /* a grid of 0 beside a tiled dimension, longer than the shape, or not dividing it */
		t->grid[below(DCAST_MAX_DIMS)] = (uint32_t)interesting(t->grid[0]);
		break;
	case 1: t->ndim = (uint32_t)below(DCAST_MAX_DIMS + 2); break;
	case 2: t->shape[below(DCAST_MAX_DIMS)] = interesting(t->shape[0]); break;
	case 3: memmove(t->name, m->td[0].name, sizeof(t->name)); break; /* a duplicate name */
	case 4: strcpy(t->name, "__metadata__"); break; /* a name no consumer can write */
	default: t->name[0] = chance(50) ? '\0' : '\xff'; break;
	}
}

static void mut_type_specific(struct fmsg *m)
{
	if (m->type == DCAST_MSG_COMMIT)
		mut_digests(m);
	else if (m->type == DCAST_MSG_MANIFEST)
		mut_tensors(m);
	else if (m->nf)
		any_field(m)->u = interesting(0);
}

static void mut_payload_size(struct fmsg *m)
{
	size_t n = chance(50) ? (m->plen ? below(m->plen) : 0) : m->plen + 1 + below(64);
	uint8_t *p = calloc(n ? n : 1, 1);
	struct field *pb = ffind(m, "payload_bytes");

	if (!p)
		return;
	memcpy(p, m->payload ? m->payload : p, n < m->plen ? n : m->plen);
	free(m->payload);
	m->payload = p;
	m->plen = n;
	if (pb && chance(60))
		pb->u = n; /* header agrees: sealed, it reaches the codec checks */
}

static void mut_field(struct fmsg *m, unsigned what)
{
	struct field *f = any_field(m);
	uint32_t len;

	if (!f)
		return;
	switch (what) {
	case 0: f->u = interesting(f->u); break;
	case 1: f->kind = (int)below(K_TENSORS); f->s = bad_string(&f->slen); break;
	case 2: *f = m->f[--m->nf]; break;                               /* dropped */
	case 3: *fadd(m, f->key, f->kind, f->u) = *f; break;             /* repeated */
	case 4: fadd(m, chance(50) ? "zzz" : "x-ext", K_UINT, 1); break; /* unknown key */
	default:
		f = ffind(m, chance(70) ? "model" : "type");
		if (f) {
			f->kind = K_STR;
			f->s = bad_string(&len);
			f->slen = len;
		}
	}
}

static void mut_msg(struct fmsg *m)
{
	unsigned what = (unsigned)below(12);

	fig.mutated++;
	if (what < 6)
		mut_field(m, what);
	else if (what == 6)
		m->frames = (int)below(FR_KINDS);
	else if (what == 7)
		mut_payload_size(m);
	else if (what == 8 && m->plen)
		m->payload[below(m->plen)] ^= (uint8_t)(1 + below(255)); /* garbage behind a checksum */
	else if (what == 9)
		m->raw = 1;
	else if (what == 10)
		mut_type_specific(m);
	else
		ffind(m, "proto") ? (void)(ffind(m, "proto")->u = below(4)) : (void)0;
	if (m->type == DCAST_MSG_CHUNK || m->type == DCAST_MSG_MANIFEST)
		m->seal = chance(75);
}

/* ---- streams: one connection and its script ---- */

struct conv;

struct stream {
	void *sock;
	int consumer, reader;     /* reader: a consumer that reads and grants credit */
	struct fmsg *msg;
	uint32_t n, cap, next, reconnect_at;
	uint64_t welcome_version;
	int welcomed, hello_acked;
	int key;                  /* --curve 1: its key (KEY_SERVER: its role's, to the wrong server key) */
	struct conv *conv;
};

/* A producer conversation: one model, its manifest and tensors, P parts. */
struct conv {
	char model[16];
	uint32_t parts, ntd, chunk_elems;
	dcast_tensor_desc td[MAX_TENSORS];
	uint8_t *cur[MAX_TENSORS], *base[MAX_TENSORS];
	struct stream *part[MAX_PARTS];
};

static void *g_ctx;
static struct stream streams[MAX_STREAMS];
static struct conv convs[MAX_STREAMS];
static uint32_t n_streams, n_convs;

static struct fmsg *script_add(struct stream *st)
{
	if (st->n == st->cap) {
		uint32_t cap = st->cap ? st->cap * 2 : 32;
		struct fmsg *n = realloc(st->msg, cap * sizeof(*n));

		if (!n) {
			fprintf(stderr, "fuzz_broker: out of memory\n");
			exit(1);
		}
		st->msg = n;
		st->cap = cap;
	}
	return &st->msg[st->n++];
}

/* ---- CURVE keys (--curve 1) ---- */

enum { KEY_PROD, KEY_FZ0, KEY_CONS, KEY_UNLISTED, KEY_SERVER, N_KEYS };

static const char *const key_names[N_KEYS] = {"prod", "prod-fz0", "cons", "unlisted", "server"};
static char key_pub[N_KEYS][DCAST_Z85_KEY_LEN + 1], key_file[N_KEYS][600];
static char wrong_server[DCAST_Z85_KEY_LEN + 1]; /* a key no broker holds */

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f || fputs(text, f) < 0 || fclose(f)) {
		fprintf(stderr, "fuzz_broker: %s: %s\n", path, strerror(errno));
		exit(1);
	}
}

/* Every key pair in DIR/KEY.secret, the broker's key lists in
 * DIR/producer-keys (prod: any model; prod-fz0: fz0 only) and
 * DIR/consumer-keys (cons). */
static void keys_make(void)
{
	char secret[DCAST_Z85_KEY_LEN + 1], text[256], path[600];

	for (int k = 0; k < N_KEYS; k++) {
		if (zmq_curve_keypair(key_pub[k], secret)) {
			fprintf(stderr, "fuzz_broker: no CURVE in this libzmq\n");
			exit(1);
		}
		snprintf(key_file[k], sizeof(key_file[k]), "%s/%s.secret", o.dir, key_names[k]);
		snprintf(text, sizeof(text), "%s\n", secret);
		write_file(key_file[k], text);
	}
	zmq_curve_keypair(wrong_server, secret);
	snprintf(path, sizeof(path), "%s/producer-keys", o.dir);
	snprintf(text, sizeof(text), "%s *\n%s fz0\n", key_pub[KEY_PROD], key_pub[KEY_FZ0]);
	write_file(path, text);
	snprintf(path, sizeof(path), "%s/consumer-keys", o.dir);
	snprintf(text, sizeof(text), "%s\n", key_pub[KEY_CONS]);
	write_file(path, text);
}

/* The key a fuzzed connection uses: mostly its role's listed key, else
 * the fz0-only producer key, the other role's, an unlisted one, or
 * KEY_SERVER: its role's key to the wrong server key. */
static int key_draw(int consumer)
{
	uint64_t r = below(100);
	int k = consumer ? KEY_CONS : KEY_PROD;

	if (r >= 70 && r < 80)
		k = consumer ? KEY_PROD : KEY_FZ0;
	else if (r >= 80 && r < 88)
		k = consumer ? KEY_FZ0 : KEY_CONS;
	else if (r >= 88 && r < 95)
		k = KEY_UNLISTED;
	else if (r >= 95)
		k = KEY_SERVER;
	fig.keys_drawn[k]++;
	return k;
}

/* 1 when the broker must refuse the handshake of st's key. */
static int key_refused(const struct stream *st)
{
	if (!o.curve)
		return 0;
	return st->consumer ? st->key != KEY_CONS : st->key != KEY_PROD && st->key != KEY_FZ0;
}

/* A DEALER connected to the consumers' or producers' port; with --curve 1
 * a CURVE client with key k. */
static void *open_dealer(int consumer, int k)
{
	const char *ep = consumer ? o.cons_ep : o.prod_ep;
	const char *server = k == KEY_SERVER ? wrong_server : key_pub[KEY_SERVER];
	int own = k == KEY_SERVER ? (consumer ? KEY_CONS : KEY_PROD) : k;
	void *s = zmq_socket(g_ctx, ZMQ_DEALER);
	int hwm = 100000;

	if (!s || dcast_wire_socket_opts(s) || zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm)) ||
	    (o.curve && dcast_curve_client_setup(s, server, key_file[own])) || zmq_connect(s, ep)) {
		fprintf(stderr, "fuzz_broker: connect %s: %s\n", ep, zmq_strerror(errno));
		exit(1);
	}
	return s;
}

static struct stream *stream_new(int consumer)
{
	struct stream *st = &streams[n_streams++];

	memset(st, 0, sizeof(*st));
	st->consumer = consumer;
	st->key = o.curve ? key_draw(consumer) : 0;
	st->sock = open_dealer(consumer, st->key);
	st->welcome_version = DCAST_VERSION_NONE;
	st->reconnect_at = UINT32_MAX;
	fig.streams++;
	return st;
}

static void stream_free(struct stream *st)
{
	for (uint32_t i = 0; i < st->n; i++)
		msg_free(&st->msg[i]);
	free(st->msg);
	zmq_close(st->sock);
	memset(st, 0, sizeof(*st));
}

/* ---- message builders ---- */

static void build_hello(struct fmsg *m, int role, const char *model, uint32_t part,
			uint32_t parts, uint64_t have, uint64_t window)
{
	msg_start(m, DCAST_MSG_HELLO);
	fstr(m, "role", role == DCAST_ROLE_CONSUMER ? "consumer" : "producer");
	fstr(m, "model", model);
	fadd(m, "part", K_UINT, part);
	fadd(m, "parts", K_UINT, parts);
	fver(m, "have_version", have);
	if (window)
		fadd(m, "window_bytes", K_UINT, window);
	fstr(m, "client", "fuzz_broker");
}

static void build_manifest(struct fmsg *m, const struct conv *c)
{
	msg_start(m, DCAST_MSG_MANIFEST);
	fstr(m, "model", c->model);
	fadd(m, "tensors", K_TENSORS, 0);
	fadd(m, "sum", K_UINT, 0);
	m->td = dup_bytes(c->td, c->ntd * sizeof(c->td[0]));
	m->ntd = m->td ? c->ntd : 0;
	m->seal = 1;
}

static void build_simple(struct fmsg *m, int type, const char *model, uint64_t a)
{
	msg_start(m, type);
	if (type == DCAST_MSG_CREDIT)
		fadd(m, "bytes", K_UINT, a);
	if (type == DCAST_MSG_ACK) {
		fstr(m, "model", model);
		fadd(m, "version", K_UINT, a);
	}
	if (type == DCAST_MSG_HEARTBEAT) {
		fadd(m, "time_ms", K_UINT, dcast_now_ms());
		fver(m, "version", a);
	}
	if (type == DCAST_MSG_BYE)
		fstr(m, "reason", "fuzz");
}

static void build_chunk(struct fmsg *m, const struct conv *c, const dcast_chunk *h,
			const void *payload)
{
	msg_start(m, DCAST_MSG_CHUNK);
	fstr(m, "model", c->model);
	fadd(m, "version", K_UINT, h->version);
	fver(m, "base_version", h->base_version);
	fadd(m, "anchor", K_BOOL, h->anchor);
	fadd(m, "part", K_UINT, h->part);
	fadd(m, "seq", K_UINT, h->seq);
	fadd(m, "tensor", K_UINT, h->tensor);
	fadd(m, "start", K_UINT, h->start);
	fadd(m, "count", K_UINT, h->count);
	fadd(m, "elem_size", K_UINT, h->elem_size);
	fadd(m, "encoding", K_UINT, h->encoding);
	fadd(m, "changed", K_UINT, h->changed);
	fadd(m, "payload_bytes", K_UINT, h->payload_bytes);
	fadd(m, "checksum", K_UINT, 0);
	m->payload = dup_bytes(payload, h->payload_bytes);
	m->plen = m->payload ? h->payload_bytes : 0;
	m->seal = 1;
}

static void build_commit(struct fmsg *m, const struct conv *c, const dcast_commit *h,
			 const dcast_range_digest *dg)
{
	msg_start(m, DCAST_MSG_COMMIT);
	fstr(m, "model", c->model);
	fadd(m, "version", K_UINT, h->version);
	fver(m, "base_version", h->base_version);
	fadd(m, "anchor", K_BOOL, h->anchor);
	fadd(m, "part", K_UINT, h->part);
	fadd(m, "parts", K_UINT, h->parts);
	fadd(m, "chunks", K_UINT, h->chunks);
	fadd(m, "bytes", K_UINT, h->bytes);
	fadd(m, "digests", K_DIGESTS, 0);
	m->dg = dup_bytes(dg, (size_t)h->n_digests * sizeof(*dg));
	m->ndg = m->dg ? h->n_digests : 0;
}

/* ---- a producer conversation: tensors, anchor, deltas ---- */

static const char *fuzz_models[] = {"fz0", "fz1", "fz2", "fz3", "fz4", "fz5"};

static void conv_init(struct conv *c)
{
	static const uint32_t dtypes[] = {DCAST_DTYPE_U8, DCAST_DTYPE_BF16, DCAST_DTYPE_F32};
	static const uint64_t elems[] = {64, 100, 1000, 4096};
	static const uint32_t chunk[] = {16, 64, 256, 1024, 1}; /* 1: a flood of tiny chunks */

	memset(c, 0, sizeof(*c));
	snprintf(c->model, sizeof(c->model), "%s", fuzz_models[below(6)]);
	c->parts = chance(70) ? 1 : 2 + (uint32_t)below(MAX_PARTS - 1);
	c->ntd = 1 + (uint32_t)below(MAX_TENSORS);
	c->chunk_elems = chunk[chance(3) ? 4 : below(4)];
	for (uint32_t t = 0; t < c->ntd; t++) {
		dcast_tensor_desc *d = &c->td[t];
		uint64_t n = elems[below(4)];

		snprintf(d->name, sizeof(d->name), "t%u", t);
		d->dtype = dtypes[below(3)];
		d->ndim = 1;
		d->shape[0] = n;
		c->cur[t] = malloc(n * 4);
		c->base[t] = calloc(n, 4);
		for (uint64_t i = 0; c->cur[t] && i < n * 4; i++)
			c->cur[t][i] = (uint8_t)rnd();
	}
}

static void conv_free(struct conv *c)
{
	for (uint32_t t = 0; t < c->ntd; t++) {
		free(c->cur[t]);
		free(c->base[t]);
	}
	memset(c, 0, sizeof(*c));
}

static unsigned conv_es(const struct conv *c, uint32_t t)
{
	return dcast_dtype_size((int)c->td[t].dtype);
}

/* One part's chunks of tensor t for version v; returns payload bytes. */
static uint64_t part_tensor_chunks(struct conv *c, struct stream *st, const dcast_chunk *tmpl,
				   uint32_t t, uint32_t *seq)
{
	uint64_t n = c->td[t].shape[0], bytes = 0, lo = n * tmpl->part / c->parts,
		 hi = n * (tmpl->part + 1) / c->parts;
	unsigned es = conv_es(c, t);
	static uint8_t out[1024 * 8 + 4096];

	for (uint64_t s = lo; s < hi; s += c->chunk_elems) {
		uint64_t k = hi - s < c->chunk_elems ? hi - s : c->chunk_elems;
		dcast_chunk h = *tmpl;
		dcast_chunk_info info;

		if (dcast_codec_encode(c->cur[t] + s * es, tmpl->anchor ? NULL : c->base[t] + s * es,
				       k, es, -1, 0, out, sizeof(out), &info))
			continue;
		if (!tmpl->anchor && !info.changed)
			continue;
		h.seq = (*seq)++;
		h.tensor = t;
		h.start = s;
		h.count = k;
		h.elem_size = es;
		h.encoding = info.encoding;
		h.changed = info.changed;
		h.payload_bytes = info.payload_bytes;
		build_chunk(script_add(st), c, &h, out);
		bytes += info.payload_bytes;
	}
	return bytes;
}

static void part_version(struct conv *c, uint32_t p, uint64_t v, int anchor)
{
	struct stream *st = c->part[p];
	dcast_range_digest dg[MAX_TENSORS];
	dcast_chunk tmpl;
	dcast_commit cm;
	uint32_t seq = 0;
	uint64_t bytes = 0;

	memset(&tmpl, 0, sizeof(tmpl));
	tmpl.version = v;
	tmpl.base_version = anchor ? DCAST_VERSION_NONE : v - 1;
	tmpl.anchor = (uint32_t)anchor;
	tmpl.part = p;
	for (uint32_t t = 0; t < c->ntd; t++) {
		uint64_t n = c->td[t].shape[0], lo = n * p / c->parts, hi = n * (p + 1) / c->parts;

		bytes += part_tensor_chunks(c, st, &tmpl, t, &seq);
		dg[t] = (dcast_range_digest){t, lo, hi - lo, 0};
		dcast_ldigest(t, lo, c->cur[t] + lo * conv_es(c, t), hi - lo, conv_es(c, t), &dg[t].digest);
	}
	memset(&cm, 0, sizeof(cm));
	cm.version = v;
	cm.base_version = tmpl.base_version;
	cm.anchor = (uint32_t)anchor;
	cm.part = p;
	cm.parts = c->parts;
	cm.chunks = seq;
	cm.bytes = bytes;
	cm.n_digests = c->ntd;
	build_commit(script_add(st), c, &cm, dg);
}

/* About 2% of the elements change. */
static void conv_step(struct conv *c)
{
	for (uint32_t t = 0; t < c->ntd; t++) {
		uint64_t n = c->td[t].shape[0] * conv_es(c, t);

		for (uint64_t k = 0; k < n / 50 + 1; k++)
			c->cur[t][below(n)] = (uint8_t)rnd();
	}
}

static void conv_versions(struct conv *c, uint64_t newest)
{
	uint64_t v = newest == DCAST_VERSION_NONE ? 1 : newest + 1;
	uint32_t deltas = chance(15) ? 8 + (uint32_t)below(8) : (uint32_t)below(4); /* long: folds cut */

	for (uint32_t i = 0; i <= deltas; i++, v++) {
		if (i)
			conv_step(c);
		for (uint32_t p = 0; p < c->parts; p++)
			part_version(c, p, v, i == 0);
		for (uint32_t t = 0; t < c->ntd; t++)
			memcpy(c->base[t], c->cur[t], c->td[t].shape[0] * conv_es(c, t));
	}
}

/* ---- script-level mutations: orders, repeats, reconnects ---- */

static void script_swap(struct stream *st)
{
	uint32_t a = 1 + (uint32_t)below(st->n - 1), b = 1 + (uint32_t)below(st->n - 1);
	struct fmsg t = st->msg[a];

	st->msg[a] = st->msg[b];
	st->msg[b] = t;
}

static void script_repeat(struct stream *st)
{
	uint32_t a = (uint32_t)below(st->n);
	struct fmsg *m = script_add(st);
	uint32_t at = a + 1 + (uint32_t)below(st->n - a - 1);

	msg_copy(m, &st->msg[a]);
	struct fmsg t = *m;
	memmove(&st->msg[at + 1], &st->msg[at], (st->n - 1 - at) * sizeof(*m));
	st->msg[at] = t;
}

static void script_drop(struct stream *st)
{
	uint32_t a = 1 + (uint32_t)below(st->n - 1);

	msg_free(&st->msg[a]);
	memmove(&st->msg[a], &st->msg[a + 1], (st->n - a - 1) * sizeof(st->msg[0]));
	st->n--;
}

/* The last COMMIT moves before the first CHUNK. */
static void script_commit_first(struct stream *st)
{
	uint32_t c = st->n, k = 0;
	struct fmsg t;

	for (uint32_t i = 0; i < st->n; i++)
		if (st->msg[i].type == DCAST_MSG_COMMIT)
			c = i;
	while (k < st->n && st->msg[k].type != DCAST_MSG_CHUNK)
		k++;
	if (c >= st->n || k >= c)
		return;
	t = st->msg[c];
	memmove(&st->msg[k + 1], &st->msg[k], (c - k) * sizeof(t));
	st->msg[k] = t;
}

static void script_mutate(struct stream *st)
{
	unsigned ops = (unsigned)below(3);

	for (unsigned i = 0; i < ops && st->n > 2; i++) {
		switch (below(6)) {
		case 0: script_swap(st); break;
		case 1: script_repeat(st); break;
		case 2: script_drop(st); break;
		case 3: script_commit_first(st); break;
		case 4: st->reconnect_at = 2 + (uint32_t)below(st->n - 2); break;
		default: /* cut short: no COMMIT, no BYE */
			while (st->n > 2 && chance(80))
				msg_free(&st->msg[--st->n]);
		}
	}
	for (uint32_t i = 0; i < st->n; i++)
		if (chance(8))
			mut_msg(&st->msg[i]);
}

/* ---- a batch ---- */

static void conv_open(void)
{
	struct conv *c = &convs[n_convs++];

	conv_init(c);
	for (uint32_t p = 0; p < c->parts && n_streams < MAX_STREAMS; p++) {
		struct stream *st = stream_new(0);

		st->conv = c;
		c->part[p] = st;
		build_hello(script_add(st), DCAST_ROLE_PRODUCER, c->model, p, c->parts,
			    DCAST_VERSION_NONE, 0);
		if (chance(10))
			mut_msg(&st->msg[0]);
	}
	if (!c->part[c->parts - 1])
		c->parts = 0; /* no room for every part: the conversation stays silent */
}

static const char *consumer_model(void)
{
	static const char *m[] = {"good", "fz0", "fz1", "fz2", "fz3", "nomodel"};

	return m[below(6)];
}

static void consumer_open(void)
{
	static const uint64_t windows[] = {0, 1, 1024, 1 << 20, 1ull << 40, 64 << 20};
	struct stream *st = stream_new(1);
	const char *model = consumer_model();
	uint64_t have = chance(50) ? DCAST_VERSION_NONE : interesting(1);
	uint32_t extra = (uint32_t)below(6);

	st->reader = chance(70);
	build_hello(script_add(st), DCAST_ROLE_CONSUMER, model, 0, 1, have, windows[below(6)]);
	if (o.bulk && chance(50))
		fadd(&st->msg[0], "x-bulk", K_BOOL, 1);
	for (uint32_t i = 0; i < extra; i++) {
		static const int types[] = {DCAST_MSG_CREDIT, DCAST_MSG_ACK, DCAST_MSG_HEARTBEAT,
					    DCAST_MSG_CREDIT, DCAST_MSG_HELLO, DCAST_MSG_COMMIT};
		int type = types[below(6)];

		if (type == DCAST_MSG_HELLO)
			msg_copy(script_add(st), &st->msg[0]);
		else
			build_simple(script_add(st), type, model, interesting(1 << 20));
	}
	if (chance(40))
		build_simple(script_add(st), DCAST_MSG_BYE, model, 0);
	for (uint32_t i = 0; i < st->n; i++)
		if (chance(15))
			mut_msg(&st->msg[i]);
}

static void batch_plan(void)
{
	uint32_t n = 1 + (uint32_t)below(8);

	if (chance(5))
		n += 40; /* many connections at once */
	for (uint32_t i = 0; i < n && n_streams + MAX_PARTS <= MAX_STREAMS; i++) {
		if (chance(65))
			conv_open();
		else
			consumer_open();
	}
}

/* ---- hostile bulk connections (--bulk 1) ---- */

#define MAX_OFFERS 32
#define MAX_RAW 160

static uint64_t offers[MAX_OFFERS]; /* tokens the broker offered this batch's consumers */
static uint32_t n_offers;
static int raw_fds[MAX_RAW];        /* connections left open until the batch ends */
static uint32_t n_raw;

static void offer_keep(uint64_t token)
{
	fig.offers++;
	if (n_offers < MAX_OFFERS)
		offers[n_offers++] = token;
}

/* A connection to `port` on loopback, or to the broker's unix socket of
 * that bulk port (non-blocking either way); -1 when refused. */
static int raw_connect(unsigned port, int local)
{
	struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct sockaddr_un un;
	socklen_t len = local ? dcast_bulk_local_addr(&un, port) : sizeof(in);
	int fd = socket(local ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd >= 0 && connect(fd, local ? (struct sockaddr *)&un : (struct sockaddr *)&in, len)) {
		close(fd);
		return -1;
	}
	if (fd >= 0)
		fcntl(fd, F_SETFL, O_NONBLOCK);
	return fd;
}

/* Closed now, or (half the time, while there is room) kept open until
 * the batch's end. */
static void raw_keep_or_close(int fd)
{
	if (chance(50) || n_raw == MAX_RAW)
		close(fd);
	else
		raw_fds[n_raw++] = fd;
}

/* The first n bytes of an opening for `token` ("DCB1", 4 zero bytes, the
 * token), now and then with a bit of its first 8 flipped. */
static void raw_opening(int fd, uint64_t token, size_t n)
{
	unsigned char b[DCAST_BULK_OPENING] = {'D', 'C', 'B', '1'};

	dcast_put_le64(b + 8, token);
	if (chance(10))
		b[below(8)] ^= (unsigned char)(1u << below(8));
	if (send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT) > 0)
		fig.inputs++;
}

/* Up to `most` bytes from fd into buf (cap bytes; each read kept after
 * the last when `keep`, else over it), each wait on fd bounded by `end`
 * (dcast_now_ms); how many came before the end, EOF or an error. */
static uint64_t read_until(int fd, char *buf, size_t cap, int keep, uint64_t most, uint64_t end)
{
	uint64_t got = 0;

	while (got < most) {
		uint64_t now = dcast_now_ms(), want = most - got;
		struct pollfd p = {fd, POLLIN, 0};
		ssize_t k;

		if (now >= end || poll(&p, 1, (int)(end - now)) <= 0)
			break;
		k = recv(fd, keep ? buf + got : buf, want < cap ? want : cap, MSG_DONTWAIT);
		if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
			break;
		got += k > 0 ? (uint64_t)k : 0;
	}
	return got;
}

/* Read up to `most` bytes of what the broker sends, for at most ms. */
static void raw_read(int fd, uint64_t most, uint64_t ms)
{
	static char buf[1 << 16];

	fig.bulk_bytes += read_until(fd, buf, sizeof(buf), 0, most, dcast_now_ms() + ms);
}

/* One hostile connection: silent, junk, an opening cut short, or an
 * opening (a token offered, or any) then part of the transfer read, all
 * of it, or none; closed now or kept to the batch's end. */
static void raw_one(void)
{
	unsigned char junk[64];
	uint64_t token = n_offers && chance(60) ? offers[below(n_offers)] : rnd();
	unsigned kind = (unsigned)below(6);
	int fd = raw_connect(o.bulk_port, chance(50));

	if (fd < 0)
		return;
	fig.bulk_conns++;
	if (kind == 1) {
		for (size_t j = 0; j < sizeof(junk); j++)
			junk[j] = (unsigned char)rnd();
		if (send(fd, junk, 1 + below(sizeof(junk)), MSG_NOSIGNAL | MSG_DONTWAIT) > 0)
			fig.inputs++;
	} else if (kind == 2) {
		raw_opening(fd, token, 1 + below(DCAST_BULK_OPENING - 1));
	} else if (kind >= 3) {
		raw_opening(fd, token, DCAST_BULK_OPENING);
		if (kind < 5) /* 5: never read, a stalled transfer */
			raw_read(fd, kind == 3 ? below(4 << 20) : UINT64_MAX, kind == 3 ? 20 : 200);
	}
	raw_keep_or_close(fd);
}

static void bulk_hostile(void)
{
	uint32_t n = 1 + (uint32_t)below(6) + (chance(3) ? 100 : 0); /* now and then many at once */

	for (uint32_t i = 0; i < n; i++)
		raw_one();
}

/* One hostile client of the metrics port: silent, junk, a request never
 * finished, one past the 8 KiB limit, another method or path, or a GET
 * whose answer is read in part or not at all. */
static void metrics_one(void)
{
	static const char *reqs[] = {"GET /metrics HTTP/1.0\r\n", "POST /metrics HTTP/1.0\r\n\r\n",
				     "GET / HTTP/1.0\r\n\r\n", "GET /metrics/../x HTTP/1.1\r\nHost: x\r\n\r\n",
				     "GET /metrics HTTP/1.0\r\n\r\n", "\r\n\r\n", "GET\n\n"};
	static char big[9000];
	unsigned kind = (unsigned)below(5);
	int fd = raw_connect(o.metrics_port, 0);

	if (fd < 0)
		return;
	fig.metrics_conns++;
	if (kind == 1) {
		for (size_t j = 0; j < 64; j++)
			big[j] = (char)rnd();
		send(fd, big, 1 + below(64), MSG_NOSIGNAL | MSG_DONTWAIT);
	} else if (kind == 2) {
		memset(big, 'A', sizeof(big));
		send(fd, big, sizeof(big), MSG_NOSIGNAL | MSG_DONTWAIT);
	} else if (kind >= 3) {
		const char *r = reqs[below(7)];
		send(fd, r, strlen(r), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (kind == 4)
			raw_read(fd, below(4096), 10);
	}
	fig.inputs++;
	raw_keep_or_close(fd);
}

static void metrics_hostile(void)
{
	uint32_t n = 1 + (uint32_t)below(4) + (chance(3) ? 40 : 0); /* more than its 16 slots */

	for (uint32_t i = 0; i < n; i++)
		metrics_one();
}

/* GET /metrics answered with the page: 0, within 3 s of tries. */
static int metrics_get(void)
{
	static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
	static char buf[1 << 16];

	fig.metrics_gets++;
	for (int t = 0; t < 30; t++, usleep(100000)) {
		int fd = raw_connect(o.metrics_port, 0);
		size_t got = 0;
		uint64_t end = dcast_now_ms() + 2000;

		if (fd < 0 || send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) != (ssize_t)sizeof(req) - 1) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		got = read_until(fd, buf, sizeof(buf) - 1, 1, sizeof(buf) - 1, end);
		close(fd);
		buf[got] = 0;
		if (!strncmp(buf, "HTTP/1.0 200", 12) && strstr(buf, "deltacast_"))
			return 0;
	}
	return -1;
}

static void raw_close_all(void)
{
	while (n_raw)
		close(raw_fds[--n_raw]);
	n_offers = 0;
}

/* ---- hostile ZMTP connections (--curve 1) ---- */

/* The port of a "tcp://HOST:PORT" endpoint. */
static unsigned ep_port(const char *ep)
{
	const char *c = strrchr(ep, ':');

	return c ? (unsigned)strtoul(c + 1, NULL, 10) : 0;
}

/* A ZMTP 3.0 greeting (64 bytes) naming `mech`, as a client. */
static void zmtp_greeting(unsigned char g[64], const char *mech)
{
	memset(g, 0, 64);
	g[0] = 0xff;
	g[9] = 0x7f;
	g[10] = 3;
	memcpy(g + 12, mech, strlen(mech) < 20 ? strlen(mech) : 20);
}

/* After a CURVE greeting, a command: a HELLO of CURVE's size (200 bytes:
 * name, version, padding, a transient key, a nonce and a box, all of them
 * random past the name), or one of any size, now and then in the long
 * form, its size (big-endian) now and then larger than what follows. */
static size_t zmtp_command(unsigned char *b, size_t cap)
{
	size_t body = chance(50) ? 200 : 6 + below(cap - 16);
	uint64_t declared = chance(10) ? rnd() : body;

	for (size_t j = 0; j < cap; j++)
		b[j] = (unsigned char)rnd();
	if (chance(20)) {
		b[0] = 0x06;
		for (int j = 0; j < 8; j++)
			b[1 + j] = (unsigned char)(declared >> (8 * (7 - j)));
		memcpy(b + 9, "\x05HELLO", 6);
		return 9 + body;
	}
	body = body > 255 ? 255 : body;
	b[0] = 0x04;
	b[1] = (unsigned char)body;
	memcpy(b + 2, "\x05HELLO", 6);
	return 2 + body;
}

/* One hostile connection to a ZeroMQ port: silent, junk, a greeting cut
 * short, one with another mechanism, or a CURVE greeting and a command
 * (the ZMTP version now and then another); what the broker answers is
 * read for a moment; closed now or kept to the batch's end. */
static void zmtp_one(void)
{
	static const char *mechs[] = {"NULL", "PLAIN", "GSSAPI", "CURVEX", ""};
	static char reply[4096];
	unsigned char b[600];
	unsigned kind = (unsigned)below(5);
	size_t n = 0;
	int fd = raw_connect(ep_port(chance(50) ? o.prod_ep : o.cons_ep), 0);

	if (fd < 0)
		return;
	fig.zmtp_conns++;
	if (kind == 1) {
		n = 1 + below(64);
		for (size_t j = 0; j < n; j++)
			b[j] = (unsigned char)rnd();
	} else if (kind >= 2) {
		zmtp_greeting(b, kind == 3 ? mechs[below(5)] : "CURVE");
		n = kind == 2 ? 1 + below(63) : 64;
		if (kind == 4)
			n += zmtp_command(b + 64, sizeof(b) - 64);
		if (chance(10))
			b[10] = (unsigned char)below(4);
	}
	if (n && send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT) > 0)
		fig.inputs++;
	if (kind >= 2)
		read_until(fd, reply, sizeof(reply), 0, sizeof(reply), dcast_now_ms() + 10);
	raw_keep_or_close(fd);
}

static void zmtp_hostile(void)
{
	uint32_t n = 1 + (uint32_t)below(6) + (chance(3) ? 60 : 0);

	for (uint32_t i = 0; i < n; i++)
		zmtp_one();
}

/* The first broker reply the schema refused (its detail), "" if none. */
static char undecodable_why[160];

/* --curve 1: m came to st, and its key may not have it: any message to
 * a key refused at the handshake, a WELCOME to the fz0-only producer key
 * for another model. */
static int key_leaked(const struct stream *st, const dcast_msg *m)
{
	if (key_refused(st))
		return 1;
	return o.curve && !st->consumer && st->key == KEY_FZ0 && m->type == DCAST_MSG_WELCOME &&
	       strcmp(m->u.welcome.model, "fz0");
}

/* Read what arrived: WELCOME versions, ERROR codes; readers grant credit.
 * Every reply must decode: an ERROR quoting a peer's bytes raw did not. */
static void stream_read(struct stream *st)
{
	dcast_wire_in in;

	for (int k = 0; k < 256; k++) {
		int rc = dcast_wire_recv(st->sock, 0, &in, ZMQ_DONTWAIT);

		if (rc == DCAST_EBUSY) {
			dcast_wire_in_close(&in);
			return;
		}
		fig.replies++;
		if (!rc && key_leaked(st, &in.msg))
			fig.key_leaks++;
		if (rc && rc != DCAST_EZMQ && !fig.undecodable++)
			snprintf(undecodable_why, sizeof(undecodable_why), "%s", dcast_last_error());
		if (!rc && in.msg.type == DCAST_MSG_WELCOME) {
			st->welcomed = 1;
			st->welcome_version = in.msg.u.welcome.version;
		}
		if (!rc && in.msg.type == DCAST_MSG_BULK)
			offer_keep(in.msg.u.bulk.token);
		if (!rc && in.msg.type == DCAST_MSG_ERROR && in.msg.u.error.code < DCAST_ERR_COUNT)
			fig.errors[in.msg.u.error.code]++;
		if (!rc && in.msg.type == DCAST_MSG_CHUNK && st->reader) {
			struct fmsg cr;

			build_simple(&cr, DCAST_MSG_CREDIT, "", in.msg.u.chunk.payload_bytes + 1);
			msg_send(st->sock, &cr);
		}
		dcast_wire_in_close(&in);
	}
}

static void read_all(uint64_t ms)
{
	uint64_t end = dcast_now_ms() + ms;

	do {
		for (uint32_t i = 0; i < n_streams; i++)
			if (!streams[i].consumer || streams[i].reader || chance(10))
				stream_read(&streams[i]);
		usleep(2000);
	} while (dcast_now_ms() < end);
}

static void hellos(void)
{
	for (uint32_t i = 0; i < n_streams; i++) {
		msg_send(streams[i].sock, &streams[i].msg[0]);
		streams[i].next = 1;
	}
	for (uint64_t end = dcast_now_ms() + 300; dcast_now_ms() < end;) {
		int all = 1;

		read_all(5);
		for (uint32_t i = 0; i < n_streams; i++)
			all &= streams[i].welcomed || streams[i].consumer;
		if (all)
			break;
	}
}

static void conv_script(struct conv *c)
{
	uint64_t newest = c->part[0]->welcome_version;

	for (uint32_t p = 0; p < c->parts; p++) {
		struct stream *st = c->part[p];

		build_manifest(script_add(st), c);
		if (chance(10))
			build_simple(script_add(st), DCAST_MSG_HEARTBEAT, c->model, newest);
	}
	conv_versions(c, newest);
	for (uint32_t p = 0; p < c->parts; p++) {
		if (chance(5))
			build_simple(script_add(c->part[p]), DCAST_MSG_ACK, c->model, 1);
		if (chance(50))
			build_simple(script_add(c->part[p]), DCAST_MSG_BYE, c->model, 0);
		script_mutate(c->part[p]);
	}
}

/* A reconnect mid-version: a new socket says HELLO and MANIFEST again. */
static void stream_reconnect(struct stream *st)
{
	zmq_close(st->sock);
	st->sock = open_dealer(st->consumer, st->key);
	msg_send(st->sock, &st->msg[0]);
	if (st->n > 1 && st->msg[1].type == DCAST_MSG_MANIFEST)
		msg_send(st->sock, &st->msg[1]);
	fig.streams++;
}

/* Interleave every stream's script, a random stream at each step. */
static void play(void)
{
	uint32_t left = 0;

	for (uint32_t i = 0; i < n_streams; i++)
		left += streams[i].n - streams[i].next;
	while (left) {
		struct stream *st = &streams[below(n_streams)];

		if (st->next >= st->n)
			continue;
		if (st->next == st->reconnect_at)
			stream_reconnect(st);
		msg_send(st->sock, &st->msg[st->next++]);
		left--;
		if (chance(3))
			read_all(0);
	}
}

static void batch_run(uint64_t batch)
{
	rng = mix64(o.seed * 0x100000001b3ull ^ mix64(batch));
	n_streams = n_convs = 0;
	batch_plan();
	hellos();
	for (uint32_t i = 0; i < n_convs; i++)
		if (convs[i].parts)
			conv_script(&convs[i]);
	play();
	read_all(50 + below(100));
	if (o.bulk)
		bulk_hostile();
	if (o.metrics)
		metrics_hostile();
	if (o.curve)
		zmtp_hostile();
	if (o.bulk || o.metrics || o.curve) {
		read_all(20);
		raw_close_all();
	}
	for (uint32_t i = 0; i < n_streams; i++)
		stream_free(&streams[i]);
	for (uint32_t i = 0; i < n_convs; i++)
		conv_free(&convs[i]);
	fig.batches++;
}

/* ---- the broker process and its health ---- */

static pid_t spawn(char *const argv[], const char *log_path)
{
	pid_t pid = fork();

	if (pid == 0) {
		FILE *f = freopen(log_path, "a", stderr);

		(void)f;
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* a tool that dies leaves no broker behind */
		if (!freopen("/dev/null", "w", stdout))
			_exit(127);
		execv(argv[0], argv);
		_exit(127);
	}
	return pid;
}

/* How many lines of path hold s. */
static uint64_t lines_with(const char *path, const char *s)
{
	char line[4096];
	uint64_t n = 0;
	FILE *f = fopen(path, "r");

	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, s) != NULL;
	if (f)
		fclose(f);
	return n;
}

/* --curve 1: the keys the broker logged as refused. */
static uint64_t auth_refusals(void)
{
	char path[600];

	snprintf(path, sizeof(path), "%s/broker.log", o.dir);
	return lines_with(path, "auth: refused");
}

/* The last of the lines naming the endpoints asked for that the broker
 * logs as it starts (consumers, metrics, bulk: broker_open's order). */
static const char *start_line(void)
{
	return o.bulk ? "bulk anchors on" : o.metrics ? "metrics on http://" : "consumers on";
}

/* Started: this try's broker logged its last endpoint and still runs.  The
 * log gathers every try, so the line is counted past the ones before. */
static int broker_started(const char *log_path, uint64_t seen)
{
	return tp_wait_log(log_path, start_line(), (int)seen + 1, 5000) &&
	       waitpid(o.pid, NULL, WNOHANG) == 0;
}

static int broker_try(const char *bin, int port, const char *log_path)
{
	char data_dir[600], pkeys[600], ckeys[600];
	uint64_t seen;
	char *argv[40] = {(char *)bin, "--producers", o.prod_ep, "--consumers", o.cons_ep,
			  "--heartbeat-ms", "300", "--part-timeout-ms", "1500",
			  "--max-pending-bytes", "16777216", "--retain-bytes", "33554432",
			  "--retain-versions", "64", "--producer-window-bytes", "4194304",
			  "--max-producers", "1024", "--max-consumers", "1024"};
	int n = 0;

	while (argv[n]) /* after the entries above */
		n++;
	if (o.durable) {
		argv[n++] = "--data-dir";
		argv[n++] = data_dir;
	}
	if (o.bulk) {
		argv[n++] = "--bulk";
		argv[n++] = "127.0.0.1:0";
	}
	if (o.metrics) {
		argv[n++] = "--metrics";
		argv[n++] = "127.0.0.1:0";
	}
	if (o.curve) {
		argv[n++] = "--curve-secret";
		argv[n++] = key_file[KEY_SERVER];
		argv[n++] = "--producer-keys";
		argv[n++] = pkeys;
		argv[n++] = "--consumer-keys";
		argv[n++] = ckeys;
	}
	snprintf(pkeys, sizeof(pkeys), "%s/producer-keys", o.dir);
	snprintf(ckeys, sizeof(ckeys), "%s/consumer-keys", o.dir);

	snprintf(data_dir, sizeof(data_dir), "%s/data", o.dir);
	snprintf(o.prod_ep, sizeof(o.prod_ep), "tcp://127.0.0.1:%d", port);
	snprintf(o.cons_ep, sizeof(o.cons_ep), "tcp://127.0.0.1:%d", port + 1);
	seen = lines_with(log_path, start_line());
	o.pid = spawn(argv, log_path);
	if (broker_started(log_path, seen) &&
	    (!o.bulk || (o.bulk_port = (unsigned)tp_log_port(log_path, "bulk anchors on 127.0.0.1:"))) &&
	    (!o.metrics || (o.metrics_port = (unsigned)tp_log_port(log_path, "metrics on http://127.0.0.1:"))))
		return 0;
	kill(o.pid, SIGKILL);
	waitpid(o.pid, NULL, 0);
	return -1;
}

static void broker_start(void)
{
	char bin[512], log_path[600];

	snprintf(bin, sizeof(bin), "%s/deltacast-broker", o.build);
	snprintf(log_path, sizeof(log_path), "%s/broker.log", o.dir);
	for (int t = 0; t < 20; t++)
		if (!broker_try(bin, 10000 + (int)((getpid() * 13 + t * 7919 + rnd()) % 10000) * 2, log_path))
			return;
	fprintf(stderr, "fuzz_broker: the broker did not start (log %s)\n", log_path);
	exit(1);
}

/* 0 alive; else a line saying how it ended. */
static int broker_dead(char *why, size_t n)
{
	int st;

	if (o.attached) {
		snprintf(why, n, "process %d is gone", (int)o.pid);
		return kill(o.pid, 0) != 0;
	}
	if (waitpid(o.pid, &st, WNOHANG) != o.pid)
		return 0;
	if (WIFSIGNALED(st))
		snprintf(why, n, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
	else
		snprintf(why, n, "exited with status %d", WEXITSTATUS(st));
	return 1;
}

static uint64_t rss_kib(void)
{
	char path[64], line[256];
	unsigned long long kib = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)o.pid);
	if (!(f = fopen(path, "r")))
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %llu kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static int run_wait(char *const argv[], const char *log_path)
{
	pid_t pid = spawn(argv, log_path);
	int st = 0;

	if (pid < 0)
		return -1;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* --bulk 1: a fresh receiver takes "good" up to `ver` with x-bulk; its
 * anchor must come over the bulk port, whole (no "bulk failed", one more
 * transfer the broker logs as done: its bulk thread hands the transfer
 * back to the event loop, which logs it, maybe after the receiver
 * exited).  0 when it did. */
static int good_bulk_check(const char *bin, const char *ver)
{
	char log_path[600], broker_log[600];
	char *recv_argv[] = {(char *)bin, "receive", o.cons_ep, "good", "--until", (char *)ver, "--bulk", "1",
			     "--timeout-ms", "30000", NULL};
	uint64_t before;

	snprintf(log_path, sizeof(log_path), "%s/good_bulk.log", o.dir);
	snprintf(broker_log, sizeof(broker_log), "%s/broker.log", o.dir);
	unlink(log_path);
	before = lines_with(broker_log, "of good has version");
	if (run_wait(recv_argv, log_path) || tp_wait_log(log_path, "bulk failed", 1, 0))
		return -1;
	return tp_wait_log(broker_log, "of good has version", (int)before + 1, 5000) ? 0 : -1;
}

/* Every GOOD_ANCHOR_EVERY-th version of "good" goes as an anchor. */
#define GOOD_ANCHOR_EVERY 4

/* A consumer that kept "good" in a state file since the last check,
 * joined before the next version is published: at an anchor the broker
 * makes it a delta (docs/operations.md, "Producer anchors as deltas"),
 * under the fuzzed traffic.  Its pid, or -1. */
static pid_t good_held_start(char *const argv[], const char *log_path)
{
	char broker_log[600];
	int before;
	pid_t pid;

	snprintf(broker_log, sizeof(broker_log), "%s/broker.log", o.dir);
	before = (int)lines_with(broker_log, " of good joined");
	if ((pid = spawn(argv, log_path)) > 0)
		tp_wait_log(broker_log, " of good joined", before + 1, 5000); /* else it joins late */
	return pid;
}

static int good_wait(pid_t pid)
{
	int st = 0;

	if (pid < 0 || waitpid(pid, &st, 0) < 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A normal producer publishes the next version of "good" (every
 * GOOD_ANCHOR_EVERY-th as an anchor); the consumer that held the one
 * before, and then a fresh normal consumer, must receive it bit-exact
 * (and with --bulk 1 a receiver take it over bulk).  0 when all succeed. */
static int good_check(void)
{
	char bin[512], ver[32], log_path[600], state[600];
	char *prod[] = {bin, "produce", o.prod_ep, "good", "--versions", ver, "--elems", GOOD_ELEMS,
			"--chunk-elems", "2048", "--timeout-ms", "30000", NULL, NULL, NULL, NULL, NULL,
			NULL, NULL};
	char *cons[] = {bin, "consume", o.cons_ep, "good", "--until", ver, "--elems", GOOD_ELEMS,
			"--chunk-elems", "2048", "--timeout-ms", "30000", NULL, NULL, NULL, NULL, NULL,
			NULL, NULL};
	int n = 12, rc;
	pid_t held;

	if (o.curve) { /* --curve 1: the listed keys */
		prod[12] = cons[12] = "--server-key";
		prod[13] = cons[13] = key_pub[KEY_SERVER];
		prod[14] = cons[14] = "--secret";
		prod[15] = key_file[KEY_PROD];
		cons[15] = key_file[KEY_CONS];
		n = 16;
	}

	snprintf(bin, sizeof(bin), "%s/tools/wire_client", o.build);
	snprintf(ver, sizeof(ver), "%llu", (unsigned long long)++fig.good_version);
	snprintf(log_path, sizeof(log_path), "%s/good.log", o.dir);
	snprintf(state, sizeof(state), "%s/good.state", o.dir);
	fig.checks++;
	if (fig.good_version % GOOD_ANCHOR_EVERY == 0) {
		prod[n] = "--anchor-at";
		prod[n + 1] = ver;
	}
	cons[n] = "--state";
	cons[n + 1] = state;
	held = good_held_start(cons, log_path);
	cons[n] = NULL; /* the fresh one */
	rc = run_wait(prod, log_path);
	rc |= good_wait(held); /* waited for whatever the producer did */
	if (rc || run_wait(cons, log_path))
		return -1;
	return o.bulk ? good_bulk_check(bin, ver) : 0;
}

/* ---- main ---- */

static void fail_batch(uint64_t batch, const char *what)
{
	say("FAIL: %s after batch %llu (seed %llu)\n", what, (unsigned long long)batch,
	    (unsigned long long)o.seed);
	say("replay: fuzz_broker --seed %llu --batches %llu   (or --start-batch %llu --batches 1)\n",
	    (unsigned long long)o.seed, (unsigned long long)batch + 1, (unsigned long long)batch);
	say("broker log: %s/broker.log, good pair log: %s/good.log\n", o.dir, o.dir);
}

static int after_batch(uint64_t batch)
{
	char why[128], text[256];
	uint64_t kib;

	if (broker_dead(why, sizeof(why))) {
		snprintf(text, sizeof(text), "CRASH: the broker %s", why);
		fail_batch(batch, text);
		return -1;
	}
	if (fig.key_leaks) {
		snprintf(text, sizeof(text), "%llu messages reached a key the broker must refuse",
			 (unsigned long long)fig.key_leaks);
		fail_batch(batch, text);
		return -1;
	}
	if (fig.undecodable) {
		snprintf(text, sizeof(text), "%llu broker replies the schema refuses, the first: %s",
			 (unsigned long long)fig.undecodable, undecodable_why);
		fail_batch(batch, text);
		return -1;
	}
	kib = rss_kib();
	fig.rss_max_kib = kib > fig.rss_max_kib ? kib : fig.rss_max_kib;
	if ((batch + 1) % 100 == 0)
		say("batch %llu: broker VmRSS %.1f MiB, %llu inputs so far\n",
		    (unsigned long long)batch + 1, kib / 1024.0, (unsigned long long)fig.inputs);
	if (kib > o.rss_max_mib << 10) {
		snprintf(text, sizeof(text), "broker VmRSS %llu KiB over the bound of %llu MiB",
			 (unsigned long long)kib, (unsigned long long)o.rss_max_mib);
		fail_batch(batch, text);
		return -1;
	}
	if (o.metrics && metrics_get()) {
		fail_batch(batch, "GET /metrics was not answered with the page within 3 s");
		return -1;
	}
	if ((batch + 1) % o.check_every == 0 && good_check()) {
		snprintf(text, sizeof(text), "the good producer/consumer pair failed at version %llu",
			 (unsigned long long)fig.good_version);
		fail_batch(batch, broker_dead(why, sizeof(why)) ? why : text);
		return -1;
	}
	return 0;
}

/* The broker's made deltas (its log lines): the good pair's anchors. */
static uint64_t anchor_deltas(void)
{
	char path[600];

	snprintf(path, sizeof(path), "%s/broker.log", o.dir);
	return lines_with(path, " as a delta of ");
}

static void report(uint64_t secs)
{
	say("fuzz_broker: seed %llu, batches %llu, %llu s, connections %llu, inputs %llu "
	    "(%llu mutated, %llu not sent: pipe full), replies %llu (%llu undecodable), "
	    "good checks %llu\n",
	    (unsigned long long)o.seed, (unsigned long long)fig.batches, (unsigned long long)secs,
	    (unsigned long long)fig.streams, (unsigned long long)fig.inputs,
	    (unsigned long long)fig.mutated, (unsigned long long)fig.send_dropped,
	    (unsigned long long)fig.replies, (unsigned long long)fig.undecodable,
	    (unsigned long long)fig.checks);
	say("fuzz_broker: anchors of \"good\" made into deltas: %llu\n", (unsigned long long)anchor_deltas());
	if (o.bulk)
		say("fuzz_broker: bulk: %llu offers to fuzzed consumers, %llu raw connections, %llu bytes "
		    "read on them\n", (unsigned long long)fig.offers, (unsigned long long)fig.bulk_conns,
		    (unsigned long long)fig.bulk_bytes);
	if (o.metrics)
		say("fuzz_broker: metrics: %llu raw connections, %llu GETs answered\n",
		    (unsigned long long)fig.metrics_conns, (unsigned long long)fig.metrics_gets);
	if (o.curve)
		say("fuzz_broker: curve: keys drawn: prod %llu, prod-fz0 %llu, cons %llu, unlisted %llu, "
		    "wrong server key %llu; %llu raw ZMTP connections; the broker refused %llu keys\n",
		    (unsigned long long)fig.keys_drawn[KEY_PROD], (unsigned long long)fig.keys_drawn[KEY_FZ0],
		    (unsigned long long)fig.keys_drawn[KEY_CONS], (unsigned long long)fig.keys_drawn[KEY_UNLISTED],
		    (unsigned long long)fig.keys_drawn[KEY_SERVER], (unsigned long long)fig.zmtp_conns,
		    (unsigned long long)auth_refusals());
	say("fuzz_broker: VmRSS %.1f MiB at start, max %.1f MiB (bound %llu MiB)\n",
	    fig.rss_start_kib / 1024.0, fig.rss_max_kib / 1024.0, (unsigned long long)o.rss_max_mib);
	say("fuzz_broker: ERRORs received by code:");
	for (int c = 1; c < DCAST_ERR_COUNT; c++)
		if (fig.errors[c])
			say(" %s %llu", dcast_errname(c), (unsigned long long)fig.errors[c]);
	say("\n");
}

static uint64_t num(const char *s)
{
	char *e;
	unsigned long long v = strtoull(s, &e, 10);

	if (!*s || *e) {
		fprintf(stderr, "fuzz_broker: not a number: %s\n", s);
		exit(2);
	}
	return v;
}

static void parse(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *k = argv[i];

		if (i + 1 >= argc) {
			fprintf(stderr, "fuzz_broker: %s needs a value\n", k);
			exit(2);
		}
		if (!strcmp(k, "--seed")) o.seed = num(argv[++i]);
		else if (!strcmp(k, "--batches")) o.batches = num(argv[++i]);
		else if (!strcmp(k, "--seconds")) o.seconds = num(argv[++i]);
		else if (!strcmp(k, "--start-batch")) o.start_batch = num(argv[++i]);
		else if (!strcmp(k, "--rss-max-mib")) o.rss_max_mib = num(argv[++i]);
		else if (!strcmp(k, "--check-every")) o.check_every = num(argv[++i]) ? num(argv[i]) : 1;
		else if (!strcmp(k, "--dir")) o.dir = argv[++i];
		else if (!strcmp(k, "--durable")) o.durable = num(argv[++i]);
		else if (!strcmp(k, "--bulk")) o.bulk = num(argv[++i]);
		else if (!strcmp(k, "--metrics")) o.metrics = num(argv[++i]);
		else if (!strcmp(k, "--curve")) o.curve = num(argv[++i]);
		else if (!strcmp(k, "--attach") && i + 3 < argc) {
			o.attached = 1;
			o.pid = (pid_t)num(argv[++i]);
			snprintf(o.prod_ep, sizeof(o.prod_ep), "%s", argv[++i]);
			snprintf(o.cons_ep, sizeof(o.cons_ep), "%s", argv[++i]);
		} else {
			fprintf(stderr, "fuzz_broker: unknown option %s (see the comment at the top "
				"of tests/tools/fuzz_broker.c)\n", k);
			exit(2);
		}
	}
	if (o.curve && (o.bulk || o.attached)) {
		fprintf(stderr, "fuzz_broker: --curve 1 goes with neither --bulk 1 (the broker refuses "
			"--bulk with CURVE) nor --attach\n");
		exit(2);
	}
}

static int dir_made; /* o.dir is ours (mkdtemp): removed after a run that passed */

static void dir_remove(void)
{
	char cmd[700];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", o.dir);
	if (system(cmd) != 0)
		say("fuzz_broker: could not remove %s\n", o.dir);
}

static void setup(void)
{
	static char dir[] = "/tmp/fuzz-broker.XXXXXX";

	memset(long_a, 'a', sizeof(long_a));
	signal(SIGPIPE, SIG_IGN);
	if (!(o.build = getenv("DELTACAST_BUILD")))
		o.build = "build";
	dir_made = !o.dir;
	if (!o.dir && !(o.dir = mkdtemp(dir))) {
		fprintf(stderr, "fuzz_broker: mkdtemp: %s\n", strerror(errno));
		exit(1);
	}
	mkdir(o.dir, 0755);
	rng = mix64(o.seed);
	if (o.curve)
		keys_make();
	if (!o.attached)
		broker_start();
	g_ctx = zmq_ctx_new();
}

int main(int argc, char **argv)
{
	uint64_t t0, batch;
	int rc = 0;

	parse(argc, argv);
	setup();
	say("fuzz_broker: seed %llu, broker pid %d on %s / %s, files in %s\n",
	    (unsigned long long)o.seed, (int)o.pid, o.prod_ep, o.cons_ep, o.dir);
	fig.rss_start_kib = rss_kib();
	if (good_check()) {
		fail_batch(0, "the good pair failed before any fuzzing");
		return 1;
	}
	t0 = dcast_now_ms();
	for (batch = o.start_batch; !rc && batch - o.start_batch < o.batches &&
	     dcast_now_ms() - t0 < o.seconds * 1000; batch++) {
		batch_run(batch);
		rc = after_batch(batch);
	}
	report((dcast_now_ms() - t0) / 1000);
	zmq_ctx_term(g_ctx);
	if (!o.attached && !rc) {
		int st = 0;

		kill(o.pid, SIGTERM);
		waitpid(o.pid, &st, 0);
		rc = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		if (rc)
			say("FAIL: the broker did not stop cleanly on SIGTERM\n");
	}
	if (!o.attached && rc)
		kill(o.pid, SIGKILL);
	say("fuzz_broker: %s\n", rc ? "FAILED" : "ok, no crash");
	if (!rc && dir_made)
		dir_remove();
	return rc ? 1 : 0;
}
