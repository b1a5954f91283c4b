#!/usr/bin/env python3
"""Table and targets of `make bench-fanout` (scripts/bench_fanout.sh).

  bench_fanout_report.py ROOT DOC   print the section, then as the last line
                                    "intake_cpu_over_tcp R broker_cpu_over_nginx S
                                    fanout_over_raw_tcp_n1 T";
                                    DOC != "0": also rewrite the bench-fanout section
                                    of DOC (placed after the Sync section if absent)

ROOT holds meta ("key value" lines) and cells.log, one line per measurement:
"COLUMN N RUN SECONDS RECV_CPU SEND_CPU [RSS_KB REJOINS ACK_SECONDS]", COLUMN one of
tcp, keep, keepread, check, nginx, disk (time only), recv, lib, libsf and liblocal (only with bulk), live; RECV_CPU: the N receivers' CPU seconds (user + system)
summed, SEND_CPU: the sender's (bench_tcp's sender threads, nginx, the broker)."""
import collections
import os
import statistics
import sys

from bench_sync_report import read_kv

BEGIN, END = "<!-- bench-fanout:begin -->", "<!-- bench-fanout:end -->"
HEADING = "## Fan-out: an anchor to N consumers (`make bench-fanout`)"
AFTER = "<!-- bench-sync:end -->"
COLUMNS = [("tcp", "raw TCP"), ("keep", "raw TCP, receivers keep the model"),
           ("keepread", "the same, sent from the file through a 1 MiB buffer"),
           ("check", "the same, receivers that also hash it as the library does and write it with O_DIRECT"),
           ("nginx", "nginx + curl"),
           ("disk", "N writers of the model's bytes at once, O_DIRECT (the consumers' checkpoints alone)"),
           ("recv", "broker, anchor in its log, to N joining consumers that only receive"),
           ("lib", "broker, anchor in its log, to N joining library consumers until READY"),
           ("libsf", "the same, the broker with `--bulk-send sendfile`"),
           ("liblocal", "the same over the broker's unix socket (local: files by reference)"),
           ("live", "publish start to N waiting library consumers READY")]
GOAL = 1.25  # library consumers until READY, at most this times raw TCP
INTAKE_GOAL = 2.0  # their CPU per GB until READY, at most this times a keeping receiver's
TARGET_N = (4, 16)
LAST_N = 4  # the last line's N for its CPU ratios
WALL_N = 1  # and for its wall-time ratio
Run = collections.namedtuple("Run", "seconds recv_cpu send_cpu rss_kb rejoins ack from_open exec_cpu")

NOTES = """\
How it is measured (scripts/bench_fanout.sh): medians of {runs} runs [min..max] (x the row's raw TCP); the model is
gen-trace's first {params} bf16 version ({model} bytes).  References per N, in rounds with the broker's runs (one run of every column per round): **raw TCP**
(tests/tools/bench_tcp, bytes dropped; *keep the model*: each receiver reads into a model-sized buffer on huge
pages, as the consumer's tensors; *sent from the file through a 1 MiB buffer*: the sender reads the model file a MiB at a
time with pread and writes that, as a server copying from its page cache, the broker to a consumer on its host; *hash it as
the library does and write it with O_DIRECT*: the same, each receiver also hashing each 512 KiB piece as it lands, XXH3 of
each 2 MiB chunk and of its 1 MiB blocks, as the library's intake in place, and writing each chunk once whole into a file of
its own with O_DIRECT through io_uring, its time and CPU read once its last write is submitted, as the library's READY
does not wait for its checkpoint: the work the library must do, and nothing else), **nginx + curl** (`sendfile on`) and the **disk** (N `dd bs=2M oflag=direct`
writers of the model's size at once in the temp dir: the library consumers' checkpoints, written behind their READY).  A fresh broker ({broker_args}) per run.  *Anchor in its log*: the anchor is ACKed, then N
consumers start at once, timed from just before their exec to the last: `wire_client receive` ({window} MiB window, no checksum, no copy; with
`--bulk 1` when the broker has `--bulk`) or tests/tools/bench_sync_consumer (default options: they ask for bulk
anchors) at VERSION_READY (also timed from the first one's `dcast_consumer_open()` call, and their CPU counted from
theirs, reference rows: raw TCP's clock and counts start after its exec, the library's exec loads libzmq's tree).  With `--bulk` those consumers take the anchor over TCP (the broker with
`--bulk-no-local`), as from another host; *with `--bulk-send sendfile`*: the same, the payloads sent with sendfile(2), where the
broker's default (`auto`) copies them to a consumer on its own host; *over the broker's unix socket*: the broker's default for a
consumer on its host, which reads each payload from the broker's segment file (a reference, the file passed with SCM_RIGHTS): no
copy in the broker.  The targets take the TCP column.  *Publish start*: the consumers wait first, timed
from `dcast_producer_publish()` (two hops in turn).  **CPU per GB**: user + system seconds per 10^9 bytes delivered;
receivers by getrusage, `times` or their own line, senders by /proc/PID/task/TID/schedstat (over loopback the sender's
system time carries much of the receivers' work).  Last line: `intake_cpu_over_tcp` (library consumers over receivers
that keep the model) and `broker_cpu_over_nginx` at N = {last_n}, `fanout_over_raw_tcp_n1` at N = {wall_n}."""


def columns(cells, cpu=False):
    """COLUMNS that this run measured (libsf, liblocal only with bulk); with cpu, those that count CPU (not disk)."""
    return [(c, name) for c, name in COLUMNS if any(k == c for k, _ in cells) and not (cpu and c == "disk")]


def read_cells(path):
    """{(column, n): [Run, ...]} (rss_kb, rejoins, ack 0 where the line has none)"""
    cells = {}
    for line in open(path):
        w = line.split()
        vals = [float(x) for x in w[3:11]] + [0] * 5
        cells.setdefault((w[0], int(w[1])), []).append(Run(*vals[:8]))
    return cells


def median_s(runs):
    return statistics.median(r.seconds for r in runs)


def cpu_per_gb(runs, field, n, model):
    """The median of the runs' CPU seconds in FIELD per GB moved to the N receivers."""
    return statistics.median(getattr(r, field) for r in runs) / (model * n / 1e9)


def ms(s):
    return "%.0f" % (s * 1e3) if s >= 0.1 else "%.1f" % (s * 1e3)


def time_cell(runs, tcp):
    m = median_s(runs)
    lo, hi = min(r.seconds for r in runs), max(r.seconds for r in runs)
    return "%s (%.2fx) [%s..%s]" % (ms(m), m / tcp, ms(lo), ms(hi))


def rss_cell(runs, model):
    kb = statistics.median(r.rss_kb for r in runs)
    return "%.0f (%.2fx model)" % (kb * 1024 / 1e6, kb * 1024 / model)


def table(cells, ns, model):
    cols = columns(cells)
    head = ["N"] + ["%s, ms" % name for _, name in cols] + \
        ["broker VmRSS after the anchor, MB", "re-joins", "publish to ACK, ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for n in ns:
        tcp = median_s(cells[("tcp", n)])
        row = [str(n), ms(tcp)] + [time_cell(cells[(c, n)], tcp) for c, _ in cols[1:]]
        lib = cells[("lib", n)]
        rejoins = sum(r.rejoins for c in ("lib", "live") for r in cells[(c, n)])
        row += [rss_cell(lib, model), "%d" % rejoins, ms(statistics.median(r.ack for r in lib))]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def cpu_table(cells, ns, model):
    """CPU seconds per GB moved, receivers / sender, one column per cell."""
    cols = columns(cells, cpu=True)
    head = ["N"] + [name for _, name in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for n in ns:
        row = [str(n)] + ["%.2f / %.2f" % (cpu_per_gb(cells[(c, n)], "recv_cpu", n, model),
                                          cpu_per_gb(cells[(c, n)], "send_cpu", n, model)) for c, _ in cols]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def verdict(ok):
    return "met" if ok else "**not met**"


def judged(r, goal):
    """(r, its verdict against at most goal)"""
    return r, verdict(r <= goal)


def targets(cells, ns, model):
    lines = ["| target | goal | measured (medians) | |", "| --- | --- | --- | --- |"]
    for n in [n for n in TARGET_N if n in ns]:
        lib, web = (median_s(cells[(c, n)]) for c in ("lib", "nginx"))
        lines.append(wall_row(cells, n))
        lines.append("| library consumers until READY against nginx + curl, N = %d | faster | %s against %s ms | %s |"
                     % (n, ms(lib), ms(web), verdict(lib < web)))
    lines += cpu_targets(cells, ns, model)
    for n in ns:
        lib, keep = (median_s(cells[(c, n)]) for c in ("lib", "keep"))
        lines.append("| (a reference, not a target) library consumers until READY / raw TCP to receivers "
                     "that keep the model, N = %d | | %s / %s ms = %.2fx | |" % (n, ms(lib), ms(keep), lib / keep))
    for n in [n for n in ns if ("keepread", n) in cells]:
        lib, keep = (median_s(cells[(c, n)]) for c in ("lib", "keepread"))
        lines.append("| (a reference, not a target) library consumers until READY / raw TCP from the model file "
                     "through a 1 MiB buffer to receivers that keep the model, N = %d | | %s / %s ms = %.2fx | |"
                     % (n, ms(lib), ms(keep), lib / keep))
    lines += check_refs(cells, ns, model)
    for n in [n for n in ns if ("disk", n) in cells]:
        lib, disk = (median_s(cells[(c, n)]) for c in ("lib", "disk"))
        lines.append("| (a reference, not a target) library consumers until READY / their checkpoints' bytes "
                     "written alone, N = %d | | %s / %s ms = %.2fx | |" % (n, ms(lib), ms(disk), lib / disk))
    for n in ns:
        broker, web = (sum(cpu_per_gb(cells[(c, n)], f, n, model) for f in ("recv_cpu", "send_cpu"))
                       for c in ("recv", "nginx"))
        lines.append("| (a reference, not a target) sender + receivers, CPU per GB: the broker and joiners that "
                     "only receive / nginx and curl, N = %d | | %.2f / %.2f = %.2fx | |"
                     % (n, broker, web, ratio("sender + receivers", broker, web)))
    return lines + sendfile_refs(cells, ns, model)


def check_refs(cells, ns, model):
    """Against the receivers that do the library's work and nothing else (check): what that work costs over
    keeping alone, the library's CPU (from its open, where its lines say) and its time over theirs."""
    lines = []
    for n in [n for n in ns if ("check", n) in cells]:
        work, keep, lib = (cpu_per_gb(cells[(c, n)], "recv_cpu", n, model) for c in ("check", "keep", "lib"))
        runs = cells[("lib", n)]
        opened = statistics.median(r.recv_cpu - r.exec_cpu for r in runs) / (model * n / 1e9) \
            if all(r.exec_cpu > 0 for r in runs) else lib
        t, t0 = (median_s(cells[(c, n)]) for c in ("lib", "check"))
        lines.append("| (a reference, not a target) the library's work alone (receivers that keep the model, hash it "
                     "as the library does and write it with O_DIRECT), N = %d: their CPU per GB / keeping receivers'; "
                     "library consumers' (from their open) / theirs; until READY / their time | | %.2f / %.2f = %.2fx; "
                     "%.2f / %.2f = %.2fx; %s / %s ms = %.2fx | |"
                     % (n, work, keep, ratio("check over keep", work, keep), opened, work,
                        ratio("intake over check", opened, work), ms(t), ms(t0), t / t0))
    return lines


VARIANTS = [("libsf", "`--bulk-send sendfile`"), ("liblocal", "the broker's unix socket (local)")]


def sendfile_refs(cells, ns, model):
    """The CPU targets' ratios again for the broker with --bulk-send sendfile, and over its unix socket
    (with its time until READY against the default's)."""
    lines = []
    for col, flag in VARIANTS:
        for n in [n for n in ns if (col, n) in cells]:
            lib, keep = (cpu_per_gb(cells[(c, n)], "recv_cpu", n, model) for c in (col, "keep"))
            broker, web = (cpu_per_gb(cells[(c, n)], "send_cpu", n, model) for c in (col, "nginx"))
            t, t0 = (median_s(cells[(c, n)]) for c in (col, "lib"))
            lines.append("| (a reference, not a target) with %s, N = %d: library consumers' CPU per GB / keeping "
                         "receivers'; the broker's / nginx's; until READY / the default's | | %.2f / %.2f = %.2fx; "
                         "%.2f / %.2f = %.2fx; %s / %s ms = %.2fx | |"
                         % (flag, n, lib, keep, ratio(col + " intake", lib, keep), broker, web,
                            ratio(col + " broker", broker, web), ms(t), ms(t0), t / t0))
    return lines


def cpu_targets(cells, ns, model):
    """The targets in CPU per byte, and the wall-time one at N = 1 (no oversubscription)."""
    lines = []
    for n in ns:
        lib, keep = (cpu_per_gb(cells[(c, n)], "recv_cpu", n, model) for c in ("lib", "keep"))
        lines.append("| library consumers' CPU per GB until READY / raw TCP receivers' that keep the model, "
                     "N = %d | at most %.0fx | %.2f / %.2f = %.2fx | %s |"
                     % (n, INTAKE_GOAL, lib, keep, *judged(ratio("intake CPU", lib, keep), INTAKE_GOAL)))
        lines += from_open_cpu_row(cells, n, model, keep)
    for n in ns:
        broker, web = (cpu_per_gb(cells[(c, n)], "send_cpu", n, model) for c in ("lib", "nginx"))
        lines.append("| the broker's CPU per GB sent to library consumers / nginx's to curl, N = %d | at most 1x "
                     "| %.2f / %.2f = %.2fx | %s |" % (n, broker, web, *judged(ratio("broker CPU", broker, web), 1.0)))
    return lines + [wall_row(cells, WALL_N), *from_open_row(cells, WALL_N)] if WALL_N in ns else lines


def from_open_cpu_row(cells, n, model, keep):
    """The intake CPU row again, less the consumers' CPU before their dcast_consumer_open() call (their exec and
    library loading, which bench_tcp's per-thread counts leave out); none where their lines carry none."""
    runs = cells[("lib", n)]
    if not all(r.exec_cpu > 0 for r in runs):
        return []
    lib = statistics.median(r.recv_cpu - r.exec_cpu for r in runs) / (model * n / 1e9)
    return ["| (a reference, not a target) the same from their `dcast_consumer_open()` calls (their exec and "
            "library loading left out, as the receivers' counts leave out theirs), N = %d | | %.2f / %.2f = %.2fx | |"
            % (n, lib, keep, ratio("intake CPU from open", lib, keep))]


def wall_row(cells, n):
    lib, tcp = (median_s(cells[(c, n)]) for c in ("lib", "tcp"))
    return ("| library consumers until READY / raw TCP, N = %d | at most %.2fx | %s / %s ms = %.2fx | %s |"
            % (n, GOAL, ms(lib), ms(tcp), lib / tcp, verdict(lib / tcp <= GOAL)))


def from_open_row(cells, n):
    """The wall row again, the library's time counted from its dcast_consumer_open() call, as bench_tcp's
    starts after its own exec; none where the consumers' lines carry no open time."""
    runs = cells[("lib", n)]
    if not all(r.from_open > 0 for r in runs):
        return []
    lib, tcp = statistics.median(r.from_open for r in runs), median_s(cells[("tcp", n)])
    return ["| (a reference, not a target) the same, the library's time from its `dcast_consumer_open()` call "
            "(the process's exec and library loading left out, as raw TCP's clock leaves out its own), N = %d "
            "| | %s / %s ms = %.2fx | |" % (n, ms(lib), ms(tcp), lib / tcp)]


def pick_n(want, ns):
    """WANT if this run has it, else its first N (said on stderr)."""
    if want in ns:
        return want
    print("bench-fanout: no N = %d in this run; the last line uses N = %d for it" % (want, ns[0]), file=sys.stderr)
    return ns[0]


def ratio(name, a, b):
    """a / b; inf (said on stderr) where b is 0: nothing measured."""
    if b > 0:
        return a / b
    print("bench-fanout: %s: the reference measured 0" % name, file=sys.stderr)
    return float("inf")


def last_line(cells, ns, model):
    n, n1 = pick_n(LAST_N, ns), pick_n(WALL_N, ns)
    intake = ratio("intake_cpu_over_tcp", cpu_per_gb(cells[("lib", n)], "recv_cpu", n, model),
                   cpu_per_gb(cells[("keep", n)], "recv_cpu", n, model))
    broker = ratio("broker_cpu_over_nginx", cpu_per_gb(cells[("lib", n)], "send_cpu", n, model),
                   cpu_per_gb(cells[("nginx", n)], "send_cpu", n, model))
    wall = ratio("fanout_over_raw_tcp_n1", median_s(cells[("lib", n1)]), median_s(cells[("tcp", n1)]))
    return "intake_cpu_over_tcp %.2f broker_cpu_over_nginx %.2f fanout_over_raw_tcp_n1 %.2f" % (intake, broker, wall)


def section(meta, cells, ns):
    model = int(meta["model_bytes"])
    head = ("Command: `%s` (%s s; %s, %s CPUs (%s), load average %s at the start, %s at the end: a shared "
            "machine, timings are noisy).  %s bf16 parameters, the whole model (%d bytes) as one anchor to N "
            "consumers over loopback." % (
                meta["command"], meta["seconds"], meta["kernel"], meta["cpus"], meta["cpu"], meta["load_start"],
                meta["load_end"], meta["params"], model))
    broker_args = "its defaults" if meta["broker_args"] == "none" else "flags: " + meta["broker_args"]
    notes = NOTES.format(runs=meta["runs"], params=meta["params"], model=model, broker_args=broker_args,
                         window=int(meta["window"]) >> 20, last_n=LAST_N, wall_n=WALL_N)
    lines = [BEGIN, head, "", *table(cells, ns, model), "",
             "CPU seconds (user + system) per GB moved to the N receivers, receivers / sender:", "",
             *cpu_table(cells, ns, model), "",
             "Targets, never adjusted here:", "", *targets(cells, ns, model), "", notes, END]
    return "\n".join(lines) + "\n"


def write_doc(doc, body):
    s = open(doc).read() if os.path.exists(doc) else ""
    if BEGIN in s and END in s:
        s = s[:s.index(BEGIN)] + body.rstrip("\n") + s[s.index(END) + len(END):]
    elif AFTER in s:  # the sync section's own text after its marker stays with it
        nxt = s.find("\n## ", s.index(AFTER))
        at = len(s) if nxt < 0 else nxt + 1
        s = s[:at] + HEADING + "\n\n" + body.rstrip("\n") + "\n\n" + s[at:]
    else:
        s = s.rstrip("\n") + "\n\n" + HEADING + "\n\n" + body
    open(doc, "w").write(s)


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    meta = read_kv(os.path.join(argv[1], "meta"))
    cells = read_cells(os.path.join(argv[1], "cells.log"))
    ns = sorted({n for _, n in cells})
    body = section(meta, cells, ns)
    sys.stdout.write(body)
    if argv[2] != "0":
        write_doc(argv[2], body)
        print("bench-fanout: wrote %s" % argv[2], file=sys.stderr)
    sys.stdout.flush()
    print(last_line(cells, ns, int(meta["model_bytes"])))


if __name__ == "__main__":
    main(sys.argv)
