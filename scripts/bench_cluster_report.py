#!/usr/bin/env python3
"""Table, targets and plots for `make bench-cluster` (scripts/bench_cluster.sh).

usage: bench_cluster_report.py ROWS.jsonl META_JSON [DOC PLOTS_DIR]
ROWS: one JSON object per (row, N): row star|tree|http|xorz, n, versions
(per version: v, t seconds to the last worker, links {port: [rx, tx]} as
the switch counts them (rx: what that host sent), rates {port: bits/s},
cpu {busy, softirq, own} as fractions of the machine; xorz: patch_bytes, the file
every worker fetched); and tree3-sf, tree3-ct: the equal-rate tree, with
fan, relays, n and versions, or failed (why).
Prints the sections; with DOC, replaces (or appends) the parts between the
bench-cluster markers and the bench-cluster-tree3 markers, and writes
PLOTS_DIR/bench_cluster_*.png."""
import json
import statistics
import sys

BEGIN, END = "<!-- bench-cluster:begin -->", "<!-- bench-cluster:end -->"
T3_BEGIN, T3_END = "<!-- bench-cluster-tree3:begin -->", "<!-- bench-cluster-tree3:end -->"
T3_ROWS = (("tree3-sf", "store and forward"), ("tree3-ct", "cut-through"))


def floor_s(ver):
    """The link-rate floor of one version: the busiest link's bytes / rate."""
    return max(max(rx, tx) * 8 / ver["rates"][p] for p, (rx, tx) in ver["links"].items())


def root_sent(ver):
    return ver["links"]["root"][0]


def summarize(rows):
    """{(row, n): {"t", "floor", "root", ...}} with medians over delta versions."""
    out = {}
    for r in rows:
        n, vs = r["n"], r["versions"]
        if r["row"] == "http":
            out[("http", n)] = {"t": vs[0]["t"], "floor": floor_s(vs[0]), "root": root_sent(vs[0])}
            continue
        if r["row"] == "xorz":
            out[("xorz", n)] = {"t": statistics.median(v["t"] for v in vs),
                                "floor": statistics.median(floor_s(v) for v in vs),
                                "root": statistics.median(root_sent(v) for v in vs),
                                "patch": statistics.median(v["patch_bytes"] for v in vs)}
            continue
        deltas = vs[1:]
        out[(r["row"], n)] = {
            "t": statistics.median(v["t"] for v in deltas),
            "t_max": max(v["t"] for v in deltas),
            "floor": statistics.median(floor_s(v) for v in deltas),
            "root": statistics.median(root_sent(v) for v in deltas),
            "broker_rss": r["broker_rss_kib"], "worker_rss": r["worker_rss_kib"],
        }
        out[(r["row"] + "-anchor", n)] = {"t": vs[0]["t"], "floor": floor_s(vs[0]), "root": root_sent(vs[0])}
    return out


ROWS = [
    ("star", "deltacast deltas, star (median of the deltas)"),
    ("tree", "deltacast deltas, tree of {relays} relays (median of the deltas)"),
    ("star-anchor", "deltacast full anchor, star (version 1)"),
    ("tree-anchor", "deltacast full anchor, tree (version 1)"),
    ("http", "whole model over HTTP (nginx on root, curl on every worker)"),
    ("xorz", "XOR + zstd -1 per tensor over HTTP (nginx on root, curl + apply on every worker; median of the deltas)"),
]


def fmt_b(b):
    return "%.2f MB" % (b / 1e6)


def section(rows, meta):
    s = summarize(rows)
    ns = sorted({n for (_, n) in s})
    head = "| row | " + " | ".join("N=%d" % n for n in ns) + " |\n|---|" + "---|" * len(ns) + "\n"
    out = [BEGIN, "", "Command: `%s` (%d s; %d CPUs, load average %s before, %s after: a shared machine)." % (
        meta["cmd"], meta["seconds"], meta["cpus"], meta["load0"], meta["load1"]), ""]
    out.append(
        "Model: gen-trace %s bf16 parameters (%s), an anchor then %d deltas at ~1%% density; chunks of %d "
        "elements; brokers with `--heartbeat-ms %d --anchor-fraction 0`; workers are `deltacast subscribe` "
        "(digests checked, local checkpoint written), each in its own network namespace.  Links: the root "
        "host's (trainer + root broker, or nginx) at %s, the bottleneck; every other host's at %s; tbf both "
        "ways%s.  Every worker's final model is checked bit-exact (model digest)." % (
            meta["params"], fmt_b(meta["model_bytes"]), meta["deltas"], meta["range_elems"],
            meta["heartbeat_ms"], meta["rate"], meta["edge"],
            "" if meta["netem"] else " (no added delay: this kernel has no sch_netem)"))
    out += ["", "Seconds from publish start (HTTP: request start) to the version applied on every worker:", "",
            head.rstrip("\n")]
    for key, label in ROWS:
        cells = ["%.3f" % s[(key, n)]["t"] if (key, n) in s else "" for n in ns]
        out.append("| %s | %s |" % (label.format(relays=meta["relays"]), " | ".join(cells)))
    cells = ["%.3f" % s[("star", n)]["floor"] if ("star", n) in s else "" for n in ns]
    out.append("| link-rate floor of the star deltas (bytes on the root link / its rate) | %s |" % " | ".join(cells))
    cells = ["%.3f" % s[("tree", n)]["floor"] if ("tree", n) in s else "" for n in ns]
    out.append("| link-rate floor of the tree deltas (busiest link's bytes / its rate) | %s |" % " | ".join(cells))
    rss = []
    for key, what in (("star", "root broker, star"), ("tree", "relay broker r1, tree"),
                      ("star", "one worker (w1), star")):
        field = "worker_rss" if "worker" in what else "broker_rss"
        if (key, ns[-1]) in s:
            rss.append("%s %d / %d" % ((what,) + tuple(s[(key, ns[-1])][field])))
    if rss:
        out += ["", "Resident memory at the end, N=%d (KiB, VmRSS / VmHWM): %s." % (ns[-1], "; ".join(rss))]
    out += ["", "Targets, this run:", "", "| target | measured | goal | |", "|---|---|---|---|"]
    for line in targets(s, ns):
        out.append(line)
    out += peer_lines(s, ns)
    out += ["", "Plots: `docs/plots/bench_cluster_time.png` (seconds to every worker against N, per row), "
            "`docs/plots/bench_cluster_bytes.png` (bytes the root host sent per version).", "", END]
    return "\n".join(out) + "\n", s, ns


def peer_lines(s, ns):
    """deltacast's star deltas beside the peer delta format, per N."""
    ns = [n for n in ns if ("star", n) in s and ("xorz", n) in s]
    if not ns:
        return []
    out = ["", "Against the peer delta format (XOR + zstd -1 per tensor, fetched from nginx), per delta version:",
           "", "| N | deltacast star, s | XOR + zstd, s | time ratio | root bytes per worker: deltacast / XOR + zstd "
           "(patch file) | bytes ratio |", "|---|---|---|---|---|---|"]
    for n in ns:
        d, x = s[("star", n)], s[("xorz", n)]
        out.append("| %d | %.3f | %.3f | %.2fx | %s / %s (%s) | %.2fx |" % (
            n, d["t"], x["t"], x["t"] / d["t"], fmt_b(d["root"] / n), fmt_b(x["root"] / n), fmt_b(x["patch"]),
            x["root"] / d["root"]))
    return out


def targets(s, ns):
    nmax, lines = max(ns), []

    def row(name, measured, goal, ok):
        lines.append("| %s | %s | %s | %s |" % (name, measured, goal, "met" if ok else "**not met**"))
        print("target: %s: %s (goal %s): %s" % (name, measured, goal, "met" if ok else "NOT MET"),
              file=sys.stderr)

    for key in ("star", "tree"):
        if (key, nmax) in s:
            d = s[(key, nmax)]
            row("1%% deltas to all %d workers, %s, within 2x the link-rate floor" % (nmax, key),
                "%.3f s = %.2fx the floor %.3f s (worst delta %.3f s)" % (d["t"], d["t"] / d["floor"], d["floor"], d["t_max"]),
                "at most 2.00x", d["t"] <= 2 * d["floor"])
    for key in ("star", "tree"):
        if (key, nmax) in s and ("http", nmax) in s:
            r = s[("http", nmax)]["t"] / s[(key, nmax)]["t"]
            row("deltas (%s) against the whole model over HTTP, N=%d" % (key, nmax),
                "%.1fx faster (%.3f s against %.3f s)" % (r, s[(key, nmax)]["t"], s[("http", nmax)]["t"]),
                "at least 50x", r >= 50)
    lo = 16 if ("tree", 16) in s else min(ns)
    if ("tree", lo) in s and ("tree", nmax) in s and lo != nmax:
        a, b = s[("tree", lo)]["root"], s[("tree", nmax)]["root"]
        row("tree: root egress per delta version, N=%d to N=%d" % (lo, nmax),
            "%s to %s (%+.1f%%)" % (fmt_b(a), fmt_b(b), 100 * (b - a) / a), "within 10%", abs(b - a) <= 0.1 * a)
    return lines


def plots(s, ns, meta, d):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in ROWS:
        xs = [n for n in ns if (key, n) in s]
        ax.plot(xs, [s[(key, n)]["t"] for n in xs], marker="o", label=label.format(relays=meta["relays"]))
    xs = [n for n in ns if ("star", n) in s]
    ax.plot(xs, [s[("star", n)]["floor"] for n in xs], "k--", label="link-rate floor, star deltas")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("workers")
    ax.set_ylabel("seconds to every worker")
    ax.set_title("%s model, root link %s" % (fmt_b(meta["model_bytes"]), meta["rate"]))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(d + "/bench_cluster_time.png", dpi=110)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in ROWS:
        xs = [n for n in ns if (key, n) in s]
        ax.plot(xs, [s[(key, n)]["root"] / 1e6 for n in xs], marker="o", label=label.format(relays=meta["relays"]))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("workers")
    ax.set_ylabel("MB sent by the root host per version")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(d + "/bench_cluster_bytes.png", dpi=110)


def tree3_cells(r):
    """One row of the tree3 table: anchor and median delta against their floors, CPU during the anchor."""
    if r is None:
        return ["not run"] + [""] * 4
    if "failed" in r:
        return ["**failed**: " + r["failed"]] + [""] * 4
    a, ds = r["versions"][0], r["versions"][1:]
    d_t, d_floor = statistics.median(v["t"] for v in ds), statistics.median(floor_s(v) for v in ds)
    return ["%.2f" % a["t"], "%.2fx (%.2f)" % (a["t"] / floor_s(a), floor_s(a)),
            "%.3f" % d_t, "%.2fx (%.3f)" % (d_t / d_floor, d_floor),
            "%.0f%% / %.0f%% / %.0f%%" % tuple(100 * a["cpu"][k] for k in ("busy", "softirq", "own"))]


def tree3_targets(by, n):
    lines = ["| target | measured | goal | |", "|---|---|---|---|"]

    def row(name, r, goal, lo, hi):
        if r is None or "failed" in r:
            measured, ok = "not run" if r is None else "failed", False
        else:
            x = r["versions"][0]["t"] / floor_s(r["versions"][0])
            measured, ok = "%.2fx" % x, lo <= x <= hi
        lines.append("| %s | %s | %s | %s |" % (name, measured, goal, "met" if ok else "**not met**"))
        print("target: %s: %s (goal %s): %s" % (name, measured, goal, "met" if ok else "NOT MET"), file=sys.stderr)

    row("anchor to all %d workers, cut-through, / floor" % n, by.get("tree3-ct"), "at most 1.30x", 0, 1.3)
    row("anchor to all %d workers, store and forward, / floor" % n, by.get("tree3-sf"),
        "2.5x to 3.5x (a floor a level)", 2.5, 3.5)
    cpus = [r["versions"][0]["cpu"] for r in by.values() if "versions" in r]
    lines.append("| machine busy during the anchors | %s | under 50%% | %s |" % (
        ", ".join("%.0f%% (the cluster's: %.0f%%)" % (100 * c["busy"], 100 * (c["softirq"] + c["own"]))
                  for c in cpus) or "not run",
        "met" if cpus and max(c["busy"] for c in cpus) < 0.5 else "**not met**"))
    return lines


def tree3_section(rows, meta):
    """The equal-rate 3-level tree: store and forward against cut-through."""
    by = {r["row"]: r for r in rows}
    f = meta["t3_fan"]
    out = [T3_BEGIN, "",
           "`%s`, %s, tree at %s, load %s before, %s after: %s bf16 parameters (%s), the anchor then a ~1%% "
           "delta; root (trainer + broker) to %d relays to %d relays to %d workers, every link %s (tbf); brokers "
           "`%s`, cut-through ones also `%s`.  Seconds from publish start to "
           "the version applied on every worker; the floor (s, in brackets): the busiest link's bytes at the switch "
           "(a broker's, %d copies) over its rate.  CPU during the anchor, shares of all %d cores (/proc/stat): busy "
           "(other users' too) / softirq (packets) / the cluster's processes." % (
               meta["cmd"], meta["date"], meta["commit"], meta["load0"].split()[0], meta["load1"].split()[0],
               meta["t3_params"], fmt_b(meta["t3_model_bytes"]), f, f * f, f ** 3, meta["t3_rate"],
               " ".join(["--heartbeat-ms %d --anchor-fraction 0" % meta["heartbeat_ms"]] +
                        ([meta["t3_flags"]] if meta.get("t3_flags") else [])),
               meta["t3_cut_flags"], f, meta["cpus"]),
           "",
           "| brokers | anchor, s | / floor | delta, s | / floor | CPU |",
           "|---|---|---|---|---|---|"]
    for key, label in T3_ROWS:
        out.append("| %s | %s |" % (label, " | ".join(tree3_cells(by.get(key)))))
    out += [""] + tree3_targets(by, f ** 3) + ["", T3_END]
    return "\n".join(out) + "\n"


def splice(doc, begin, end, text, heading):
    """doc with text between begin and end (appended under heading if absent)."""
    if begin in doc:
        return doc[:doc.index(begin)] + text.rstrip("\n") + doc[doc.index(end) + len(end):]
    return doc.rstrip("\n") + "\n\n" + heading + "\n\n" + text


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    meta = json.loads(sys.argv[2])
    t3 = [r for r in rows if r["row"].startswith("tree3-")]
    rows = [r for r in rows if not r["row"].startswith("tree3-")]
    doc = open(sys.argv[3]).read() if len(sys.argv) > 3 else None
    if rows:
        text, s, ns = section(rows, meta)
        print(text)
        if doc is not None:
            doc = splice(doc, BEGIN, END, text, "## Cluster: network namespaces, link-bound (`make bench-cluster`)")
            plots(s, ns, meta, sys.argv[4])
    if t3:
        text = tree3_section(t3, meta)
        print(text)
        if doc is not None:
            doc = splice(doc, T3_BEGIN, T3_END, text, "### An equal-rate tree, 3 levels (`BENCH_CLUSTER_ROWS=tree3`)")
    if doc is not None:
        open(sys.argv[3], "w").write(doc)


if __name__ == "__main__":
    main()
