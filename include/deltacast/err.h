/* deltacast error codes: one enum for the whole project, 0 is success.
 *
 * Every failing call returns a dcast_err and, on the calling thread, leaves a
 * detail message that names what was wrong (which field, which limit, which
 * file): read it with dcast_last_error().  dcast_strerror() gives the fixed
 * text of a code.  io_uring and syscall results travel as -errno inside the
 * libraries and become DCAST_EIO (with strerror text in the detail) here. */
#ifndef DELTACAST_ERR_H
#define DELTACAST_ERR_H

#include "deltacast/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dcast_err {
	DCAST_OK = 0,
	DCAST_EINVAL,         /* bad argument from the caller */
	DCAST_ENOMEM,         /* allocation failed */
	DCAST_ETRUNCATED,     /* buffer ends before the message does */
	DCAST_EMALFORMED,     /* not well-formed msgpack / JSON / file layout */
	DCAST_EPROTO_VERSION, /* protocol version this build does not speak */
	DCAST_EMSG_TYPE,      /* unknown message type */
	DCAST_EFIELD_MISSING, /* a required field is absent */
	DCAST_EFIELD_TYPE,    /* a field has the wrong msgpack type */
	DCAST_EFIELD_RANGE,   /* a field's value is out of its allowed range */
	DCAST_EFIELD_UNKNOWN, /* a field this message type does not define */
	DCAST_ETOO_LARGE,     /* a string, array or buffer exceeds its limit */
	DCAST_EPAYLOAD_SIZE,  /* payload frame length differs from the header */
	DCAST_ECHECKSUM,      /* payload (CHUNK) or MANIFEST sum mismatch */
	DCAST_ECORRUPT,       /* a payload or file fails a structural check */
	DCAST_EDIGEST,        /* tensor digest differs from the producer's */
	DCAST_EDTYPE,         /* dtype the codec cannot take */
	DCAST_ESHAPE,         /* tensor shape or size mismatch */
	DCAST_ENOTFOUND,      /* no such tensor, model, version or file */
	DCAST_EVERSION,       /* model version not increasing / not expected */
	DCAST_EGAP,           /* a delta whose base is not the applied version */
	DCAST_ESTATE,         /* call not valid in the object's current state */
	DCAST_ETIMEDOUT,      /* deadline passed */
	DCAST_ECLOSED,        /* peer or object closed / unreachable */
	DCAST_EIO,            /* file or io_uring I/O failed */
	DCAST_EZMQ,           /* ZeroMQ call failed */
	DCAST_EAUTH,          /* peer refused by authentication */
	DCAST_ECUDA,          /* a CUDA call failed */
	DCAST_ENODEVICE,      /* no CUDA device where one was asked for */
	DCAST_EBUSY,          /* resource budget exhausted (staging, credit) */
	DCAST_EABORTED,       /* version dropped before it committed */
	DCAST_EPOISONED,      /* committed version the broker's check refused: never served */
	DCAST_ERR_COUNT
} dcast_err;

/* Fixed text of an error code ("field missing", ...).  Never NULL; unknown
 * codes give "unknown error".  The string is static. */
DCAST_API const char *dcast_strerror(int err);

/* Symbolic name of an error code ("DCAST_EFIELD_MISSING"), as used in test
 * vectors.  Never NULL; the string is static. */
DCAST_API const char *dcast_errname(int err);

/* Parse a symbolic name back to its code; returns -1 if unknown. */
DCAST_API int dcast_err_from_name(const char *name);

/* Detail message of the last error set on this thread, e.g.
 * "CHUNK.count: 70000000 exceeds DCAST_MAX_CHUNK_ELEMS (16777216)".
 * Empty string when none.  Valid until the next deltacast call on this
 * thread; copy it to keep it. */
DCAST_API const char *dcast_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
