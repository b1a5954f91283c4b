#!/usr/bin/env python3
"""Table and targets of `make bench-sync` (scripts/bench_sync.sh).

  bench_sync_report.py delta-bytes ROOT   median delta payload bytes of ROOT/floor.log
  bench_sync_report.py table ROOT DOC     print the section; DOC != "0": also rewrite the
                                          bench-sync section of DOC (appended if absent)

ROOT holds floor.log (tests/tools/bench_sync_floor), meta ("key value" lines) and one folder
per run with its references floor.log and tcp.log ("tcp delta|model N BYTES S"), config, publish.log
(tests/tools/fault_publish) and cI.log per consumer: "applied V KIND key value..."
(bench_sync_consumer, C or Python) or "T_US WRITE_BYTES version V KIND key value..."
(`deltacast subscribe` lines stamped by bench_sync.sh)."""
import os
import statistics
import sys

BEGIN, END = "<!-- bench-sync:begin -->", "<!-- bench-sync:end -->"
FORMS = {"lib": "library, C (bench_sync_consumer)", "py": "library, Python binding",
         "sub": "`deltacast subscribe`",
         "gpu": "library, C, producer's and consumers' tensors in CUDA memory"}
FORM_ORDER = ["lib", "py", "sub", "gpu"]


def pairs(words):
    """{key: int or float} from "key value key value ..." (ms keys become ns)."""
    out = {}
    for k, v in zip(words[::2], words[1::2]):
        try:
            val = float(v)
        except ValueError:
            continue
        if k.endswith("_ms"):
            k, val = k[:-3] + "_ns", val * 1e6
        out[k] = val
    return out


def consumer_line(line):
    """(version, {t_ns, stage_ns, apply_ns, bytes, ...}) or None."""
    w = line.split()
    if len(w) >= 3 and w[0] == "applied":
        rec = pairs(w[3:])
        return int(w[1]), rec
    if len(w) >= 5 and w[2] == "version":
        rec = pairs(w[5:])
        rec["t_ns"], rec["io_write_bytes"] = int(w[0]) * 1000, int(w[1])
        return int(w[3]), rec
    return None


def read_consumer(path):
    out = {}
    for line in open(path):
        got = consumer_line(line)
        if got:
            out[got[0]] = got[1]
    return out


def read_kv(path):
    out = {}
    for line in open(path):
        k, _, v = line.rstrip("\n").partition(" ")
        out[k] = v
    return out


def median(xs):
    return statistics.median(xs) if xs else None


def grown(cons, key, v):
    """Largest growth of a cumulative counter from v-1 to v over the consumers, or None."""
    if any(key not in c[v] or key not in c[v - 1] for c in cons):
        return None
    return max(c[v][key] - c[v - 1][key] for c in cons)


def most(cons, key, v):
    return max(c[v][key] for c in cons) if all(key in c[v] for c in cons) else None


def run_summary(d, warmup):
    """The numbers of one run: per delta version after the warm-up ones, then medians."""
    cfg = read_kv(os.path.join(d, "config"))
    pub = {}
    for line in open(os.path.join(d, "publish.log")):
        w = line.split()
        pub[int(w[1])] = (int(w[2]), int(w[3]))
    cons = [read_consumer(os.path.join(d, f)) for f in sorted(os.listdir(d))
            if f.startswith("c") and f.endswith(".log")]
    deltas = sorted(pub)[1 + warmup:]
    per = {k: [] for k in ("reach", "rest", "publish", "stage", "apply", "bytes", "hashed", "written", "logged")}
    for v in deltas:
        last = max((c[v] for c in cons), key=lambda r: r["t_ns"])
        per["reach"].append(last["t_ns"] - pub[v][0])
        per["rest"].append(per["reach"][-1] - last["stage_ns"] - last["apply_ns"])
        per["publish"].append(pub[v][1] - pub[v][0])
        per["stage"].append(most(cons, "stage_ns", v))
        per["apply"].append(most(cons, "apply_ns", v))
        per["bytes"].append(most(cons, "bytes", v))
        per["hashed"].append(most(cons, "verify_bytes", v))
        per["written"].append(grown(cons, "io_write_bytes", v))
        per["logged"].append(grown(cons, "log_write_bytes", v))
    s = {k: (None if None in xs else median(xs)) for k, xs in per.items()}
    s["written_mean"] = None if None in per["written"] else statistics.mean(per["written"])
    s.update(form=cfg["form"], n=int(cfg["n"]), datadir=cfg["datadir"] == "1",
             reach_min=min(per["reach"]), reach_max=max(per["reach"]), versions=len(deltas))
    tcp = tcp_summary(d)
    s.update(floor=floor_summary(d), tcp_delta=tcp[("delta", s["n"])], tcp_model=tcp[("model", s["n"])])
    return s


def floor_summary(d):
    rows = [pairs(line.split()[2:]) for line in open(os.path.join(d, "floor.log"))]
    get = lambda k: median([r[k] for r in rows])  # noqa: E731
    return {"encode": get("encode_ns"), "apply": get("apply_ns"),
            "total": median([r["encode_ns"] + r["apply_ns"] for r in rows]),
            "payload": get("payload_bytes"), "changed": get("changed"), "pairs": len(rows)}


def tcp_summary(d):
    got = {}
    for line in open(os.path.join(d, "tcp.log")):
        _, kind, n, _, s = line.split()
        got.setdefault((kind, int(n)), []).append(float(s) * 1e9)
    return {k: median(v) for k, v in got.items()}


def ms(ns):
    return "-" if ns is None else "%.1f" % (ns / 1e6)


def mb_of(b, model):
    return "not reported" if b is None else "%.2f (%.3f)" % (b / 1e6, b / model)


def ratio(a, b):
    return None if a is None or not b else a / b


def fmt_ratio(r):
    return "-" if r is None else "%.3gx" % r


def columns(model):
    """(header, cell of a run) for each column of the main table."""
    return [
        ("consumer", lambda r: FORMS[r["form"]]),
        ("N", lambda r: "%d" % r["n"]),
        ("broker", lambda r: "--data-dir" if r["datadir"] else "memory"),
        ("delta to all N, ms: median (min..max)",
         lambda r: "%s (%s..%s)" % (ms(r["reach"]), ms(r["reach_min"]), ms(r["reach_max"]))),
        ("publish to ACK, ms", lambda r: ms(r["publish"])),
        ("last consumer: before its first chunk + after its apply, ms", lambda r: ms(r["rest"])),
        ("stage, ms", lambda r: ms(r["stage"])),
        ("apply, ms", lambda r: ms(r["apply"])),
        ("raw TCP, delta bytes, ms", lambda r: ms(r["tcp_delta"])),
        ("raw TCP, whole model, ms", lambda r: ms(r["tcp_model"])),
        ("delta / TCP whole model", lambda r: "**%s**" % fmt_ratio(ratio(r["reach"], r["tcp_model"]))),
        ("floor, ms", lambda r: ms(r["floor"]["total"])),
        ("stage / floor", lambda r: fmt_ratio(ratio(r["stage"], r["floor"]["total"]))),
        ("hashed per consumer, MB (x model)", lambda r: mb_of(r["hashed"], model)),
        ("written per consumer, MB (x model); mean", lambda r: "%s; %s" % (
            mb_of(r["written"], model), "-" if r["written_mean"] is None else "%.2f" % (r["written_mean"] / 1e6))),
        ("of it, record log, MB", lambda r: "-" if r["logged"] is None else "%.2f" % (r["logged"] / 1e6)),
        ("wire bytes per consumer", lambda r: "%d" % r["bytes"]),
    ]


def table_rows(runs, model):
    cols = columns(model)
    out = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + " --- |" * len(cols)]
    for r in runs:
        out.append("| " + " | ".join(cell(r) for _, cell in cols) + " |")
    return out


def verdict(value, goal):
    if value is None:
        return "not measured"
    return "met" if value <= goal else "**not met**"


def cell_ratio(a, b, goal, unit="ms"):
    r = ratio(a, b)
    if unit == "MB":
        return "not reported: not measured" if r is None else "%.2f MB = %.3f: %s" % (a / 1e6, r, verdict(r, goal))
    return "%s / %s ms = %s: %s" % (ms(a), ms(b), fmt_ratio(r), verdict(r, goal))


def target_rows(runs, model, n):
    """One row per target, one column per consumer form: (1) and the bytes at N = n, the
    stage time at N = 1 (a consumer alone) and at N = n; runs without --data-dir."""
    forms = [f for f in FORM_ORDER if any(r["form"] == f for r in runs)]
    at = {(r["form"], r["n"]): r for r in runs if not r["datadir"]}
    rows = [("(1) 1%% delta to all %d consumers / raw TCP of the whole model to %d" % (n, n), "at most 0.1x",
             lambda f: cell_ratio(at[f, n]["reach"], at[f, n]["tcp_model"], 0.1)),
            ("(2) bytes hashed per version per consumer / model, N = %d" % n, "at most 0.05",
             lambda f: cell_ratio(at[f, n]["hashed"], model, 0.05, "MB")),
            ("(2) bytes written to disk per version per consumer / model, N = %d" % n, "at most 0.05",
             lambda f: cell_ratio(at[f, n]["written"], model, 0.05, "MB"))]
    for k in sorted({1, n}):
        rows.append(("(2) stage time / compute floor, N = %d" % k, "at most 3x",
                     lambda f, k=k: cell_ratio(at[f, k]["stage"], at[f, k]["floor"]["total"], 3)
                     if (f, k) in at else "-"))
    out = ["| target | goal | " + " | ".join(FORMS[f] for f in forms) + " |",
           "| --- | --- |" + " --- |" * len(forms)]
    for label, goal, cell in rows:
        out.append("| %s | %s | %s |" % (label, goal, " | ".join(cell(f) for f in forms)))
    return out


NOTES = """\
How it is measured (scripts/bench_sync.sh): **delta to all N** from `dcast_producer_publish()` to the last
consumer's apply, one version at a time; **stage** (first chunk to READY) and **apply**: the slowest consumer's;
**raw TCP** (tests/tools/bench_tcp) and the **floor** (tests/tools/bench_sync_floor) just before each row;
**hashed**: `verify_bytes`, **written**: /proc/PID/io `write_bytes`.  Every counted version passed its digest check.
"""


def floor_line(runs):
    """The compute floor: medians over the rows' own measurements (min..max of the totals)."""
    fl = [r["floor"] for r in runs]
    tot = [f["total"] for f in fl]
    f0 = fl[0]
    return ("Compute floor (one thread, measured before each row): encode %s ms + decode and scatter %s ms = "
            "**%s ms** per delta, median over the rows (%s..%s); payload %d bytes, %d changed elements "
            "(median of the %d counted deltas)." % (
                ms(median([f["encode"] for f in fl])), ms(median([f["apply"] for f in fl])), ms(median(tot)),
                ms(min(tot)), ms(max(tot)), f0["payload"], f0["changed"], f0["pairs"]))


def section(root):
    meta = read_kv(os.path.join(root, "meta"))
    model = int(meta["model_bytes"])
    runs = [run_summary(os.path.join(root, d), int(meta["warmup"])) for d in sorted(os.listdir(root))
            if os.path.exists(os.path.join(root, d, "config"))]
    runs.sort(key=lambda r: (r["datadir"], r["n"], FORM_ORDER.index(r["form"])))
    ns = sorted({r["n"] for r in runs})
    tn = 4 if 4 in ns else ns[-1]
    budget = [0.1 * r["tcp_model"] for r in runs if r["n"] == tn and not r["datadir"]]
    lines = [BEGIN,
             "Command: `%s` (%d s; Linux %s, %s CPUs, load average %s at the start, %s at the end: a shared "
             "machine, timings are noisy).  %s bf16 parameters (%d bytes), an anchor, %s warm-up delta%s, then %s deltas "
             "at ~1%% density (gen-trace); medians over those %s." % (
                 meta["command"], int(meta["seconds"]), os.uname().machine, meta["cpus"], meta["load_start"],
                 meta["load_end"], meta["params"], model, meta["warmup"], "" if meta["warmup"] == "1" else "s",
                 meta["versions"], meta["versions"]),
             "", *table_rows(runs, model), "", floor_line(runs), "",
             "Targets, broker without --data-dir; each ratio against its own row's references.  "
             "The budget of (1) at N = %d was %s..%s ms in these rows, against the one-thread compute floor above:" % (
                 tn, ms(min(budget)), ms(max(budget))),
             "", *target_rows(runs, model, tn), "", NOTES.rstrip("\n"), END]
    return "\n".join(lines) + "\n"


def write_doc(doc, body):
    s = open(doc).read() if os.path.exists(doc) else ""
    if BEGIN in s and END in s:
        s = s[:s.index(BEGIN)] + body.rstrip("\n") + s[s.index(END) + len(END):]
    else:
        s = s.rstrip("\n") + "\n\n## Sync: a delta to N consumers (`make bench-sync`)\n\n" + body
    open(doc, "w").write(s)


def main(argv):
    if len(argv) == 3 and argv[1] == "delta-bytes":
        print(int(floor_summary(argv[2])["payload"]))
    elif len(argv) == 4 and argv[1] == "table":
        body = section(argv[2])
        sys.stdout.write(body)
        if argv[3] != "0":
            write_doc(argv[3], body)
            print("bench-sync: wrote %s" % argv[3], file=sys.stderr)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
