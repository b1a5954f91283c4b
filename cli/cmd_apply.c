#include "cli.h"
int cmd_apply(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return CLI_FAILED;
}
