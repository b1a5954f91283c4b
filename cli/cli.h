/* Private header of the deltacast command-line tool: the command table and
 * helpers shared by the subcommands.  Adding a subcommand is one line in
 * CLI_COMMANDS plus its file cli/cmd_<name>.c defining cmd_<name>(). */
#ifndef DCAST_CLI_H
#define DCAST_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "deltacast/err.h"
#include "deltacast/safetensors.h"

/* X(function suffix, command name, one-line summary) */
#define CLI_COMMANDS(X)                                                                   \
	X(gen_trace, "gen-trace", "write a synthetic RL training trace of bf16 checkpoints")  \
	X(diff, "diff", "measure the delta between two checkpoints: sizes, entropy, speed")  \
	X(delta, "delta", "encode NEW against BASE into a patch file")                      \
	X(apply, "apply", "apply a patch file to BASE, writing a checkpoint equal to NEW") \
	X(subscribe, "subscribe", "follow a model from a broker into DIR/model.safetensors") \
	X(publish, "publish", "publish checkpoints through a broker, each file the next version") \
	X(status, "status", "show a broker's models, consumers and counters from its /metrics") \
	X(keygen, "keygen", "write a CURVE key pair PREFIX.secret / PREFIX.public") \
	X(model, "model", "model delete NAME: remove a model from a running broker (--admin-socket)")

#define CLI_DECLARE(fn, name, summary) int cmd_##fn(int argc, char **argv);
CLI_COMMANDS(CLI_DECLARE)
#undef CLI_DECLARE

/* Exit statuses of every subcommand. */
enum { CLI_OK = 0, CLI_FAILED = 1, CLI_USAGE = 2 };

/* Element range of one chunk in diff and delta (codec elements). */
#define CLI_CHUNK_ELEMS (1u << 20)

/* The CLI uses only the public API (include/deltacast/): its own failures
 * carry their detail here.  cli_fail records a printf-style detail for
 * `err` on this thread and returns err, as the library's internal
 * dcast_fail does; cli_report prints it when the error it reports is that
 * code, else the library's dcast_last_error(). */
int cli_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Print "deltacast CMD: <error text>: <detail>" for err to stderr and
 * forget the CLI's detail; returns CLI_FAILED. */
int cli_report(const char *cmd, int err);

/* Write `len` bytes to fd at offset `off`, retrying short writes and EINTR;
 * `label` names the file in the error.  Errors: DCAST_EIO (cli_fail). */
int cli_pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *label);

#define CLI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Print a usage error for cmd ("deltacast CMD: what; see --help");
 * returns CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse "CMD A B -o OUT [--help]" for the two-input, one-output commands.
 * Returns -1 when the caller should go on (*out and argv[optind],
 * argv[optind + 1] set); otherwise the exit code to return (help printed,
 * or a usage error naming `needs`). */
int cli_parse_two_in_one_out(const char *cmd, const char *usage, const char *needs, int argc,
			     char **argv, const char **out);

/* Long name of the option whose getopt value is `val` ("?" if none). */
struct option;
const char *cli_option_name(const struct option *longopts, int val);

/* Parse a count with an optional suffix K, M, B/G, T (powers of 1000),
 * decimals allowed ("1.5B").  0 on success, -1 when malformed or zero. */
int cli_parse_count(const char *s, uint64_t *out);

/* Parse a finite double in [lo, hi]; 0 on success, -1 otherwise. */
int cli_parse_double(const char *s, double lo, double hi, double *out);

/* Parse --timeout-ms (milliseconds in [1, 600000]) for cmd.  Returns 0,
 * or CLI_USAGE after printing a usage error naming the value. */
int cli_parse_timeout_ms(const char *cmd, const char *s, long *out);

/* Print s as a JSON string literal (quotes, backslashes and control
 * characters escaped). */
void cli_print_json_string(FILE *to, const char *s);

/* A new string a + b + c (malloc'd: the caller frees it), or NULL when out
 * of memory. */
char *cli_concat(const char *a, const char *b, const char *c);

/* Seconds of the monotonic clock. */
double cli_now_s(void);

/* Progress of a long transfer on stderr: "WHAT: B MiB [of T MiB (P%)]
 * R MiB/s [ETA S s]" (of, percent and ETA only with a total; frac, in
 * [0, 1], stands for bytes done over total when the bytes alone do not
 * tell, as for a delta; -1 without).  On a terminal the line updates in
 * place (a carriage return), else one line each.  Never fails. */
void cli_progress_line(const char *what, uint64_t done, uint64_t total, double frac,
		       double secs, int tty);

/* Whether progress goes to stderr: --progress, or stderr is a terminal. */
int cli_progress_wanted(int forced);

/* Element size the codec works with for a dtype: 8-byte dtypes travel as
 * pairs of 4-byte words; 0 for unknown dtypes. */
unsigned cli_codec_elem_size(const dcast_st_tensor *t);

/* Two opened checkpoints, with NEW's tensors matched to BASE's by name. */
typedef struct cli_pair {
	dcast_st_file *base;
	dcast_st_file *cur;
	const dcast_st_tensor **base_of; /* per tensor of cur, in offset order; NULL
					    when BASE lacks it or its dtype/shape differ */
} cli_pair;

/* Open both files and match tensors.  If `strict`, every tensor of NEW must
 * be in BASE with the same dtype and shape and vice versa (DCAST_ESHAPE,
 * DCAST_ENOTFOUND otherwise).  On error everything is closed. */
int cli_pair_open(const char *base_path, const char *cur_path, int strict, cli_pair *p);
void cli_pair_close(cli_pair *p);

/* A new output file written through a temporary in the same directory:
 * cli_out_open creates `path`.tmp.XXXXXX; cli_out_commit fsyncs, closes and
 * renames it over path; cli_out_abort closes and removes it. */
typedef struct cli_out {
	int fd;
	char *tmp;
	const char *path;
} cli_out;

int cli_out_open(const char *path, cli_out *o);
int cli_out_commit(cli_out *o);
void cli_out_abort(cli_out *o);

#endif
