/* faultproxy: a loopback TCP proxy for the fault suite.  Accepts on
 * 127.0.0.1:LISTEN, connects each client to 127.0.0.1:TARGET, and forwards
 * both ways whole ZMTP frames (tests/tools/fault_zmtp.h; a frame too big
 * for its 64 KiB buffer goes through in pieces).  Per read (at most 64 KiB),
 * with the per-mille rates given and a PRNG seeded by SEED (the same seed
 * draws the same decisions), it:
 *   drop       closes both sides of the connection before forwarding
 *   delay      sleeps 1..50 ms before forwarding
 *   corrupt    flips one random bit of what was read (after the 64-byte
 *              ZMTP greeting; the frame parser sees the damage too)
 *   truncate   forwards a random prefix of the next frame, then closes both sides
 *   duplicate  sends the next whole message (all its frames) twice
 *   swap       sends the next two whole messages in the other order: the
 *              first is held while the rest of the second is on its way
 *              (some of it read, both fit the buffer); else a later pair
 * Each fault is one stderr line "fault KIND conn N at byte B".  SIGUSR1 stops
 * injecting (clean forwarding from then on); SIGUSR2 holds what the broker
 * side sends (left unread in the sockets from then on, the line "holding
 * what the broker sends" once it is so); SIGTERM exits 0.
 * usage: faultproxy LISTEN TARGET SEED DROP DELAY TRUNCATE CORRUPT [DUPLICATE [SWAP]]
 * (a rate of 0 draws nothing: a seed replays as it did before that fault). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include "fault_zmtp.h"

#define MAX_PAIRS 64

typedef struct pair {
	int fd[2];          /* 0: client side, 1: broker side; -1 when unused */
	uint64_t moved[2];  /* bytes read from each side */
	unsigned id;
	fz_dir d[2];        /* frames read from each side */
	int swap_due[2];    /* a swap drawn, not done yet */
} pair;

static pair pairs[MAX_PAIRS];
static volatile sig_atomic_t quiet, stop, hold;
static uint64_t rng;
static unsigned rate_drop, rate_delay, rate_trunc, rate_corrupt, rate_dup, rate_swap;

static void on_usr1(int s) { (void)s; quiet = 1; }
static void on_term(int s) { (void)s; stop = 1; }
static void on_usr2(int s) { (void)s; hold = 1; }

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static int chance(unsigned per_mille)
{
	return !quiet && per_mille && next_rand() % 1000 < per_mille;
}

static int tcp_socket(int port, int listening)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0)
		return -1;
	setsockopt(fd, listening ? SOL_SOCKET : IPPROTO_TCP, listening ? SO_REUSEADDR : TCP_NODELAY,
		   &one, sizeof(one));
	if (listening ? bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 64)
		      : connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		close(fd);
		return -1;
	}
	return fd;
}

static void pair_close(pair *p)
{
	for (int s = 0; s < 2; s++)
		if (p->fd[s] >= 0)
			close(p->fd[s]);
	p->fd[0] = p->fd[1] = -1;
	p->swap_due[0] = p->swap_due[1] = 0;
}

/* Writes block the single-threaded proxy: a peer that stops reading for
 * 2 s loses its connection (logged as a stall) instead of stalling all. */
static void send_timeout(int fd)
{
	struct timeval tv = {2, 0};
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static void accept_one(int lfd, int target, unsigned *next_id)
{
	int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC), b;

	if (c < 0)
		return;
	send_timeout(c);
	for (int i = 0; i < MAX_PAIRS; i++) {
		if (pairs[i].fd[0] >= 0)
			continue;
		if ((b = tcp_socket(target, 0)) < 0)
			break; /* broker down: the client sees a closed connection */
		send_timeout(b);
		pairs[i].fd[0] = c;
		pairs[i].fd[1] = b;
		pairs[i].moved[0] = pairs[i].moved[1] = 0;
		pairs[i].id = (*next_id)++;
		fz_init(&pairs[i].d[0]);
		fz_init(&pairs[i].d[1]);
		return;
	}
	close(c);
}

static void fault(const char *kind, const pair *p, int side)
{
	fprintf(stderr, "fault %s conn %u at byte %llu\n", kind, p->id,
		(unsigned long long)p->moved[side]);
}

static int write_all(int fd, const unsigned char *b, size_t n)
{
	for (int guard = 0; n && guard < 100000; guard++) {
		ssize_t w = write(fd, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return n ? -1 : 0;
}

static int stalled(const pair *p)
{
	fprintf(stderr, "stall conn %u: peer not reading, closed\n", p->id);
	return -1;
}

/* The items that make up the first len bytes of d's buffer, passed. */
static void skip(fz_dir *d, size_t len)
{
	fz_item it;

	for (size_t done = 0; done < len && fz_next(d, &it); done += it.n)
		fz_take(d, &it);
}

/* Send the whole message at the buffer's start twice and pass it. */
static int duplicate(pair *p, int s, size_t len)
{
	fz_dir *d = &p->d[s];

	fault("duplicate", p, s);
	if (write_all(p->fd[!s], d->buf, len) || write_all(p->fd[!s], d->buf, len))
		return stalled(p);
	skip(d, len);
	return 0;
}

/* Send the two whole messages at the buffer's start, of first and second
 * bytes, in the other order, and pass them. */
static int swap(pair *p, int s, size_t first, size_t second)
{
	fz_dir *d = &p->d[s];

	fault("swap", p, s);
	if (write_all(p->fd[!s], d->buf + first, second) || write_all(p->fd[!s], d->buf, first))
		return stalled(p);
	skip(d, first + second);
	return 0;
}

/* A swap drawn for side s, whose whole message at the buffer's start is
 * `whole` bytes: done (1), the first held for the rest of the second (-1:
 * emit stops, the next read brings it), or not now (0: forward as usual,
 * the swap waits for a later pair). */
static int swap_step(pair *p, int s, size_t whole, int *err)
{
	fz_dir *d = &p->d[s];
	size_t next = fz_message_len_at(d, whole);

	if (next) {
		p->swap_due[s] = 0;
		*err = swap(p, s, whole, next);
		return 1;
	}
	return d->len > whole && d->len < FZ_BUF ? -1 : 0;
}

/* Forward every whole item read from side s, with the truncation,
 * duplication or swap drawn for this read; 0, or -1 to close the pair. */
static int emit(pair *p, int s, int trunc, int dup)
{
	fz_dir *d = &p->d[s];
	fz_item it;
	int err = 0, st;

	while (fz_next(d, &it)) {
		int swp = p->swap_due[s] && !quiet;
		size_t whole = (dup || swp) && it.first ? fz_message_len(d) : 0;

		if (whole && swp && (st = swap_step(p, s, whole, &err))) {
			if (st < 0 || err)
				return err ? -1 : 0;
			continue;
		}
		if (whole && dup) {
			if (duplicate(p, s, whole))
				return -1;
			dup = 0;
			continue;
		}
		if (trunc) {
			fault("truncate", p, s);
			write_all(p->fd[!s], it.p, next_rand() % it.n);
			return -1;
		}
		if (write_all(p->fd[!s], it.p, it.n))
			return stalled(p);
		fz_take(d, &it);
	}
	return 0;
}

/* Flip one bit of the n bytes just read (not in the greeting). */
static void corrupt(pair *p, int s, size_t n)
{
	uint64_t before = p->moved[s] - n;
	uint64_t lo = before < FZ_GREETING ? FZ_GREETING - before : 0;
	uint64_t at = lo + next_rand() % ((uint64_t)n - lo);

	p->d[s].buf[p->d[s].len + at] ^= (unsigned char)(1u << (next_rand() % 8));
	fault("corrupt", p, s);
}

/* Read what side s has (into its frame buffer) and move it on; 0, or -1 to
 * close the pair. */
static int forward(pair *p, int s)
{
	fz_dir *d = &p->d[s];
	ssize_t n = read(p->fd[s], d->buf + d->len, FZ_BUF - d->len);
	int trunc, dup;

	if (n <= 0)
		return n < 0 && errno == EINTR ? 0 : -1;
	p->moved[s] += (uint64_t)n;
	if (chance(rate_drop))
		return fault("drop", p, s), -1;
	if (chance(rate_delay)) {
		struct timespec ts = {0, (long)(1 + next_rand() % 50) * 1000000L};
		fault("delay", p, s);
		nanosleep(&ts, NULL);
	}
	if (p->moved[s] > FZ_GREETING && chance(rate_corrupt))
		corrupt(p, s, (size_t)n);
	d->len += (size_t)n;
	trunc = chance(rate_trunc); /* drawn in this order: replays stay the same */
	dup = chance(rate_dup);
	if (rate_swap && chance(rate_swap))
		p->swap_due[s] = 1;
	return emit(p, s, trunc, dup);
}

static void serve(int lfd, int target)
{
	struct pollfd pf[1 + 2 * MAX_PAIRS];
	unsigned next_id = 0;

	while (!stop) {
		int n = 1;
		if (hold == 1) { /* from here on nothing more is read from a broker */
			hold = 2;
			fprintf(stderr, "faultproxy: holding what the broker sends\n");
		}
		pf[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
		for (int i = 0; i < MAX_PAIRS; i++)
			for (int s = 0; s < 2; s++)
				pf[n++] = (struct pollfd){.fd = pairs[i].fd[s], .events = s && hold ? 0 : POLLIN};
		if (poll(pf, (nfds_t)n, 200) <= 0)
			continue;
		if (pf[0].revents)
			accept_one(lfd, target, &next_id);
		for (int i = 0; i < MAX_PAIRS; i++)
			for (int s = 0; s < 2; s++)
				if (pairs[i].fd[s] >= 0 && pf[1 + 2 * i + s].revents && !(s && hold) &&
				    forward(&pairs[i], s))
					pair_close(&pairs[i]);
	}
}

int main(int argc, char **argv)
{
	int lfd;

	if (argc < 8 || argc > 10) {
		fprintf(stderr, "usage: faultproxy LISTEN TARGET SEED DROP DELAY TRUNCATE CORRUPT"
				" [DUPLICATE [SWAP]] (rates per mille of reads)\n");
		return 2;
	}
	rng = strtoull(argv[3], NULL, 10) * 0x9E3779B97F4A7C15ull + 1;
	rate_drop = (unsigned)atoi(argv[4]);
	rate_delay = (unsigned)atoi(argv[5]);
	rate_trunc = (unsigned)atoi(argv[6]);
	rate_corrupt = (unsigned)atoi(argv[7]);
	rate_dup = argc >= 9 ? (unsigned)atoi(argv[8]) : 0;
	rate_swap = argc == 10 ? (unsigned)atoi(argv[9]) : 0;
	for (int i = 0; i < MAX_PAIRS; i++)
		pairs[i].fd[0] = pairs[i].fd[1] = -1;
	signal(SIGPIPE, SIG_IGN);
	signal(SIGUSR1, on_usr1);
	signal(SIGUSR2, on_usr2);
	signal(SIGTERM, on_term);
	if ((lfd = tcp_socket(atoi(argv[1]), 1)) < 0) {
		fprintf(stderr, "faultproxy: cannot listen on 127.0.0.1:%s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	fprintf(stderr, "faultproxy: listening on %s, forwarding to %s\n", argv[1], argv[2]);
	serve(lfd, atoi(argv[2]));
	for (int i = 0; i < MAX_PAIRS; i++)
		pair_close(&pairs[i]);
	close(lfd);
	return 0;
}
