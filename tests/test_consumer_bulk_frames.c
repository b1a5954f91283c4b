/* The consumer's side of an anchor over a bulk connection (docs/protocol.md,
 * "Bulk anchors") against a broker played by this test: a ROUTER socket
 * speaking the wire format, and a TCP listener speaking the bulk framing.
 * - With the default options on a tcp:// endpoint the consumer's HELLO
 *   says x-bulk.  On BULK(7) it connects to the listener, opens with
 *   "DCB1", 4 zero bytes and the token (u64 LE), takes anchor 7's CHUNK
 *   and COMMIT frames: READY, applied bit-exact, stats.bulk_versions 1.
 *   It grants no CREDIT for those bytes (they were never in the ZeroMQ
 *   window), and exactly anchor 8's bytes when 8 comes over ZeroMQ after.
 *   A fresh consumer reads the anchor's payload straight into the tensor
 *   (stats.bulk_in_place_bytes).
 * - A whole bind while a frame's payload is half read into the tensor:
 *   the transfer ends (the connection closed, no failure counted), the
 *   consumer re-joins asking for bulk again, and the anchor offered anew
 *   comes through a buffer into the caller's memory, bit-exact.
 * - An endpoint naming its host (tcp://localhost:PORT): the name is
 *   resolved at open, and the anchor comes over bulk all the same.
 * - On BULK(9), a frame of version 10 fails the transfer:
 *   stats.bulk_failures 1, and the re-join's HELLO has no x-bulk; as does
 *   a BULK naming a port where nothing listens (connect refused), one
 *   naming a port that never answers (given up after
 *   DCAST_BULK_CONNECT_MS, not the transfer's 30 s), and a
 *   frame whose header does not decode, at once, before its payload.
 * - A fresh consumer that reads a CHUNK with one payload bit flipped into
 *   its tensor (hashed as it lands) refuses it: no READY, a re-join; the
 *   anchor sent again over ZeroMQ is applied bit-exact.
 * - DELTACAST_BULK=0 at open: no x-bulk; DELTACAST_BULK=2: open refused,
 *   naming the variable.
 * - The broker's unix socket (@deltacast-bulk-PORT, played here beside the
 *   TCP listener): a fresh consumer on a loopback endpoint connects there,
 *   not to the TCP port, and takes a CHUNK whose payload is a reference to
 *   a file passed with it (SCM_RIGHTS) at an offset: READY, bit-exact, read
 *   into the tensor; and one whose payload follows its reference inline.
 *   A reference with no file passed, or one past the file's end, fails the
 *   transfer: nothing READY, and the re-join asks for no bulk. */
#include <arpa/inet.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include "check.h"
#include "dcast_bulkrx.h"
#include "chunk_fit_cases.h"
#include "dcast_bytes.h"
#include "dcast_wire.h"
#include "deltacast/consumer.h"
#include "router_peer.h"

#define N CFC_ELEMS
#define MODEL "bulkf"
#define TOKEN 0x0123456789abcdefull

static void *router, *ctx;
static zmq_msg_t rid;

static void send_to(dcast_msg *m, const void *payload, size_t len)
{
	rp_send(router, &rid, m, payload, len);
}

/* The next message from the consumer of `type` (others passed over, each
 * CREDIT's bytes added to *credit when not NULL), its routing id kept; 0
 * when none came within the router's receive timeout. */
static int recv_type(uint32_t type, dcast_msg *out, uint64_t *credit)
{
	dcast_wire_in in;

	for (;;) {
		if (dcast_wire_recv(router, 1, &in, 0)) {
			dcast_wire_in_close(&in);
			return 0;
		}
		if (in.msg.type == DCAST_MSG_CREDIT && credit)
			*credit += in.msg.u.credit.bytes;
		if (in.msg.type == type)
			break;
		dcast_wire_in_close(&in);
	}
	zmq_msg_close(&rid);
	zmq_msg_init(&rid);
	zmq_msg_copy(&rid, &in.rid);
	*out = in.msg;
	memset(&in.msg, 0, sizeof(in.msg));
	dcast_wire_in_close(&in);
	return 1;
}

/* The consumer's HELLO (returned): answered with WELCOME and MANIFEST. */
static dcast_hello welcome(void)
{
	dcast_msg h;

	REQUIRE(recv_type(DCAST_MSG_HELLO, &h, NULL));
	rp_welcome(router, &rid, MODEL);
	return h.u.hello;
}

static void write_all(int fd, const void *p, size_t n)
{
	REQUIRE(write(fd, p, n) == (ssize_t)n);
}

/* One bulk frame: the prefix, m's header, the payload. */
static void frame(int fd, const dcast_msg *m, const void *payload, uint64_t len)
{
	unsigned char prefix[12];
	void *hdr;
	size_t hlen;

	REQUIRE(dcast_msg_encode(m, &hdr, &hlen) == 0);
	dcast_put_le32(prefix, (uint32_t)hlen);
	dcast_put_le64(prefix + 4, len);
	write_all(fd, prefix, sizeof(prefix));
	write_all(fd, hdr, hlen);
	if (len)
		write_all(fd, payload, len);
	free(hdr);
}

/* A loopback listener on a port it picks, with this accept backlog. */
static int listener_of(uint32_t *port, int backlog)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, backlog) == 0);
	REQUIRE(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
	*port = ntohs(a.sin_port);
	return fd;
}

static int listener(uint32_t *port)
{
	return listener_of(port, 4);
}

/* BULK(version) naming `port` to the consumer. */
static void bulk_send(uint32_t port, uint64_t version)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_BULK);
	strcpy(m.u.bulk.model, MODEL);
	m.u.bulk.version = version, m.u.bulk.port = port, m.u.bulk.token = TOKEN;
	m.u.bulk.chunks = 1, m.u.bulk.bytes = N * 2;
	send_to(&m, NULL, 0);
}

/* BULK(version) to the consumer; its connection to the listener accepted
 * and its opening checked.  -1 when it never connected. */
static int bulk_offer(int lfd, uint32_t port, uint64_t version)
{
	struct pollfd p = {lfd, POLLIN, 0};
	unsigned char opening[16], want[16] = "DCB1";
	int fd;

	bulk_send(port, version);
	if (poll(&p, 1, 10000) != 1)
		return -1;
	REQUIRE((fd = accept(lfd, NULL, NULL)) >= 0);
	REQUIRE(recv(fd, opening, sizeof(opening), MSG_WAITALL) == sizeof(opening));
	dcast_put_le64(want + 8, TOKEN);
	CHECK(!memcmp(opening, want, sizeof(want)));
	return fd;
}

/* The next event of type `type` within 10 s, into *ev. */
static int event(dcast_consumer *c, int type, dcast_event *ev)
{
	for (int i = 0; i < 100; i++)
		if (dcast_consumer_poll(c, 100, ev) == 0 && ev->type == type)
			return 1;
	return 0;
}

/* Anchor 7 over the bulk connection, then anchor 8 over ZeroMQ: only
 * 8's bytes come back as CREDIT. */
static void bulk_anchor(dcast_consumer *c, int lfd, uint32_t port)
{
	uint16_t w7[N], w8[N];
	dcast_msg chunk, commit, m;
	dcast_range_digest d;
	dcast_consumer_stats st;
	uint64_t credit = 0;
	dcast_event ev;
	void *ptr;
	int fd;

	for (int i = 0; i < N; i++)
		w7[i] = (uint16_t)(i * 7 + 1), w8[i] = (uint16_t)(i * 3 + 2);
	REQUIRE((fd = bulk_offer(lfd, port, 7)) >= 0);
	rp_anchor(&chunk, &commit, &d, MODEL, 7, w7);
	frame(fd, &chunk, w7, N * 2);
	frame(fd, &commit, NULL, 0);
	CHECK(event(c, DCAST_EV_VERSION_READY, &ev) && ev.version == 7);
	CHECK_ERR(dcast_consumer_apply(c, 7), 0);
	CHECK(dcast_consumer_tensor(c, "w", &ptr, NULL, NULL) == 0 && !memcmp(ptr, w7, sizeof(w7)));
	CHECK(recv_type(DCAST_MSG_ACK, &m, &credit) && m.u.ack.version == 7);
	CHECK(credit == 0);
	close(fd);
	rp_anchor(&chunk, &commit, &d, MODEL, 8, w8);
	send_to(&chunk, w8, N * 2);
	send_to(&commit, NULL, 0);
	CHECK(event(c, DCAST_EV_VERSION_READY, &ev) && ev.version == 8);
	CHECK_ERR(dcast_consumer_apply(c, 8), 0);
	CHECK(recv_type(DCAST_MSG_ACK, &m, &credit) && m.u.ack.version == 8);
	CHECK(credit == N * 2);
	fprintf(stderr, "CREDIT after the bulk anchor and a ZeroMQ one: %" PRIu64 " bytes\n", credit);
	dcast_consumer_stats_get(c, &st);
	CHECK(st.bulk_versions == 1 && st.bulk_failures == 0);
	CHECK(st.bulk_in_place_bytes == N * 2);
}

/* The receive queue of the consumer's end of fd (the row of
 * /proc/net/tcp whose local port is fd's peer's), -1 when not found. */
static long peer_rx_queue(int fd)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	char line[512];
	unsigned lport, tx, rx;
	long q = -1;
	FILE *f;

	REQUIRE(getpeername(fd, (struct sockaddr *)&a, &len) == 0);
	REQUIRE((f = fopen("/proc/net/tcp", "r")));
	while (q < 0 && fgets(line, sizeof(line), f))
		if (sscanf(line, " %*u: %*x:%x %*x:%*x %*x %x:%x", &lport, &tx, &rx) == 3 &&
		    lport == ntohs(a.sin_port))
			q = rx;
	fclose(f);
	return q;
}

/* Every byte written to fd read by the consumer (the kernel's queues on
 * both ends empty), within 10 s. */
static int consumer_read_all(int fd)
{
	for (int i = 0; i < 1000; i++) {
		int out = -1;
		if (ioctl(fd, SIOCOUTQ, &out) == 0 && out == 0 && peer_rx_queue(fd) == 0)
			return 1;
		usleep(10000);
	}
	return 0;
}

/* A fresh consumer, BULK(7): the frame's header and half its payload
 * read (into the tensor), then "w" bound to our memory.  The transfer
 * ends without a failure, the re-join asks for bulk, and anchor 7
 * offered again lands in our memory through a buffer. */
static void bulk_bind_midframe(const char *ep, const char *dir, int lfd, uint32_t port)
{
	static uint16_t w7[N], mine[N];
	unsigned char prefix[12];
	dcast_msg chunk, commit;
	dcast_range_digest d;
	dcast_consumer_stats st;
	dcast_consumer *c = NULL;
	dcast_event ev;
	size_t hlen;
	void *hdr;
	int fd;

	for (int i = 0; i < N; i++)
		w7[i] = (uint16_t)(i * 5 + 3);
	REQUIRE(dcast_consumer_open(ep, MODEL, dir, 4 << 20, NULL, &c) == 0);
	CHECK(welcome().bulk == 1);
	REQUIRE((fd = bulk_offer(lfd, port, 7)) >= 0);
	rp_anchor(&chunk, &commit, &d, MODEL, 7, w7);
	REQUIRE(dcast_msg_encode(&chunk, &hdr, &hlen) == 0);
	dcast_put_le32(prefix, (uint32_t)hlen);
	dcast_put_le64(prefix + 4, N * 2);
	write_all(fd, prefix, sizeof(prefix));
	write_all(fd, hdr, hlen);
	write_all(fd, w7, N);
	free(hdr);
	CHECK(consumer_read_all(fd));
	CHECK_ERR(dcast_consumer_bind(c, "w", mine, DCAST_MEM_HOST, sizeof(mine)), 0);
	CHECK(welcome().bulk == 1);
	close(fd);
	REQUIRE((fd = bulk_offer(lfd, port, 7)) >= 0);
	frame(fd, &chunk, w7, N * 2);
	frame(fd, &commit, NULL, 0);
	CHECK(event(c, DCAST_EV_VERSION_READY, &ev) && ev.version == 7);
	CHECK_ERR(dcast_consumer_apply(c, 7), 0);
	CHECK(!memcmp(mine, w7, sizeof(w7)));
	dcast_consumer_stats_get(c, &st);
	CHECK(st.bulk_versions == 1 && st.bulk_failures == 0 && st.bulk_in_place_bytes == 0);
	close(fd);
	dcast_consumer_close(&c);
}

/* BULK(9), whose connection brings a frame of version 10: the transfer
 * fails, and the re-join asks for no bulk. */
static void bulk_wrong_version(dcast_consumer *c, int lfd, uint32_t port)
{
	uint16_t w[N] = {0};
	dcast_msg chunk, commit;
	dcast_range_digest d;
	dcast_consumer_stats st;
	int fd;

	REQUIRE((fd = bulk_offer(lfd, port, 9)) >= 0);
	rp_anchor(&chunk, &commit, &d, MODEL, 10, w);
	frame(fd, &chunk, w, N * 2);
	CHECK(welcome().bulk == 0);
	dcast_consumer_stats_get(c, &st);
	CHECK(st.bulk_versions == 1 && st.bulk_failures == 1);
	CHECK(dcast_consumer_version(c) == 8);
	close(fd);
}

/* BULK naming a port where nothing listens: the connect is refused, the
 * transfer fails, and the re-join asks for no bulk. */
/* A fresh consumer offered BULK(7) at `port`, which it cannot reach: the
 * transfer fails, and the re-join asks for no bulk. */
static void bulk_unreachable(const char *ep, const char *dir, uint32_t port)
{
	dcast_consumer *c = NULL;
	dcast_consumer_stats st;

	REQUIRE(dcast_consumer_open(ep, MODEL, dir, 4 << 20, NULL, &c) == 0);
	CHECK(welcome().bulk == 1);
	bulk_send(port, 7);
	CHECK(welcome().bulk == 0);
	dcast_consumer_stats_get(c, &st);
	CHECK(st.bulk_versions == 0 && st.bulk_failures == 1);
	dcast_consumer_close(&c);
}

static void bulk_refused(const char *ep, const char *dir)
{
	uint32_t port;
	int fd = listener(&port);

	close(fd); /* nothing listens there now */
	bulk_unreachable(ep, dir, port);
}

/* BULK naming a port that never answers: its listener's accept queue is
 * full (backlog 0 and one connection never accepted), so the kernel drops
 * the consumer's SYNs, as a firewall does.  The connect is given up after
 * DCAST_BULK_CONNECT_MS, well before the transfer's quiet limit (30 s, past
 * this test's 10 s wait for the HELLO), and the re-join asks for no bulk. */
static void bulk_unanswered(const char *ep, const char *dir)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	uint32_t port;
	int lfd = listener_of(&port, 0), filler = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_port = htons((uint16_t)port);
	REQUIRE(filler >= 0 && connect(filler, (struct sockaddr *)&a, sizeof(a)) == 0);
	bulk_unreachable(ep, dir, port);
	close(filler);
	close(lfd);
}

/* A fresh consumer at ep keeping its files in dir (*c), welcomed as it
 * asks for bulk, then offered BULK(7): its connection to the listener,
 * accepted and its opening checked. */
static int fresh_offer(const char *ep, const char *dir, int lfd, uint32_t port, dcast_consumer **c)
{
	int fd;

	REQUIRE(dcast_consumer_open(ep, MODEL, dir, 4 << 20, NULL, c) == 0);
	CHECK(welcome().bulk == 1);
	REQUIRE((fd = bulk_offer(lfd, port, 7)) >= 0);
	return fd;
}

/* BULK(7), whose connection brings a frame header that is no message
 * and none of the payload its prefix announces: the transfer fails at the
 * header, without waiting for the payload, and the re-join asks for no
 * bulk. */
static void bulk_bad_header(const char *ep, const char *dir, int lfd, uint32_t port)
{
	unsigned char prefix[12], junk[3] = {0xc1, 0xc1, 0xc1};
	dcast_consumer *c = NULL;
	dcast_consumer_stats st;
	int fd;

	fd = fresh_offer(ep, dir, lfd, port, &c);
	dcast_put_le32(prefix, sizeof(junk));
	dcast_put_le64(prefix + 4, N * 2);
	write_all(fd, prefix, sizeof(prefix));
	write_all(fd, junk, sizeof(junk));
	CHECK(welcome().bulk == 0); /* within the router's 10 s: no wait for the payload */
	dcast_consumer_stats_get(c, &st);
	CHECK(st.bulk_versions == 0 && st.bulk_failures == 1);
	close(fd);
	dcast_consumer_close(&c);
}

/* BULK(7) to a fresh consumer, whose one CHUNK comes with a bit of its
 * payload flipped after its checksum was taken: the payload is read into
 * the tensor and hashed there, the chunk refused, anchor 7 dropped, and the
 * consumer re-joins; 7 sent again over ZeroMQ is READY and bit-exact. */
static void bulk_damaged(const char *ep, const char *dir, int lfd, uint32_t port)
{
	static uint16_t w[N], bad[N];
	dcast_msg chunk, commit;
	dcast_range_digest d;
	dcast_consumer_stats st;
	dcast_consumer *c = NULL;
	dcast_event ev;
	void *ptr;
	int fd;

	for (int i = 0; i < N; i++)
		w[i] = bad[i] = (uint16_t)(i * 5 + 3);
	bad[N / 2] ^= 0x10;
	fd = fresh_offer(ep, dir, lfd, port, &c);
	rp_anchor(&chunk, &commit, &d, MODEL, 7, w);
	frame(fd, &chunk, bad, N * 2); /* no COMMIT: the refusal may close the connection first */
	welcome(); /* the re-join after the refusal */
	dcast_consumer_stats_get(c, &st);
	CHECK(st.bulk_in_place_bytes == 0); /* counted once a chunk is taken */
	CHECK(dcast_consumer_version(c) == DCAST_VERSION_NONE);
	send_to(&chunk, w, N * 2);
	send_to(&commit, NULL, 0);
	CHECK(event(c, DCAST_EV_VERSION_READY, &ev) && ev.version == 7);
	CHECK_ERR(dcast_consumer_apply(c, 7), 0);
	CHECK(dcast_consumer_tensor(c, "w", &ptr, NULL, NULL) == 0 && !memcmp(ptr, w, sizeof(w)));
	close(fd);
	dcast_consumer_close(&c);
}

/* The endpoint ep with its host written as "localhost": BULK(7) over
 * bulk, READY. */
static void bulk_by_name(const char *ep, const char *dir, int lfd, uint32_t port)
{
	static uint16_t w[N];
	char named[160];
	dcast_msg chunk, commit;
	dcast_range_digest d;
	dcast_consumer *c = NULL;
	dcast_event ev;
	int fd;

	REQUIRE(!strncmp(ep, "tcp://127.0.0.1:", 16));
	snprintf(named, sizeof(named), "tcp://localhost:%s", ep + 16);
	fd = fresh_offer(named, dir, lfd, port, &c);
	rp_anchor(&chunk, &commit, &d, MODEL, 7, w);
	frame(fd, &chunk, w, N * 2);
	frame(fd, &commit, NULL, 0);
	CHECK(event(c, DCAST_EV_VERSION_READY, &ev) && ev.version == 7);
	close(fd);
	dcast_consumer_close(&c);
}

/* The broker's unix socket for the bulk port `port`. */
static int local_listener(uint32_t port)
{
	struct sockaddr_un a;
	socklen_t len = dcast_bulk_local_addr(&a, port);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, len) == 0 && listen(fd, 4) == 0);
	return fd;
}

/* One frame of a local connection: the prefix, m's header, the reference
 * `ref` (the file `file` passed with it when >= 0), then the payload
 * inline when ref is DCAST_BULK_REF_INLINE. */
static void frame_ref(int fd, const dcast_msg *m, uint64_t ref, int file, const void *payload, uint64_t len)
{
	unsigned char prefix[12], r[DCAST_BULK_REF];
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
	struct iovec iov[3];
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 3};
	struct cmsghdr *cm;
	void *hdr;
	size_t hlen;

	REQUIRE(dcast_msg_encode(m, &hdr, &hlen) == 0);
	dcast_put_le32(prefix, (uint32_t)hlen);
	dcast_put_le64(prefix + 4, len);
	dcast_put_le64(r, ref);
	iov[0] = (struct iovec){prefix, sizeof(prefix)};
	iov[1] = (struct iovec){hdr, hlen};
	iov[2] = (struct iovec){r, sizeof(r)};
	if (file >= 0) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		cm = CMSG_FIRSTHDR(&mh);
		*cm = (struct cmsghdr){.cmsg_len = CMSG_LEN(sizeof(int)), .cmsg_level = SOL_SOCKET,
				       .cmsg_type = SCM_RIGHTS};
		memcpy(CMSG_DATA(cm), &file, sizeof(int));
	}
	REQUIRE(sendmsg(fd, &mh, 0) == (ssize_t)(sizeof(prefix) + hlen + sizeof(r)));
	if (ref == DCAST_BULK_REF_INLINE)
		write_all(fd, payload, len);
	free(hdr);
}

/* A file holding w's bytes at offset 4096. */
static int payload_file(const uint16_t *w)
{
	static const unsigned char zero[4096];
	int fd = memfd_create("bulk-local", MFD_CLOEXEC);

	REQUIRE(fd >= 0);
	write_all(fd, zero, sizeof(zero));
	write_all(fd, w, N * 2);
	return fd;
}

/* A fresh consumer offered BULK(7) over the unix socket, its one CHUNK's
 * payload by reference `ref` to a file holding it at 4096 (passed when
 * `pass`), or inline: READY and bit-exact when `good`, else a failed
 * transfer and a re-join without bulk.  The TCP listener gets nothing. */
static void bulk_local(const char *ep, const char *dir, int lfd, uint32_t port, uint64_t ref, int pass, int good)
{
	static uint16_t w[N];
	struct pollfd tcp = {lfd, POLLIN, 0};
	dcast_msg chunk, commit;
	dcast_range_digest d;
	dcast_consumer_stats st;
	dcast_consumer *c = NULL;
	dcast_event ev;
	int ulfd = local_listener(port), file, fd;
	void *ptr;

	for (int i = 0; i < N; i++)
		w[i] = (uint16_t)(i * 11 + 5);
	file = payload_file(w);
	fd = fresh_offer(ep, dir, ulfd, port, &c);
	CHECK(poll(&tcp, 1, 0) == 0);
	rp_anchor(&chunk, &commit, &d, MODEL, 7, w);
	frame_ref(fd, &chunk, ref, pass ? file : -1, w, N * 2);
	/* A bad reference is refused at the CHUNK's frame, and the consumer
	 * may have closed the connection before a COMMIT's write: no COMMIT. */
	if (good) {
		frame(fd, &commit, NULL, 0); /* no payload: no reference */
		CHECK(event(c, DCAST_EV_VERSION_READY, &ev) && ev.version == 7);
		CHECK(dcast_consumer_tensor(c, "w", &ptr, NULL, NULL) == 0 && !memcmp(ptr, w, sizeof(w)));
	} else {
		CHECK(welcome().bulk == 0);
		CHECK(dcast_consumer_version(c) == DCAST_VERSION_NONE);
	}
	dcast_consumer_stats_get(c, &st);
	CHECK(st.bulk_versions == (uint64_t)good && st.bulk_failures == (uint64_t)!good);
	CHECK(st.bulk_in_place_bytes == (good ? N * 2 : 0));
	close(fd);
	close(file);
	close(ulfd);
	dcast_consumer_close(&c);
}

/* DELTACAST_BULK at open: 0 asks for no bulk; anything but 0 or 1 is
 * refused, naming the variable. */
static void bulk_env(const char *ep, const char *dir)
{
	dcast_consumer *c = NULL;

	setenv("DELTACAST_BULK", "2", 1);
	CHECK_ERR(dcast_consumer_open(ep, MODEL, dir, 4 << 20, NULL, &c), DCAST_EINVAL);
	CHECK(strstr(dcast_last_error(), "DELTACAST_BULK=2") != NULL);
	setenv("DELTACAST_BULK", "0", 1);
	REQUIRE(dcast_consumer_open(ep, MODEL, dir, 4 << 20, NULL, &c) == 0);
	CHECK(welcome().bulk == 0);
	dcast_consumer_close(&c);
	unsetenv("DELTACAST_BULK");
}

int main(void)
{
	char dir[] = "/tmp/dcast-test-bulkf-XXXXXX", dir2[] = "/tmp/dcast-test-bulkf2-XXXXXX",
	     dir3[] = "/tmp/dcast-test-bulkf3-XXXXXX", dir4[] = "/tmp/dcast-test-bulkf4-XXXXXX",
	     dir5[] = "/tmp/dcast-test-bulkf5-XXXXXX", dir6[] = "/tmp/dcast-test-bulkf6-XXXXXX",
	     dir7[] = "/tmp/dcast-test-bulkf7-XXXXXX", dir8[] = "/tmp/dcast-test-bulkf8-XXXXXX",
	     dir9[] = "/tmp/dcast-test-bulkf9-XXXXXX", dir10[] = "/tmp/dcast-test-bulkf10-XXXXXX",
	     dir11[] = "/tmp/dcast-test-bulkf11-XXXXXX", dir12[] = "/tmp/dcast-test-bulkf12-XXXXXX", ep[128];
	size_t len = sizeof(ep);
	int timeout_ms = 10000, lfd;
	dcast_consumer *c = NULL;
	uint32_t port;

	alarm(60);
	signal(SIGPIPE, SIG_IGN); /* a write to a connection the consumer closed fails its REQUIRE */
	REQUIRE(mkdtemp(dir) && mkdtemp(dir2) && mkdtemp(dir3) && mkdtemp(dir4) && mkdtemp(dir5) && mkdtemp(dir6) &&
		mkdtemp(dir7) && mkdtemp(dir8) && mkdtemp(dir9) && mkdtemp(dir10) && mkdtemp(dir11) && mkdtemp(dir12));
	unsetenv("DELTACAST_BULK");
	REQUIRE((ctx = zmq_ctx_new()) && (router = zmq_socket(ctx, ZMQ_ROUTER)));
	REQUIRE(zmq_setsockopt(router, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms)) == 0);
	REQUIRE(zmq_bind(router, "tcp://127.0.0.1:*") == 0);
	REQUIRE(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len) == 0);
	lfd = listener(&port);
	zmq_msg_init(&rid);
	REQUIRE(dcast_consumer_open(ep, MODEL, dir, 4 << 20, NULL, &c) == 0);
	CHECK(welcome().bulk == 1);
	bulk_anchor(c, lfd, port);
	bulk_wrong_version(c, lfd, port);
	dcast_consumer_close(&c);
	bulk_refused(ep, dir3);
	bulk_unanswered(ep, dir8);
	bulk_bind_midframe(ep, dir4, lfd, port);
	bulk_by_name(ep, dir5, lfd, port);
	bulk_bad_header(ep, dir6, lfd, port);
	bulk_damaged(ep, dir7, lfd, port);
	bulk_env(ep, dir2);
	bulk_local(ep, dir9, lfd, port, 4096, 1, 1);
	bulk_local(ep, dir10, lfd, port, DCAST_BULK_REF_INLINE, 0, 1);
	bulk_local(ep, dir11, lfd, port, 4096, 0, 0);    /* no file passed */
	bulk_local(ep, dir12, lfd, port, 1 << 20, 1, 0); /* past the file's end */
	close(lfd);
	zmq_msg_close(&rid);
	zmq_close(router);
	zmq_ctx_term(ctx);
	check_remove_dir(dir);
	check_remove_dir(dir2);
	check_remove_dir(dir3);
	check_remove_dir(dir4);
	check_remove_dir(dir5);
	check_remove_dir(dir6);
	check_remove_dir(dir7);
	check_remove_dir(dir8);
	check_remove_dir(dir9);
	check_remove_dir(dir10);
	check_remove_dir(dir11);
	check_remove_dir(dir12);
	return check_done("test_consumer_bulk_frames");
}
