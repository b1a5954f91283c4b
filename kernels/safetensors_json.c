/* Strict recursive-descent JSON parser for safetensors headers (see
 * safetensors_json.h).  Strings are decoded into their own allocations;
 * object keys are checked for duplicates by sorting once per object. */
#include <stdlib.h>
#include <string.h>

#include "dcast_common.h"
#include "safetensors_json.h"

typedef struct json_parser {
	const char *start;
	const char *p;
	const char *end;
	const char *label;
	int depth;
} json_parser;

static int parse_value(json_parser *jp, dcast_json *out);

static int json_error(const json_parser *jp, const char *what)
{
	return dcast_fail(DCAST_EMALFORMED, "%s: header JSON at byte %zu: %s", jp->label,
			  (size_t)(jp->p - jp->start), what);
}

static void skip_ws(json_parser *jp)
{
	while (jp->p < jp->end &&
	       (*jp->p == ' ' || *jp->p == '\t' || *jp->p == '\n' || *jp->p == '\r'))
		jp->p++;
}

static int peek(json_parser *jp)
{
	skip_ws(jp);
	return jp->p < jp->end ? (unsigned char)*jp->p : -1;
}

static int expect(json_parser *jp, char c, const char *what)
{
	if (peek(jp) != (unsigned char)c)
		return json_error(jp, what);
	jp->p++;
	return 0;
}

void dcast_json_free(dcast_json *root)
{
	if (!root)
		return;
	for (size_t i = 0; i < root->nkids; i++)
		dcast_json_free(&root->kids[i]);
	free(root->kids);
	free(root->key);
	free(root->str);
	memset(root, 0, sizeof(*root));
}

/* Length of the valid UTF-8 sequence at s (n bytes available), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	size_t len;
	uint32_t cp;
	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		len = 2, cp = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		len = 3, cp = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		len = 4, cp = s[0] & 0x07;
	else
		return 0;
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

static int hex4(json_parser *jp, uint32_t *out)
{
	uint32_t v = 0;
	if (jp->end - jp->p < 4)
		return json_error(jp, "truncated \\u escape");
	for (int i = 0; i < 4; i++) {
		char c = *jp->p++;
		int d = c >= '0' && c <= '9'   ? c - '0'
			: c >= 'a' && c <= 'f' ? c - 'a' + 10
			: c >= 'A' && c <= 'F' ? c - 'A' + 10
					       : -1;
		if (d < 0)
			return json_error(jp, "bad hex digit in \\u escape");
		v = v << 4 | (uint32_t)d;
	}
	*out = v;
	return 0;
}

static size_t put_utf8(char *o, uint32_t cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
	o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* \uXXXX (already past the 'u'), joining a surrogate pair; writes UTF-8. */
static int unicode_escape(json_parser *jp, char *o, size_t *n)
{
	uint32_t cp, lo;
	int err = hex4(jp, &cp);
	if (err)
		return err;
	if (cp >= 0xdc00 && cp <= 0xdfff)
		return json_error(jp, "lone low surrogate in \\u escape");
	if (cp >= 0xd800 && cp <= 0xdbff) {
		if (jp->end - jp->p < 2 || jp->p[0] != '\\' || jp->p[1] != 'u')
			return json_error(jp, "high surrogate without low surrogate");
		jp->p += 2;
		if ((err = hex4(jp, &lo)))
			return err;
		if (lo < 0xdc00 || lo > 0xdfff)
			return json_error(jp, "bad low surrogate in \\u escape");
		cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
	}
	if (cp == 0)
		return json_error(jp, "NUL character in string");
	*n = put_utf8(o, cp);
	return 0;
}

static int escape(json_parser *jp, char *o, size_t *n)
{
	static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
	if (jp->p >= jp->end)
		return json_error(jp, "unterminated string");
	char c = *jp->p++;
	if (c == 'u')
		return unicode_escape(jp, o, n);
	const char *hit = c ? strchr(from, c) : NULL;
	if (!hit)
		return json_error(jp, "bad escape in string");
	*o = to[hit - from];
	*n = 1;
	return 0;
}

/* One source character (or escape) of a string body into o; *n bytes out. */
static int string_char(json_parser *jp, char *o, size_t *n)
{
	unsigned char c = (unsigned char)*jp->p;
	if (c == '\\') {
		jp->p++;
		return escape(jp, o, n);
	}
	if (c < 0x20)
		return json_error(jp, "control character in string");
	size_t len = utf8_len((const unsigned char *)jp->p, (size_t)(jp->end - jp->p));
	if (!len)
		return json_error(jp, "invalid UTF-8 in string");
	memcpy(o, jp->p, len);
	jp->p += len;
	*n = len;
	return 0;
}

/* Bytes from jp->p to the closing quote (or the end), skipping escapes. */
static size_t string_source_len(const json_parser *jp)
{
	const char *q = jp->p;
	while (q < jp->end && *q != '"')
		q += (*q == '\\' && q + 1 < jp->end) ? 2 : 1;
	return (size_t)(q - jp->p);
}

/* A string at jp->p (the opening quote is next); result malloc'd. */
static int parse_string(json_parser *jp, char **out, size_t *out_len)
{
	int err = expect(jp, '"', "expected a string");
	if (err)
		return err;
	/* Decoded text is never longer than its source. */
	char *buf = malloc(string_source_len(jp) + 1);
	if (!buf)
		return dcast_fail(DCAST_ENOMEM, "%s: header JSON: out of memory", jp->label);
	size_t len = 0;
	while (!err && jp->p < jp->end && *jp->p != '"') {
		size_t n = 0;
		err = string_char(jp, buf + len, &n);
		len += n;
	}
	if (!err && jp->p >= jp->end)
		err = json_error(jp, "unterminated string");
	if (err) {
		free(buf);
		return err;
	}
	jp->p++;
	buf[len] = '\0';
	*out = buf;
	*out_len = len;
	return 0;
}

static int parse_int(json_parser *jp, dcast_json *out)
{
	out->type = DCAST_JSON_INT;
	if (*jp->p == '-') {
		out->negative = 1;
		jp->p++;
	}
	if (jp->p >= jp->end || *jp->p < '0' || *jp->p > '9')
		return json_error(jp, "expected a digit");
	if (*jp->p == '0' && jp->p + 1 < jp->end && jp->p[1] >= '0' && jp->p[1] <= '9')
		return json_error(jp, "leading zero in integer");
	uint64_t v = 0;
	while (jp->p < jp->end && *jp->p >= '0' && *jp->p <= '9') {
		unsigned d = (unsigned)(*jp->p - '0');
		if (v > (UINT64_MAX - d) / 10)
			return json_error(jp, "integer does not fit in 64 bits");
		v = v * 10 + d;
		jp->p++;
	}
	if (jp->p < jp->end && (*jp->p == '.' || *jp->p == 'e' || *jp->p == 'E'))
		return json_error(jp, "non-integer number (not used in safetensors headers)");
	out->num = v;
	return 0;
}

/* Append a zeroed child to a container; returns it or NULL (ENOMEM set). */
static dcast_json *add_kid(json_parser *jp, dcast_json *c, size_t *cap)
{
	if (c->nkids == *cap) {
		size_t ncap = *cap ? *cap * 2 : 4;
		dcast_json *k = realloc(c->kids, ncap * sizeof(*k));
		if (!k) {
			dcast_fail(DCAST_ENOMEM, "%s: header JSON: out of memory", jp->label);
			return NULL;
		}
		c->kids = k;
		*cap = ncap;
	}
	dcast_json *kid = &c->kids[c->nkids++];
	memset(kid, 0, sizeof(*kid));
	return kid;
}

static int cmp_key(const void *a, const void *b)
{
	const dcast_json *x = *(const dcast_json *const *)a, *y = *(const dcast_json *const *)b;
	size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
	int c = memcmp(x->key, y->key, n);
	return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

static int check_duplicates(json_parser *jp, const dcast_json *obj)
{
	if (obj->nkids < 2)
		return 0;
	const dcast_json **idx = malloc(obj->nkids * sizeof(*idx));
	if (!idx)
		return dcast_fail(DCAST_ENOMEM, "%s: header JSON: out of memory", jp->label);
	for (size_t i = 0; i < obj->nkids; i++)
		idx[i] = &obj->kids[i];
	qsort(idx, obj->nkids, sizeof(*idx), cmp_key);
	int err = 0;
	for (size_t i = 1; i < obj->nkids && !err; i++)
		if (cmp_key(&idx[i - 1], &idx[i]) == 0)
			err = dcast_fail(DCAST_EMALFORMED, "%s: header JSON: duplicate key \"%.200s\"",
					 jp->label, idx[i]->key);
	free(idx);
	return err;
}

static int parse_member(json_parser *jp, dcast_json *obj, size_t *cap)
{
	dcast_json *kid = add_kid(jp, obj, cap);
	if (!kid)
		return DCAST_ENOMEM;
	int err = parse_string(jp, &kid->key, &kid->key_len);
	if (!err)
		err = expect(jp, ':', "expected ':' after object key");
	if (!err)
		err = parse_value(jp, kid);
	return err;
}

/* Members or items up to `close`, separated by commas. */
static int parse_container(json_parser *jp, dcast_json *out, char close)
{
	size_t cap = 0;
	int err = 0;
	jp->p++;
	if (peek(jp) == (unsigned char)close) {
		jp->p++;
		return 0;
	}
	for (;;) {
		if (close == '}') {
			err = parse_member(jp, out, &cap);
		} else {
			dcast_json *kid = add_kid(jp, out, &cap);
			err = kid ? parse_value(jp, kid) : DCAST_ENOMEM;
		}
		if (err)
			return err;
		int c = peek(jp);
		jp->p++;
		if (c == close)
			return close == '}' ? check_duplicates(jp, out) : 0;
		if (c != ',') {
			jp->p--;
			return json_error(jp, close == '}' ? "expected ',' or '}' in object"
							    : "expected ',' or ']' in array");
		}
	}
}

static int parse_value(json_parser *jp, dcast_json *out)
{
	int c = peek(jp);
	if (c == '"') {
		out->type = DCAST_JSON_STRING;
		return parse_string(jp, &out->str, &out->str_len);
	}
	if (c == '-' || (c >= '0' && c <= '9'))
		return parse_int(jp, out);
	if (c != '{' && c != '[')
		return json_error(jp, c < 0 ? "unexpected end of header"
					    : "expected an object, array, string or integer");
	if (jp->depth >= DCAST_JSON_MAX_DEPTH)
		return json_error(jp, "nesting too deep");
	jp->depth++;
	out->type = c == '{' ? DCAST_JSON_OBJECT : DCAST_JSON_ARRAY;
	int err = parse_container(jp, out, c == '{' ? '}' : ']');
	jp->depth--;
	return err;
}

int dcast_json_parse(const char *text, size_t len, const char *label, dcast_json *root)
{
	json_parser jp = {text, text, text + len, label ? label : "json", 0};
	memset(root, 0, sizeof(*root));
	int err = parse_value(&jp, root);
	if (!err && peek(&jp) >= 0)
		err = json_error(&jp, "trailing bytes after the header object");
	if (err)
		dcast_json_free(root);
	return err;
}

const dcast_json *dcast_json_get(const dcast_json *obj, const char *key)
{
	if (!obj || obj->type != DCAST_JSON_OBJECT)
		return NULL;
	size_t n = strlen(key);
	for (size_t i = 0; i < obj->nkids; i++)
		if (obj->kids[i].key_len == n && memcmp(obj->kids[i].key, key, n) == 0)
			return &obj->kids[i];
	return NULL;
}
