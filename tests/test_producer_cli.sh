#!/usr/bin/env bash
# deltacast publish end to end: a gen-trace model's checkpoints go through the
# real broker as an anchor and deltas; the test reader's copy of the last
# version equals the last file tensor by tensor; bad input is refused with a
# clear message.
. "$(dirname "$0")/tools/broker_lib.sh"
B=$BUILD
PY=${PYTHON:-/usr/bin/python3}
tmp=$TMP

"$B/deltacast" gen-trace --params 3M --steps 3 --density 0.01 -o "$tmp/trace" 2>/dev/null ||
	fail "gen-trace"
start_broker b # on ports it picks and logs
ep=$b_PROD

"$B/deltacast" publish --broker "$ep" --model cli "$tmp"/trace/v000*.safetensors 2>"$tmp/pub.log" ||
	{ cat "$tmp/pub.log"; fail "publish"; }
cat "$tmp/pub.log"
[ "$(grep -c '^version' "$tmp/pub.log")" = 4 ] || fail "want 4 progress lines"
grep -q '^version 1 anchor' "$tmp/pub.log" || fail "first version not an anchor"
grep -q '^version 4 delta' "$tmp/pub.log" || fail "last version not a delta"
"$B/tools/producer_reader" --endpoint "$b_CONS" --model cli --until 4 \
	--out "$tmp/got.safetensors" >/dev/null || fail "reader"
same_tensors "$tmp/got.safetensors" "$tmp/trace/v0003.safetensors" || fail "content differs"

# int64, float64 and bool tensors (8-byte values as two wire elements each)
"$PY" - "$tmp" <<'PYEOF'
import json, struct, sys
import numpy as np
def save(path, ts):
    h, blob = {}, b""
    for name, a in ts.items():
        h[name] = {"dtype": {"int64": "I64", "float64": "F64", "bool": "BOOL"}[a.dtype.name],
                   "shape": list(a.shape), "data_offsets": [len(blob), len(blob) + a.nbytes]}
        blob += a.tobytes()
    h = json.dumps(h).encode(); h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + blob)
rng = np.random.default_rng(5)
ts = {"steps": np.array([(1 << 40) + 7, -3, 12], np.int64), "stat": rng.standard_normal((4, 5)),
      "mask": rng.random(16) > 0.5}
save(sys.argv[1] + "/w1.safetensors", ts)
ts["steps"] += 1; ts["stat"][1, 2] = 0.5; ts["mask"][3] = not ts["mask"][3]
save(sys.argv[1] + "/w2.safetensors", ts)
PYEOF
"$B/deltacast" publish --broker "$ep" --model wide "$tmp/w1.safetensors" "$tmp/w2.safetensors" \
	2>"$tmp/wide.log" || { cat "$tmp/wide.log"; fail "publish int64/float64/bool"; }
"$B/tools/producer_reader" --endpoint "$b_CONS" --model wide --until 2 \
	--out "$tmp/wide.safetensors" >/dev/null || fail "reader of int64/float64/bool"
"$PY" - "$tmp/wide.safetensors" "$tmp/w2.safetensors" <<'PYEOF' || fail "int64/float64/bool differ"
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: (v["dtype"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a == b, "tensors differ"
PYEOF
grep -q '^version 2 delta' "$tmp/wide.log" || { cat "$tmp/wide.log"; fail "version 2 not a delta"; }

# versions must increase: the broker's newest is 4
"$B/deltacast" publish --broker "$ep" --model cli "$tmp/trace/v0000.safetensors" 2>"$tmp/err.log" &&
	fail "republishing version 1 succeeded"
grep -q "not above" "$tmp/err.log" || { cat "$tmp/err.log"; fail "no version error"; }
# a file with other tensors than the first
"$PY" - "$tmp/other.safetensors" <<'PYEOF'
import json, struct, sys
h = json.dumps({"zzz": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(8))
PYEOF
"$B/deltacast" publish --broker "$ep" --model cli2 "$tmp/trace/v0000.safetensors" \
	"$tmp/other.safetensors" 2>"$tmp/err2.log" && fail "a file with other tensors was published"
grep -q "other.safetensors" "$tmp/err2.log" || { cat "$tmp/err2.log"; fail "error names no file"; }
# no broker at all
"$B/deltacast" publish --broker tcp://127.0.0.1:1 --model cli "$tmp/trace/v0000.safetensors" \
	2>"$tmp/err3.log" && fail "publish without a broker succeeded"
grep -q "tcp://127.0.0.1:1" "$tmp/err3.log" || { cat "$tmp/err3.log"; fail "error names no endpoint"; }
"$B/deltacast" publish --model x f 2>/dev/null; [ $? = 2 ] || fail "usage error not 2"
echo "test_producer_cli: ok"
