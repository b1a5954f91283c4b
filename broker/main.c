/* deltacast-broker: parse the configuration, open the sockets, run the loop
 * until SIGTERM or SIGINT, close everything.  Exit 0 on a clean shutdown,
 * 2 on a configuration error, 1 on a runtime failure. */
#include <string.h>
#include "broker.h"
#include "dcast_common.h"
#include "limits.h" /* the open-file limit (broker/limits.c) */

static int log_level_set(const char *name)
{
	static const char *names[] = {"error", "warn", "info", "debug"};

	for (int i = 0; i < 4; i++)
		if (!strcmp(name, names[i])) {
			dcast_log_set_level(i);
			return 0;
		}
	return dcast_fail(DCAST_EINVAL, "--log-level: \"%s\" is not error, warn, info or debug", name);
}

int main(int argc, char **argv)
{
	struct broker_config cfg;
	static struct broker b;
	int rc = broker_config_parse(&cfg, argc, argv);

	if (rc == BROKER_CONFIG_HELP) {
		broker_config_usage(stdout);
		broker_config_free();
		return 0;
	}
	if (rc || (rc = broker_config_check(&cfg)) || (rc = log_level_set(cfg.log_level))) {
		fprintf(stderr, "deltacast-broker: %s\n", dcast_last_error());
		broker_config_free();
		return 2;
	}
	broker_limits_nofile(&cfg);
	broker_limits_memory(&cfg);
	rc = broker_open(&b, &cfg);
	if (rc)
		DCAST_LOG_E("start: %s", dcast_last_error());
	else if ((rc = broker_run(&b)))
		DCAST_LOG_E("loop: %s", dcast_last_error());
	broker_close(&b);
	broker_config_free();
	DCAST_LOG_I("stopped");
	return rc ? 1 : 0;
}
