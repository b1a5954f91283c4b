"""A restarted trainer costs its workers no anchor: a producer process
publishes versions 1..3 and is killed (SIGKILL); a new process takes the
broker's version 3 as its baseline (Producer(baseline_from=True): from
the consumer endpoint the broker names in its WELCOME) and publishes
version 4 as a delta.  A subscriber that held 3 receives 4 as a
delta (its received bytes are a small fraction of the model), bit-exact; a
late joiner still gets the anchor.  A restarted producer whose tensors
differ from the broker's is refused, naming the tensor.  Progress: a
producer's progress() and a consumer's bytes_received() move, read from
another thread, while an anchor is held up by a stopped broker."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import procs, run_with_broker  # noqa: E402

import numpy as np  # noqa: E402

from deltacast import Consumer, DeltacastError, Producer  # noqa: E402

MODEL = "restart"
ELEMS = 1 << 20  # per tensor: 2 tensors of float32, 8 MiB in all


def state(version):
    """The model at `version`: a seeded start, then 1% of the elements of
    each tensor changed by every later version."""
    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal(ELEMS).astype(np.float32) for n in ("a", "b")}
    for v in range(2, version + 1):
        r = np.random.default_rng(v)
        for a in arrays.values():
            idx = r.choice(ELEMS, ELEMS // 100, replace=False)
            a[idx] += np.float32(1.0)
    return arrays


def child(prod_ep, cons_ep, first, last, mode):
    """A producer process: publish first..last; "wait" then blocks until
    killed, "fetch" takes the broker's newest version as its baseline,
    from the consumer endpoint the broker names (cons_ep unused)."""
    kw = {"baseline_from": True} if mode == "fetch" else {}
    p = Producer(prod_ep, MODEL, **kw)
    arrays = state(first)
    for n, a in arrays.items():
        p.register(n, a)
    for v in range(first, last + 1):
        np.copyto(arrays["a"], state(v)["a"])
        np.copyto(arrays["b"], state(v)["b"])
        p.publish(v)
        p.wait(v)
    s = p.stats()
    print(json.dumps({"acked": last, "anchor": s.anchor, "payload": s.payload_bytes,
                      "baseline": s.baseline_version}), flush=True)
    if mode == "wait":
        sys.stdin.read()  # killed here
    p.close()


def spawn(prod_ep, cons_ep, first, last, mode):
    p = subprocess.Popen([sys.executable, __file__, "--child", prod_ep, cons_ep, str(first),
                          str(last), mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    procs.append(p)
    line = p.stdout.readline()
    if not line:
        raise RuntimeError(f"producer child ({mode}) ended without publishing: rc {p.wait()}")
    return p, json.loads(line)


def follow(c, version, deadline_s=30):
    """Apply every READY version until `version` is applied."""
    deadline = time.monotonic() + deadline_s
    while c.version != version:
        if time.monotonic() > deadline:
            raise AssertionError(f"version {version} not applied in {deadline_s} s "
                                 f"(at {c.version})")
        ev = c.poll(200)
        if ev is not None and ev.type == "ready":
            c.apply(ev.version)


def check_equal(c, version):
    want = state(version)
    for n, a in want.items():
        got = c.tensor(n)
        assert np.array_equal(got.view(np.uint32), a.view(np.uint32)), f"{n} differs at {version}"


def restart_case(tmp, prod_ep, cons_ep):
    model_bytes = 2 * ELEMS * 4
    c = Consumer(cons_ep, MODEL, os.path.join(tmp, "held"))
    first, info = spawn(prod_ep, cons_ep, 1, 3, "wait")
    follow(c, 3)
    before = c.bytes_received()
    first.send_signal(signal.SIGKILL)
    first.wait()
    second, info = spawn(prod_ep, cons_ep, 4, 4, "fetch")
    assert second.wait() == 0
    assert info["baseline"] == 3 and info["anchor"] == 0, info
    follow(c, 4)
    got = c.bytes_received() - before
    assert c.stats().anchor == 0, "version 4 reached the subscriber as an anchor"
    assert got < model_bytes // 10, f"version 4 cost {got} bytes of a {model_bytes}-byte model"
    check_equal(c, 4)
    c.close()
    late = Consumer(cons_ep, MODEL, os.path.join(tmp, "late"))
    follow(late, 4)
    assert late.bytes_received() >= model_bytes, "the late joiner got no anchor"
    check_equal(late, 4)
    late.close()
    print(f"restart: version 4 reached the subscriber in {got} bytes "
          f"({100.0 * got / model_bytes:.2f}% of the model), bit-exact; late joiner anchored")


def refused(prod_ep, cons_ep, tensors, words):
    """A restarted producer with `tensors` is refused with DCAST_ESHAPE."""
    p = Producer(prod_ep, MODEL, baseline_from=cons_ep)
    for n, a in tensors:
        p.register(n, a)
    try:
        p.publish(5)
        raise AssertionError(f"a producer with {words} took the broker's baseline")
    except DeltacastError as e:
        assert e.name == "DCAST_ESHAPE" and words in str(e), str(e)
    p.close()


def mismatch_case(tmp, prod_ep, cons_ep):
    """Another shape, or the same tensors in another order (the index is
    part of every digest), is refused naming the tensor."""
    small, full = np.zeros(ELEMS // 2, dtype=np.float32), np.zeros(ELEMS, dtype=np.float32)
    refused(prod_ep, cons_ep, [("a", small), ("b", full)], "tensor a")
    refused(prod_ep, cons_ep, [("b", full), ("a", full)], "order")
    print("mismatch: another shape or order refused with DCAST_ESHAPE, naming the tensor")


def main():
    run_with_broker("dcast-restart-", lambda *a: (restart_case(*a), mismatch_case(*a)))
    print("test_producer_restart: ok")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        main()
