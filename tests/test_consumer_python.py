"""The Python Consumer against the real broker and a Python Producer:
numpy arrays bound as live tensors receive an anchor and deltas bit-exact,
.version tags what they hold (apply with stream and event, the async
call, too: without a device it is the plain apply), a reopened consumer
resumes from its dir without the anchor, and bad input raises
DeltacastError with the C code.
(The example worker has its own end-to-end test: test_torch_rollout.py.)"""
import os
import shutil
import sys
import tempfile

# Shared with the producer's test: the sanitizer re-exec (runs on import)
# and the broker start-up on ports it picks and logs.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import procs, start_broker  # noqa: E402

import numpy as np  # noqa: E402

from deltacast import Consumer, DeltacastError, Producer  # noqa: E402


def drive(c, target, polls=400, **on_stream):
    for _ in range(polls):
        if c.version is not None and c.version >= target:
            return True
        ev = c.poll(100)
        if ev and ev.type == "ready" and c.ready_version is not None:
            c.apply(c.ready_version, **on_stream)
    return False


def step(rng, arrays):
    for a in arrays.values():
        flat = a.reshape(-1).view(np.uint8)
        idx = rng.integers(0, flat.size, size=max(1, flat.size // 200))
        flat[idx] ^= 1


def main():
    tmp = tempfile.mkdtemp(prefix="dcast-consumer-py-")
    try:
        prod_ep, cons_ep = start_broker(tmp)
        rng = np.random.default_rng(5)
        src = {"w": rng.integers(0, 1 << 16, size=(128, 512), dtype=np.uint16),
               "f": rng.standard_normal(50000).astype(np.float32)}
        snaps = {}
        p = Producer(prod_ep, "pym", range_elems=16384)
        p.register("w", src["w"], dtype="bf16")
        p.register("f", src["f"])
        p.publish(1)
        p.wait(1)
        snaps[1] = {k: v.copy() for k, v in src.items()}

        d = os.path.join(tmp, "worker")
        c = Consumer(cons_ep, "pym", d, budget_bytes=1 << 20)
        assert c.version is None
        for _ in range(100):
            if c.names():
                break
            c.poll(50)
        assert sorted(c.names()) == ["f", "w"], c.names()
        live = {"w": np.zeros((128, 512), np.uint16), "f": np.zeros(50000, np.float32)}
        for k, a in live.items():
            c.bind(k, a)
        try:
            c.bind("w", np.zeros(10, np.uint16))
            raise AssertionError("bind with the wrong size accepted")
        except DeltacastError as e:
            assert e.name in ("DCAST_ESHAPE", "DCAST_ESTATE"), e
        try:
            c.bind("nope", np.zeros(10, np.uint16))
            raise AssertionError("bind of an unknown tensor accepted")
        except DeltacastError as e:
            assert e.name == "DCAST_ENOTFOUND", e
        assert drive(c, 1)
        assert all(np.array_equal(live[k], snaps[1][k]) for k in live)
        for v in (2, 3):
            step(rng, src)
            p.publish(v)
            p.wait(v)
            snaps[v] = {k: a.copy() for k, a in src.items()}
            assert drive(c, v, **({"stream": 0, "event": 0} if v == 3 else {}))
            assert c.version == v
            assert all(np.array_equal(live[k], snaps[v][k]) for k in live), f"version {v} differs"
        st = c.stats()
        assert st.version == 3 and st.anchor == 0 and st.apply_ns > 0
        try:
            c.apply(99)
            raise AssertionError("apply of an unknown version accepted")
        except DeltacastError as e:
            assert e.name == "DCAST_ESTATE", e
        for bad, name in (({"stream": 0}, "DCAST_ESTATE"), ({"stream": "s"}, "DCAST_EINVAL"),
                          ({"event": -1}, "DCAST_EINVAL")):
            try:
                c.apply(99, **bad)
                raise AssertionError(f"apply(99, {bad}) accepted")
            except DeltacastError as e:
                assert e.name == name, e
                assert name == "DCAST_ESTATE" or "apply: " + next(iter(bad)) in e.detail, e
        c.close()
        c.close()

        # Reopen: version 3 from the dir at once, only the delta of 4 on the
        # wire (ZeroMQ only: bulk=False).
        step(rng, src)
        p.publish(4)
        p.wait(4)
        snaps[4] = {k: a.copy() for k, a in src.items()}
        with Consumer(cons_ep, "pym", d, budget_bytes=1 << 20, verify="all", bulk=False) as c2:
            assert c2.wait_confirmed(20000) == 3, c2.version  # the broker's run confirmed
            assert drive(c2, 4)
            assert all(np.array_equal(c2.tensor(k, as_numpy=True), snaps[4][k]) for k in src)
            model_bytes = sum(a.nbytes for a in src.values())
            assert 0 < c2.stats().total_bytes_received < model_bytes // 4
            assert c2.stats().verify_bytes == model_bytes  # "all": every range computed whole

        p.close()

        try:
            Consumer(cons_ep, "pym", os.path.join(tmp, "x"), budget_bytes=1000)
            raise AssertionError("tiny budget accepted")
        except DeltacastError as e:
            assert e.name == "DCAST_EINVAL" and "budget" in e.detail, e
        try:
            Consumer(cons_ep, "pym", os.path.join(tmp, "x"), bulk="no")
            raise AssertionError("bulk=\"no\" accepted")
        except DeltacastError as e:
            assert e.name == "DCAST_EINVAL" and "bulk" in e.detail, e
        print("test_consumer_python: ok")
    finally:
        for pr in procs:
            pr.kill()
            pr.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
