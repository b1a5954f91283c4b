/* deltacast: the command-line tool.  Dispatches `deltacast CMD ARGS...` to
 * cmd_<name>() through the table built from CLI_COMMANDS in cli.h. */
#include <string.h>

#include "cli.h"
#include "deltacast/schema.h" /* DCAST_PROTO_VERSION */

typedef struct cli_command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} cli_command;

#define CLI_ENTRY(fn, name, summary) {name, cmd_##fn, summary},
static const cli_command commands[] = {CLI_COMMANDS(CLI_ENTRY)};
#undef CLI_ENTRY

static void usage(FILE *to)
{
	fprintf(to, "usage: deltacast COMMAND [ARGS...]\n"
		    "       deltacast COMMAND --help\n"
		    "       deltacast --version\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(to, "  %-12s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return CLI_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return CLI_OK;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("deltacast %s (wire protocol %d)\n", DCAST_PACKAGE_VERSION, DCAST_PROTO_VERSION);
		return CLI_OK;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "deltacast: unknown command \"%s\"\n", argv[1]);
	usage(stderr);
	return CLI_USAGE;
}
