#!/usr/bin/python3
"""The table of `make bench-scale` (scripts/bench_scale.sh) from its logs.

usage: bench_scale_report.py ROOT MODEL_BYTES PARAMS DOC
Prints the table and the targets; DOC (not "0") gets them between its
bench-scale markers.  The last line printed:
`restart_wire_over_delta R broker_hwm_over_model S worker_dir_peak_over_model T`.
"""
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys

BEGIN, END = "<!-- bench-scale:begin -->", "<!-- bench-scale:end -->"


def lines(path):
    try:
        with open(path) as f:
            return [l.split() for l in f if l.strip()]
    except FileNotFoundError:
        return []


def worker_versions(root, i):
    """{version: (epoch, kind, bytes)} from worker i's stamped lines."""
    out = {}
    for w in lines(f"{root}/w{i}.log"):
        if len(w) > 5 and w[1] == "version" and w[4] == "bytes":
            out[int(w[2])] = (float(w[0]), w[3], int(w[5]))
    return out


def starts(root):
    """{version: publish start, epoch seconds}."""
    out = {}
    for w in lines(f"{root}/publish.log"):
        if w[0] == "acked":
            out[int(w[1])] = int(w[2]) / 1e9
        elif w[0] == "start5":
            out[5] = float(w[1])
    return out


def kv(root):
    out = {}
    for w in lines(f"{root}/hwm.log"):
        out[" ".join(w[:-1])] = int(w[-1])
    return out


def dir_peaks(root):
    peaks = [0, 0]
    for w in lines(f"{root}/du.log"):
        if len(w) == 3:
            peaks = [max(peaks[0], int(w[1])), max(peaks[1], int(w[2]))]
    return peaks


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        return "?"


def version_rows(root, model):
    ws = [worker_versions(root, 1), worker_versions(root, 2)]
    st = starts(root)
    rows, deltas = [], []
    for v in sorted(st):
        got = [w.get(v) for w in ws]
        if None in got:
            continue
        t = max(g[0] for g in got) - st[v]
        b = [g[2] for g in got]
        kind = got[0][1]
        who = "restarted producer" if v == 5 else "first producer"
        rows.append(f"| {v} | {kind} | {who} | {t:.2f} | {b[0]:,} / {b[1]:,} | {max(b) / model:.4f} |")
        if kind == "delta" and v != 5:
            deltas.append(max(b))
    restart = max(ws[0][5][2], ws[1][5][2]) if 5 in ws[0] and 5 in ws[1] else None
    return rows, deltas, restart


def mark(ok):
    return "met" if ok else "**not met**"


def report(root, model, params):
    rows, deltas, restart = version_rows(root, model)
    k = kv(root)
    peaks = dir_peaks(root)
    gib = model / 2**30
    out = [f"Command: `make bench-scale` ({params} bf16 parameters: {model:,} bytes, {gib:.2f} GiB); "
           f"{os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, load average "
           f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end; tree at {commit()}, "
           f"{datetime.date.today()}.  A broker with `--data-dir`, 2 `deltacast subscribe` workers "
           f"(`--fold-every 2`); versions 1-4 from one producer process, version 5 from a new one "
           f"(`deltacast publish` with no other flag, its baseline fetched from the consumer endpoint the broker names).", "",
           "| version | kind | published by | to both workers, s | wire bytes, worker 1 / 2 | over the model |",
           "| --- | --- | --- | --- | --- | --- |"] + rows
    hw = {n: k.get(f"hwm {n}", 0) * 1024 for n in ("broker", "worker1", "worker2", "producer1", "producer2")}
    out += ["", "| process | peak RSS (VmHWM), MB | over the model |", "| --- | --- | --- |"]
    for n, b in hw.items():
        out.append(f"| {n} | {b / 1e6:.1f} | {b / model:.3f}x |")
    out += ["", "| directory | peak on disk, MB | over the model |", "| --- | --- | --- |"]
    for i, p in enumerate(peaks, 1):
        out.append(f"| worker {i} (sampled every 0.2 s) | {p / 1e6:.1f} | {p / model:.3f}x |")
    bd = k.get("broker_data", 0)
    out.append(f"| broker `--data-dir` at the end | {bd / 1e6:.1f} | {bd / model:.3f}x |")
    med = statistics.median(deltas) if deltas else 0
    r = restart / med if restart and med else float("nan")
    patch = k.get("patch", 0)
    s = hw["broker"] / model
    t = max(peaks) / model
    out += ["", "Targets, this run:", "", "| target | measured | goal | |", "| --- | --- | --- | --- |",
            f"| version 5 (restarted producer) wire bytes per worker / the first producer's deltas' (median) "
            f"| {restart or 0:,} / {med:,.0f} = {r:.2f}x (a patch file of the same version: {patch:,} bytes) "
            f"| at most 2x | {mark(r <= 2)} |",
            f"| broker peak RSS / model, `--data-dir` | {s:.3f}x | at most 0.25x | {mark(s <= 0.25)} |",
            f"| worker directory peak / model | {t:.3f}x | at most 1.25x | {mark(t <= 1.25)} |", ""]
    last = f"restart_wire_over_delta {r:.3f} broker_hwm_over_model {s:.3f} worker_dir_peak_over_model {t:.3f}"
    return "\n".join(out), last


def write_doc(doc, text):
    with open(doc) as f:
        s = f.read()
    body = BEGIN + "\n" + text + END
    if BEGIN in s:
        s = s[:s.index(BEGIN)] + body + s[s.index(END) + len(END):]
    else:
        s += "\n## Scale: a 1B model from disk (`make bench-scale`)\n\n" + body + "\n"
    with open(doc, "w") as f:
        f.write(s)


def main():
    root, model, params, doc = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    text, last = report(root, model, params)
    print(text)
    if doc != "0":
        write_doc(doc, text)
    print(last)


if __name__ == "__main__":
    main()
