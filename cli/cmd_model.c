/* deltacast model delete: ask a running broker, through its local admin
 * socket (--admin-socket PATH, mode 0600: the broker's user or root), to
 * remove a model: its log, its slot, its files in --data-dir; its peers
 * are dropped with an ERROR saying so.  One request line, one answer line
 * (docs/operations.md, "Removing models"). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli.h"
#include "deltacast/schema.h"

#define CMD "model"
#define MODEL_ANSWER_BYTES 4096

static const char usage_text[] =
	"usage: deltacast model delete NAME --admin-socket PATH [--timeout-ms MS]\n"
	"Removes model NAME from a running broker: its log and slot at once, its\n"
	"segments and run file in --data-dir; its producers and consumers get an\n"
	"ERROR and are dropped.  A producer may create the name again later, as a\n"
	"new run (consumers then take its anchor).  PATH is the broker's\n"
	"--admin-socket (only the broker's user or root may use it).  Prints the\n"
	"broker's answer; exit 1 when the broker refuses or cannot be reached.\n";

static int dial(const char *path, long timeout_ms, int *out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return cli_fail(DCAST_EINVAL, "--admin-socket \"%s\": longer than %zu bytes", path,
				sizeof(sa.sun_path) - 1);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return cli_fail(DCAST_EIO, "socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		int err = errno;

		close(fd);
		return cli_fail(DCAST_EIO, "--admin-socket %s: connect: %s (is the broker running "
				"with --admin-socket %s, and are you its user?)", path, strerror(err), path);
	}
	*out = fd;
	return 0;
}

/* Send `request`, read the one answer line into answer (NUL-terminated). */
static int ask(const char *path, long timeout_ms, const char *request, char *answer, size_t cap)
{
	size_t len = 0;
	ssize_t r = 0;
	int fd = -1, rc, err;

	if ((rc = dial(path, timeout_ms, &fd)))
		return rc;
	if (send(fd, request, strlen(request), MSG_NOSIGNAL) != (ssize_t)strlen(request))
		r = -1;
	while (r >= 0 && len < cap - 1 && !memchr(answer, '\n', len) &&
	       (r = recv(fd, answer + len, cap - 1 - len, 0)) > 0)
		len += (size_t)r;
	err = errno;
	close(fd);
	answer[len] = '\0';
	if (r < 0)
		return cli_fail(DCAST_EIO, "--admin-socket %s: %s", path, strerror(err));
	if (!len)
		return cli_fail(DCAST_EIO, "--admin-socket %s: closed without an answer", path);
	return 0;
}

static int delete_model(const char *name, const char *path, long timeout_ms)
{
	char request[DCAST_MAX_NAME + 16], answer[MODEL_ANSWER_BYTES];
	int rc;

	if (!*name || strlen(name) > DCAST_MAX_NAME || strchr(name, '\n'))
		return cli_usage_error(CMD, "NAME must be 1 to %d bytes, one line", DCAST_MAX_NAME);
	snprintf(request, sizeof(request), "delete %s\n", name);
	if ((rc = ask(path, timeout_ms, request, answer, sizeof(answer))))
		return cli_report(CMD, rc);
	if (!strncmp(answer, "ok", 2)) {
		fputs(answer, stdout);
		return CLI_OK;
	}
	fprintf(stderr, "deltacast " CMD ": broker: %s", answer);
	return CLI_FAILED;
}

int cmd_model(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"admin-socket", required_argument, NULL, 'a'},
		{"timeout-ms", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *path = NULL;
	long timeout_ms = 5000;
	int c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'a': path = optarg; break;
		case 't':
			if ((rc = cli_parse_timeout_ms(CMD, optarg, &timeout_ms)))
				return rc;
			break;
		case 'h': fputs(usage_text, stdout); return CLI_OK;
		default: return cli_usage_error(CMD, "unknown option");
		}
	}
	if (argc - optind != 2 || strcmp(argv[optind], "delete"))
		return cli_usage_error(CMD, "want: model delete NAME --admin-socket PATH");
	if (!path)
		return cli_usage_error(CMD, "--admin-socket PATH is required");
	return delete_model(argv[optind + 1], path, timeout_ms);
}
