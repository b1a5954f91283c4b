#include "cli.h"
int cmd_delta(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return CLI_FAILED;
}
