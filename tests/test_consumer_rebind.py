"""unbind and re-bind against a real broker and producer: an engine that
reloads its model drops its bindings and binds the new storage, without
reopening the consumer and without losing versions staged or READY.
 - Consumer: "w" bound whole, "b" bound in two slices; versions applied;
   versions 3 and 4 READY (checked ahead) at unbind(); the old arrays
   are left alone from then on; 3 applies into the consumer's own copy,
   the new storage is bound (filled with version 3), 4 and 5 apply into
   it, bit-exact.  unbind() of an unknown name (DCAST_ENOTFOUND) and of
   a tensor not bound (DCAST_ESTATE).
 - The same where DELTACAST_DEVICE_TWIN=1 sends host tensors through the
   device batch: version 4, resolved ahead into a batch naming the old
   memory, applies into the new storage after unbind and re-bind.
 - engine.EngineWorker: unbind() while apply() waits on another thread
   is refused (DCAST_ESTATE); rebind(new params) with a version READY at
   unbind time, bit-exact after apply; the old parameters stay as they
   were."""
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import raises, run_with_broker  # noqa: E402
from test_worker_papercuts import DEADLINE_S, wait_ready  # noqa: E402

import numpy as np  # noqa: E402

from deltacast import Consumer, DeltacastError, Producer, engine  # noqa: E402


class Trainer:
    """A producer of "w" (f32) and "b" (bf16 bit patterns) that changes a
    few elements per version."""

    def __init__(self, ep, model, seed):
        rng = np.random.default_rng(seed)
        self.w = rng.standard_normal(5000).astype(np.float32)
        self.b = rng.integers(0, 1 << 16, size=(64, 48), dtype=np.uint16)
        self.p = Producer(ep, model)
        self.p.register("w", self.w)
        self.p.register("b", self.b, dtype="bf16")
        self.rng = rng

    def publish(self, v):
        if v > 1:
            self.w[self.rng.integers(0, self.w.size, 40)] += 1
            self.b.flat[self.rng.integers(0, self.b.size, 30)] ^= 3
        self.p.publish(v)
        self.p.wait(v, DEADLINE_S * 1000)

    def check(self, what, w, b0, b1):
        assert np.array_equal(w, self.w), f"{what}: w differs"
        assert np.array_equal(b0, self.b[:, :24]) and np.array_equal(b1, self.b[:, 24:]), \
            f"{what}: b differs"


def consumer_part(tmp, prod_ep, cons_ep, model="rebind"):
    t = Trainer(prod_ep, model, 5)
    with Consumer(cons_ep, model, os.path.join(tmp, "c"), budget_bytes=16 << 20) as c:
        for v in (1, 2):
            t.publish(v)
        wait_ready(c, 1)  # the manifest is in
        old = (np.zeros(5000, np.float32), np.zeros((64, 24), np.uint16),
               np.zeros((64, 24), np.uint16))
        c.bind("w", old[0])  # may drop versions staged into the copy it moves: sent again
        c.bind_slice("b", old[1], (0, 0))
        c.bind_slice("b", old[2], (0, 24))
        wait_ready(c, 2)
        c.apply(2)
        t.check("v2, first binding", *old)
        t.publish(3)
        w3 = t.w.copy()
        t.publish(4)
        wait_ready(c, 4)
        assert c.ready_versions() == [3, 4], c.ready_versions()
        raises(DeltacastError, "DCAST_ENOTFOUND", lambda: c.unbind("nope"), "nope")
        c.unbind()
        raises(DeltacastError, "DCAST_ESTATE", lambda: c.unbind("w"), "w", "not bound")
        kept = [a.copy() for a in old]
        c.apply(3)  # into the consumer's own copies
        assert all(np.array_equal(a, k) for a, k in zip(old, kept)), "old storage written"
        assert np.array_equal(c.tensor("w"), w3), "version 3 not in the consumer's copy"
        new = (np.full(5000, np.nan, np.float32), np.full((64, 24), 7, np.uint16),
               np.full((64, 24), 7, np.uint16))
        c.bind("w", new[0])
        c.bind_slice("b", new[1], (0, 0))
        c.bind_slice("b", new[2], (0, 24))
        assert c.version == 3 and c.ready_versions() == [4], (c.version, c.ready_versions())
        assert np.array_equal(new[0], w3), "the new storage not filled with version 3"
        c.apply(4)  # READY since before unbind, into the new storage
        t.check("v4, READY at unbind, into the new storage", *new)
        t.publish(5)
        wait_ready(c, 5)
        c.apply(5)
        t.check("v5, new storage", *new)
        assert all(np.array_equal(a, k) for a, k in zip(old, kept)), "old storage written"
    t.p.close()
    print("consumer: unbind with versions READY, re-bind, apply: bit-exact, old storage untouched")


def engine_part(tmp, prod_ep, cons_ep):
    t = Trainer(prod_ep, "rebind-engine", 6)
    t.publish(1)
    params = {"w": np.zeros(5000, np.float32), "b": np.zeros((64, 48), np.uint16)}
    w = engine.EngineWorker(cons_ep, "rebind-engine", os.path.join(tmp, "e"), params,
                            budget_bytes=16 << 20)
    try:
        w.apply(1)
        t.check("engine v1", params["w"], params["b"][:, :24], params["b"][:, 24:])
        waiting = threading.Thread(target=w.apply, args=(2,))
        waiting.start()
        while not w._applying:  # the flag apply() raises is the event
            time.sleep(0.001)
        raises(DeltacastError, "DCAST_ESTATE", w.unbind, "unbind()", "apply")
        t.publish(2)
        waiting.join(DEADLINE_S)
        assert not waiting.is_alive() and w.version == 2, w.version
        t.publish(3)
        wait_ready(w.consumer, 3)
        w.unbind()
        kept = {k: a.copy() for k, a in params.items()}
        t.publish(4)
        reloaded = {"w": np.ones(5000, np.float32), "b": np.ones((64, 48), np.uint16)}
        w.rebind(reloaded)
        assert w.version == 2 and w.binds
        w.apply(4)
        t.check("engine v4 after rebind", reloaded["w"], reloaded["b"][:, :24],
                reloaded["b"][:, 24:])
        assert all(np.array_equal(params[k], kept[k]) for k in params), "old params written"
    finally:
        w.close()
        t.p.close()
    print("engine: unbind during apply refused; rebind, READY version applied: bit-exact")


def twin_part(tmp, prod_ep, cons_ep):
    """consumer_part again in a process where DELTACAST_DEVICE_TWIN=1 sends
    the host tensors through the device batch (its CPU twin): a version
    checked ahead has its changes resolved into a batch that names the
    bound memory's addresses, which unbind must forget."""
    env = dict(os.environ, DELTACAST_DEVICE_TWIN="1")
    r = subprocess.run([sys.executable, __file__, "twin", tmp, prod_ep, cons_ep], env=env,
                       capture_output=True, text=True, timeout=DEADLINE_S * 3)
    assert r.returncode == 0, f"twin: exit {r.returncode}: {r.stdout} {r.stderr}"
    assert "device path (CPU twin)" in r.stderr, r.stderr
    print("device twin: " + r.stdout.strip())


def body(tmp, prod_ep, cons_ep):
    consumer_part(tmp, prod_ep, cons_ep)
    twin_part(tmp, prod_ep, cons_ep)
    engine_part(tmp, prod_ep, cons_ep)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "twin":
        _, _, tmp, prod_ep, cons_ep = sys.argv
        os.makedirs(os.path.join(tmp, "twin"))
        consumer_part(os.path.join(tmp, "twin"), prod_ep, cons_ep, "rebind-twin")
        return 0
    run_with_broker("dcast-consumer-rebind-", body)
    print("test_consumer_rebind: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
