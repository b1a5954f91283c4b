/* deltacast diff: how NEW differs from BASE, per tensor and in total:
 * changed elements, payload bytes of every encoding over fixed chunks of
 * CLI_CHUNK_ELEMS, the bytes the codec picks, the entropy bound, encode and
 * apply throughput against memcpy of the same bytes in the same run, and a
 * check that decoding reproduces NEW exactly. */
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "deltacast/codec.h"
#include "histogram.h"

#define CMD "diff"

static const char usage_text[] =
	"usage: deltacast diff BASE.safetensors NEW.safetensors [--json]\n"
	"Per tensor and in total: elements, changed, density, payload bytes of each\n"
	"encoding (chunks of 2^20 elements), bytes chosen, bits per changed element,\n"
	"the entropy bound, encode/apply/memcpy throughput in GB/s of NEW's bytes, and\n"
	"whether decoding reproduced NEW exactly.  --json prints one JSON object.\n"
	"Exit status: 0 when the round trip is exact, 1 otherwise or on error.\n";

typedef struct tensor_diff {
	const char *name;
	const char *dtype;
	uint64_t elements, changed, nbytes;
	uint64_t sizes[DCAST_ENC_COUNT];
	uint64_t bytes_chosen;
	double entropy_bits; /* positions + value changes of this tensor */
	double encode_s, apply_s, memcpy_s;
	int exact;
} tensor_diff;

/* Buffers reused across tensors, and the value histogram of all tensors. */
typedef struct diff_run {
	cli_hist values;
	unsigned char *payload, *work;
	size_t payload_cap, work_cap;
	dcast_chunk_info *infos;
	size_t infos_cap;
} diff_run;

static int ensure(void **buf, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	void *p = realloc(*buf, need);
	if (!p)
		return cli_fail(DCAST_ENOMEM, "out of memory (%zu bytes)", need);
	*buf = p;
	*cap = need;
	return 0;
}

static uint32_t load_elem(const unsigned char *p, unsigned es)
{
	uint32_t v = 0;
	memcpy(&v, p, es); /* little-endian host */
	return v;
}

/* n * H(changed / n): the bits any code needs for the positions. */
static double position_bits(uint64_t n, uint64_t changed)
{
	if (!changed || changed == n)
		return 0.0;
	double p = (double)changed / (double)n;
	return (double)n * -(p * log2(p) + (1 - p) * log2(1 - p));
}

/* Histogram of exact differences of sortable images, keyed with the size. */
static void count_values(const unsigned char *cur, const unsigned char *base, uint64_t count,
			 unsigned es, cli_hist *h)
{
	unsigned w = 8 * es;
	for (uint64_t i = 0; i < count; i++) {
		const unsigned char *c = cur + i * es, *b = base + i * es;
		if (memcmp(c, b, es) == 0)
			continue;
		int64_t d = (int64_t)cli_sortable(load_elem(c, es), w) -
			    (int64_t)cli_sortable(load_elem(b, es), w);
		cli_hist_add(h, d * 8 + es, 1);
	}
}

static int sizes_pass(const unsigned char *cur, const unsigned char *base, uint64_t count,
		      unsigned es, tensor_diff *td)
{
	for (uint64_t at = 0; at < count; at += CLI_CHUNK_ELEMS) {
		uint64_t n = count - at < CLI_CHUNK_ELEMS ? count - at : CLI_CHUNK_ELEMS;
		uint64_t sizes[DCAST_ENC_COUNT], changed = 0;
		int err = dcast_codec_sizes(cur + at * es, base + at * es, n, es, sizes, &changed);
		if (err)
			return err;
		for (int e = 0; e < DCAST_ENC_COUNT; e++)
			td->sizes[e] += sizes[e];
		td->changed += changed;
	}
	return 0;
}

static uint64_t chunk_count(uint64_t count)
{
	return (count + CLI_CHUNK_ELEMS - 1) / CLI_CHUNK_ELEMS;
}

/* Encode every chunk (smallest encoding) into r->payload, timed. */
static int encode_pass(diff_run *r, const unsigned char *cur, unsigned char *base, uint64_t count,
		       unsigned es, tensor_diff *td)
{
	uint64_t chunks = chunk_count(count);
	size_t cap = (size_t)chunks * dcast_codec_bound(CLI_CHUNK_ELEMS, es);
	int err = ensure((void **)&r->payload, &r->payload_cap, cap + 1);
	if (!err)
		err = ensure((void **)&r->infos, &r->infos_cap, (chunks + 1) * sizeof(*r->infos));
	size_t used = 0;
	double t0 = cli_now_s();
	for (uint64_t c = 0; c < chunks && !err; c++) {
		uint64_t at = c * CLI_CHUNK_ELEMS, n = count - at < CLI_CHUNK_ELEMS ? count - at : CLI_CHUNK_ELEMS;
		err = dcast_codec_encode(cur + at * es, base + at * es, n, es, -1, 0, r->payload + used,
					 cap - used, &r->infos[c]);
		used += err ? 0 : r->infos[c].payload_bytes;
	}
	td->encode_s = cli_now_s() - t0;
	td->bytes_chosen = used;
	return err;
}

/* memcpy of NEW's bytes, then BASE + every payload, both timed; compare. */
static int apply_pass(diff_run *r, const unsigned char *cur, const unsigned char *base,
		      uint64_t count, unsigned es, tensor_diff *td)
{
	size_t nbytes = (size_t)(count * es);
	int err = ensure((void **)&r->work, &r->work_cap, nbytes + 1);
	if (err)
		return err;
	memcpy(r->work, base, nbytes); /* fault the pages in before timing */
	double t0 = cli_now_s();
	memcpy(r->work, cur, nbytes);
	td->memcpy_s = cli_now_s() - t0;
	memcpy(r->work, base, nbytes);
	size_t off = 0;
	t0 = cli_now_s();
	for (uint64_t c = 0; c < chunk_count(count) && !err; c++) {
		err = dcast_codec_apply(&r->infos[c], r->payload + off, r->work + c * CLI_CHUNK_ELEMS * es,
					NULL);
		off += r->infos[c].payload_bytes;
	}
	td->apply_s = cli_now_s() - t0;
	td->exact = !err && memcmp(r->work, cur, nbytes) == 0;
	return err;
}

static int diff_tensor(diff_run *r, const dcast_st_tensor *b, const dcast_st_tensor *t,
		       tensor_diff *td)
{
	unsigned es = cli_codec_elem_size(t);
	uint64_t count = t->nbytes / es;
	const unsigned char *cur = t->data;
	unsigned char *base = (unsigned char *)b->data; /* encode without UPDATE_BASE: read only */
	cli_hist values = {0};
	*td = (tensor_diff){.name = t->name, .dtype = dcast_st_dtype_name(t->dtype),
			    .elements = count, .nbytes = t->nbytes};
	int err = sizes_pass(cur, base, count, es, td);
	if (!err) {
		count_values(cur, base, count, es, &values);
		td->entropy_bits = position_bits(count, td->changed) + cli_hist_bits(&values);
		cli_hist_merge(&r->values, &values);
		err = values.failed ? cli_fail(DCAST_ENOMEM, "out of memory (histogram)") : 0;
	}
	cli_hist_free(&values);
	if (!err)
		err = encode_pass(r, cur, base, count, es, td);
	if (!err)
		err = apply_pass(r, cur, base, count, es, td);
	return err;
}

/* Totals of all tensors; the value entropy is over all changed elements. */
static tensor_diff total_of(const tensor_diff *tds, size_t n, const diff_run *r)
{
	tensor_diff tot = {.name = "total", .dtype = "", .exact = 1};
	double pos = 0.0;
	for (size_t i = 0; i < n; i++) {
		const tensor_diff *d = &tds[i];
		tot.elements += d->elements, tot.changed += d->changed, tot.nbytes += d->nbytes;
		for (int e = 0; e < DCAST_ENC_COUNT; e++)
			tot.sizes[e] += d->sizes[e];
		tot.bytes_chosen += d->bytes_chosen;
		tot.encode_s += d->encode_s, tot.apply_s += d->apply_s, tot.memcpy_s += d->memcpy_s;
		tot.exact &= d->exact;
		pos += position_bits(d->elements, d->changed);
	}
	tot.entropy_bits = pos + cli_hist_bits(&r->values);
	return tot;
}

static double gbps(uint64_t bytes, double s)
{
	return s > 0 ? (double)bytes / s / 1e9 : 0.0;
}

static double bits_per_changed(const tensor_diff *d)
{
	return d->changed ? 8.0 * (double)d->bytes_chosen / (double)d->changed : 0.0;
}

static void print_json_fields(const tensor_diff *d)
{
	printf("\"elements\":%llu,\"changed\":%llu,\"density\":%.9g,\"bytes\":{",
	       (unsigned long long)d->elements, (unsigned long long)d->changed,
	       d->elements ? (double)d->changed / (double)d->elements : 0.0);
	for (int e = 0; e < DCAST_ENC_COUNT; e++)
		printf("%s\"%s\":%llu", e ? "," : "", dcast_encoding_name(e),
		       (unsigned long long)d->sizes[e]);
	printf("},\"bytes_chosen\":%llu,\"bits_per_changed\":%.6g,\"entropy_bound_bytes\":%.0f,"
	       "\"new_bytes\":%llu,\"encode_gbps\":%.4g,\"apply_gbps\":%.4g,\"memcpy_gbps\":%.4g,"
	       "\"exact\":%s",
	       (unsigned long long)d->bytes_chosen, bits_per_changed(d), ceil(d->entropy_bits / 8),
	       (unsigned long long)d->nbytes, gbps(d->nbytes, d->encode_s),
	       gbps(d->nbytes, d->apply_s), gbps(d->nbytes, d->memcpy_s),
	       d->exact ? "true" : "false");
}

static void print_json(const tensor_diff *tds, size_t n, const tensor_diff *tot)
{
	printf("{");
	print_json_fields(tot);
	printf(",\"chunk_elems\":%u,\"tensors\":[", CLI_CHUNK_ELEMS);
	for (size_t i = 0; i < n; i++) {
		printf("%s{\"name\":", i ? "," : "");
		cli_print_json_string(stdout, tds[i].name);
		printf(",\"dtype\":\"%s\",", tds[i].dtype);
		print_json_fields(&tds[i]);
		printf("}");
	}
	printf("]}\n");
}

static void print_row(const tensor_diff *d)
{
	printf("%-48.48s %-5s %11llu %10llu %8.5f", d->name, d->dtype,
	       (unsigned long long)d->elements, (unsigned long long)d->changed,
	       d->elements ? (double)d->changed / (double)d->elements : 0.0);
	for (int e = 0; e < DCAST_ENC_COUNT; e++)
		printf(" %11llu", (unsigned long long)d->sizes[e]);
	printf(" %11llu %8.2f\n", (unsigned long long)d->bytes_chosen, bits_per_changed(d));
}

static void print_text(const tensor_diff *tds, size_t n, const tensor_diff *tot)
{
	printf("%-48s %-5s %11s %10s %8s", "tensor", "dtype", "elements", "changed", "density");
	for (int e = 0; e < DCAST_ENC_COUNT; e++)
		printf(" %11s", dcast_encoding_name(e));
	printf(" %11s %8s\n", "chosen", "bits/chg");
	for (size_t i = 0; i < n; i++)
		print_row(&tds[i]);
	print_row(tot);
	double bound = tot->entropy_bits / 8;
	printf("entropy bound: %.0f bytes (%.2f bits per changed element); chosen / bound = %.3f\n",
	       ceil(bound), tot->changed ? tot->entropy_bits / (double)tot->changed : 0.0,
	       bound > 0 ? (double)tot->bytes_chosen / bound : 0.0);
	double mc = gbps(tot->nbytes, tot->memcpy_s);
	printf("throughput, GB/s of NEW's %llu bytes: encode %.2f (%.2fx memcpy), apply %.2f "
	       "(%.2fx memcpy), memcpy %.2f\n",
	       (unsigned long long)tot->nbytes, gbps(tot->nbytes, tot->encode_s),
	       mc > 0 ? gbps(tot->nbytes, tot->encode_s) / mc : 0.0, gbps(tot->nbytes, tot->apply_s),
	       mc > 0 ? gbps(tot->nbytes, tot->apply_s) / mc : 0.0, mc);
	printf("round trip: %s\n", tot->exact ? "exact (decoding BASE + delta reproduces NEW bit for bit)"
					      : "MISMATCH (decoding did not reproduce NEW)");
}

static int diff_all(const cli_pair *p, int json)
{
	size_t n = dcast_st_count(p->cur);
	tensor_diff *tds = calloc(n + 1, sizeof(*tds));
	diff_run r = {0};
	int err = tds ? 0 : cli_fail(DCAST_ENOMEM, "out of memory");
	for (size_t i = 0; i < n && !err; i++)
		err = diff_tensor(&r, p->base_of[i], dcast_st_tensor_at(p->cur, i), &tds[i]);
	tensor_diff tot = {0};
	if (!err) {
		tot = total_of(tds, n, &r);
		if (json)
			print_json(tds, n, &tot);
		else
			print_text(tds, n, &tot);
	}
	free(tds);
	free(r.payload);
	free(r.work);
	free(r.infos);
	cli_hist_free(&r.values);
	return err ? err : tot.exact ? 0 : -1;
}

int cmd_diff(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int json = 0, c;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (c == 'h') {
			fputs(usage_text, stdout);
			return CLI_OK;
		}
		if (c != 'j')
			return cli_usage_error(CMD, "bad option");
		json = 1;
	}
	if (argc - optind != 2)
		return cli_usage_error(CMD, "needs BASE and NEW");
	cli_pair p;
	int err = cli_pair_open(argv[optind], argv[optind + 1], 1, &p);
	if (!err)
		err = diff_all(&p, json);
	cli_pair_close(&p);
	if (err < 0)
		fprintf(stderr, "deltacast diff: decoding did not reproduce NEW\n");
	return err > 0 ? cli_report(CMD, err) : err ? CLI_FAILED : CLI_OK;
}
