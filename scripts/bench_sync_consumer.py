"""The Python consumer of scripts/bench_sync.sh: deltacast.Consumer as a
rollout worker runs it (default options, every ready version applied at
once).  Prints the same line as tests/tools/bench_sync_consumer after each
apply:
  applied V anchor|delta t_ns T stage_ns S apply_ns A bytes B
    verify_bytes H log_write_bytes L io_write_bytes W
Staging budget 64 MiB, as bench_sync_consumer and `deltacast subscribe`.
usage: bench_sync_consumer.py ENDPOINT MODEL DIR UNTIL"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from deltacast import Consumer  # noqa: E402


def io_write_bytes():
    """write_bytes of /proc/self/io (cumulative), or 0."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def report(c, t_ns):
    s = c.stats()
    print(f"applied {s.version} {'anchor' if s.anchor else 'delta'} t_ns {t_ns} "
          f"stage_ns {s.stage_ns} apply_ns {s.apply_ns} bytes {s.bytes} "
          f"verify_bytes {s.verify_bytes} log_write_bytes {s.log_write_bytes} "
          f"io_write_bytes {io_write_bytes()}", flush=True)


def main(argv):
    if len(argv) != 5:
        sys.exit(__doc__.split("\n")[-1])
    endpoint, model, directory, until = argv[1], argv[2], argv[3], int(argv[4])
    with Consumer(endpoint, model, directory, budget_bytes=64 << 20, client="bench_sync_py") as c:
        while c.version is None or c.version < until:
            ev = c.poll(200)
            if ev is None:
                continue
            if ev.type in ("error", "gap"):
                print(f"bench_sync_consumer.py: {ev.type} at version {ev.version}: {ev.text}",
                      file=sys.stderr)
            if ev.type == "ready":
                c.apply(ev.version)
                report(c, time.time_ns())


if __name__ == "__main__":
    main(sys.argv)
