"""docs/protocol.md is enough to implement a peer: its
table of ERROR codes must match the library's codes and names exactly,
every code the library has must be listed, the header's `proto` and
the limits table must name the library's DCAST_PROTO_VERSION, and the
table of which refusal gets which code must agree with the schema vectors;
the worked example of the additive digest is what the library computes,
and so is MANIFEST.sum as its canonical form is described."""
import ctypes
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_producer_python  # noqa: E402,F401  (re-exec under the sanitizer runtime when needed)

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
lib = ctypes.CDLL(os.environ.get("DELTACAST_LIB", os.path.join(root, "build", "libdeltacast.so")))
lib.dcast_errname.restype = ctypes.c_char_p
lib.dcast_errname.argtypes = [ctypes.c_int]
doc = open(os.path.join(root, "docs", "protocol.md")).read()

rows = dict((int(c), n) for c, n in re.findall(r"^\| (\d+) \| `(DCAST_E[A-Z_]+)` \|", doc, re.M))
failures = []
code = 1
while code < 256 and lib.dcast_errname(code).decode() != "DCAST_EUNKNOWN":
    name = lib.dcast_errname(code).decode()
    if rows.get(code) != name:
        failures.append(f"code {code}: library {name}, doc {rows.get(code)}")
    code += 1
if len(rows) != code - 1:
    failures.append(f"doc lists {len(rows)} codes, the library has {code - 1}")
proto = re.search(r"#define DCAST_PROTO_VERSION (\d+)", open(os.path.join(root, "include", "deltacast", "schema.h")).read()).group(1)
if f"protocol version, `{proto}`" not in doc or f"| `DCAST_PROTO_VERSION` | {proto} |" not in doc:
    failures.append(f"docs do not say proto {proto} in the header table and the limits table")
# The refusal table names the code the library gives, for the refusals a
# schema vector pins (schema/vectors/<name>.json says the code).
refusals = re.findall(r"^\| (.+) \| `(DCAST_E[A-Z_]+)` \|$", doc.split("Which refusal gets which code:")[1].split("## Limits")[0], re.M)
for phrase, vector in [("a delta without `base_version`", "bad_chunk_delta_no_base"),
                       ("a dense payload whose size is not `count * elem_size`", "bad_chunk_dense_size"),
                       ("an anchor with a `base_version`", "bad_chunk_anchor_with_base"),
                       ("a MANIFEST whose `sum` is not that of its content", "bad_manifest_sum")]:
    want = json.load(open(os.path.join(root, "schema", "vectors", vector + ".json")))["error"]
    got = [code for text, code in refusals if phrase in text]
    if got != [want]:
        failures.append(f"refusal table: {phrase}: doc says {got}, {vector} says {want}")
# The worked example of the additive digest: every number in it is what
# the library computes (dcast_ldigest_term, dcast_ldigest), and the
# formula as written (mix, seed) gives the same terms.
lib.dcast_ldigest_term.restype = ctypes.c_uint64
lib.dcast_ldigest_term.argtypes = [ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32]
lib.dcast_ldigest.argtypes = [ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64,
                              ctypes.c_uint, ctypes.POINTER(ctypes.c_uint64)]
M64 = (1 << 64) - 1


def mix(x):
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & M64
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def seed(t, s):
    return mix(((t << 32) | s) ^ 0x9e3779b97f4a7c15)


def ldigest(t, start, values):
    d = ctypes.c_uint64()
    data = b"".join(v.to_bytes(2, "little") for v in values)
    if lib.dcast_ldigest(t, start, data, len(values), 2, ctypes.byref(d)):
        return None
    return d.value


def num(text):
    return 2 ** int(text[2:]) if text.startswith("2^") else int(text, 0)


example = doc.split("<!-- digest-example:begin -->")[1].split("<!-- digest-example:end -->")[0]
terms = re.findall(r"h\((\d+), (2\^\d+|\d+), (0x[0-9a-f]+)\)\s+= (0x[0-9a-f]+)", example)
seeds = re.findall(r"seed\((\d+), (\d+)\)\s+= (0x[0-9a-f]+)", example)
digests = [int(x, 16) for x in re.findall(r"digest\s+= (0x[0-9a-f]+)", example)]
if len(terms) < 5 or len(seeds) != 1 or len(digests) != 2:
    failures.append(f"digest example: {len(terms)} terms, {len(seeds)} seeds, {len(digests)} digests found")
for t, i, b, want in terms:
    t, i, b, want = int(t), num(i), int(b, 16), int(want, 16)
    got = lib.dcast_ldigest_term(t, i, b)
    formula = mix((((i & 0xffffffff) << 32) | b) ^ seed(t, i >> 32))
    if got != want or formula != want:
        failures.append(f"digest example: h({t}, {i}, {b:#x}) doc {want:#x}, library {got:#x}, formula {formula:#x}")
for t, sv, want in seeds:
    if seed(int(t), int(sv)) != int(want, 16):
        failures.append(f"digest example: seed({t}, {sv}) doc {want}, formula {seed(int(t), int(sv)):#x}")
if digests and ldigest(1, 2, [0x3f80, 0x4000, 0xc040]) != digests[0]:
    failures.append(f"digest example: doc {digests[0]:#x}, library {ldigest(1, 2, [0x3f80, 0x4000, 0xc040])}")
if len(digests) > 1 and ldigest(1, 2, [0x3f80, 0x4040, 0xc040]) != digests[1]:
    failures.append(f"digest example after the change: doc {digests[1]:#x}")
if ldigest(1, 2, []) != 0:
    failures.append("a digest of count 0 is not 0")
# MANIFEST.sum: the canonical form as the MANIFEST section words it, built
# from the good vector's JSON, hashed with XXH3-64 (dcast_checksum), is the
# vector's sum and the doc's example.
lib.dcast_checksum.restype = ctypes.c_uint64
lib.dcast_checksum.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def u32(n):
    return n.to_bytes(4, "little")


def lstr(text):
    return u32(len(text.encode())) + text.encode()


def canonical(mf):
    form = lstr(mf["model"]) + u32(len(mf["tensors"]))
    for t in mf["tensors"]:
        grid = t.get("grid", [1] * len(t["shape"]))
        form += lstr(t["name"]) + lstr(t["dtype"]) + u32(len(t["shape"]))
        form += b"".join(d.to_bytes(8, "little") for d in t["shape"]) + b"".join(u32(g) for g in grid)
    return form


mf = json.load(open(os.path.join(root, "schema", "vectors", "manifest.json")))
form = canonical(mf)
got = lib.dcast_checksum(form, len(form))
example = re.search(r"canonical form is (\d+) bytes and `sum` is\s+(\d+) \((0x[0-9a-f]+)\)", doc)
if got != mf["sum"]:
    failures.append(f"MANIFEST.sum: vector says {mf['sum']}, the canonical form as documented sums to {got}")
if not example or (int(example.group(1)), int(example.group(2)), int(example.group(3), 16)) != (len(form), got, got):
    failures.append(f"MANIFEST.sum example: doc {example and example.groups()}, computed {len(form)} bytes, {got}")
for f in failures:
    print("FAIL:", f)
print(f"test_protocol_doc: {code - 1} codes checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
