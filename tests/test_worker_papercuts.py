"""The small edges of a worker's and a trainer's life, against a real
broker:
 - Producer.stats() before the first publish: version and acked_version
   None (not 2^64-1); Consumer.stats().version None before an apply.
 - A restarted trainer asks the broker for its newest committed version
   (Producer.broker_version: None for a new model, 3 after v1-v3) and
   publishes above it.
 - wait_version(v) that times out while v is READY but not applied says
   so (and names the version held); the backlog (Stats.ready_backlog,
   Consumer.backlog, ready_versions()) counts the READY versions, and one
   apply() of the newest takes all three.
 - tensor() of a BF16 tensor with as_numpy=True: the uint16 bit patterns
   (the path without torch)."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import raises, run_with_broker  # noqa: E402

import numpy as np  # noqa: E402

from deltacast import Consumer, DeltacastTimeout, Producer  # noqa: E402

DEADLINE_S = 20


def wait_ready(c, v):
    end = time.monotonic() + DEADLINE_S
    while v not in c.ready_versions():
        assert time.monotonic() < end, f"{v} not READY (have {c.ready_versions()})"
        c.poll(100)


def body(tmp, prod_ep, cons_ep):
    rng = np.random.default_rng(9)
    b = rng.integers(0, 1 << 16, size=(64, 32), dtype=np.uint16)  # bf16 bit patterns
    f = rng.standard_normal(1000).astype(np.float32)
    p = Producer(prod_ep, "edges")
    assert p.broker_version is None, p.broker_version
    p.register("b", b, dtype="bf16")
    p.register("f", f)
    st = p.stats()
    assert st.version is None and st.acked_version is None, st
    assert st.total_reconnects == 0 and "version=None" in repr(st), repr(st)
    for v in (1, 2, 3):
        f[v] += 1
        p.publish(v)
        p.wait(v, DEADLINE_S * 1000)
    assert p.stats().version == 3 and p.stats().acked_version == 3
    p.close()

    with Producer(prod_ep, "edges") as p:  # the trainer restarted
        assert p.broker_version == 3, p.broker_version
        p.register("b", b, dtype="bf16")
        p.register("f", f)
        with Consumer(cons_ep, "edges", os.path.join(tmp, "w"), budget_bytes=16 << 20) as c:
            assert c.stats().version is None
            wait_ready(c, 3)
            c.apply(3)
            assert c.backlog == 0 and c.ready_versions() == []
            for v in range(p.broker_version + 1, p.broker_version + 4):
                f[v] += 1
                b[0, v] ^= 1
                p.publish(v)
                p.wait(v, DEADLINE_S * 1000)
            wait_ready(c, 6)
            assert c.ready_versions() == [4, 5, 6] and c.backlog == 3, c.ready_versions()
            assert c.stats().ready_backlog == 3
            e = raises(DeltacastTimeout, "DCAST_ETIMEDOUT", lambda: c.wait_version(5, 50),
                       "version 5", "READY", "not applied", "hold 3")
            print(f"wait_version on a READY version: {e}")
            raises(DeltacastTimeout, "DCAST_ETIMEDOUT", lambda: c.wait_version(7, 50),
                   "version 7", "hold 3")
            c.apply(6)  # newest first: one call takes 4, 5 and 6
            assert c.version == 6 and c.backlog == 0 and c.stats().version == 6
            c.wait_version(6, 0)
            got = c.tensor("b", as_numpy=True)
            assert got.dtype == np.uint16 and np.array_equal(got, b)
            assert np.array_equal(c.tensor("f"), f)
            print("p.broker_version, stats, backlog 3 -> 0 in one apply, bf16 as bits: ok")


def main():
    run_with_broker("dcast-worker-papercuts-", body)
    print("test_worker_papercuts: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
