/* CURVE key files and client set-up (dcast_curve.h). */
#include <errno.h>
#include <string.h>
#include <zmq.h>
#include "dcast_common.h"
#include "dcast_curve.h"

static int is_z85_key(const char *s, size_t n)
{
	uint8_t bin[32];
	char tmp[DCAST_Z85_KEY_LEN + 1];

	if (n != DCAST_Z85_KEY_LEN)
		return 0;
	memcpy(tmp, s, n);
	tmp[n] = '\0';
	return zmq_z85_decode(bin, tmp) != NULL;
}

int dcast_curve_read_secret(const char *path, char *secret, char *public_z85)
{
	char line[256];
	FILE *f = fopen(path, "r");
	int lineno = 0;

	if (!f)
		return dcast_fail(DCAST_EIO, "key file '%s': %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f) && ++lineno <= 1000) {
		size_t n = strcspn(line, " \t\r\n");

		if (!is_z85_key(line, n) && (n == 0 || line[0] == '#'))
			continue; /* a comment (Z85 itself may start with '#') */
		fclose(f);
		if (!is_z85_key(line, n))
			return dcast_fail(DCAST_EMALFORMED, "key file '%s' line %d: not a 40-character "
					  "Z85 secret key", path, lineno);
		memcpy(secret, line, n);
		secret[n] = '\0';
		if (public_z85 && zmq_curve_public(public_z85, secret))
			return dcast_fail(DCAST_EZMQ, "key file '%s': zmq_curve_public: %s", path,
					  zmq_strerror(errno));
		return 0;
	}
	fclose(f);
	return dcast_fail(DCAST_EMALFORMED, "key file '%s': no key in it", path);
}

int dcast_curve_client_setup(void *sock, const char *server_public_z85, const char *secret_file)
{
	char secret[DCAST_Z85_KEY_LEN + 1], pub[DCAST_Z85_KEY_LEN + 1];
	int rc;

	if (!server_public_z85 || !is_z85_key(server_public_z85, strlen(server_public_z85)))
		return dcast_fail(DCAST_EINVAL, "server public key: not 40 Z85 characters");
	if ((rc = dcast_curve_read_secret(secret_file, secret, pub)))
		return rc;
	if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_public_z85, DCAST_Z85_KEY_LEN) ||
	    zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, DCAST_Z85_KEY_LEN) ||
	    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, secret, DCAST_Z85_KEY_LEN))
		rc = dcast_fail(DCAST_EZMQ, "CURVE client options: %s", zmq_strerror(errno));
	memset(secret, 0, sizeof(secret));
	return rc;
}
