/* deltacast keygen: make a CURVE key pair (zmq_curve_keypair) for the
 * broker's --curve-secret / --producer-keys / --consumer-keys and the client
 * libraries: PREFIX.secret (mode 0600, a comment line and the Z85 secret,
 * the format dcast_curve_read_secret reads) and PREFIX.public (the Z85
 * public key on one line, ready to append to a key list).  Existing files
 * are never overwritten unless --force is given. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "cli.h"

#define CMD "keygen"
#define KEY_PATH_MAX 4096

static const char usage_text[] =
	"usage: deltacast keygen -o PREFIX [--force]\n"
	"Writes a new CURVE key pair: PREFIX.secret (mode 0600; give it to\n"
	"deltacast-broker --curve-secret or to a client) and PREFIX.public (list it\n"
	"in the broker's --producer-keys / --consumer-keys file, or give a broker's\n"
	"to its clients as the server key).  Refuses to overwrite either file\n"
	"unless --force.\n";

/* Write text to path (mode), atomically through a temporary in the same
 * directory; with !force an existing path is refused. */
static int write_key_file(const char *path, const char *text, mode_t mode, int force)
{
	char tmp[KEY_PATH_MAX + 16];
	size_t len = strlen(text);
	int fd;

	if (!force && access(path, F_OK) == 0)
		return cli_fail(DCAST_EINVAL, "%s exists (use --force to replace it)", path);
	snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path);
	if ((fd = mkstemp(tmp)) < 0)
		return cli_fail(DCAST_EIO, "%s: %s", tmp, strerror(errno));
	if (fchmod(fd, mode) || write(fd, text, len) != (ssize_t)len || fsync(fd)) {
		int e = errno;

		close(fd);
		unlink(tmp);
		return cli_fail(DCAST_EIO, "%s: %s", tmp, strerror(e));
	}
	close(fd);
	if (rename(tmp, path)) {
		int e = errno;

		unlink(tmp);
		return cli_fail(DCAST_EIO, "%s: %s", path, strerror(e));
	}
	return 0;
}

static int keygen(const char *prefix, int force)
{
	char pub[41], sec[41], text[128], spath[KEY_PATH_MAX], ppath[KEY_PATH_MAX];
	int rc;

	if (strlen(prefix) + 8 >= KEY_PATH_MAX)
		return cli_fail(DCAST_EINVAL, "-o: PREFIX longer than %d bytes", KEY_PATH_MAX - 8);
	snprintf(spath, sizeof(spath), "%s.secret", prefix);
	snprintf(ppath, sizeof(ppath), "%s.public", prefix);
	if (!force && (access(spath, F_OK) == 0 || access(ppath, F_OK) == 0))
		return cli_fail(DCAST_EINVAL, "%s exists (use --force to replace it)",
				  access(spath, F_OK) == 0 ? spath : ppath);
	if (zmq_curve_keypair(pub, sec))
		return cli_fail(DCAST_EZMQ, "zmq_curve_keypair: %s (libzmq built without CURVE?)",
				  zmq_strerror(errno));
	snprintf(text, sizeof(text), "# deltacast CURVE secret key: keep it private\n%s\n", sec);
	rc = write_key_file(spath, text, 0600, force);
	memset(text, 0, sizeof(text));
	memset(sec, 0, sizeof(sec));
	if (rc)
		return rc;
	snprintf(text, sizeof(text), "%s\n", pub);
	if ((rc = write_key_file(ppath, text, 0644, force))) {
		unlink(spath); /* no half pair left behind */
		return rc;
	}
	printf("%s\n%s\npublic key %s\n", spath, ppath, pub);
	return 0;
}

int cmd_keygen(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"output", required_argument, NULL, 'o'},
		{"force", no_argument, NULL, 'f'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *prefix = NULL;
	int force = 0, c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "o:fh", longopts, NULL)) != -1) {
		if (c == 'o')
			prefix = optarg;
		else if (c == 'f')
			force = 1;
		else if (c == 'h')
			return fputs(usage_text, stdout), CLI_OK;
		else
			return cli_usage_error(CMD, "unknown option");
	}
	if (optind < argc)
		return cli_usage_error(CMD, "unexpected argument \"%s\"", argv[optind]);
	if (!prefix || !*prefix)
		return cli_usage_error(CMD, "-o PREFIX is required");
	if ((rc = keygen(prefix, force)))
		return cli_report(CMD, rc);
	return CLI_OK;
}
