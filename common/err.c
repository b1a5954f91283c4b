/* Error codes, their text, and the per-thread detail message. */
#include <stdarg.h>
#include <string.h>
#include "dcast_common.h"

static const struct {
	const char *name;
	const char *text;
} err_table[DCAST_ERR_COUNT] = {
	[DCAST_OK] = {"DCAST_OK", "success"},
	[DCAST_EINVAL] = {"DCAST_EINVAL", "invalid argument"},
	[DCAST_ENOMEM] = {"DCAST_ENOMEM", "out of memory"},
	[DCAST_ETRUNCATED] = {"DCAST_ETRUNCATED", "truncated input"},
	[DCAST_EMALFORMED] = {"DCAST_EMALFORMED", "malformed input"},
	[DCAST_EPROTO_VERSION] = {"DCAST_EPROTO_VERSION", "unsupported protocol version"},
	[DCAST_EMSG_TYPE] = {"DCAST_EMSG_TYPE", "unknown message type"},
	[DCAST_EFIELD_MISSING] = {"DCAST_EFIELD_MISSING", "required field missing"},
	[DCAST_EFIELD_TYPE] = {"DCAST_EFIELD_TYPE", "field has wrong type"},
	[DCAST_EFIELD_RANGE] = {"DCAST_EFIELD_RANGE", "field out of range"},
	[DCAST_EFIELD_UNKNOWN] = {"DCAST_EFIELD_UNKNOWN", "unknown field"},
	[DCAST_ETOO_LARGE] = {"DCAST_ETOO_LARGE", "exceeds size limit"},
	[DCAST_EPAYLOAD_SIZE] = {"DCAST_EPAYLOAD_SIZE", "payload size mismatch"},
	[DCAST_ECHECKSUM] = {"DCAST_ECHECKSUM", "checksum mismatch"},
	[DCAST_ECORRUPT] = {"DCAST_ECORRUPT", "corrupt data"},
	[DCAST_EDIGEST] = {"DCAST_EDIGEST", "digest mismatch"},
	[DCAST_EDTYPE] = {"DCAST_EDTYPE", "unsupported dtype"},
	[DCAST_ESHAPE] = {"DCAST_ESHAPE", "shape mismatch"},
	[DCAST_ENOTFOUND] = {"DCAST_ENOTFOUND", "not found"},
	[DCAST_EVERSION] = {"DCAST_EVERSION", "bad model version"},
	[DCAST_EGAP] = {"DCAST_EGAP", "version gap"},
	[DCAST_ESTATE] = {"DCAST_ESTATE", "invalid state"},
	[DCAST_ETIMEDOUT] = {"DCAST_ETIMEDOUT", "timed out"},
	[DCAST_ECLOSED] = {"DCAST_ECLOSED", "closed or unreachable"},
	[DCAST_EIO] = {"DCAST_EIO", "I/O error"},
	[DCAST_EZMQ] = {"DCAST_EZMQ", "ZeroMQ error"},
	[DCAST_EAUTH] = {"DCAST_EAUTH", "authentication refused"},
	[DCAST_ECUDA] = {"DCAST_ECUDA", "CUDA error"},
	[DCAST_ENODEVICE] = {"DCAST_ENODEVICE", "no CUDA device"},
	[DCAST_EBUSY] = {"DCAST_EBUSY", "resource busy"},
	[DCAST_EABORTED] = {"DCAST_EABORTED", "version aborted"},
	[DCAST_EPOISONED] = {"DCAST_EPOISONED", "version poisoned"},
};

static _Thread_local char last_error[1024];

/* A detail cut at its buffer's end may end inside a UTF-8 sequence (a
 * name it quotes): drop the partial sequence, so the detail, which
 * reaches ERROR texts and logs, stays well-formed. */
static void utf8_trim(char *s, size_t len)
{
	size_t i = len;

	while (i > 0 && ((unsigned char)s[i - 1] & 0xc0) == 0x80)
		i--;
	if (i > 0 && (unsigned char)s[i - 1] >= 0xc0) {
		unsigned char lead = (unsigned char)s[i - 1];
		size_t want = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2;
		if (len - (i - 1) < want)
			s[i - 1] = '\0';
	}
}

const char *dcast_strerror(int err)
{
	if (err < 0 || err >= DCAST_ERR_COUNT)
		return "unknown error";
	return err_table[err].text;
}

const char *dcast_errname(int err)
{
	if (err < 0 || err >= DCAST_ERR_COUNT)
		return "DCAST_EUNKNOWN";
	return err_table[err].name;
}

int dcast_err_from_name(const char *name)
{
	for (int i = 0; i < DCAST_ERR_COUNT; i++)
		if (strcmp(err_table[i].name, name) == 0)
			return i;
	return -1;
}

const char *dcast_last_error(void)
{
	return last_error;
}

void dcast_clear_error(void)
{
	last_error[0] = '\0';
}

int dcast_fail(int err, const char *fmt, ...)
{
	char text[sizeof(last_error)]; /* an argument may be dcast_last_error() itself */
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (n >= (int)sizeof(text))
		utf8_trim(text, sizeof(text) - 1);
	memcpy(last_error, text, sizeof(text));
	return err;
}

const char *dcast_printable(char *out, size_t cap, const void *s, size_t len)
{
	const unsigned char *p = s;
	size_t n = 0;

	DCAST_ASSERT(cap > 0);
	for (size_t i = 0; i < len && n + 5 <= cap; i++)
		n += (size_t)snprintf(out + n, cap - n, p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' &&
				      p[i] != '"' ? "%c" : "\\x%02x", p[i]);
	out[n] = '\0';
	return out;
}
