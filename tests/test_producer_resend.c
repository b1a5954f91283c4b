/* A lost connection after publish() handed over the COMMIT and before the
 * ACK: wait() must never report a version the broker did not take.
 * (0) First, the broker dies mid-version (stopped under a 1 MiB credit
 *     window, killed, restarted with its data dir): publish() re-joins and
 *     resumes the delta, the ranges already encoded going again from the
 *     undo log.
 * (1) The broker is stopped, takes the version into its socket buffer, and is
 *     killed (SIGKILL) and restarted with its data dir: it has the version
 *     before; wait() re-joins, re-sends the same delta from the baseline
 *     (the trainer's tensors have moved on meanwhile) and gets the ACK.
 * (2) The same, restarted without a data dir: it lost everything; the
 *     version goes again as an anchor made from the baseline.
 * (3) The broker takes the version but its ACK is lost (a proxy in between
 *     holds what the broker sends, then is killed): the re-joined broker
 *     names the version as its newest, which counts as the ACK; nothing is
 *     sent again.
 * Each time a reader gets the version bit-exact as published. */
#include <pthread.h>
#include <stdint.h>
#include "check.h"
#include "deltacast/producer.h"
#include "deltacast/safetensors.h"
#include "producer_harness.h"

#define N (1u << 21) /* 4 MiB of bf16 in 8 chunks */
#define IN_FLIGHT (16u << 10) /* bytes waiting for the stopped broker: more than any
			       * control message, so chunks of the version */

static harness_broker b;
static char dir[] = "/tmp/dcast-test-producer-resend-XXXXXX";
static uint16_t *w, *want;
static uint64_t seed = 5;
static pid_t proxy;
static int proxy_port;

static int read_back(uint64_t v)
{
	char out[256];

	snprintf(out, sizeof(out), "%s/v%llu.safetensors", dir, (unsigned long long)v);
	return !harness_read(&b, "resend", v, out) && harness_same_as_file(out, "w", want, N * 2ull);
}

/* The tensors as they are, published as a delta and read back. */
static void plain_delta(dcast_producer *p, uint64_t v)
{
	dcast_producer_stats s;

	memcpy(want, w, N * 2ull);
	CHECK_ERR(harness_publish(p, v), 0);
	dcast_producer_stats_get(p, &s);
	CHECK(!s.anchor);
	CHECK(read_back(v));
}

/* Version v goes into a stopped broker's socket buffer, then the broker
 * dies and comes back (with data dir or not); meanwhile the trainer moves on. */
static void lost_before_commit(dcast_producer *p, uint64_t v, int keep_data)
{
	dcast_producer_stats s;

	harness_perturb(w, N, 10000, &seed);
	memcpy(want, w, N * 2ull);
	tp_broker_kill(&b, SIGSTOP);
	CHECK_ERR(dcast_producer_publish(p, v), 0);
	dcast_producer_stats_get(p, &s);
	CHECK(tp_wait_unread(b.pport, s.payload_bytes, 5000)); /* its payload, unread */
	tp_broker_kill(&b, SIGKILL);
	if (!keep_data)
		b.n_extra = 2; /* the window only */
	REQUIRE(tp_broker_start(&b) == 0);
	harness_perturb(w, N, 10000, &seed); /* the next step's weights */
	CHECK_ERR(dcast_producer_wait(p, v, 20000), 0);
	CHECK(read_back(v));
}

/* Once the stopped broker's socket holds chunks of the version (*arg: 1
 * when seen within 10 s), kill it and start it again. */
static void *kill_and_restart(void *arg)
{
	*(int *)arg = tp_wait_unread(b.pport, IN_FLIGHT, 10000);
	tp_broker_kill(&b, SIGKILL);
	tp_broker_start(&b);
	return NULL;
}

/* (0): every element changes (a dense delta, four times the window): the
 * kill lands mid-version; the restarted broker has the version before. */
static void lost_mid_version(dcast_producer *p, uint64_t v)
{
	dcast_producer_stats s;
	pthread_t th;
	int in_flight = 0;

	harness_fill(w, N, &seed);
	memcpy(want, w, N * 2ull);
	tp_broker_kill(&b, SIGSTOP);
	pthread_create(&th, NULL, kill_and_restart, &in_flight);
	CHECK_ERR(dcast_producer_publish(p, v), 0);
	pthread_join(th, NULL);
	CHECK(in_flight);
	CHECK_ERR(dcast_producer_wait(p, v, 20000), 0);
	dcast_producer_stats_get(p, &s);
	CHECK(!s.anchor && s.total_reconnects >= 1 && s.total_resends == 0);
	CHECK(read_back(v));
}

/* One try at the proxy on proxy_port: 1 once its "listening on PORT," line
 * is in its log, 0 when it exited (the port is taken). */
static int proxy_try(const char *exe, const char *log)
{
	char listen[16], target[16], line[64];
	int count;

	snprintf(listen, sizeof(listen), "%d", proxy_port);
	snprintf(target, sizeof(target), "%d", b.pport);
	snprintf(line, sizeof(line), "listening on %d,", proxy_port);
	count = check_count_in_file(log, line);
	if ((proxy = fork()) == 0) {
		if (!freopen(log, "a", stderr))
			_exit(126);
		execl(exe, exe, listen, target, "1", "0", "0", "0", "0", (char *)NULL);
		_exit(127);
	}
	tp_track(proxy);
	for (int waited = 0; waited < 5000; waited += 10) {
		if (check_count_in_file(log, line) > count)
			return 1;
		if (waitpid(proxy, NULL, WNOHANG) == proxy)
			break;
		tp_sleep_ms(10);
	}
	kill(proxy, SIGKILL);
	waitpid(proxy, NULL, 0);
	tp_untrack(proxy);
	return 0;
}

/* The proxy, listening: on proxy_port when `same` (a restart: the producer
 * knows that port; it is retried), else on the first free port from it. */
static void start_proxy(int same)
{
	char exe[512], log[512];
	int ok = 0;

	snprintf(exe, sizeof(exe), "%s/tools/faultproxy", tp_build());
	snprintf(log, sizeof(log), "%s/proxy.log", dir);
	for (int attempt = 0; attempt < 20 && !(ok = proxy_try(exe, log)); attempt++)
		if (!same)
			proxy_port += 3;
		else
			tp_sleep_ms(50);
	REQUIRE(ok);
}

/* The proxy holds what the broker sends from now on (faultproxy SIGUSR2;
 * its log line says when). */
static void hold_replies(void)
{
	char log[512];
	int count;

	snprintf(log, sizeof(log), "%s/proxy.log", dir);
	count = check_count_in_file(log, "holding what the broker sends");
	kill(proxy, SIGUSR2);
	REQUIRE(tp_wait_log(log, "holding what the broker sends", count + 1, 5000));
}

static void stop_proxy(int sig)
{
	kill(proxy, sig);
	if (sig == SIGKILL) {
		waitpid(proxy, NULL, 0);
		tp_untrack(proxy);
	}
}

/* (3): the broker commits v, its ACK is held by the proxy, which dies. */
static void ack_lost(dcast_producer *p, uint64_t v)
{
	harness_perturb(w, N, 10000, &seed);
	memcpy(want, w, N * 2ull);
	hold_replies();
	CHECK_ERR(dcast_producer_publish(p, v), 0);
	CHECK(tp_wait_metric(b.mport, "deltacast_model_version{model=\"resend\"}", v, 5000));
	stop_proxy(SIGKILL);
	start_proxy(1);
	CHECK_ERR(dcast_producer_wait(p, v, 20000), 0);
	CHECK(read_back(v));
}

int main(void)
{
	dcast_producer_opts o;
	dcast_producer *p = NULL, *q = NULL;
	dcast_producer_stats s;
	static char data[64];
	char ep[64];

	harness_init();
	REQUIRE(mkdtemp(dir) && (w = calloc(N, 2)) && (want = calloc(N, 2)));
	snprintf(data, sizeof(data), "%s/data", dir);
	b.extra[b.n_extra++] = "--producer-window-bytes";
	b.extra[b.n_extra++] = "1048576";
	b.extra[b.n_extra++] = "--data-dir";
	b.extra[b.n_extra++] = data;
	b.with_metrics = 1;
	REQUIRE(harness_broker_start(&b, dir) == 0);
	dcast_producer_opts_init(&o);
	o.connect_timeout_ms = 1000;
	o.max_reconnects = 5;
	o.range_elems = 1u << 18;
	o.undo_bytes = 32u << 20; /* holds (0)'s dense delta: it can resume */
	harness_fill(w, N, &seed);
	memcpy(want, w, N * 2ull);
	p = harness_open_w(b.producers, "resend", &o, w, N);
	CHECK_ERR(harness_publish(p, 1), 0);

	/* (0) killed mid-version, back with its data: the delta resumes */
	lost_mid_version(p, 2);

	/* (1) the restarted broker has version 2: the same delta again */
	lost_before_commit(p, 3, 1);
	dcast_producer_stats_get(p, &s);
	CHECK(s.total_reconnects >= 2 && s.total_resends == 1 && s.acked_version == 3);
	CHECK(check_file_has(b.log, "version 3 committed (delta"));
	/* the trainer's tensors moved on: a plain delta against 3 */
	plain_delta(p, 4);

	/* (2) the restarted broker lost everything: an anchor from the baseline */
	lost_before_commit(p, 5, 0);
	dcast_producer_stats_get(p, &s);
	CHECK(s.total_resends == 2 && s.acked_version == 5);
	CHECK(check_file_has(b.log, "version 5 committed (anchor"));
	CHECK_ERR(dcast_producer_wait(p, 3, 0), 0); /* earlier outcomes are kept */
	CHECK_ERR(dcast_producer_wait(p, 9, 0), DCAST_ENOTFOUND);

	/* (3) through a proxy: the broker took version 7 and its ACK was lost */
	proxy_port = b.cport + 2;
	start_proxy(0); /* the next free port from there */
	snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", proxy_port);
	dcast_producer_close(&p);
	q = harness_open_w(ep, "resend", &o, w, N);
	memcpy(want, w, N * 2ull);
	CHECK_ERR(harness_publish(q, 6), 0); /* a new producer: an anchor */
	ack_lost(q, 7);
	dcast_producer_stats_get(q, &s);
	CHECK(s.total_reconnects >= 1 && s.total_resends == 0 && s.acked_version == 7);
	harness_perturb(w, N, 10000, &seed);
	plain_delta(q, 8);
	dcast_producer_close(&q);
	stop_proxy(SIGKILL);
	tp_broker_kill(&b, SIGTERM);
	free(w);
	free(want);
	return check_done("test_producer_resend");
}
