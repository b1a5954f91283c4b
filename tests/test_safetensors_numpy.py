"""Cross-check: a checkpoint written by `deltacast gen-trace` reads with a tiny
pure-numpy safetensors parser (the standard layout), and what numpy sees
(element and changed counts per tensor, header alignment) matches what
`deltacast diff --json` reports."""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

DTYPES = {"BF16": np.uint16, "F16": np.uint16, "F32": np.uint32, "U8": np.uint8, "I8": np.uint8}


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        arr = np.frombuffer(data[b:end], dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = arr
    return n, header, out


def main():
    build = os.environ.get("DELTACAST_BUILD", "build")
    exe = os.path.join(build, "deltacast")
    with tempfile.TemporaryDirectory(prefix="dcast_np_") as d:
        subprocess.run([exe, "gen-trace", "--params", "500K", "--steps", "1", "--density", "0.02",
                        "-o", d], check=True, stderr=subprocess.DEVNULL)
        a, b = (os.path.join(d, f"v000{i}.safetensors") for i in (0, 1))
        n, header, t0 = read_safetensors(a)
        _, _, t1 = read_safetensors(b)
        assert n % 8 == 0, "header not padded to 8 bytes"
        assert header["__metadata__"]["step"] == "0"
        rep = json.loads(subprocess.run([exe, "diff", a, b, "--json"], check=True,
                                        capture_output=True).stdout)
        by_name = {t["name"]: t for t in rep["tensors"]}
        assert set(by_name) == set(t0), "tensor sets differ"
        total = 0
        for name, x in t0.items():
            y = t1[name]
            changed = int(np.count_nonzero(x != y))
            total += changed
            assert by_name[name]["elements"] == x.size, name
            assert by_name[name]["changed"] == changed, (name, changed, by_name[name]["changed"])
            assert by_name[name]["dtype"] == "BF16"
        assert rep["changed"] == total and rep["exact"] is True
        # Values look like weights: matrices near std 0.02, norms near 1.0.
        f = lambda u: (u.astype(np.uint32) << 16).view(np.float32)
        q = f(t0["model.layers.0.self_attn.q_proj.weight"])
        norm = f(t0["model.norm.weight"])
        assert 0.015 < float(q.std()) < 0.025, float(q.std())
        assert abs(float(norm.mean()) - 1.0) < 0.05, float(norm.mean())
        print(f"test_safetensors_numpy: ok ({len(t0)} tensors, {total} changed)")


if __name__ == "__main__":
    sys.exit(main())
