#!/usr/bin/python3
"""Seeds of tests/fuzz/fuzz_bulkrx.c, into tests/fuzz/seeds/fuzz_bulkrx/:
version 42's CHUNK and COMMIT of schema/vectors as a broker writes them on
a bulk connection (docs/protocol.md, "Bulk anchors"): over TCP, on the
unix socket with the payload inline, and on the unix socket by reference
to the file the target passes.  Byte 0 and 1 are the target's flags and
version.  Usage: tests/fuzz/bulkrx_seeds.py (from the repository root)."""
import json
import os
import struct

VECTORS = "schema/vectors"
OUT = "tests/fuzz/seeds/fuzz_bulkrx"
INLINE = 0xFFFFFFFFFFFFFFFF


def vector(name):
    with open(os.path.join(VECTORS, name + ".msgpack"), "rb") as f:
        head = f.read()
    with open(os.path.join(VECTORS, name + ".json")) as f:
        return head, json.load(f)


def frame(head, payload_len, ref=None):
    out = struct.pack("<IQ", len(head), payload_len) + head
    if ref is not None and payload_len:
        out += struct.pack("<Q", ref)
    return out


def main():
    chunk, cj = vector("chunk")
    commit, mj = vector("commit")
    assert cj["version"] == mj["version"] == 42
    n = cj["payload_bytes"]
    payload = bytes((i * 131 + 7) & 0xFF for i in range(n))  # the target's file bytes at 0
    seeds = {
        "tcp": bytes([0, 42]) + frame(chunk, n) + payload + frame(commit, 0),
        "local_inline": bytes([1, 42]) + frame(chunk, n, INLINE) + payload + frame(commit, 0),
        "local_ref": bytes([3, 42]) + frame(chunk, n, 0) + frame(commit, 0),
        "local_ref_no_file": bytes([1, 42]) + frame(chunk, n, 0) + frame(commit, 0),
    }
    os.makedirs(OUT, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
