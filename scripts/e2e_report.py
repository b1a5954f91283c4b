#!/usr/bin/env python3
"""Summaries for scripts/demo.sh and scripts/bench_e2e.sh from their time-stamped logs.

  e2e_report.py demo TMPDIR    the demo's tables
  e2e_report.py bench TMPDIR   one JSON line: mean time to every consumer of versions 2..

Logs (written by e2e_stamp: "EPOCH LINE"):
  producer.log  deltacast publish: version V anchor|delta bytes B of M (R%) changed C (D%)
                chunks S/T ms T
  cN.log        deltacast subscribe: version V anchor|delta bytes B stage_ms S apply_ms A
                received R
  cN.events     "EPOCH start" / "EPOCH kill" per consumer incarnation
"""
import os
import re
import sys

PUB = re.compile(r"^([0-9.]+) version (\d+) (anchor|delta) bytes (\d+) of (\d+) \(([0-9.]+)%\) "
                 r"changed (\d+) \(([0-9.]+)%\) chunks (\d+)/(\d+) ms ([0-9.]+)")
SUB = re.compile(r"^([0-9.]+) version (\d+) (anchor|delta) bytes (\d+) stage_ms ([0-9.]+) "
                 r"apply_ms ([0-9.]+) received (\d+)")


def parse(path, rx):
    out = []
    if os.path.exists(path):
        for line in open(path):
            m = rx.match(line)
            if m:
                out.append(m.groups())
    return out


def events(path):
    ev = []
    if os.path.exists(path):
        for line in open(path):
            t, what = line.split()
            ev.append((float(t), what))
    return ev


def mib(n):
    return "%.2f MiB" % (n / 2**20) if n >= 2**20 else "%.1f KiB" % (n / 1024)


def incarnation_start(ev, t):
    """Start time of the incarnation alive at t, or None if dead at t."""
    alive = None
    for te, what in ev:
        if te > t:
            break
        alive = te if what == "start" else None
    return alive


def load(tmp):
    pub = parse(os.path.join(tmp, "producer.log"), PUB)
    names = sorted(n[:-4] for n in os.listdir(tmp) if re.match(r"c\d+\.log$", n))
    cons = {n: parse(os.path.join(tmp, n + ".log"), SUB) for n in names}
    evs = {n: events(os.path.join(tmp, n + ".events")) for n in names}
    rows, anchor_reach = [], None
    for (t, v, kind, b, m, _, ch, dens, _, _, ms) in pub:
        t, b, m, ms = float(t), int(b), int(m), float(ms)
        start = t - ms / 1000.0
        reach, n_in, n_all = 0.0, 0, 0
        for n in names:
            alive = incarnation_start(evs[n], start)
            if alive is None:
                continue  # not running when the version was published (late, or killed)
            n_all += 1
            mine = [x for x in cons[n] if float(x[0]) >= alive]
            got = [float(x[0]) for x in mine if x[1] == v]
            prev = [float(x[0]) for x in mine if int(x[1]) == int(v) - 1]
            killed = [te for te, w in evs[n] if w == "kill" and te > start]
            if got and not (killed and killed[0] < got[0]):
                ready = max(start, prev[0]) if prev else start
                reach = max(reach, got[0] - ready)
                n_in += 1
        if kind == "anchor":
            anchor_reach = reach
        rows.append((v, kind, float(dens), b, m, ms, reach, n_in, n_all))
    return pub, names, cons, evs, rows, anchor_reach


def bench(tmp):
    """One JSON line: time to every consumer of versions 2.. (mean, and each) and their
    bytes; the same for version 1."""
    import json
    pub, names, cons, evs, rows, _ = load(tmp)
    later = [r for r in rows if int(r[0]) >= 2 and r[7] == r[8]]  # skipped by none
    if not later:
        return 1
    print(json.dumps({
        "versions": len(later), "consumers": len(names),
        "mean_reach_s": sum(r[6] for r in later) / len(later),
        "reach_s": [r[6] for r in later], "first_reach_s": rows[0][6],
        "first_bytes": rows[0][3],
        "wire_bytes": sum(r[3] for r in later) // len(later),
        "model_bytes": later[0][4],
        "density": sum(r[2] for r in later) / len(later)}))
    return 0


def demo(tmp):
    pub, names, cons, evs, rows, anchor_reach = load(tmp)
    if not pub:
        print("no producer lines", file=sys.stderr)
        return 1
    print()
    print("version kind    density  wire bytes    model bytes  publish ms  to every consumer"
          "  bytes saved  speed-up")
    for (v, kind, dens, b, m, ms, reach, n_in, n_all) in rows:
        ratio = m / b if b else float("inf")
        speed = (anchor_reach / reach) if (anchor_reach and reach) else 0
        print("%7s %-6s %7.3f%% %12s %12s %10.1f %10.3f s (%d/%d) %10.1fx %8.1fx" %
              (v, kind, dens, mib(b), mib(m), ms, reach, n_in, n_all, ratio, speed))
    print("(to every consumer: the longest, over the consumers running when it was published,"
          " from the later of its publish start and the consumer's apply of the version before"
          " it, to the consumer's apply line: delivery time without queueing behind earlier"
          " versions; speed-up: the anchor's time / this version's, the anchor being the full"
          " model over the same path)")
    print()
    print("consumer versions  received        stage ms (mean)  apply ms (mean)  notes")
    for n in names:
        rows_c = cons[n]
        if not rows_c:
            print("%-8s none" % n)
            continue
        recv = sum(int(x[3]) for x in rows_c)
        st = sum(float(x[4]) for x in rows_c) / len(rows_c)
        ap = sum(float(x[5]) for x in rows_c) / len(rows_c)
        starts = [t for t, w in evs[n] if w == "start"]
        note = []
        if len(starts) > 1:
            note.append("killed and restarted: %d incarnations" % len(starts))
        if starts and float(pub[0][0]) < starts[0]:
            note.append("joined late, caught up in %.2f s" %
                        (float(rows_c[-1][0]) - starts[0]))
        print("%-8s %8d  %14s  %15.1f  %15.1f  %s" %
              (n, len(rows_c), mib(recv), st, ap, "; ".join(note)))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("demo", "bench"):
        sys.exit((demo if sys.argv[1] == "demo" else bench)(sys.argv[2]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
