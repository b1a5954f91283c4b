/* test_faults_zmtp: a consumer gets back to the stream after what a damaged
 * connection does to it (the fault suite's proxy trials that never
 * converged: seeds 5022, 5028, 5044).  A real broker and producer; between
 * the broker and the consumer a proxy thread that works on ZMTP frames
 * (tests/tools/fault_zmtp.h), each phase with its own consumer:
 *   A. the first MANIFEST arrives damaged (its type no longer decodes): the
 *      consumer joins again instead of ignoring every CHUNK after it;
 *   B. the first MANIFEST arrives with one bit of a tensor name flipped
 *      ("layers.0.w" -> "layers/0.w", still a valid name: seed 53165):
 *      its sum refuses it, the consumer joins again and binds the real
 *      names;
 *   C. every CREDIT of the first join is damaged into a grant of 1 byte: the
 *      broker runs out of credit mid-anchor; the consumer sees the broker
 *      has a version it lacks, nothing coming, and joins again;
 *   D. a frame header ZeroMQ refuses (a size over ZMQ_MAXMSGSIZE) between
 *      two messages: libzmq ends that connection for good (no reconnect
 *      after a protocol error), so the consumer must open a new socket to
 *      get version 2.
 * Each phase ends bit-exact; a regression hangs or times out (alarm). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include "check.h"
#include "consumer_harness.h"
#include "tools/fault_zmtp.h"

#define PX_CONNS 8

typedef struct pconn {
	int fd[2];     /* 0: consumer side, 1: broker side; -1 unused */
	fz_dir *d[2];  /* bytes read from side s */
	int poisoned;  /* broker -> consumer closed by the poison frame */
	int hellos;    /* HELLOs the consumer sent on it */
} pconn;

static struct {
	int lfd, target;
	pconn c[PX_CONNS];
	atomic_int stop, mangle_manifest, flip_name, mangle_credit, poison;
	atomic_int accepted, manifests_mangled, names_flipped, credits_mangled, poisoned;
} px;

static int px_socket(int port, int listening)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0)
		return -1;
	if (listening ? bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 8)
		      : connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		close(fd);
		return -1;
	}
	return fd;
}

static int px_port(int fd)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);

	return getsockname(fd, (struct sockaddr *)&a, &len) ? -1 : ntohs(a.sin_port);
}

static void px_close(pconn *p)
{
	for (int s = 0; s < 2; s++) {
		if (p->fd[s] >= 0)
			close(p->fd[s]);
		free(p->d[s]);
	}
	*p = (pconn){.fd = {-1, -1}};
}

static void px_accept(void)
{
	int c = accept4(px.lfd, NULL, NULL, SOCK_CLOEXEC);

	for (int i = 0; c >= 0 && i < PX_CONNS; i++) {
		if (px.c[i].fd[0] >= 0)
			continue;
		px.c[i] = (pconn){.fd = {c, px_socket(px.target, 0)},
				  .d = {malloc(sizeof(fz_dir)), malloc(sizeof(fz_dir))}};
		fz_init(px.c[i].d[0]);
		fz_init(px.c[i].d[1]);
		px.accepted++;
		return;
	}
	if (c >= 0)
		close(c);
}

static int write_all(int fd, const unsigned char *b, size_t n)
{
	while (n) {
		ssize_t w = write(fd, b, n);
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

/* A CREDIT's "bytes" value, whatever its msgpack width, becomes 1. */
static void credit_to_one(unsigned char *q)
{
	if (*q < 0x80) {
		*q = 1;
	} else if (*q >= 0xcc && *q <= 0xcf) {
		size_t w = (size_t)1 << (*q - 0xcc);
		memset(q + 1, 0, w);
		q[w] = 1;
	}
}

/* The damage of phases A, B and C, on a message's header frame. */
static void px_mangle(pconn *p, int s, fz_item *it)
{
	unsigned char *q;

	if (!it->first || it->kind != FZ_FRAME)
		return;
	if (s == 0 && fz_find(it, "\xa5HELLO", 6))
		p->hellos++;
	if (s == 1 && px.mangle_manifest > 0 && (q = fz_find(it, "\xa8MANIFEST", 9))) {
		q[8] = 'X'; /* type "MANIFESX": the message does not decode */
		px.mangle_manifest--;
		px.manifests_mangled++;
	}
	if (s == 1 && px.flip_name > 0 && fz_find(it, "\xa8MANIFEST", 9) &&
	    (q = fz_find(it, "\xaalayers.0.w", 11))) {
		q[7] ^= 1; /* '.' -> '/' */
		px.flip_name--;
		px.names_flipped++;
	}
	if (s == 0 && px.mangle_credit && p->hellos == 1 && fz_find(it, "\xa6" "CREDIT", 7) &&
	    (q = fz_find(it, "\xa5" "bytes", 6))) {
		credit_to_one(q + 6);
		px.credits_mangled++;
	}
}

/* Read from side s, forward whole frames to the other side. */
static int px_forward(pconn *p, int s)
{
	fz_dir *d = p->d[s];
	ssize_t n = read(p->fd[s], d->buf + d->len, FZ_BUF - d->len);
	fz_item it;

	if (n <= 0)
		return -1;
	d->len += (size_t)n;
	while (fz_next(d, &it)) {
		px_mangle(p, s, &it);
		if (!(s == 1 && p->poisoned) && write_all(p->fd[!s], it.p, it.n))
			return -1;
		fz_take(d, &it);
	}
	return 0;
}

/* Phase D: a frame of 2^62 bytes, between two messages of the broker's. */
static void px_poison(void)
{
	static const unsigned char frame[9] = {FZ_LONG, 0x40, 0, 0, 0, 0, 0, 0, 0};

	for (int i = 0; px.poison && i < PX_CONNS; i++) {
		pconn *p = &px.c[i];
		if (p->fd[0] < 0 || p->poisoned || !p->d[1]->msgs || !fz_at_boundary(p->d[1]))
			continue;
		if (write_all(p->fd[0], frame, sizeof(frame)))
			continue;
		p->poisoned = 1;
		px.poison = 0;
		px.poisoned++;
	}
}

static void *px_main(void *arg)
{
	struct pollfd pf[1 + 2 * PX_CONNS];

	(void)arg;
	while (!px.stop) {
		pf[0] = (struct pollfd){.fd = px.lfd, .events = POLLIN};
		for (int i = 0; i < PX_CONNS; i++)
			for (int s = 0; s < 2; s++)
				pf[1 + 2 * i + s] = (struct pollfd){.fd = px.c[i].fd[s], .events = POLLIN};
		poll(pf, 1 + 2 * PX_CONNS, 20);
		if (pf[0].revents)
			px_accept();
		for (int i = 0; i < PX_CONNS; i++)
			for (int s = 0; s < 2; s++)
				if (px.c[i].fd[s] >= 0 && pf[1 + 2 * i + s].revents && px_forward(&px.c[i], s))
					px_close(&px.c[i]);
		px_poison();
	}
	for (int i = 0; i < PX_CONNS; i++)
		px_close(&px.c[i]);
	return NULL;
}

static void on_alarm(int sig)
{
	(void)sig;
	static const char msg[] = "test_faults_zmtp: timed out: a consumer never got back to the stream\n";
	if (write(2, msg, sizeof(msg) - 1) < 0)
		_exit(2);
	_exit(1);
}

static char root[] = "/tmp/dcast-faults-zmtp-XXXXXX";

/* A consumer through the proxy in root/NAME, driven to version v. */
static void follow(const char *name, uint64_t budget, const h_model *m, uint64_t v, dcast_consumer **out)
{
	char ep[64], dir[128];
	dcast_consumer_opts o;
	h_seen seen = {0};

	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", px_port(px.lfd));
	snprintf(dir, sizeof(dir), "%s/%s", root, name);
	dcast_consumer_opts_init(&o);
	o.client = name;
	REQUIRE(dcast_consumer_open(ep, "m", dir, budget, &o, out) == 0);
	CHECK(h_drive(*out, m, v, &seen) == 0);
	CHECK(h_equal(*out, m, v));
	CHECK(seen.untouched_bad == 0);
}

int main(void)
{
	char *flags[] = {"--heartbeat-ms", "300", NULL};
	dcast_consumer *a = NULL, *b = NULL;
	dcast_producer *p = NULL;
	pthread_t th;
	h_broker br;
	h_model m;
	int port;

	signal(SIGALRM, on_alarm);
	signal(SIGPIPE, SIG_IGN);
	alarm(120);
	REQUIRE(mkdtemp(root));
	REQUIRE(h_broker_start_args(&br, flags) == 0);
	h_model_init(&m, 7, 1);
	REQUIRE(h_producer_open(&br, "m", &m, &p) == 0);
	REQUIRE(h_publish(p, &m, 1, 100) == 0);
	sscanf(strrchr(br.consumers, ':') + 1, "%d", &port);
	px.target = port;
	for (int i = 0; i < PX_CONNS; i++)
		px.c[i] = (pconn){.fd = {-1, -1}};
	REQUIRE((px.lfd = px_socket(0, 1)) >= 0);
	REQUIRE(pthread_create(&th, NULL, px_main, NULL) == 0);

	px.mangle_manifest = 1; /* A */
	follow("a", 16u << 20, &m, 1, &a);
	CHECK(px.manifests_mangled == 1);
	dcast_consumer_close(&a);

	px.flip_name = 1; /* B */
	follow("b0", 16u << 20, &m, 1, &a);
	CHECK(px.names_flipped == 1);
	dcast_consumer_close(&a);

	px.mangle_credit = 1; /* C: window 512 KiB, anchor 1.3 MB */
	follow("b", 2u << 20, &m, 1, &b);
	CHECK(px.credits_mangled > 0);
	px.mangle_credit = 0;

	int before = px.accepted; /* D */
	px.poison = 1;
	for (int i = 0; i < 100 && !px.poisoned; i++) {
		dcast_event ev;
		dcast_consumer_poll(b, 50, &ev);
	}
	REQUIRE(px.poisoned == 1);
	REQUIRE(h_publish(p, &m, 2, 100) == 0);
	h_seen seen = {0};
	CHECK(h_drive(b, &m, 2, &seen) == 0);
	CHECK(h_equal(b, &m, 2));
	CHECK(px.accepted > before); /* a new socket, a new connection */
	dcast_consumer_close(&b);

	px.stop = 1;
	pthread_join(th, NULL);
	close(px.lfd);
	dcast_producer_close(&p);
	h_broker_stop(&br);
	h_model_free(&m);
	check_remove_dir(root);
	return check_done("test_faults_zmtp");
}
