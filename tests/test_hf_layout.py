"""Sharded Hugging Face checkpoints through `deltacast publish DIR|INDEX`
and `deltacast subscribe --layout hf`, with real files, a real broker and
real subscriber processes.  A 3-shard checkpoint (BF16, F32 and U8 tensors,
shard __metadata__, an index as transformers writes it) goes out as an
anchor and deltas and comes back as the same files byte for byte, plus
deltacast.version, with no temporary directory left (a stale one from a
dead run is cleared); a reader loading the layout over and over while ten
more versions land only ever finds one whole version; a restarted
subscriber writes it from its checkpoint.
Each bad input is refused naming the file and the tensor, before anything
is published; a subscriber refuses a model without a layout, a layout
record that does not decode or names a path outside its directory, and a
--layout-dir holding someone else's files (left untouched)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_producer_python import BUILD, procs, run_with_broker  # noqa: E402

import numpy as np  # noqa: E402

from deltacast import Producer  # noqa: E402

DC = os.path.join(BUILD, "deltacast")
LAYOUT_TENSOR = "__deltacast_hf_layout__"
DTYPES = {"uint16": "BF16", "float32": "F32", "uint8": "U8"}


def write_safetensors(path, tensors, meta=None):
    """A safetensors file as the reference writer lays it out."""
    hdr, off, blobs = {"__metadata__": meta or {"format": "pt"}}, 0, []
    for name, a in tensors.items():
        b = a.tobytes()
        hdr[name] = {"dtype": DTYPES[a.dtype.name], "shape": list(a.shape),
                     "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def shard_name(i, n):
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


# The files beside the shards that travel with them, and some that do not
# (hidden, weights in another format, another index, a subdirectory).
EXTRAS = {"config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 48}\n',
          "generation_config.json": b'{"do_sample": true, "temperature": 0.6}\n',
          "tokenizer.json": json.dumps({"model": {"vocab": {f"t{i}": i for i in range(300)}}}).encode(),
          "tokenizer_config.json": b'{"model_max_length": 4096}\n',
          "special_tokens_map.json": b'{"bos_token": "<s>"}\n',
          "merges.txt": b"#version: 0.2\nt 0\n",
          "tokenizer.model": bytes(range(256)) * 3}
LEFT_OUT = {".gitattributes": b"*.safetensors filter=lfs\n", "pytorch_model.bin": b"\0" * 64,
            "pytorch_model.bin.index.json": b"{}\n"}


def write_extras(d):
    for name, data in {**EXTRAS, **LEFT_OUT}.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    os.makedirs(os.path.join(d, "original"), exist_ok=True)


def write_layout(d, shards, weight_map=None):
    """Shards (a list of {name: array}) and their index, into directory d,
    with the files beside them (EXTRAS, LEFT_OUT)."""
    os.makedirs(d, exist_ok=True)
    write_extras(d)
    wm, total = {}, 0
    for i, tensors in enumerate(shards):
        write_safetensors(os.path.join(d, shard_name(i, len(shards))), tensors)
        for name, a in tensors.items():
            wm[name] = shard_name(i, len(shards))
            total += a.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map or wm}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return d


def model(rng):
    return [{"a.w": rng.integers(0, 1 << 16, (64, 48), dtype=np.uint16),
             "a.b": rng.standard_normal(48).astype(np.float32)},
            {"b.w": rng.integers(0, 1 << 16, (96, 16), dtype=np.uint16)},
            {"c.w": rng.integers(0, 256, (7,), dtype=np.uint8),
             "c.norm": rng.standard_normal(16).astype(np.float32)}]


def step(rng, shards):
    """About 2% of the elements change, as after an RL optimizer step."""
    for tensors in shards:
        for a in tensors.values():
            flat = a.reshape(-1).view(np.uint8 if a.itemsize == 1 else
                                      np.uint16 if a.itemsize == 2 else np.uint32)
            idx = rng.choice(flat.size, max(1, flat.size // 50), replace=False)
            flat[idx] += 1


def deltacast(*args):
    return subprocess.run([DC, *args], capture_output=True, text=True, timeout=60)


class Subscriber:
    """A `deltacast subscribe` process whose stdout lines the test waits on."""

    def __init__(self, tmp, name, *args):
        self.out = os.path.join(tmp, name + ".out")
        self.err = os.path.join(tmp, name + ".err")
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.p = subprocess.Popen([DC, "subscribe", *args], stdout=o, stderr=e)
        procs.append(self.p)

    def text(self):
        with open(self.out) as f:
            return f.read()

    def wait_line(self, line, timeout_s=60):
        """Wait until `line` is printed; fails if the process exits first or
        timeout_s pass."""
        deadline = time.monotonic() + timeout_s
        while line + "\n" not in self.text():
            if self.p.poll() is not None and line + "\n" not in self.text():
                raise AssertionError(f"subscriber exited {self.p.returncode} before {line!r}: "
                                     f"{self.text()} {open(self.err).read()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {line!r} within {timeout_s} s: "
                                     f"{self.text()} {open(self.err).read()}")
            time.sleep(0.02)

    def finish(self):
        rc = self.p.wait(timeout=60)
        return rc, self.text(), open(self.err).read()


def read_safetensors(path):
    """{name: array} of a safetensors file, as an engine's loader reads it:
    the header JSON, then each tensor at its data offsets."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    hdr, out = json.loads(blob[8:8 + n]), {}
    types = {v: k for k, v in DTYPES.items()}
    for name, t in hdr.items():
        if name != "__metadata__":
            a, b = t["data_offsets"]
            out[name] = np.frombuffer(blob[8 + n + a:8 + n + b], types[t["dtype"]]).reshape(t["shape"])
    return out


def same_tensors(out, shards):
    """The layout in out, loaded through its index, holds the tensors of shards."""
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    loaded = {}
    for shard in sorted(set(wm.values())):
        loaded.update(read_safetensors(os.path.join(out, shard)))
    want = {k: a for tensors in shards for k, a in tensors.items()}
    assert sorted(loaded) == sorted(want), (sorted(loaded), sorted(want))
    for k, a in want.items():
        assert loaded[k].dtype == a.dtype and np.array_equal(loaded[k], a), f"{out}: {k} differs"


def same_files(src, out, version):
    want = sorted(n for n in os.listdir(src) if n not in LEFT_OUT and n != "original")
    got = sorted(os.listdir(out))
    assert got == sorted(want + ["deltacast.version"]), f"{out} holds {got}, want {want}"
    for name in want:
        with open(os.path.join(src, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
            assert a.read() == b.read(), f"{out}/{name} differs from {src}/{name}"
    with open(os.path.join(out, "deltacast.version")) as f:
        assert f.read() == f"{version}\n"


def files_of(d):
    with os.scandir(d) as it:
        return {e.name: open(e.path, "rb").read() for e in it
                if e.is_file() and e.name not in LEFT_OUT}


class Reader(threading.Thread):
    """Reads the layout directory over and over while versions land, as a
    loader would: the directory opened once, then each file in it.  Every
    read that finds all its files must be one version's layout, whole."""

    def __init__(self, out, published):
        super().__init__(daemon=True)
        self.out, self.published, self.stop = out, published, threading.Event()
        self.whole = self.vanished = 0
        self.wrong = []

    def read_once(self):
        try:
            fd = os.open(self.out, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            self.vanished += 1
            return
        try:
            got = {n: open(n, "rb", opener=lambda p, f: os.open(p, f, dir_fd=fd)).read()
                   for n in os.listdir(fd)}
        except FileNotFoundError:  # swapped out while being read: its files are gone
            self.vanished += 1
            return
        finally:
            os.close(fd)
        v = int(got.pop("deltacast.version", b"0"))
        if got != self.published.get(v):
            self.wrong.append(v)
        else:
            self.whole += 1

    def run(self):
        while not self.stop.is_set():
            self.read_once()


def round_trip(tmp, prod, cons, rng):
    shards = model(rng)
    v = [write_layout(os.path.join(tmp, "v1"), shards)]
    for i in (2, 3):
        step(rng, shards)
        v.append(write_layout(os.path.join(tmp, f"v{i}"), shards))
    out = os.path.join(tmp, "out")
    os.makedirs(out + ".deltacast-tmp")  # as a subscriber killed while writing leaves it
    open(os.path.join(out + ".deltacast-tmp", "model-00001-of-00003.safetensors"), "w").close()
    sub = Subscriber(tmp, "sub", "--broker", cons, "--model", "hf", "--dir",
                     os.path.join(tmp, "sub"), "--layout", "hf", "--layout-dir", out)
    r = deltacast("publish", "--broker", prod, "--model", "hf", "--range-elems", "256", v[0])
    assert r.returncode == 0, r.stderr
    assert "version 1 anchor" in r.stderr, r.stderr
    sub.wait_line(f"layout 1 written to {out}")
    same_files(v[0], out, 1)
    assert not os.path.exists(out + ".deltacast-tmp"), "stale temporary directory left"

    r = deltacast("publish", "--broker", prod, "--model", "hf", "--range-elems", "256",
                  "--first-version", "2", os.path.join(v[1], "model.safetensors.index.json"), v[2])
    assert r.returncode == 0, r.stderr
    # a new publish process fetches version 1 as its baseline from the consumer
    # endpoint the broker names: its first version is a delta too
    assert "baseline version 1 fetched" in r.stderr, r.stderr
    assert "version 2 delta" in r.stderr and "version 3 delta" in r.stderr, r.stderr
    sub.wait_line(f"layout 3 written to {out}")
    same_files(v[2], out, 3)

    # ten more versions while a reader loads the layout again and again
    published = {i + 1: files_of(d) for i, d in enumerate(v)}
    for i in range(4, 14):
        step(rng, shards)
        v.append(write_layout(os.path.join(tmp, f"v{i}"), shards))
        published[i] = files_of(v[-1])
    reader = Reader(out, published)
    reader.start()
    r = deltacast("publish", "--broker", prod, "--model", "hf", "--first-version", "4", *v[3:])
    assert r.returncode == 0, r.stderr
    sub.wait_line(f"layout 13 written to {out}")
    reader.stop.set()
    reader.join()
    reader.read_once()  # after the last swap: version 13, whole
    assert not reader.wrong, f"a reader saw a mixed or partial layout (versions {reader.wrong})"
    assert reader.whole >= 1, "no read of the layout succeeded"
    print(f"reader: {reader.whole} whole layouts read, {reader.vanished} swapped away mid-read")
    same_files(v[-1], out, 13)
    same_tensors(out, shards)
    sub.p.terminate()
    rc, text, err = sub.finish()
    assert rc == 0, f"subscriber exit {rc}: {err}"
    assert "version 13 delta" in text, text
    same_files(v[-1], out, 13)
    for junk in (".deltacast-tmp", ".deltacast-old"):
        assert not os.path.exists(out + junk), f"{out}{junk} left behind"

    # restarted on its directory: version 13 from the checkpoint, written at exit
    out2 = os.path.join(tmp, "out2")
    sub2 = Subscriber(tmp, "sub2", "--broker", cons, "--model", "hf", "--dir",
                      os.path.join(tmp, "sub"), "--layout", "hf", "--layout-dir", out2,
                      "--until", "13")
    rc, text, err = sub2.finish()
    assert rc == 0 and "loaded version 13" in text, f"exit {rc}: {text} {err}"
    same_files(v[-1], out2, 13)

    # a --layout-dir with other files is not replaced
    foreign = os.path.join(tmp, "foreign")
    os.makedirs(foreign)
    with open(os.path.join(foreign, "notes.txt"), "w") as f:
        f.write("mine\n")
    sub3 = Subscriber(tmp, "sub3", "--broker", cons, "--model", "hf", "--dir",
                      os.path.join(tmp, "sub3"), "--layout", "hf", "--layout-dir", foreign,
                      "--until", "3")
    rc, text, err = sub3.finish()
    assert rc == 1 and foreign in err and "deltacast.version" in err, f"exit {rc}: {err}"
    assert os.listdir(foreign) == ["notes.txt"], os.listdir(foreign)
    return v


def refused(prod, args, *words):
    r = deltacast("publish", "--broker", prod, "--model", "bad", *args)
    assert r.returncode == 1, f"{args}: exit {r.returncode}: {r.stderr}"
    for w in words:
        assert w in r.stderr, f"{args}: {w!r} not in {r.stderr!r}"
    print(r.stderr.strip())


def bad_inputs(tmp, prod, v1):
    def copy(name):
        d = os.path.join(tmp, name)
        shutil.copytree(v1, d)
        return d

    s2, s3 = shard_name(1, 3), shard_name(2, 3)
    d = copy("missing")
    os.remove(os.path.join(d, s2))
    refused(prod, [d], os.path.join(d, "model.safetensors.index.json"), s2, '"b.w"')

    d = copy("twice")
    rng = np.random.default_rng(5)
    write_safetensors(os.path.join(d, s3), {"c.w": rng.integers(0, 256, (7,), dtype=np.uint8),
                                            "b.w": np.zeros((96, 16), np.uint16)})
    refused(prod, [d], '"b.w"', "two shards", s2, s3)

    d = copy("stray")
    shutil.copy(os.path.join(d, s3), os.path.join(d, "extra.safetensors"))
    refused(prod, [d], "extra.safetensors", "not in")

    d = copy("corrupt")
    with open(os.path.join(d, s3), "r+b") as f:
        f.seek(8)
        f.write(b"#garbage")
    refused(prod, [d], os.path.join(d, s3), '(holding tensor "c.', "header JSON")

    d = copy("ghost")
    index = os.path.join(d, "model.safetensors.index.json")
    with open(index) as f:
        idx = json.load(f)
    idx["weight_map"]["ghost.w"] = shard_name(0, 3)
    with open(index, "w") as f:
        json.dump(idx, f)
    refused(prod, [index], '"ghost.w"', shard_name(0, 3), "does not hold it")

    d = copy("unlisted")
    index = os.path.join(d, "model.safetensors.index.json")
    del idx["weight_map"]["ghost.w"], idx["weight_map"]["a.b"]
    with open(index, "w") as f:
        json.dump(idx, f)
    refused(prod, [d], '"a.b"', shard_name(0, 3), "not in the index")

    d = copy("outside")
    index = os.path.join(d, "model.safetensors.index.json")
    idx["weight_map"]["a.b"] = shard_name(0, 3)
    idx["weight_map"]["c.w"] = "../v1/" + s3
    with open(index, "w") as f:
        json.dump(idx, f)
    refused(prod, [d], index, '"c.w"', "../v1/" + s3)

    d = copy("big")
    with open(os.path.join(d, "notes.json"), "wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: refused by its size, before it is read
    refused(prod, [d], "notes.json", "67108864", "limit", "move large files")

    two = write_layout(os.path.join(tmp, "two"), [{"a.w": np.zeros((64, 48), np.uint16)},
                                                   {"a.b": np.zeros(48, np.float32)}])
    refused(prod, [v1, two], two, "differs", v1)
    # a bad second version: not even the good first one is published
    refused(prod, [v1, os.path.join(tmp, "missing")], s2)
    r = deltacast("publish", "--broker", prod, "--model", "bad", v1)
    assert r.returncode == 0 and "version 1 anchor" in r.stderr, \
        f"version 1 of 'bad' was published by a refused run: {r.stderr}"


def record(index_name, index, shards, files=None):
    """A layout record (cli/hf_layout.h) of an index, {shard: header JSON}
    and, when files is not None, [(file name, bytes)] (DCHFLAY2)."""
    out = (b"DCHFLAY1" if files is None else b"DCHFLAY2") + struct.pack("<I", len(shards))
    out += struct.pack("<I", len(index_name)) + index_name + struct.pack("<Q", len(index)) + index
    for name, (hdr, data_bytes) in shards.items():
        out += struct.pack("<I", len(name)) + name + struct.pack("<Q", len(hdr)) + hdr
        out += struct.pack("<Q", data_bytes)
    if files is not None:
        out += struct.pack("<I", len(files))
        for name, data in files:
            out += struct.pack("<I", len(name)) + name + struct.pack("<Q", len(data)) + data
    return np.frombuffer(out, dtype=np.uint8).copy()


def publish_record(prod, model, x, rec):
    with Producer(prod, model) as p:
        p.register("x", x)
        p.register(LAYOUT_TENSOR, rec)
        p.publish(1)
        p.wait(1)


def old_record_read(tmp, prod, cons):
    """A record without files (DCHFLAY1, as publish wrote before files
    travelled) is still exported."""
    x = np.arange(8, dtype=np.uint8)
    hdr = b'{"x":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}   '
    index = json.dumps({"weight_map": {"x": "model.safetensors"}}).encode()
    publish_record(prod, "old", x, record(b"model.safetensors.index.json", index,
                                          {b"model.safetensors": (hdr, 8)}))
    out = os.path.join(tmp, "old-layout")
    rc, _, err = Subscriber(tmp, "old", "--broker", cons, "--model", "old", "--dir",
                            os.path.join(tmp, "old"), "--layout", "hf", "--layout-dir", out,
                            "--until", "1").finish()
    assert rc == 0, f"exit {rc}: {err}"
    assert sorted(os.listdir(out)) == ["deltacast.version", "model.safetensors",
                                       "model.safetensors.index.json"], os.listdir(out)
    assert np.array_equal(read_safetensors(os.path.join(out, "model.safetensors"))["x"], x)
    print("a DCHFLAY1 record (no files) is exported")


def subscriber_refuses(tmp, prod, cons, v1):
    sub_args = ["--layout", "hf", "--until", "1"]
    r = deltacast("publish", "--broker", prod, "--model", "plain",
                  os.path.join(v1, shard_name(0, 3)))
    assert r.returncode == 0, r.stderr
    rc, _, err = Subscriber(tmp, "plain", "--broker", cons, "--model", "plain", "--dir",
                            os.path.join(tmp, "plain"), *sub_args).finish()
    assert rc == 1 and "carries no Hugging Face layout" in err, f"exit {rc}: {err}"

    x = np.arange(4, dtype=np.uint8)
    hdr = b'{"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
    evil = b"../evil.safetensors"
    name = b"model.safetensors.index.json"
    good = json.dumps({"weight_map": {"x": "model.safetensors"}}).encode()
    bad = json.dumps({"weight_map": {"x": evil.decode()}}).encode()
    cases = {"garbage": (np.frombuffer(b"not a layout record", np.uint8).copy(), "magic"),
             "evil": (record(name, bad, {evil: (hdr, 4)}), "../evil.safetensors"),
             "short": (record(name, good, {b"model.safetensors": (hdr, 4)})[:-3], "cut short"),
             "evilfile": (record(name, good, {b"model.safetensors": (hdr, 4)},
                                 [(b"../evil.txt", b"x")]), "../evil.txt"),
             "twicefile": (record(name, good, {b"model.safetensors": (hdr, 4)},
                                  [(b"a.json", b"1"), (b"a.json", b"2")]),
                           "a.json"),
             "shardfile": (record(name, good, {b"model.safetensors": (hdr, 4)},
                                  [(b"model.safetensors", b"x")]), "model.safetensors")}
    for name, (rec, word) in cases.items():
        publish_record(prod, name, x, rec)
        out = os.path.join(tmp, name + "-layout")
        rc, _, err = Subscriber(tmp, name, "--broker", cons, "--model", name, "--dir",
                                os.path.join(tmp, name), "--layout-dir", out, *sub_args).finish()
        assert rc == 1 and "layout record" in err and word in err, f"{name}: exit {rc}: {err}"
        assert not os.path.exists(out), f"{name}: {out} written"
    assert not os.path.exists(os.path.join(tmp, "evil.safetensors")), "wrote outside its directory"
    assert not os.path.exists(os.path.join(tmp, "evil.txt")), "wrote outside its directory"


def main():
    def body(tmp, prod, cons):
        v = round_trip(tmp, prod, cons, np.random.default_rng(1))
        bad_inputs(tmp, prod, v[0])
        subscriber_refuses(tmp, prod, cons, v[0])
        old_record_read(tmp, prod, cons)
    run_with_broker("dcast-hf-layout-", body)
    print("test_hf_layout: ok")


if __name__ == "__main__":
    main()
