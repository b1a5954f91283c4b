/* Private: CURVE key files shared by the broker and the client libraries.
 * A secret key file holds the 40-character Z85 secret key on its first
 * line that is not empty and not a # comment; the public key is derived
 * from it (zmq_curve_public), so only one file is kept per identity. */
#ifndef DCAST_CURVE_H
#define DCAST_CURVE_H

#include <stddef.h>

#define DCAST_Z85_KEY_LEN 40

/* Read a Z85 secret key from `path` into secret (41 bytes, NUL-terminated)
 * and derive its public key into public_z85 (41 bytes) when not NULL.
 * Errors: DCAST_EIO (cannot read, naming the file), DCAST_EMALFORMED (no
 * 40-character Z85 key in it, naming the file and line). */
int dcast_curve_read_secret(const char *path, char *secret, char *public_z85);

/* Make a DEALER a CURVE client of a broker: the server's public key
 * (Z85, 40 characters) and this client's secret key file.  Call before
 * zmq_connect.  Errors: DCAST_EINVAL (server key not 40 Z85 characters),
 * dcast_curve_read_secret's, DCAST_EZMQ (libzmq without CURVE support). */
int dcast_curve_client_setup(void *sock, const char *server_public_z85, const char *secret_file);

#endif
