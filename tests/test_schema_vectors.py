"""Decode every good schema vector with Debian's python3-msgpack and compare
it with the JSON beside it: proves the headers are plain msgpack and that
docs/protocol.md's field names and types are what goes on the wire."""
import json
import os
import sys

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
VEC = os.path.join(HERE, "..", "schema", "vectors")
TYPES = {"HELLO", "WELCOME", "MANIFEST", "CHUNK", "COMMIT", "ACK", "CREDIT",
         "ERROR", "HEARTBEAT", "BYE"}


def main():
    good = bad = 0
    seen = set()
    failures = 0
    for name in sorted(os.listdir(VEC)):
        if not name.endswith(".msgpack"):
            continue
        stem = name[:-8]
        with open(os.path.join(VEC, name), "rb") as f:
            raw = f.read()
        with open(os.path.join(VEC, stem + ".json")) as f:
            want = json.load(f)
        if stem.startswith("bad_"):
            bad += 1
            if not want.get("error", "").startswith("DCAST_E") or not want.get("detail"):
                print(f"{stem}: bad vector JSON lacks error/detail: {want}")
                failures += 1
            continue
        good += 1
        got = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        if got != want:
            print(f"{stem}: msgpack decodes to\n  {got}\nbut JSON says\n  {want}")
            failures += 1
        if got.get("proto") != 2 or got.get("type") not in TYPES:
            print(f"{stem}: proto/type wrong: {got.get('proto')} {got.get('type')}")
            failures += 1
        seen.add(got.get("type"))
    if seen != TYPES:
        print(f"missing good vectors for {sorted(TYPES - seen)}")
        failures += 1
    print(f"{good} good vectors match their JSON, {bad} bad vectors described")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
