#!/usr/bin/env python3
"""Rows, table, docs section and plots of `make bench` (scripts/bench_e2e.sh).

  bench_report.py baseline DIR NAME COMMAND        a row from scripts/bench_baselines.sh logs
  bench_report.py deltacast NCONS NAME COMMAND DIR a row from e2e_report.py bench's JSON (stdin)
                                                   and the subscribers' logs in DIR
  bench_report.py tcp BYTES NAME COMMAND S...      a row from bench_tcp runs of S seconds each
  bench_report.py delta-bytes ROWS NCONS           one consumer's bytes per delta (first deltacast
                                                   deltas row of the file ROWS), or 0
  bench_report.py table ROWS META [DOC PLOTS]      print the table; with DOC and PLOTS, write the
                                                   bench-e2e section of DOC and PNGs into PLOTS

A row is one JSON line: name, command, reach_s (per version 2..N: seconds from the producer
starting on it to the last consumer having it), first_s (the same for version 1, which every
transport sends whole), bytes (per version 2..N, summed over the consumers), first_bytes.
Rows of the same name (rounds of the benchmark) merge: their samples pool, the table shows
medians.
"""
import json
import os
import re
import statistics
import sys


def per_version(path, cast):
    """{version: [values]} from "V VALUE" lines (a "V FAIL" line is an error)."""
    out = {}
    for line in open(path) if os.path.exists(path) else []:
        v, val = line.split()
        if val == "FAIL":
            raise SystemExit("bench_report: %s: version %s failed" % (path, v))
        out.setdefault(int(v), []).append(cast(val))
    return out


def baseline(d, name, command):
    start = {v: t[0] for v, t in per_version(os.path.join(d, "start.log"), float).items()}
    done = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".done"):
            for v, ts in per_version(os.path.join(d, f), float).items():
                done.setdefault(v, []).append(max(ts))
    nbytes = {v: sum(b) for v, b in per_version(os.path.join(d, "bytes.log"), int).items()}
    versions = sorted(start)
    reach = {v: max(done[v]) - start[v] for v in versions}
    return {"name": name, "command": command, "first_s": reach[1], "first_bytes": nbytes.get(1, 0),
            "reach_s": [reach[v] for v in versions[1:]],
            "bytes": statistics.mean(nbytes.get(v, 0) for v in versions[1:]), "apply_ms": apply_ms(d)}


def apply_ms(d):
    """The subscribers' apply step per version 2.. (ms), from "version V ... apply_ms A" lines."""
    rx = re.compile(r"^[0-9.]+ version (\d+) \S+ bytes \d+ stage_ms [0-9.]+ apply_ms ([0-9.]+)")
    out = []
    for f in sorted(os.listdir(d)):
        if re.match(r"c\d+\.log$", f):
            out += [float(m.group(2)) for m in map(rx.match, open(os.path.join(d, f)))
                    if m and int(m.group(1)) >= 2]
    return out


def deltacast(nconsumers, name, command, d):
    j = json.loads(sys.stdin.read())
    return {"name": name, "command": command, "first_s": j["first_reach_s"],
            "first_bytes": j["first_bytes"] * nconsumers, "reach_s": j["reach_s"],
            "bytes": j["wire_bytes"] * nconsumers, "apply_ms": apply_ms(d)}


def tcp(nbytes, name, command, seconds):
    return {"name": name, "command": command, "first_s": None, "first_bytes": None,
            "reach_s": seconds, "bytes": nbytes}


def merge(rows):
    """One row per name, in first-seen order: samples pooled, bytes averaged."""
    out = {}
    for r in rows:
        m = out.setdefault(r["name"], dict(r, reach_s=[], first=[], nbytes=[], apply_ms=[]))
        m["reach_s"] += r["reach_s"]
        m["nbytes"].append(r["bytes"])
        m["apply_ms"] += r.get("apply_ms", [])
        if r["first_s"] is not None:
            m["first"].append(r["first_s"])
    for m in out.values():
        m["bytes"] = statistics.mean(m["nbytes"])
        m["first_s"] = statistics.median(m["first"]) if m["first"] else None
        m["rounds"] = len(m["nbytes"])
    return list(out.values())


def delta_bytes(rows, nconsumers):
    d = [r for r in rows if r["name"] == "deltacast deltas"]
    return int(d[0]["bytes"]) // nconsumers if d else 0


def mib(n):
    return "%.1f MiB" % (n / 2**20) if n >= 2**20 else "%.0f KiB" % (n / 1024)


def ratio(x, base):
    return "%.3g" % (x / base) if base else "-"


def table(rows, meta):
    base = next((r for r in rows if r["name"] == "deltacast deltas"), None)
    bt = statistics.median(base["reach_s"]) if base else 0
    bb = base["bytes"] if base else 0
    out = [meta, "",
           "| transport | time to all consumers | (min..max) | x deltacast | bytes moved "
           "| x deltacast | version 1 (whole model): time, bytes | command |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        t = statistics.median(r["reach_s"])
        first = ("%.2f s, %s" % (r["first_s"], mib(r["first_bytes"]))
                 if r["first_s"] is not None else "-")
        out.append("| %s | %.3f s | %.3f..%.3f | %s | %s | %s | %s | %s |" % (
            r["name"], t, min(r["reach_s"]), max(r["reach_s"]), ratio(t, bt), mib(r["bytes"]),
            ratio(r["bytes"], bb), first, r["command"]))
    if base and base["apply_ms"]:
        out += ["", "Samples per row: %d rounds x %d versions (raw TCP: 3 runs a round).  The "
                "deltacast consumers' apply step took %.0f ms per version (median); the rest of "
                "their time is the wait for the producer's encode and the broker's commit, and staging "
                "(receive, checksums, the digest check, the version's record written behind)."
                % (base["rounds"], len(base["reach_s"]) // base["rounds"],
                   statistics.median(base["apply_ms"]))]
    return "\n".join(out)


def plot(rows, plots):
    """Two bar charts, log scale; the time bars carry min..max whiskers."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = rows[::-1]
    names = [r["name"].replace("`", "") for r in rows]
    med = [statistics.median(r["reach_s"]) for r in rows]
    spread = [[m - min(r["reach_s"]) for m, r in zip(med, rows)],
              [max(r["reach_s"]) - m for m, r in zip(med, rows)]]
    series = [("bench_e2e_time.png", "time to all consumers per version, s (median, min..max)",
               med, spread),
              ("bench_e2e_bytes.png", "bytes moved per version to all consumers, MiB",
               [r["bytes"] / 2**20 for r in rows], None)]
    os.makedirs(plots, exist_ok=True)
    for fname, label, vals, err in series:
        fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.2))
        bars = ax.barh(names, vals, xerr=err, capsize=3, color=[
            "#d62728" if n.startswith("deltacast") else "#7f7f7f" for n in names])
        ax.set_xscale("log")
        ax.set_xlabel(label + ", log scale")
        ax.bar_label(bars, labels=["%.3g" % v for v in vals], padding=3, fontsize=8)
        ax.margins(x=0.15)
        fig.tight_layout()
        fig.savefig(os.path.join(plots, fname), dpi=100)
        plt.close(fig)


NOTE = """
Time: from the producer's start on a version to the last consumer having it, the median over
versions 2..N of every round (one version at a time, but for the pipelined row).  Bytes: per version,
summed over the consumers.  HTTP and Redis consumers fetch the patch, then `deltacast apply` (checked,
checkpoint fsynced); the shared-filesystem consumers read the whole file from the page cache.

![time to all consumers](plots/bench_e2e_time.png)
![bytes moved](plots/bench_e2e_bytes.png)
"""


def write_doc(path, text):
    b, e = "<!-- bench-e2e:begin -->", "<!-- bench-e2e:end -->"
    s = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    body = b + "\n" + text + "\n" + NOTE + e
    if b in s:
        s = s[:s.index(b)] + body + s[s.index(e) + len(e):]
    else:
        s += "\n## End to end\n\n" + body + "\n"
    open(path, "w").write(s)


def main(argv):
    if len(argv) == 5 and argv[1] == "baseline":
        print(json.dumps(baseline(argv[2], argv[3], argv[4])))
    elif len(argv) == 6 and argv[1] == "deltacast":
        print(json.dumps(deltacast(int(argv[2]), argv[3], argv[4], argv[5])))
    elif len(argv) == 4 and argv[1] == "delta-bytes":
        print(delta_bytes([json.loads(line) for line in open(argv[2]) if line.strip()], int(argv[3])))
    elif len(argv) >= 6 and argv[1] == "tcp":
        print(json.dumps(tcp(int(argv[2]), argv[3], argv[4], [float(s) for s in argv[5:]])))
    elif len(argv) in (4, 6) and argv[1] == "table":
        rows = merge(json.loads(line) for line in open(argv[2]) if line.strip())
        text = table(rows, argv[3])
        print(text)
        if len(argv) == 6:
            plot(rows, argv[5])
            write_doc(argv[4], text)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
