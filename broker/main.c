/* deltacast-broker: parse the configuration, open the sockets, run the loop
 * until SIGTERM or SIGINT, close everything.  Exit 0 on a clean shutdown,
 * 2 on a configuration error, 1 on a runtime failure.  The signals are the
 * program's, not the broker's (struct broker runs inside any process that
 * calls broker_open / broker_run): they arrive on a signalfd that this file
 * adds to the loop's poll set. */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>
#include "broker.h"
#include "dcast_common.h"
#include "limits.h" /* the open-file limit (broker/limits.c) */

static int log_level_set(const char *name)
{
	static const char *names[] = {"error", "warn", "info", "debug"};

	for (int i = 0; i < 4; i++)
		if (!strcmp(name, names[i])) {
			dcast_log_set_level(i);
			return 0;
		}
	return dcast_fail(DCAST_EINVAL, "--log-level: \"%s\" is not error, warn, info or debug", name);
}

/* SIGTERM/SIGINT blocked and on a signalfd: before the ZeroMQ context
 * starts, so that its threads inherit the mask. */
static int signals_block(void)
{
	sigset_t set;
	int fd;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	if (sigprocmask(SIG_BLOCK, &set, NULL) || (fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0)
		return -dcast_fail(DCAST_EIO, "signalfd: %s", strerror(errno));
	return fd;
}

static void on_signal(struct broker *b, int fd, void *arg)
{
	struct signalfd_siginfo si;

	(void)arg;
	if (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si))
		DCAST_LOG_I("signal %u received", si.ssi_signo);
	b->stop = 1;
}

/* Open, run until a signal, close; 0 on a clean shutdown. */
static int serve(struct broker *b, const struct broker_config *cfg)
{
	int sfd = signals_block(), rc;

	if (sfd < 0) {
		DCAST_LOG_E("start: %s", dcast_last_error());
		return -sfd;
	}
	rc = broker_open(b, cfg);
	if (!rc)
		rc = broker_poll_add(b, sfd, on_signal, NULL);
	if (rc)
		DCAST_LOG_E("start: %s", dcast_last_error());
	else if ((rc = broker_run(b)))
		DCAST_LOG_E("loop: %s", dcast_last_error());
	broker_close(b);
	close(sfd);
	return rc;
}

int main(int argc, char **argv)
{
	struct broker_config cfg;
	static struct broker b;
	int rc = broker_config_parse(&cfg, argc, argv);

	if (rc == BROKER_CONFIG_HELP || rc == BROKER_CONFIG_VERSION) {
		if (rc == BROKER_CONFIG_HELP)
			broker_config_usage(stdout);
		else
			printf("deltacast-broker %s (wire protocol %d)\n", DCAST_PACKAGE_VERSION,
			       DCAST_PROTO_VERSION);
		broker_config_free(&cfg);
		return 0;
	}
	if (rc || (rc = broker_config_check(&cfg)) || (rc = log_level_set(cfg.log_level))) {
		fprintf(stderr, "deltacast-broker: %s\n", dcast_last_error());
		broker_config_free(&cfg);
		return 2;
	}
	broker_limits_nofile(&cfg);
	broker_limits_memory(&cfg);
	rc = serve(&b, &cfg);
	broker_config_free(&cfg);
	DCAST_LOG_I("stopped");
	return rc ? 1 : 0;
}
