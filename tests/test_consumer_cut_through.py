"""The Python Consumer (the consumer library) behind a broker with
--cut-through, which sends an open version's chunks before its COMMIT:
- a producer holding inside version 3 (tests/tools/wire_client produce
  --hold-at): with commit_timeout_ms=300 the consumer drops what it
  staged of 3, says so (an "error" event DCAST_ETIMEDOUT naming 3) and
  counts it (stats().commit_timeouts), stays at 2, and applies 3 and 4
  once the producer goes on;
- reopened (the default timeout), a two-part version 5 whose part 1 dies
  inside it after chunks went out: the broker's ERROR
  DCAST_EABORTED makes the consumer drop 5 (an "error" event
  DCAST_EABORTED, stats().versions_aborted) and stay at 4; 5 published
  again applies."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import BUILD, procs, start_broker  # noqa: E402

from deltacast import Consumer  # noqa: E402
from deltacast._lib import error_code  # noqa: E402

WC = os.path.join(BUILD, "tools", "wire_client")


def produce(tmp, name, prod_ep, *args):
    """wire_client produce of model ct in the background, its stderr in
    tmp/name.err."""
    err = open(os.path.join(tmp, name + ".err"), "w")
    p = subprocess.Popen([WC, "produce", prod_ep, "ct", *args], stdout=err, stderr=err)
    procs.append(p)
    return p


def wait_for(what, cond, c=None, seconds=20):
    """Poll the consumer (applying what is READY) until cond() holds; the
    events seen on the way."""
    seen = []
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; events {seen}")
        if c is None:
            time.sleep(0.05)
            continue
        ev = c.poll(50)
        if ev:
            seen.append((ev.type, ev.version, ev.code))
        if ev and ev.type == "ready" and c.ready_version is not None:
            c.apply(c.ready_version)
    return seen


def logged(tmp, name, text):
    return lambda: text in open(os.path.join(tmp, name + ".err")).read()


def dropped(c, code, version, events):
    return any(t == "error" and v == version and k == code for t, v, k in events)


def commit_timeout(tmp, prod_ep, c):
    go = os.path.join(tmp, "go")
    p = produce(tmp, "p", prod_ep, "--versions", "4", "--hold-at", "3", "--hold-file", go)
    wait_for("version 2", lambda: c.version == 2, c)
    wait_for("the hold", logged(tmp, "p", "holding inside version 3"))
    events = wait_for("a COMMIT timeout", lambda: c.stats().commit_timeouts >= 1, c)
    assert c.version == 2, c.version
    open(go, "w").close()
    events += wait_for("version 4", lambda: c.version == 4, c)
    assert dropped(c, error_code("DCAST_ETIMEDOUT"), 3, events), events
    assert p.wait(20) == 0


def abort(tmp, prod_ep, c):
    wait_for("the stream", lambda: c.version == 4, c)
    received = c.bytes_received()
    p0 = produce(tmp, "p0", prod_ep, "--part", "0", "--parts", "2", "--versions", "5")
    p1 = produce(tmp, "p1", prod_ep, "--part", "1", "--parts", "2", "--versions", "5",
                 "--hold-at", "5", "--hold-file", os.path.join(tmp, "never"))
    wait_for("part 1 inside 5", logged(tmp, "p1", "holding inside version 5"))
    wait_for("chunks of 5", lambda: c.bytes_received() > received, c)
    assert c.stats().versions_aborted == 0
    p1.send_signal(signal.SIGKILL)  # silent: the broker drops it, and 5
    events = wait_for("the abort", lambda: c.stats().versions_aborted >= 1, c)
    assert dropped(c, error_code("DCAST_EABORTED"), 5, events), events
    assert p0.wait(20) == 3  # ERROR DCAST_EABORTED to the part still there
    assert c.version == 4, c.version
    for part in ("0", "1"):
        produce(tmp, "again" + part, prod_ep, "--part", part, "--parts", "2", "--versions", "5")
    wait_for("version 5", lambda: c.version == 5, c)


def main():
    tmp = tempfile.mkdtemp(prefix="dcast-cut-py-")
    try:
        # 1 s heartbeats: on a loaded machine a consumer that took a late
        # heartbeat for the broker's silence would reconnect, dropping 5
        # itself before the broker's abort reaches it
        prod_ep, cons_ep = start_broker(tmp, "--cut-through", "--heartbeat-ms", "1000",
                                        "--part-timeout-ms", "600000")
        d = os.path.join(tmp, "worker")
        c = Consumer(cons_ep, "ct", d, budget_bytes=8 << 20, commit_timeout_ms=300)
        commit_timeout(tmp, prod_ep, c)
        c.close()
        # reopened from its dir at 4, with the default timeout: only the
        # broker's abort drops what it stages of 5
        c = Consumer(cons_ep, "ct", d, budget_bytes=8 << 20)
        abort(tmp, prod_ep, c)
        c.close()
        print("test_consumer_cut_through: ok")
    except AssertionError:
        print(open(os.path.join(tmp, "broker.log")).read()[-3000:], file=sys.stderr)
        raise
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if not os.environ.get("KEEP_TMP"):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
