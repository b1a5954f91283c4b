"""No stale window: a worker restarted on its directory while the broker is
down reports no version and says it cannot reach the broker, then serves
the version once the broker is back and confirms the run.

A broker with a data dir; a trainer publishes v1, v2; a worker applies v2
and closes.  The broker is killed.  Reopened on the same directory:
 - Consumer.version is None (the checkpoint holds v2, unconfirmed), and
   wait_confirmed() raises DCAST_ECLOSED naming the broker's endpoint and
   the version loaded; so does wait_version(2), which does not return on
   the unconfirmed v2;
 - apply_all_ranks (one rank) serves no version;
 - engine.EngineWorker refuses to start, naming the broker.
The broker restarts on the same endpoints and data dir (the same run):
the consumer confirms and reports v2 without fetching anything, and a
worker then catches up to v3."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import (BUILD, bound_endpoints, procs, raises,  # noqa: E402
                                  run_with_broker)

import numpy as np  # noqa: E402

from deltacast import Consumer, DeltacastError, Producer, engine  # noqa: E402
from deltacast.worker import FileAgreement, apply_all_ranks  # noqa: E402

DEADLINE_S = 20
MODEL = "restart"


def start_at(tmp, prod_ep, cons_ep, data):
    """The broker again, on the endpoints it had, with its data dir."""
    log = os.path.join(tmp, "broker2.log")
    with open(log, "w") as f:
        p = subprocess.Popen([os.path.join(BUILD, "deltacast-broker"), "--producers", prod_ep,
                              "--consumers", cons_ep, "--data-dir", data], stdout=f, stderr=f)
    procs.append(p)
    end = time.monotonic() + 10
    while not bound_endpoints(log):
        assert p.poll() is None and time.monotonic() < end, open(log).read()
        time.sleep(0.02)
    return p


def body(tmp, prod_ep, cons_ep):
    broker = procs[-1]
    dir = os.path.join(tmp, "worker")
    w = np.arange(4096, dtype=np.float32)
    p = Producer(prod_ep, MODEL)
    p.register("w", w)
    for v in (1, 2):
        w[v * 7] += v
        p.publish(v)
        p.wait(v, DEADLINE_S * 1000)
    want2 = w.copy()
    with Consumer(cons_ep, MODEL, dir, budget_bytes=16 << 20) as c:
        c.wait_confirmed(DEADLINE_S * 1000)
        end = time.monotonic() + DEADLINE_S
        while c.ready_version != 2:
            assert time.monotonic() < end, "v2 not READY"
            c.poll(100)
        c.apply(2)
        c.checkpoint()
    p.close()
    broker.kill()
    broker.wait()

    with Consumer(cons_ep, MODEL, dir, budget_bytes=16 << 20) as c:
        assert c.version is None, f"an unconfirmed version is reported: {c.version}"
        assert c.run == 0 and not c.confirmed
        e = raises(DeltacastError, "DCAST_ECLOSED", lambda: c.wait_confirmed(300),
                   cons_ep, "down or unreachable", "version 2, loaded from", "is not reported")
        print(f"restarted, broker down: {e}")
        raises(DeltacastError, "DCAST_ECLOSED", lambda: c.wait_version(2, 300), cons_ep)
        served = apply_all_ranks(c, FileAgreement(os.path.join(tmp, "agree"), 0, 1))
        assert served.version is None and served.ranks == [None] and not served.applied, served
    e = raises(DeltacastError, "DCAST_ECLOSED",
               lambda: engine.EngineWorker(cons_ep, MODEL, dir, {"w": np.zeros(4096, np.float32)},
                                           timeout_ms=300, budget_bytes=16 << 20), cons_ep)
    print(f"engine worker, broker down: {e}")

    start_at(tmp, prod_ep, cons_ep, os.path.join(tmp, "data"))
    with Consumer(cons_ep, MODEL, dir, budget_bytes=16 << 20) as c:
        c.wait_version(2, DEADLINE_S * 1000)
        assert c.version == 2 and c.confirmed
        assert np.array_equal(c.tensor("w"), want2)
        assert c.stats().total_bytes_received == 0, "the confirmed state was fetched again"
    with Producer(prod_ep, MODEL) as p:
        p.register("w", w)
        w[3] += 1
        p.publish(3)
        p.wait(3, DEADLINE_S * 1000)
    params = {"w": np.zeros(4096, np.float32)}
    wk = engine.EngineWorker(cons_ep, MODEL, dir, params, timeout_ms=DEADLINE_S * 1000,
                             budget_bytes=16 << 20)
    try:
        assert wk.version == 2
        wk.apply(3)
        assert np.array_equal(params["w"], w)
    finally:
        wk.close()


def main():
    run_with_broker("dcast-worker-restart-", body, "--data-dir", "{tmp}/data")
    print("test_worker_restart: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
