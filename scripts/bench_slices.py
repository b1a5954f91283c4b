#!/usr/bin/env -S /usr/bin/python3
"""make bench-slices: what a tensor-parallel slice costs a consumer's apply.

One real broker; a 4096 x 4096 bf16 weight (32 MiB) published twice in the
same run: untiled by one producer, and tiled by 4 producer parts (column
blocks, register_slice).  An anchor, then deltas at 1% density.  Four
consumers apply every version; the table gives the median apply time of
the deltas (Consumer.stats().apply_ns) for
  - untiled, bound whole (the baseline: applies into the caller's buffer),
  - tiled, not bound (the consumer's host copy only),
  - tiled, bound whole (a view: the host copy, then the changes copied out),
  - tiled, a TP-2 worker's column half bound (a view of half the tensor),
and the same as a ratio to one memcpy of the tensor's 32 MiB, measured in
the same run.  The consumers do not fold (fold_fraction 0): a fold's
background write would share the CPUs with the applies timed.  Results go to docs/benchmarks.md (section "Tensor-parallel
slices").  BENCH_SLICES_QUICK=1: 1024 x 1024 and 3 deltas, print only."""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
BUILD = os.environ.get("DELTACAST_BUILD", os.path.join(ROOT, "build"))
os.environ.setdefault("DELTACAST_LIB", os.path.join(BUILD, "libdeltacast.so"))

import numpy as np  # noqa: E402

from deltacast import Consumer, Producer  # noqa: E402

QUICK = os.environ.get("BENCH_SLICES_QUICK") == "1"
ROWS = COLS = 1024 if QUICK else 4096
DELTAS = 3 if QUICK else 7
PARTS = 4
DENSITY = 0.01


def start_broker(tmp):
    log = os.path.join(tmp, "broker.log")
    with open(log, "w") as f:
        p = subprocess.Popen([os.path.join(BUILD, "deltacast-broker"), "--producers",
                              "tcp://127.0.0.1:*", "--consumers", "tcp://127.0.0.1:*"],
                             stdout=f, stderr=f)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        text = open(log).read()
        prod = re.search(r"producers on (tcp://\S+)", text)
        cons = re.search(r"consumers on (tcp://\S+)", text)
        if prod and cons:
            return p, prod.group(1), cons.group(1)
        time.sleep(0.02)
    p.kill()
    raise RuntimeError("the broker did not start: " + open(log).read())


def drive(c, version):
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if c.version is not None and c.version >= version:
            return c.stats().apply_ns
        ready = c.ready_version
        if ready is not None and ready <= version:
            c.apply(ready)
            continue
        c.poll(50)
    raise RuntimeError(f"version {version} not applied")


def memcpy_ns(a):
    b = np.empty_like(a)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        np.copyto(b, a)
        runs.append(time.perf_counter_ns() - t0)
    return statistics.median(runs)


def main():
    tmp = tempfile.mkdtemp(prefix="dcast-bench-slices-")
    broker = None
    try:
        broker, prod_ep, cons_ep = start_broker(tmp)
        rng = np.random.default_rng(1)
        ref = rng.integers(0, 1 << 16, size=(ROWS, COLS), dtype=np.uint16)
        flat = Producer(prod_ep, "flat")
        flat.register("w", ref, dtype="bf16")
        w = COLS // PARTS
        shards = [np.ascontiguousarray(ref[:, r * w:(r + 1) * w]) for r in range(PARTS)]
        ranks = [Producer(prod_ep, "tiled", r, PARTS) for r in range(PARTS)]
        for r, p in enumerate(ranks):
            p.register_slice("w", shards[r], (ROWS, COLS), (0, r * w), dtype="bf16")

        def publish(v):
            flat.publish(v)
            for r, p in enumerate(ranks):
                shards[r][...] = ref[:, r * w:(r + 1) * w]
                p.publish(v)
            flat.wait(v)
            for p in ranks:
                p.wait(v)

        publish(1)
        cases = {"untiled, bound whole": ("flat", None), "tiled, not bound": ("tiled", None),
                 "tiled, bound whole (a view)": ("tiled", "whole"),
                 "tiled, TP-2 column half bound": ("tiled", "half")}
        cons, bufs = {}, {}
        for i, (name, (model, bind)) in enumerate(cases.items()):
            # no folds: their background writes would share the CPUs with the applies timed
            c = Consumer(cons_ep, model, os.path.join(tmp, f"c{i}"), 256 << 20, fold_fraction=0.0)
            drive(c, 1)
            if model == "flat" or bind == "whole":
                bufs[name] = np.zeros((ROWS, COLS), np.uint16)
                c.bind("w", bufs[name])
            elif bind == "half":
                bufs[name] = np.zeros((ROWS, COLS // 2), np.uint16)
                c.bind_slice("w", bufs[name], (0, COLS // 2))
            cons[name] = c
        times = {name: [] for name in cases}
        for v in range(2, 2 + DELTAS):
            idx = rng.random((ROWS, COLS)) < DENSITY
            ref[idx] ^= 1
            publish(v)
            for name, c in cons.items():
                times[name].append(drive(c, v))
        for name, b in bufs.items():
            want = ref if b.shape == ref.shape else ref[:, COLS // 2:]
            assert np.array_equal(b, want), f"{name}: differs"
        base = memcpy_ns(ref)
        rows = []
        for name in cases:
            med = statistics.median(times[name])
            rows.append((name, med / 1e6, med / base))
        for c in cons.values():
            c.close()
        for p in [flat] + ranks:
            p.close()
        report(rows, base)
        return 0
    finally:
        if broker:
            broker.kill()
            broker.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def report(rows, base):
    mib = ROWS * COLS * 2 / (1 << 20)
    lines = [f"Command: `make bench-slices` ({ROWS} x {COLS} bf16, {mib:.0f} MiB; "
             f"{int(DENSITY * 100)}% deltas, median of {DELTAS}; one memcpy of the tensor "
             f"{base / 1e6:.2f} ms in the same run).", "",
             "| consumer | apply of a delta, ms | over untiled, bound whole | over one memcpy of the tensor |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {n} | {ms:.2f} | {ms / rows[0][1]:.2f}x | {r:.2f}x |" for n, ms, r in rows]
    lines += ["", "A bound slice is a view of the host copy: apply maps each changed position "
              "inside it and copies it (O(changed)); the mapping splits coordinates once per tile "
              "row inside the slice, the views' main cost. Run to run the ratios move by about +-0.4."]
    text = "\n".join(lines)
    print(text)
    if QUICK:
        return
    path = os.path.join(ROOT, "docs", "benchmarks.md")
    doc = open(path).read()
    section = ("<!-- bench-slices:begin -->\n## Tensor-parallel slices\n\n" + text +
               "\n<!-- bench-slices:end -->")
    if "<!-- bench-slices:begin -->" in doc:
        doc = re.sub(r"<!-- bench-slices:begin -->.*<!-- bench-slices:end -->", lambda _: section,
                     doc, flags=re.S)
    else:
        doc = doc.rstrip() + "\n\n" + section + "\n"
    open(path, "w").write(doc)
    print("written to docs/benchmarks.md")


if __name__ == "__main__":
    sys.exit(main())
