/* Operator requests (admin.h) on a local UNIX socket, inside the broker's
 * event loop.  Why a UNIX socket and not the network: deleting a model is
 * destructive (its log and files are gone, its consumers re-fetch an
 * anchor), so it is reachable only by a local process of the broker's own
 * user (or root): the socket file is created mode 0600, and each peer's
 * uid is checked again with SO_PEERCRED, so a permissive umask or folder
 * does not open it up.  The metrics port, unauthenticated, stays
 * read-only.  Like the metrics clients (both are broker_clients tables,
 * clients.c), every client is a non-blocking fd in the poll set, bounded
 * by ADMIN_REQUEST_BYTES, ADMIN_CLIENT_MS from accept and
 * ADMIN_MAX_CLIENTS at once: a silent client costs a slot for two seconds,
 * never a wait. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "admin.h"
#include "dcast_common.h"

#define ADMIN_REQUEST_BYTES 512  /* one line; a longer request is refused */
#define ADMIN_CLIENT_MS 2000     /* accept to answer, then closed */
#define ADMIN_MAX_CLIENTS 4      /* more are closed as soon as accepted */
#define ADMIN_ANSWER_BYTES 2048

struct admin_client {
	struct broker_client base;   /* first: the slot of b->admin_clients */
	unsigned uid, pid;
	int refused;                 /* not the broker's uid or root: answered EAUTH */
	size_t len;
	char req[ADMIN_REQUEST_BYTES];
};

static void client_close(struct broker *b, struct admin_client *c)
{
	broker_clients_close(b, &b->admin_clients, &c->base);
}

/* The answer is one short line: a UNIX socket's buffer takes it whole, and
 * a client that does not read it loses it, never the loop's time. */
static void client_answer(struct broker *b, struct admin_client *c, const char *line)
{
	if (send(c->base.fd, line, strlen(line), MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		DCAST_LOG_W("admin: answer to pid %u not sent: %s", c->pid, strerror(errno));
	client_close(b, c);
}

static struct broker_model *model_named(struct broker *b, const char *name)
{
	for (uint32_t i = 0; i < b->n_models; i++)
		if (!strcmp(b->models[i]->name, name))
			return b->models[i];
	return NULL;
}

/* `delete MODEL`: the answer's line into out. */
static void do_delete(struct broker *b, const struct admin_client *c, const char *name,
		      char *out, size_t cap)
{
	struct broker_model *m = model_named(b, name);
	char why[96], shown[4 * DCAST_MAX_NAME + 8];
	int rc;

	dcast_printable(shown, sizeof(shown), name, strlen(name));
	if (!*name || strlen(name) > DCAST_MAX_NAME) {
		snprintf(out, cap, "error DCAST_EINVAL: model name of %zu bytes (want 1 to %d)\n",
			 strlen(name), DCAST_MAX_NAME);
		return;
	}
	if (!m) {
		snprintf(out, cap, "error DCAST_ENOTFOUND: no model \"%s\" (names are exact)\n", shown);
		return;
	}
	snprintf(why, sizeof(why), "operator request (admin socket, uid %u pid %u)", c->uid, c->pid);
	if ((rc = broker_model_remove(b, m, 0, why)))
		snprintf(out, cap, "error %s: %s\n", dcast_errname(rc), dcast_last_error());
	else
		snprintf(out, cap, "ok model \"%s\" deleted%s\n", shown,
			 b->cfg.data_dir ? "; its files in --data-dir are being deleted" : "");
}

/* One request line (newline stripped): the answer's line into out. */
static void request_run(struct broker *b, const struct admin_client *c, const char *req,
			char *out, size_t cap)
{
	char shown[64];

	if (!strncmp(req, "delete ", 7)) {
		do_delete(b, c, req + 7, out, cap);
		return;
	}
	dcast_printable(shown, sizeof(shown), req, strlen(req));
	snprintf(out, cap, "error DCAST_EINVAL: unknown request \"%s\" (want: delete MODEL)\n", shown);
}

static void client_request(struct broker *b, struct admin_client *c)
{
	char out[ADMIN_ANSWER_BYTES];
	char *nl = memchr(c->req, '\n', c->len);

	if (!nl || memchr(c->req, '\0', (size_t)(nl - c->req))) {
		client_answer(b, c, nl ? "error DCAST_EINVAL: a NUL byte in the request\n" :
				     "error DCAST_EINVAL: the request is not one line ended by a newline\n");
		return;
	}
	*nl = '\0';
	if (c->refused)
		snprintf(out, sizeof(out), "error DCAST_EAUTH: uid %u may not ask (only uid %u or root)\n",
			 c->uid, (unsigned)geteuid());
	else
		request_run(b, c, c->req, out, sizeof(out));
	if (!strncmp(out, "ok", 2))
		DCAST_LOG_I("admin: uid %u pid %u: %.*s", c->uid, c->pid, (int)strcspn(out, "\n"), out);
	else
		DCAST_LOG_W("admin: uid %u pid %u: %.*s", c->uid, c->pid, (int)strcspn(out, "\n"), out);
	client_answer(b, c, out);
}

/* Read what has arrived; answer once a line (or EOF) is in, or refuse a
 * request that fills the buffer without one. */
static void on_client(struct broker *b, int fd, void *arg)
{
	struct admin_client *c = arg;
	ssize_t r;

	(void)fd;
	if (dcast_now_ms() >= c->base.deadline_ms) {
		client_close(b, c);
		return;
	}
	r = recv(c->base.fd, c->req + c->len, sizeof(c->req) - c->len, MSG_DONTWAIT);
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (r < 0) {
		client_close(b, c);
		return;
	}
	c->len += (size_t)r;
	if (r == 0 || memchr(c->req + c->len - (size_t)r, '\n', (size_t)r))
		client_request(b, c);
	else if (c->len == sizeof(c->req))
		client_answer(b, c, "error DCAST_ETOO_LARGE: request over 512 bytes\n");
}

/* Only the broker's own user (or root) may ask: the file mode is the first
 * fence, the peer's credentials the second.  A refused peer still has its
 * request read before the answer, so that the answer is not lost to a
 * reset (a UNIX socket closed with unread bytes resets the peer). */
static void client_accept(struct broker *b, struct broker_client *base)
{
	struct admin_client *c = (struct admin_client *)base;
	struct ucred cr = {.pid = 0, .uid = (uid_t)-1};
	socklen_t len = sizeof(cr);

	(void)b;
	getsockopt(base->fd, SOL_SOCKET, SO_PEERCRED, &cr, &len);
	c->uid = (unsigned)cr.uid;
	c->pid = (unsigned)cr.pid;
	c->refused = cr.uid && cr.uid != geteuid();
	if (c->refused)
		DCAST_LOG_W("admin: refused a peer (uid %u, pid %u): only uid %u or root may ask",
			    c->uid, c->pid, (unsigned)geteuid());
}

/* A socket file left by a broker that died is replaced; a live one (a
 * broker still running) or another kind of file is not. */
static int path_clear(const struct sockaddr_un *sa)
{
	struct stat st;
	int fd, live;

	if (lstat(sa->sun_path, &st))
		return errno == ENOENT ? 0 : dcast_fail(DCAST_EIO, "--admin-socket %s: %s",
							sa->sun_path, strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return dcast_fail(DCAST_EIO, "--admin-socket %s: exists and is not a socket; not "
				  "replaced", sa->sun_path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	live = fd >= 0 && !connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
	if (fd >= 0)
		close(fd);
	if (live)
		return dcast_fail(DCAST_EIO, "--admin-socket %s: a process (another broker?) "
				  "listens on it", sa->sun_path);
	if (unlink(sa->sun_path))
		return dcast_fail(DCAST_EIO, "--admin-socket %s: stale socket not removed: %s",
				  sa->sun_path, strerror(errno));
	DCAST_LOG_I("--admin-socket %s: replaced a stale socket file", sa->sun_path);
	return 0;
}

/* The listening socket's fd, or a negative error. */
static int listen_at(const struct sockaddr_un *sa)
{
	mode_t old;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), rc;

	if (fd < 0)
		return dcast_fail(DCAST_EIO, "--admin-socket: socket: %s", strerror(errno));
	old = umask(0177); /* born 0600: no moment where others may connect */
	rc = bind(fd, (const struct sockaddr *)sa, sizeof(*sa));
	umask(old);
	if (rc || listen(fd, ADMIN_MAX_CLIENTS)) {
		rc = dcast_fail(DCAST_EIO, "--admin-socket %s: %s", sa->sun_path, strerror(errno));
		close(fd);
		return -rc;
	}
	return fd;
}

int broker_admin_open(struct broker *b)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, rc;

	b->admin_clients = (struct broker_clients){
		.what = "admin", .listen_fd = -1, .cap = ADMIN_MAX_CLIENTS, .burst = ADMIN_MAX_CLIENTS,
		.slot_bytes = sizeof(struct admin_client), .client_ms = ADMIN_CLIENT_MS,
		.on_client = on_client, .on_accept = client_accept};
	if (!b->cfg.admin_socket)
		return 0;
	DCAST_ASSERT(strlen(b->cfg.admin_socket) < sizeof(sa.sun_path) &&
		     sizeof(sa.sun_path) <= sizeof(b->admin_path)); /* config.c checked */
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", b->cfg.admin_socket);
	if ((rc = path_clear(&sa)))
		return rc;
	if ((fd = listen_at(&sa)) < 0)
		return -fd;
	if ((rc = broker_clients_start(b, &b->admin_clients, fd))) {
		unlink(sa.sun_path);
		return rc;
	}
	snprintf(b->admin_path, sizeof(b->admin_path), "%s", sa.sun_path);
	DCAST_LOG_I("admin requests on %s (mode 0600, uid %u or root)", b->admin_path,
		    (unsigned)geteuid());
	return 0;
}

void broker_admin_close(struct broker *b)
{
	broker_clients_stop(b, &b->admin_clients);
	if (b->admin_path[0] && unlink(b->admin_path))
		DCAST_LOG_W("--admin-socket %s: not removed: %s", b->admin_path, strerror(errno));
	b->admin_path[0] = '\0';
}
