/* The broker's durable write off its event loop, over real processes and
 * real files.  The slow disk is the fault hook at the writer's seam,
 * DELTACAST_BROKER_FAULT=slowdisk:MS (the writer thread sleeps MS ms before
 * each COMMIT record and again after each fsync; the event loop is not
 * touched): this machine has no device-mapper (dm-delay) and no cgroup v2
 * io.max, so a really slow disk cannot be made here.
 * (1) While a version's write takes 2 x 600 ms (--heartbeat-ms 200): the
 *     model's consumer gets it before its ACK (served before durable), keeps
 *     getting heartbeats and is never dropped; a second model's version
 *     flows to its consumer; a delta on the in-flight version is accepted;
 *     the producer's ACKs come in order, each only once the segment file
 *     holds the version's COMMIT record, and no loop turn is late.
 * (2) SIGKILL while a version's write is in flight: the restarted broker
 *     has that version whole or not at all, never torn; the producer that
 *     was not ACKed publishes it again from its baseline, and a fresh
 *     consumer gets it bit-exact.
 * (0) The producer library's wait for an ACK that the durable write
 *     delays (2 x 600 ms) past its timeout (400 ms): the broker's
 *     HEARTBEATs name the version committed meanwhile, so at the timeout
 *     the producer re-joins and the WELCOME, naming it, settles it. */
#include <dirent.h>
#include <poll.h>
#include "broker_harness.h"
#include "deltacast/producer.h"
#include "dcast_reclog.h"
#include "dcast_common.h"

#define SLOW_MS 600
#define MAX_ACKS 16

enum { PA, CA, PB, CB, N_PEERS };

static struct h_client cl[N_PEERS];
static const int is_consumer[N_PEERS] = {0, 1, 0, 1};
static uint64_t heartbeats[N_PEERS];
static uint64_t acks[MAX_ACKS];
static int acks_on_disk[MAX_ACKS], n_acks;
static char data[300];

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* 1 when the segment file holds a COMMIT record of `version` of `model`
 * (records: common/dcast_reclog.h; the FILE record names the model). */
static int file_has_commit(const char *path, const char *model, uint64_t version)
{
	FILE *fp = fopen(path, "rb");
	size_t n = 0, off = 0;
	uint8_t *img = malloc(64u << 20);
	int named = 0, found = 0;

	REQUIRE(img);
	if (fp) {
		n = fread(img, 1, 64u << 20, fp); /* a file being written may be empty */
		fclose(fp);
	}

	while (!found && off + DCAST_REC_PREFIX <= n) {
		uint32_t kind = img[off + 4], hl = le32(img + off + 8), pl = le32(img + off + 12);
		uint64_t v = le32(img + off + 16) | (uint64_t)le32(img + off + 20) << 32;

		if (off + DCAST_REC_PREFIX + (uint64_t)hl + pl > n)
			break;
		if (kind == 1)
			named = hl == strlen(model) && !memcmp(img + off + DCAST_REC_PREFIX, model, hl);
		found = named && kind == 4 && v == version;
		off += DCAST_REC_PREFIX + (size_t)hl + pl;
	}
	free(img);
	return found;
}

static int seg_has_commit(const char *model, uint64_t version)
{
	DIR *d = opendir(data), *m;
	struct dirent *e, *f;
	char sub[600], path[900];
	int found = 0;

	while (d && !found && (e = readdir(d)))
		if (e->d_name[0] != '.') {
			snprintf(sub, sizeof(sub), "%s/%s", data, e->d_name);
			m = opendir(sub);
			while (m && !found && (f = readdir(m)))
				if (!strncmp(f->d_name, "seg-", 4)) {
					snprintf(path, sizeof(path), "%s/%s", sub, f->d_name);
					found = file_has_commit(path, model, version);
				}
			if (m)
				closedir(m);
		}
	if (d)
		closedir(d);
	return found;
}

static void beat_all(void)
{
	dcast_msg m;

	dcast_msg_init(&m, DCAST_MSG_HEARTBEAT);
	for (int i = 0; i < N_PEERS; i++)
		if (cl[i].sock)
			h_send(&cl[i], &m, NULL);
}

/* Take every message waiting at client i; the producer of model a has
 * each ACK's version checked against the segment file as it is seen. */
static void take(int i)
{
	dcast_wire_in in;

	while (dcast_wire_recv(cl[i].sock, 0, &in, ZMQ_DONTWAIT) == 0) {
		if (in.msg.type == DCAST_MSG_HEARTBEAT)
			heartbeats[i]++;
		if (i == PA && in.msg.type == DCAST_MSG_ACK && n_acks < MAX_ACKS) {
			acks_on_disk[n_acks] = seg_has_commit("slow/a", in.msg.u.ack.version);
			acks[n_acks++] = in.msg.u.ack.version;
		}
		if (is_consumer[i])
			h_consumer_handle(&cl[i], &in);
		else
			h_producer_handle(&cl[i], &in);
		dcast_wire_in_close(&in);
	}
	dcast_wire_in_close(&in);
}

/* Serve every client (heartbeats every 50 ms) until done() or max_ms. */
static int run_until(int (*done)(void), int max_ms)
{
	uint64_t end = dcast_now_ms() + (uint64_t)max_ms, last_beat = 0;

	while (!done() && dcast_now_ms() < end) {
		zmq_pollitem_t it[N_PEERS];
		int n = 0;

		if (dcast_now_ms() - last_beat >= 50) {
			beat_all();
			last_beat = dcast_now_ms();
		}
		for (int i = 0; i < N_PEERS; i++)
			if (cl[i].sock)
				it[n++] = (zmq_pollitem_t){cl[i].sock, 0, ZMQ_POLLIN, 0};
		zmq_poll(it, n, 20);
		for (int i = 0; i < N_PEERS; i++)
			if (cl[i].sock)
				take(i);
	}
	return done();
}

static int a_has_1(void) { return cl[CA].version != DCAST_VERSION_NONE && cl[CA].version >= 1; }
static int a_has_3(void) { return cl[CA].version != DCAST_VERSION_NONE && cl[CA].version >= 3; }
static int b_has_1(void) { return cl[CB].version != DCAST_VERSION_NONE && cl[CB].version >= 1; }
static int acked_2(void) { return n_acks >= 2; }
static int never(void) { return 0; }

static void join_all(int pport, int cport)
{
	h_client_open(&cl[PA], pport, "slow/a");
	h_client_open(&cl[PB], pport, "slow/b");
	h_client_open(&cl[CA], cport, "slow/a");
	h_client_open(&cl[CB], cport, "slow/b");
	REQUIRE(h_producer_join(&cl[PA]) == 0);
	REQUIRE(h_producer_join(&cl[PB]) == 0);
	h_hello(&cl[CA], DCAST_ROLE_CONSUMER, DCAST_VERSION_NONE);
	h_hello(&cl[CB], DCAST_ROLE_CONSUMER, DCAST_VERSION_NONE);
	run_until(never, 100);
}

/* (1): returns the snapshots of model a's versions 1 and 2 in snap. */
static void slow_write_phase(tp_broker *br, uint16_t (*snap)[H_TENSORS][H_ELEMS])
{
	uint32_t rng = 77;
	uint64_t t0, hb0;

	h_mutate(&cl[PA], &rng, 1);
	memcpy(snap[1], cl[PA].state, sizeof(snap[1]));
	h_client_publish(&cl[PA], 1, 1, 0); /* sent; not waiting for its ACK */
	t0 = dcast_now_ms();
	hb0 = heartbeats[CA];
	CHECK(run_until(a_has_1, 1000));
	CHECK(n_acks == 0); /* served before it is durable */
	h_mutate(&cl[PA], &rng, 50);
	memcpy(snap[2], cl[PA].state, sizeof(snap[2]));
	h_client_publish(&cl[PA], 2, 0, 0); /* a delta on the in-flight version */
	h_mutate(&cl[PB], &rng, 1);
	h_client_publish(&cl[PB], 1, 1, 0);
	CHECK(run_until(b_has_1, 1000));
	CHECK(n_acks == 0); /* the second model flowed while a's write was slow */
	CHECK(run_until(acked_2, 20 * SLOW_MS));
	CHECK(n_acks == 2 && acks[0] == 1 && acks[1] == 2);
	CHECK(acks_on_disk[0] && acks_on_disk[1]);
	fprintf(stderr, "ACKs of 1 and 2 after %llu ms; %llu heartbeats meanwhile\n",
		(unsigned long long)(dcast_now_ms() - t0), (unsigned long long)(heartbeats[CA] - hb0));
	CHECK(dcast_now_ms() - t0 >= 4 * SLOW_MS); /* each ACK waited for its write */
	CHECK(heartbeats[CA] - hb0 >= 5);
	CHECK(cl[CA].last_error_code == 0 && cl[CB].last_error_code == 0); /* not dropped */
	CHECK(cl[CA].version == 2 && memcmp(cl[CA].state, snap[2], sizeof(snap[2])) == 0);
	CHECK(memcmp(cl[CB].state, cl[PB].state, sizeof(cl[PB].state)) == 0);
	CHECK(cl[CA].errors == 0 && cl[CA].digest_mismatch == 0);
	CHECK(!check_file_has(br->log, "event loop busy"));
	CHECK(tp_metric_now(br->mport, "deltacast_peers_timed_out_total") == 0); /* none dropped */
}

/* (2): SIGKILL with version 3 in flight; restart; republish; read back. */
static void kill_phase(tp_broker *br, uint16_t (*snap)[H_TENSORS][H_ELEMS])
{
	static struct h_client fresh;
	uint32_t rng = 99;
	uint64_t restored, newest;
	int whole;

	h_mutate(&cl[PA], &rng, 50);
	memcpy(snap[3], cl[PA].state, sizeof(snap[3]));
	h_client_publish(&cl[PA], 3, 0, 0);
	CHECK(run_until(a_has_3, 1000));
	tp_broker_kill(br, SIGKILL); /* the writer sleeps before 3's COMMIT record */
	CHECK(n_acks == 2);
	unsetenv("DELTACAST_BROKER_FAULT");
	REQUIRE(h_broker_start(br) == 0);
	/* restored: 3 versions up to 3 (3 whole), or 2 up to 2 (3 cut off) */
	restored = tp_metric_now(br->mport, "deltacast_model_log_versions{model=\"slow/a\"}");
	newest = tp_metric_now(br->mport, "deltacast_model_version{model=\"slow/a\"}");
	whole = restored == 3 && newest == 3;
	CHECK(whole || (restored == 2 && newest == 2));
	fprintf(stderr, "version 3 after the kill: %s\n", whole ? "whole" : "cut off");

	h_client_close(&cl[PA]);
	h_client_open(&cl[PA], br->pport, "slow/a");
	memcpy(cl[PA].state, snap[3], sizeof(snap[3]));
	memcpy(cl[PA].base, snap[2], sizeof(snap[2]));
	cl[PA].version = 2;
	REQUIRE(h_producer_join(&cl[PA]) == 0);
	CHECK(cl[PA].welcome_version == (whole ? 3u : 2u));
	if (!whole)
		CHECK(h_client_publish(&cl[PA], 3, 0, 50) == 0); /* not ACKed: sent again */
	h_client_open(&fresh, br->cport, "slow/a");
	CHECK(h_consume_until(&fresh, DCAST_VERSION_NONE, 3, 50) == 0);
	CHECK(fresh.version == 3 && fresh.errors == 0 && fresh.digest_mismatch == 0);
	CHECK(memcmp(fresh.state, snap[3], sizeof(snap[3])) == 0);
	h_client_close(&fresh);
}

/* (3): a wait shorter than the durable write still gets the ACK. */
static void durable_wait_phase(const tp_broker *br)
{
	static uint16_t w[4096];
	uint64_t shape[1] = {4096}, t0;
	dcast_producer_stats st;
	dcast_producer *p = NULL;
	char ep[64];

	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", br->pport);
	REQUIRE(dcast_producer_open(ep, "slow/lib", 0, 1, NULL, &p) == 0);
	REQUIRE(dcast_producer_register(p, "w", DCAST_DTYPE_BF16, 1, shape, w, DCAST_MEM_HOST, 0, 4096) == 0);
	for (int i = 0; i < 4096; i++)
		w[i] = (uint16_t)(0x3f80 + i);
	t0 = dcast_now_ms();
	CHECK(dcast_producer_publish(p, 1) == 0);
	CHECK(dcast_producer_wait(p, 1, 400) == 0); /* the durable write takes 1200 ms */
	printf("library producer: version 1 settled after %llu ms, waited with a 400 ms timeout\n",
	       (unsigned long long)(dcast_now_ms() - t0));
	dcast_producer_stats_get(p, &st);
	CHECK(st.acked_version == 1); /* settled by the re-join, before the write ended */
	dcast_producer_close(&p);
}

int main(void)
{
	static uint16_t snap[4][H_TENSORS][H_ELEMS];
	static char dir[] = "/tmp/dcast_test_slowdisk_XXXXXX";
	tp_broker br = {0};
	char fault[64];

	h_init();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s/broker.log", dir);
	snprintf(data, sizeof(data), "%s/data", dir);
	snprintf(fault, sizeof(fault), "slowdisk:%d", SLOW_MS);
	setenv("DELTACAST_BROKER_FAULT", fault, 1);
	br.extra[br.n_extra++] = "--data-dir";
	br.extra[br.n_extra++] = data;
	br.extra[br.n_extra++] = "--heartbeat-ms";
	br.extra[br.n_extra++] = "200";
	br.extra[br.n_extra++] = "--anchor-fraction";
	br.extra[br.n_extra++] = "0";
	br.with_metrics = 1;
	REQUIRE(h_broker_start(&br) == 0);
	CHECK(check_file_has(br.log, "fault injection: slowdisk"));
	durable_wait_phase(&br); /* before the wire clients, which it would leave unanswered */
	join_all(br.pport, br.cport);

	slow_write_phase(&br, snap);
	kill_phase(&br, snap);

	for (int i = 0; i < N_PEERS; i++)
		h_client_close(&cl[i]);
	return h_finish(&br, dir, "test_broker_slowdisk");
}
