"""The Python binding publishes numpy tensors (bf16 bit patterns, float32,
float16) through the real broker; the test reader (tests/tools/
producer_reader) receives every version bit-exact.  Errors surface as
DeltacastError with the C code and message.  An anchor's publish() returns
before the broker took any of it (the broker stopped, its window 1 MiB of
16 MiB): the arrays are overwritten at once, flush() waits for the ACK,
and the reader gets the published values."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time


def _sanitizer_reexec():
    """A sanitizer build of libdeltacast.so loads only with the ASan runtime
    first: re-run this script with it preloaded (leak checks off: python)."""
    lib = os.environ.get("DELTACAST_LIB", "")
    if "build-san" not in lib or os.environ.get("LD_PRELOAD"):
        return
    pre = []
    for name in ("libasan.so", "libubsan.so"):
        r = subprocess.run(["cc", "-print-file-name=" + name], capture_output=True, text=True)
        if r.returncode == 0 and os.path.isabs(r.stdout.strip()):
            pre.append(r.stdout.strip())
    env = dict(os.environ, LD_PRELOAD=":".join(pre), ASAN_OPTIONS="detect_leaks=0")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


_sanitizer_reexec()
import numpy as np  # noqa: E402

from deltacast import DeltacastError, Producer  # noqa: E402
from deltacast._lib import lib  # noqa: E402

BUILD = os.environ.get("DELTACAST_BUILD", "build")
procs = []


def bound_endpoints(log):
    """The (producers, consumers) endpoints the broker's log names, None
    until it names both."""
    text = open(log).read()
    found = [re.search(rf"{role} on (tcp://127\.0\.0\.1:\d+)$", text, re.M)
             for role in ("producers", "consumers")]
    return tuple(m.group(1) for m in found) if all(found) else None


def start_broker(tmp, *flags):
    """A broker with `flags` on ports it picks itself (no port is guessed);
    its (producers, consumers) endpoints once its log names them (10 s)."""
    log = os.path.join(tmp, "broker.log")
    with open(log, "w") as f:
        p = subprocess.Popen([os.path.join(BUILD, "deltacast-broker"), "--producers",
                              "tcp://127.0.0.1:*", "--consumers", "tcp://127.0.0.1:*", *flags],
                             stdout=f, stderr=f)
    procs.append(p)
    deadline = time.monotonic() + 10
    while not (eps := bound_endpoints(log)):
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the broker did not start: {open(log).read()}")
        time.sleep(0.02)
    return eps


def run_with_broker(prefix, body, *flags):
    """body(tmp, producer endpoint, consumer endpoint) with a fresh broker
    (started with `flags`, where "{tmp}" stands for the temporary
    directory) and temporary directory; kills every process in `procs`
    and removes the directory afterwards, pass or fail."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        body(tmp, *start_broker(tmp, *(f.replace("{tmp}", tmp) for f in flags)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def drive(c, version, deadline_s=20):
    """Apply READY versions until consumer c holds `version` (polls; no
    fixed sleeps); AssertionError after deadline_s or on an error event."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if c.version is not None and c.version >= version:
            assert c.version == version, (c.version, version)
            return
        ready = c.ready_version
        if ready is not None and ready <= version:
            c.apply(ready)
            continue
        ev = c.poll(100)
        assert ev is None or ev.type != "error", ev
    raise AssertionError(f"version {version} not applied in {deadline_s} s (have {c.version})")


def raises(cls, name, fn, *words):
    """The `cls` error that fn() raises, checked for its name ("DCAST_...")
    and for each of `words` in its message; AssertionError when none."""
    try:
        fn()
    except cls as e:
        assert e.name == name, f"got {e.name}: {e}, want {name}"
        for w in words:
            assert w in str(e), f"{w!r} not in {e}"
        return e
    raise AssertionError(f"no {name}")


def read_version(cons_ep, model, version, out):
    r = subprocess.run([os.path.join(BUILD, "tools", "producer_reader"), "--endpoint", cons_ep,
                        "--model", model, "--until", str(version), "--out", out,
                        "--timeout-ms", "20000"], timeout=40)
    assert r.returncode == 0, f"reader exit {r.returncode}"
    with open(out, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]]
            for k, v in hdr.items() if k != "__metadata__"}


def expect_error(name, fn):
    try:
        fn()
    except DeltacastError as e:
        assert e.name == name, f"got {e.name}: {e}, want {name}"
        assert e.code > 0 and str(e)
        return e
    raise AssertionError(f"no error, want {name}")


def anchor_returns_early(tmp):
    """publish() of an anchor returns with nothing taken by a stopped
    broker; the caller's array is free at once; flush() reports the ACK."""
    os.mkdir(os.path.join(tmp, "early"))
    prod_ep, cons_ep = start_broker(os.path.join(tmp, "early"), "--producer-window-bytes",
                                    str(1 << 20))
    broker = procs[-1]
    a = np.random.default_rng(9).standard_normal(4 << 20).astype(np.float32)
    with Producer(prod_ep, "early", range_elems=1 << 16, ack_timeout_ms=10000) as p:
        p.flush(0)  # nothing published: at once
        p.register("a", a)
        want = a.tobytes()
        broker.send_signal(signal.SIGSTOP)
        try:
            p.publish(1)
            pr = p.progress()
            assert pr.active and pr.anchor and pr.bytes_taken == 0, (pr.active, pr.bytes_taken)
            a[:] = 0.5  # the next step's weights, at once
        finally:
            broker.send_signal(signal.SIGCONT)
        p.flush(20000)
        pr, s = p.progress(), p.stats()
        assert not pr.active and pr.err == 0 and pr.bytes_taken == len(want)
        assert s.acked_version == 1 and s.failed_version is None and s.failed_err == 0
    got = read_version(cons_ep, "early", 1, os.path.join(tmp, "early", "v1.st"))
    assert got["a"] == want, "the reader did not get the published values"


def main():
    tmp = tempfile.mkdtemp(prefix="dcast-test-producer-py-")
    try:
        e = expect_error("DCAST_ECLOSED", lambda: Producer("tcp://127.0.0.1:1", "m",
                                                           connect_timeout_ms=300))
        assert "tcp://127.0.0.1:1" in str(e)
        prod_ep, cons_ep = start_broker(tmp)
        if not lib().dcast_cuda_available():  # no GPU here: the option is refused at open
            e = expect_error("DCAST_ENODEVICE",
                             lambda: Producer(prod_ep, "m", baseline_on_device=True))
            assert "baseline_on_device" in str(e)
        rng = np.random.default_rng(5)
        w = (0x3c00 + rng.integers(0, 1024, size=(1500, 1000))).astype(np.uint16)  # bf16 bits
        f32 = rng.standard_normal(70000).astype(np.float32)
        f16 = rng.standard_normal((10, 33)).astype(np.float16)
        with Producer(prod_ep, "pymodel", range_elems=1 << 18, encode_threads=2) as p:
            expect_error("DCAST_EDTYPE", lambda: p.register("bad", np.zeros(4, np.complex64)))
            expect_error("DCAST_EINVAL", lambda: p.register("nc", f16[:, ::2]))
            expect_error("DCAST_EDTYPE", lambda: p.register("x", f32, dtype="bf16"))
            p.register("w", w, dtype="bf16")
            p.register("f32", f32)
            p.register("f16", f16)
            for v in (1, 2, 3):
                if v > 1:
                    idx = rng.integers(0, w.size, size=w.size // 100)
                    w.reshape(-1)[idx] += 1
                    f32[rng.integers(0, f32.size, 50)] *= 2
                p.publish(v)
                p.wait(v, 20000)
                s = p.stats()
                assert s.anchor == (v == 1) and s.acked_version == v
                got = read_version(cons_ep, "pymodel", v, os.path.join(tmp, f"v{v}.st"))
                assert got["w"] == w.tobytes(), f"w differs at version {v}"
                assert got["f32"] == f32.tobytes(), f"f32 differs at version {v}"
                assert got["f16"] == f16.tobytes(), f"f16 differs at version {v}"
            assert s.payload_bytes < s.model_bytes // 10, (s.payload_bytes, s.model_bytes)
            e = expect_error("DCAST_EVERSION", lambda: p.publish(3))
            assert "not above" in e.detail
            expect_error("DCAST_ESHAPE", lambda: p.register("w", w[:10], dtype="bf16"))
        anchor_returns_early(tmp)
        print("test_producer_python: ok")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
