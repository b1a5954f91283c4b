"""docs/protocol.md is enough to implement a peer: its
table of ERROR codes must match the library's codes and names exactly,
every code the library has must be listed, the header's `proto` and
the limits table must name the library's DCAST_PROTO_VERSION, and the
table of which refusal gets which code must agree with the schema vectors."""
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
                       ("an anchor with a `base_version`", "bad_chunk_anchor_with_base")]:
    want = json.load(open(os.path.join(root, "schema", "vectors", vector + ".json")))["error"]
    got = [code for text, code in refusals if phrase in text]
    if got != [want]:
        failures.append(f"refusal table: {phrase}: doc says {got}, {vector} says {want}")
for f in failures:
    print("FAIL:", f)
print(f"test_protocol_doc: {code - 1} codes checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
