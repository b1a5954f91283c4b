/* One consumer per directory.  Two consumers opened on one DIR were both
 * accepted, and wrote the same checkpoint files.  Now the second open is
 * refused with DCAST_EBUSY naming the directory and the first one's pid:
 * a second dcast_consumer_open in this process, and `deltacast subscribe`
 * (a real process) on the same DIR.  Closing the first frees DIR, and so
 * does the death of a holder (a subscribe killed with SIGKILL).  Real
 * broker over loopback. */
#include "check.h"
#include "deltacast/consumer.h"
#include "proc.h"

#define MODEL "lock"
#define BUDGET (4u << 20)

static char dir[] = "/tmp/dcast-test-dirlock-XXXXXX";
static tp_broker br;

/* Does the file at arg hold pid `want_pid` (DIR/lock of a holder)? */
static pid_t want_pid;
static int lock_names_pid(void *arg)
{
	char buf[32] = "";
	FILE *f = fopen(arg, "r");

	if (!f)
		return 0;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	fclose(f);
	return atoi(buf) == want_pid;
}

static pid_t subscribe(const char *err_path)
{
	static char bin[512];
	int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	pid_t pid;

	snprintf(bin, sizeof(bin), "%s/deltacast", tp_build());
	char *argv[] = {bin, "subscribe", "--broker", br.consumers, "--model", MODEL, "--dir", dir, NULL};
	REQUIRE(fd >= 0);
	pid = tp_spawn(argv, -1, fd);
	close(fd);
	REQUIRE(pid > 0);
	return pid;
}

static int exited(void *arg)
{
	pid_t *pid = arg;
	int st;

	if (waitpid(*pid, &st, WNOHANG) != *pid)
		return 0;
	tp_untrack(*pid);
	*pid = st; /* the status from here on */
	return 1;
}

int main(void)
{
	char err_path[600], lock_path[600], want[64], text[2048] = "";
	dcast_consumer *a = NULL, *b = NULL;
	pid_t sub;
	FILE *f;

	tp_install();
	REQUIRE(mkdtemp(dir));
	snprintf(br.log, sizeof(br.log), "%s.broker.log", dir);
	REQUIRE(tp_broker_start(&br) == 0);
	snprintf(err_path, sizeof(err_path), "%s.sub.err", dir);
	snprintf(lock_path, sizeof(lock_path), "%s/lock", dir);
	snprintf(want, sizeof(want), "pid %d holds", (int)getpid());

	printf("a second consumer in this process:\n");
	CHECK_ERR(dcast_consumer_open(br.consumers, MODEL, dir, BUDGET, NULL, &a), 0);
	CHECK_ERR(dcast_consumer_open(br.consumers, MODEL, dir, BUDGET, NULL, &b), DCAST_EBUSY);
	printf("  %s\n", dcast_last_error());
	CHECK(!b && strstr(dcast_last_error(), dir) && strstr(dcast_last_error(), want));

	printf("deltacast subscribe on the same directory:\n");
	sub = subscribe(err_path);
	CHECK(tp_wait_until(10000, exited, &sub));
	CHECK(WIFEXITED(sub) && WEXITSTATUS(sub) == 1);
	REQUIRE((f = fopen(err_path, "r")));
	if (!fgets(text, sizeof(text), f))
		text[0] = '\0';
	fclose(f);
	printf("  %s", text);
	CHECK(strstr(text, "DCAST_EBUSY") || strstr(text, "in use"));
	CHECK(strstr(text, dir) && strstr(text, want));

	printf("closed, the directory is free; a holder that dies frees it too:\n");
	dcast_consumer_close(&a);
	sub = subscribe(err_path);
	want_pid = sub;
	CHECK(tp_wait_until(10000, lock_names_pid, lock_path)); /* subscribe holds DIR */
	CHECK_ERR(dcast_consumer_open(br.consumers, MODEL, dir, BUDGET, NULL, &b), DCAST_EBUSY);
	kill(sub, SIGKILL);
	waitpid(sub, NULL, 0);
	tp_untrack(sub);
	CHECK_ERR(dcast_consumer_open(br.consumers, MODEL, dir, BUDGET, NULL, &b), 0);
	dcast_consumer_close(&b);

	tp_broker_kill(&br, SIGTERM);
	if (!check_failures) {
		unlink(err_path);
		unlink(br.log);
	}
	check_remove_dir(dir);
	return check_done("test_consumer_dirlock");
}
