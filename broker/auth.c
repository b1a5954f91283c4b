/* CURVE server set-up and the ZAP handler (auth.h).  The handler runs in its
 * own thread on a REP socket: it reads only the key lists, which are fixed
 * before it starts, and answers every request, so handshakes never wait on
 * the broker's loop.  Sockets are told apart by ZMQ_ZAP_DOMAIN. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include "auth.h"
#include "dcast_common.h"
#include "dcast_curve.h"

#define AUTH_MAX_KEYS 4096
#define AUTH_ZAP_FRAMES 8

struct key_list {
	char (*keys)[DCAST_Z85_KEY_LEN + 1];
	char **models;   /* [AUTH_MAX_KEYS]: a key's model list, "a,b"; NULL: any model */
	unsigned n;
	int given;
};

/* b->auth: set once CURVE is on; the ZAP thread reads the key lists
 * (never changed after start) and counts refusals. */
struct broker_auth {
	char secret[DCAST_Z85_KEY_LEN + 1], public_z85[DCAST_Z85_KEY_LEN + 1];
	struct key_list producers, consumers;
	void *zap;
	pthread_t thread;
	int thread_on;
	atomic_ullong refused;
};

uint64_t broker_auth_refused(const struct broker *b)
{
	return b->auth ? atomic_load(&b->auth->refused) : 0;
}

/* The rest of a key line: empty or "*" (any model), or models "a,b". */
static int key_models(char *rest, int producers, const char *path, int lineno, char **out)
{
	char *end = rest + strcspn(rest, "#\r\n");

	*out = NULL;
	*end = '\0';
	while (end > rest && (end[-1] == ' ' || end[-1] == '\t'))
		*--end = '\0';
	rest += strspn(rest, " \t");
	if (!*rest || !strcmp(rest, "*"))
		return 0;
	if (!producers)
		return dcast_fail(DCAST_EMALFORMED, "key list '%s' line %d: a model list (\"%s\") is "
				  "only for --producer-keys", path, lineno, rest);
	if (strlen(rest) > 4000 || strstr(rest, ",,") || *rest == ',' || end[-1] == ',' ||
	    strpbrk(rest, " \t"))
		return dcast_fail(DCAST_EMALFORMED, "key list '%s' line %d: \"%s\" is not a model "
				  "list (KEY, KEY *, or KEY model1,model2 with no spaces)", path,
				  lineno, rest);
	if (!(*out = strdup(rest)))
		return dcast_fail(DCAST_ENOMEM, "key list '%s'", path);
	return 0;
}

static int key_line(struct key_list *kl, char *line, int producers, const char *path,
		    int lineno)
{
	size_t n = strcspn(line, " \t\r\n");
	uint8_t bin[32];
	char *rest = line + n + (line[n] != '\0');
	int key;

	line[n] = '\0';
	key = n == DCAST_Z85_KEY_LEN && zmq_z85_decode(bin, line); /* Z85 has '#' */
	if (!key && (n == 0 || line[0] == '#'))
		return 0;
	if (!key || kl->n == AUTH_MAX_KEYS)
		return dcast_fail(DCAST_EMALFORMED, "key list '%s' line %d: %s", path, lineno,
				  kl->n == AUTH_MAX_KEYS ? "more than 4096 keys"
							 : "not a 40-character Z85 public key");
	memcpy(kl->keys[kl->n], line, n + 1);
	return key_models(rest, producers, path, lineno, &kl->models[kl->n++]);
}

static int load_keys(const char *path, struct key_list *kl, int producers)
{
	char line[4096 + 64];
	FILE *f;
	int lineno = 0, rc = 0;

	if (!path)
		return 0;
	kl->given = 1;
	if (!(kl->keys = calloc(AUTH_MAX_KEYS, sizeof(*kl->keys))) ||
	    !(kl->models = calloc(AUTH_MAX_KEYS, sizeof(*kl->models))))
		return dcast_fail(DCAST_ENOMEM, "key list '%s'", path);
	if (!(f = fopen(path, "r")))
		return dcast_fail(DCAST_EIO, "key list '%s': %s", path, strerror(errno));
	while (!rc && fgets(line, sizeof(line), f))
		rc = key_line(kl, line, producers, path, ++lineno);
	fclose(f);
	if (!rc)
		DCAST_LOG_I("auth: %u key(s) from '%s'", kl->n, path);
	return rc;
}

/* Index of a key in the list, -1 if absent. */
static int key_find(const struct key_list *kl, const char *z85)
{
	for (unsigned i = 0; i < kl->n; i++)
		if (!strcmp(kl->keys[i], z85))
			return (int)i;
	return -1;
}

static int key_listed(const struct key_list *kl, const char *z85)
{
	return key_find(kl, z85) >= 0;
}

/* 1 when `model` is an item of the comma-separated list. */
static int list_has(const char *list, const char *model)
{
	size_t n = strlen(model);

	for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (!strncmp(p, model, n) && (p[n] == ',' || p[n] == '\0'))
			return 1;
	return 0;
}

int broker_auth_producer_model(const struct broker *b, const char *user_id, const char *model)
{
	const struct broker_auth *auth = b->auth;
	int i;

	if (!auth)
		return 0;
	i = key_find(&auth->producers, user_id);
	if (i < 0)
		return dcast_fail(DCAST_EAUTH, "producer HELLO for model \"%s\": the connection "
				  "has no listed CURVE key", model);
	if (auth->producers.models[i] && !list_has(auth->producers.models[i], model))
		return dcast_fail(DCAST_EAUTH, "producer key %s may not publish model \"%s\" "
				  "(its --producer-keys line allows: %s)", user_id, model,
				  auth->producers.models[i]);
	return 0;
}

/* Decide one ZAP request: 1 admit, 0 refuse. */
static int zap_decide(const struct broker_auth *auth, const char *domain, const char *mechanism,
		      const uint8_t *key, size_t key_len, char *z85)
{
	strcpy(z85, "?");
	if (strcmp(mechanism, "CURVE") || key_len != 32 || !zmq_z85_encode(z85, key, 32))
		return 0;
	if (!strcmp(domain, "producers"))
		return key_listed(&auth->producers, z85);
	if (!strcmp(domain, "consumers"))
		return !auth->consumers.given || key_listed(&auth->consumers, z85);
	return 0;
}

static void frame_str(zmq_msg_t *m, char *out, size_t cap)
{
	size_t n = zmq_msg_size(m) < cap - 1 ? zmq_msg_size(m) : cap - 1;

	memcpy(out, zmq_msg_data(m), n);
	out[n] = '\0';
}

/* The user id of an admitted peer is its Z85 public key: every message it
 * sends carries it (zmq_msg_gets "User-Id", dcast_wire_in.user_id), which
 * ties a key to the models its line lists. */
static void zap_reply(void *sock, zmq_msg_t *req_id, int ok, const char *z85)
{
	const char *status = ok ? "200" : "400", *text = ok ? "OK" : "key not listed";

	zmq_send(sock, "1.0", 3, ZMQ_SNDMORE);
	zmq_send(sock, zmq_msg_data(req_id), zmq_msg_size(req_id), ZMQ_SNDMORE);
	zmq_send(sock, status, 3, ZMQ_SNDMORE);
	zmq_send(sock, text, strlen(text), ZMQ_SNDMORE);
	zmq_send(sock, z85, ok ? strlen(z85) : 0, ZMQ_SNDMORE);
	zmq_send(sock, "", 0, 0);
}

/* Receive one request (all its frames); returns frames read, -1 on ETERM. */
static int zap_recv(void *sock, zmq_msg_t *f)
{
	int n = 0, more = 1;

	while (more) {
		zmq_msg_t scratch, *m = n < AUTH_ZAP_FRAMES ? &f[n] : &scratch;

		zmq_msg_init(m);
		if (zmq_msg_recv(m, sock, 0) < 0) {
			zmq_msg_close(m);
			return errno == ETERM ? -1 : n;
		}
		more = zmq_msg_more(m);
		if (m == &scratch)
			zmq_msg_close(m);
		else
			n++;
	}
	return n;
}

static void *zap_thread(void *arg)
{
	struct broker_auth *auth = arg;
	void *sock = auth->zap;
	zmq_msg_t f[AUTH_ZAP_FRAMES];
	int n;

	while ((n = zap_recv(sock, f)) >= 0) {
		char domain[64] = "", mech[32] = "", addr[64] = "", z85[DCAST_Z85_KEY_LEN + 1];
		int ok = 0;

		if (n >= 7) {
			frame_str(&f[2], domain, sizeof(domain));
			frame_str(&f[3], addr, sizeof(addr));
			frame_str(&f[5], mech, sizeof(mech));
			ok = zap_decide(auth, domain, mech, zmq_msg_data(&f[6]), zmq_msg_size(&f[6]), z85);
		}
		if (n >= 2)
			zap_reply(sock, &f[1], ok, z85);
		if (!ok) {
			atomic_fetch_add(&auth->refused, 1);
			DCAST_LOG_W("auth: refused %s peer %s: %s key %s not listed", domain, addr,
				    mech, z85);
		}
		for (int i = 0; i < n; i++)
			zmq_msg_close(&f[i]);
	}
	zmq_close(sock);
	return NULL;
}

static void keys_free(struct key_list *kl)
{
	for (unsigned i = 0; kl->models && i < kl->n; i++)
		free(kl->models[i]);
	free(kl->models);
	free(kl->keys);
}

static int auth_start(struct broker *b)
{
	const struct broker_config *c = &b->cfg;
	struct broker_auth *auth;
	int zero = 0, rc;

	if (!c->producer_keys)
		return dcast_fail(DCAST_EINVAL, "--curve-secret needs --producer-keys FILE "
				  "(the producer keys to admit)");
	if (!(auth = b->auth = calloc(1, sizeof(*auth))))
		return dcast_fail(DCAST_ENOMEM, "auth state");
	if ((rc = dcast_curve_read_secret(c->curve_secret, auth->secret, auth->public_z85)) ||
	    (rc = load_keys(c->producer_keys, &auth->producers, 1)) ||
	    (rc = load_keys(c->consumer_keys, &auth->consumers, 0)))
		return rc;
	auth->zap = zmq_socket(b->ctx, ZMQ_REP);
	if (!auth->zap || zmq_setsockopt(auth->zap, ZMQ_LINGER, &zero, sizeof(zero)) ||
	    zmq_bind(auth->zap, "inproc://zeromq.zap.01"))
		rc = dcast_fail(DCAST_EZMQ, "ZAP handler: %s", zmq_strerror(errno));
	else if (pthread_create(&auth->thread, NULL, zap_thread, auth))
		rc = dcast_fail(DCAST_ENOMEM, "ZAP handler thread");
	if (rc) { /* the context cannot terminate while the socket is open */
		if (auth->zap)
			zmq_close(auth->zap);
		auth->zap = NULL;
		return rc;
	}
	auth->thread_on = 1;
	DCAST_LOG_I("auth: CURVE on; server public key %s; consumers %s", auth->public_z85,
		    auth->consumers.given ? "listed only" : "any CURVE client");
	return 0;
}

void broker_auth_close(struct broker *b)
{
	struct broker_auth *auth = b->auth;

	if (!auth)
		return;
	DCAST_ASSERT(!b->ctx); /* terminated: the ZAP thread's recv ended, it closed its socket */
	if (auth->thread_on)
		pthread_join(auth->thread, NULL);
	keys_free(&auth->producers);
	keys_free(&auth->consumers);
	free(auth);
	b->auth = NULL;
}

/* The relay's DEALER: a CURVE client of the upstream with
 * --upstream-server-key and --upstream-curve-secret (both or neither:
 * broker_config_check), plain without them. */
static int upstream_client(const struct broker *b, void *sock)
{
	const struct broker_config *c = &b->cfg;
	int rc;

	if (!c->upstream_server_key) {
		if (c->curve_secret)
			DCAST_LOG_W("auth: the --upstream connection is not CURVE-encrypted "
				    "(no --upstream-server-key)");
		return 0;
	}
	rc = dcast_curve_client_setup(sock, c->upstream_server_key, c->upstream_curve_secret);
	if (rc == DCAST_EINVAL)
		return dcast_fail(rc, "--upstream-server-key \"%s\": not a 40-character Z85 "
				  "public key", c->upstream_server_key);
	if (rc)
		return dcast_fail(rc, "--upstream-curve-secret: %s", dcast_last_error());
	return 0;
}

int broker_auth_socket(struct broker *b, void *sock, const char *which)
{
	const struct broker_config *c = &b->cfg;
	int one = 1, rc;

	if (!strcmp(which, "upstream"))
		return upstream_client(b, sock);
	if (!c->curve_secret)
		return c->producer_keys || c->consumer_keys
			       ? dcast_fail(DCAST_EINVAL, "--producer-keys/--consumer-keys need "
					    "--curve-secret FILE")
			       : 0;
	if (!b->auth && (rc = auth_start(b)))
		return rc;
	if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, which, strlen(which)) ||
	    zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) ||
	    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, b->auth->secret, DCAST_Z85_KEY_LEN))
		return dcast_fail(DCAST_EZMQ, "%s socket: CURVE options: %s", which,
				  zmq_strerror(errno));
	return 0;
}
