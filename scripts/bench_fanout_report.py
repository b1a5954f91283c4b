#!/usr/bin/env python3
"""Table and targets of `make bench-fanout` (scripts/bench_fanout.sh).

  bench_fanout_report.py ROOT DOC   print the section, then as the last line
                                    "fanout_over_raw_tcp R nginx_over_raw_tcp S";
                                    DOC != "0": also rewrite the bench-fanout section
                                    of DOC (placed after the Sync section if absent)

ROOT holds meta ("key value" lines) and cells.log, one line per measurement:
"COLUMN N RUN SECONDS [RSS_KB REJOINS ACK_SECONDS]", COLUMN one of tcp, keep, nginx, recv, lib, live."""
import os
import statistics
import sys

from bench_sync_report import read_kv

BEGIN, END = "<!-- bench-fanout:begin -->", "<!-- bench-fanout:end -->"
HEADING = "## Fan-out: an anchor to N consumers (`make bench-fanout`)"
AFTER = "<!-- bench-sync:end -->"
COLUMNS = [("tcp", "raw TCP"), ("keep", "raw TCP, receivers keep the model"), ("nginx", "nginx + curl"),
           ("recv", "broker, anchor in its log, to N joining consumers that only receive"),
           ("lib", "broker, anchor in its log, to N joining library consumers until READY"),
           ("live", "publish start to N waiting library consumers READY")]
GOAL = 1.25  # library consumers until READY, at most this times raw TCP
TARGET_N = (4, 16)
LAST_N = 4  # the last line's N

NOTES = """\
How it is measured (scripts/bench_fanout.sh; every number from this one run, each cell the
median of {runs} runs, min..max in brackets, the ratio to the same row's raw TCP median):
- The model: gen-trace's first version of a {params} bf16 model, a safetensors file of
  {model} bytes ({payload} bytes of tensor payload on the broker's wire).
- Per N, first the row's references, so that a row and its references see the same load on
  this shared machine: **raw TCP** (tests/tools/bench_tcp: the file's size to N receivers at
  once over loopback, one sender and one receiver thread per connection, 1 MiB writes, reads
  into a 1 MiB buffer, nothing else done with the bytes); **raw TCP, receivers keep the
  model**: the same, each receiver reading into a buffer of the file's size that it allocates
  when it starts (`bench_tcp BYTES N keep`): the least a receiver that keeps the model pays,
  the first touch of that memory included (a consumer must hold the model); **nginx + curl**: a private nginx
  (its own conf and prefix in a temp dir, a free port, `sendfile on`, one worker per core)
  started for the row, then N `curl -o /dev/null` of the file at once, from the start of the
  first to the end of the last, each checked to have received the whole file.
- Then the broker ({broker_args}), a fresh one for every run.  The two "anchor in its log"
  columns are late joiners (a restarted fleet, workers added to a run): tests/tools/fault_publish
  publishes the file as version 1, an anchor, with the producer library and the broker ACKs
  it; then N consumers start at once, and the time runs from their start (the script's clock
  before the first is forked) to the last consumer's line (CLOCK_REALTIME in each process):
  **only receive**: `wire_client receive` (tests/tools/wire_client.c) sends HELLO with the
  library's window ({window} MiB), counts each CHUNK's payload bytes and gives the credit back,
  and prints its line at the anchor's COMMIT once the chunk and byte counts match it (no
  checksum, no copy); **library consumers until READY**: tests/tools/bench_sync_consumer, the C
  library with default options (64 MiB staging budget, every chunk checksummed, digests checked,
  the record log written in DIR), prints its line when `dcast_consumer_poll()` returns the
  anchor's VERSION_READY, then applies it.  **publish start to N waiting library consumers**
  (a new run: the consumers are there first): the same library consumers join, and the time
  runs from fault_publish's `dcast_producer_publish()` call to the last READY; it holds two
  hops, trainer to broker and broker to consumers, one after the other: the broker serves a
  version once it is committed (docs/protocol.md), so this column is about the raw TCP time
  plus the publish to ACK time at best.
- **broker VmRSS after the anchor**: /proc/PID/status of the broker in the library runs, once
  every consumer has applied the anchor; against the model file's size.  **re-joins**: the
  broker's "joined" lines beyond N, summed over the library runs (a consumer the broker
  dropped, or that gave up its session, joins again).  **publish to ACK**: the producer's
  publish call to the broker's ACK of the anchor (checksums, send, commit), median of the
  late-joiner library runs.
- After each broker run its processes are killed, its files removed and `sync` waits for the
  writeback, so that a run does not pay for the one before.
- Everything shares this machine's cores: producer, broker, N consumers, the references."""


def read_cells(path):
    """{(column, n): [(seconds, rss_kb, rejoins, ack_seconds), ...]}"""
    cells = {}
    for line in open(path):
        w = line.split()
        extra = [float(x) for x in w[4:7]] + [0, 0, 0]
        cells.setdefault((w[0], int(w[1])), []).append((float(w[3]), *extra[:3]))
    return cells


def median_s(runs):
    return statistics.median(r[0] for r in runs)


def ms(s):
    return "%.0f" % (s * 1e3) if s >= 0.1 else "%.1f" % (s * 1e3)


def time_cell(runs, tcp):
    m = median_s(runs)
    lo, hi = min(r[0] for r in runs), max(r[0] for r in runs)
    return "%s (%.2fx) [%s..%s]" % (ms(m), m / tcp, ms(lo), ms(hi))


def rss_cell(runs, model):
    kb = statistics.median(r[1] for r in runs)
    return "%.0f (%.2fx model)" % (kb * 1024 / 1e6, kb * 1024 / model)


def table(cells, ns, model):
    head = ["N"] + ["%s, ms" % name for _, name in COLUMNS] + \
        ["broker VmRSS after the anchor, MB", "re-joins", "publish to ACK, ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for n in ns:
        tcp = median_s(cells[("tcp", n)])
        row = [str(n), ms(tcp)] + [time_cell(cells[(c, n)], tcp) for c, _ in COLUMNS[1:]]
        lib = cells[("lib", n)]
        rejoins = sum(r[2] for c in ("lib", "live") for r in cells[(c, n)])
        row += [rss_cell(lib, model), "%d" % rejoins, ms(statistics.median(r[3] for r in lib))]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def verdict(ok):
    return "met" if ok else "**not met**"


def targets(cells, ns):
    lines = ["| target | goal | measured (medians) | |", "| --- | --- | --- | --- |"]
    for n in [n for n in TARGET_N if n in ns]:
        lib, tcp, web = (median_s(cells[(c, n)]) for c in ("lib", "tcp", "nginx"))
        lines.append("| library consumers until READY / raw TCP, N = %d | at most %.2fx | %s / %s ms = %.2fx | %s |"
                     % (n, GOAL, ms(lib), ms(tcp), lib / tcp, verdict(lib / tcp <= GOAL)))
        lines.append("| library consumers until READY against nginx + curl, N = %d | faster | %s against %s ms | %s |"
                     % (n, ms(lib), ms(web), verdict(lib < web)))
    for n in [n for n in TARGET_N if n in ns]:
        lib, keep = (median_s(cells[(c, n)]) for c in ("lib", "keep"))
        lines.append("| (a reference, not a target) library consumers until READY / raw TCP to receivers "
                     "that keep the model, N = %d | | %s / %s ms = %.2fx | |" % (n, ms(lib), ms(keep), lib / keep))
    return lines


def last_line(cells, ns):
    n = LAST_N if LAST_N in ns else ns[0]
    if n != LAST_N:
        print("bench-fanout: no N = %d in this run; the last line is for N = %d" % (LAST_N, n), file=sys.stderr)
    tcp = median_s(cells[("tcp", n)])
    return "fanout_over_raw_tcp %.2f nginx_over_raw_tcp %.2f" % (
        median_s(cells[("lib", n)]) / tcp, median_s(cells[("nginx", n)]) / tcp)


def section(meta, cells, ns):
    model = int(meta["model_bytes"])
    head = ("Command: `%s` (%s s; %s, %s CPUs (%s), load average %s at the start, %s at the end: a shared "
            "machine, timings are noisy).  %s bf16 parameters, the whole model (%d bytes) as one anchor to N "
            "consumers over loopback." % (
                meta["command"], meta["seconds"], meta["kernel"], meta["cpus"], meta["cpu"], meta["load_start"],
                meta["load_end"], meta["params"], model))
    notes = NOTES.format(runs=meta["runs"], params=meta["params"], model=model, payload=meta["payload_bytes"],
                         broker_args="its defaults" if meta["broker_args"] == "none" else "flags: " + meta["broker_args"], window=int(meta["window"]) >> 20)
    lines = [BEGIN, head, "", *table(cells, ns, model), "",
             "Targets, never adjusted here:", "", *targets(cells, ns), "", notes, END]
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
    print(last_line(cells, ns))


if __name__ == "__main__":
    main(sys.argv)
