#!/usr/bin/env bash
# deltacast CLI end to end: gen-trace a small model, diff --json, delta +
# apply reproducing NEW byte for byte, and refusals (corrupt patch, wrong
# BASE) that leave no OUT behind.
set -u
B="${DELTACAST_BUILD:-build}/deltacast"
PY=${PYTHON:-/usr/bin/python3}
T=$(mktemp -d /tmp/dcast_test_cli.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi; }

[ -x "$B" ] || { echo "no $B"; exit 1; }
check "--help lists commands" '"$B" --help | grep -q gen-trace'
check "diff --help" '"$B" diff --help | grep -q json'
check "unknown command fails" '! "$B" frobnicate 2>/dev/null'
V=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$(dirname "$0")/../python/deltacast/_version.py")
check "--version names $V and the wire protocol" '[ "$("$B" --version)" = "deltacast $V (wire protocol 2)" ]'

"$B" gen-trace --params 2M --steps 3 --density 0.01 --seed 7 -o "$T/tr" 2>"$T/gen.err"
check "gen-trace exit 0" '[ $? = 0 ]'
cat "$T/gen.err"
check "gen-trace wrote v0000..v0003" '[ -f "$T/tr/v0000.safetensors" ] && [ -f "$T/tr/v0003.safetensors" ] && [ ! -e "$T/tr/v0004.safetensors" ]'
check "density reported near 0.01" \
	'"$PY" -c "import re,sys; d=[float(x) for x in re.findall(r\"density ([0-9.]+)\", open(sys.argv[1]).read())]; sys.exit(not (len(d)==3 and all(0.007<x<0.013 for x in d)))" "$T/gen.err"'

# --experts: a mixture-of-experts layout, 3E + 7 tensors a layer, with
# the same density, and a delta of it round-trips too.
"$B" gen-trace --params 2M --experts 8 --steps 1 --density 0.01 --seed 7 -o "$T/moe" 2>"$T/moe.err"
check "gen-trace --experts 8 exit 0" '[ $? = 0 ]'
check "--experts: 3*8 + 7 tensors a layer, expert names" \
	'"$PY" -c "
import json,re,struct,sys
err=open(sys.argv[1]).read()
layers,n=map(int,re.search(r\"(\\d+) layers.*?(\\d+) tensors\",err).groups())
assert n == 3 + layers * 31, (layers, n)
f=open(sys.argv[2],\"rb\"); h=json.loads(f.read(struct.unpack(\"<Q\",f.read(8))[0]))
assert len([k for k in h if k != \"__metadata__\"]) == n
assert \"model.layers.0.mlp.experts.7.down_proj.weight\" in h and \"model.layers.0.mlp.gate.weight\" in h
d=[float(x) for x in re.findall(r\"density ([0-9.]+)\", err)]
assert len(d) == 1 and 0.007 < d[0] < 0.013, d
" "$T/moe.err" "$T/moe/v0000.safetensors"'
"$B" gen-trace --params 2M --experts 8 --stacked --steps 1 --density 0.01 --seed 7 -o "$T/moes" 2>"$T/moes.err"
check "--stacked: 10 tensors a layer, the same parameters" \
	'"$PY" -c "
import json,re,struct,sys
a,b=open(sys.argv[1]).read(),open(sys.argv[2]).read()
la,na=map(int,re.search(r\"(\\d+) layers.*?(\\d+) tensors\",a).groups())
pa,pb=(int(re.search(r\"(\\d+) parameters\",x).group(1)) for x in (a,b))
assert na == 3 + la * 10 and pa == pb, (la, na, pa, pb)
f=open(sys.argv[3],\"rb\"); h=json.loads(f.read(struct.unpack(\"<Q\",f.read(8))[0]))
assert h[\"model.layers.0.mlp.experts.down_proj.weight\"][\"shape\"][0] == 8 * 192
" "$T/moes.err" "$T/moe.err" "$T/moes/v0000.safetensors"'
check "--stacked without --experts refused" '! "$B" gen-trace --params 2M --stacked --steps 1 --density 0.01 -o "$T/st_bad" 2>/dev/null'
"$B" gen-trace --params 2M --experts 4000 --steps 1 --density 0.01 -o "$T/moe_bad" 2>"$T/moe_bad.err"
check "--experts above the MLP width refused, naming it" '[ $? != 0 ] && grep -q "experts 4000" "$T/moe_bad.err"'
"$B" delta "$T/moe/v0000.safetensors" "$T/moe/v0001.safetensors" -o "$T/pmoe" &&
	"$B" apply "$T/moe/v0000.safetensors" "$T/pmoe" -o "$T/moe_out.safetensors"
check "MoE delta + apply reproduces NEW" 'cmp "$T/moe_out.safetensors" "$T/moe/v0001.safetensors"'

"$B" diff "$T/tr/v0001.safetensors" "$T/tr/v0002.safetensors" --json >"$T/diff.json"
check "diff --json exit 0" '[ $? = 0 ]'
check "diff --json: exact, 0 < density < 0.05, keys present" \
	'"$PY" -c "
import json,sys
d=json.load(open(sys.argv[1]))
keys=\"elements changed density bytes_chosen bits_per_changed entropy_bound_bytes encode_gbps apply_gbps memcpy_gbps exact tensors\".split()
assert all(k in d for k in keys), keys
assert d[\"exact\"] is True and 0 < d[\"density\"] < 0.05
assert sum(t[\"changed\"] for t in d[\"tensors\"]) == d[\"changed\"]
assert 0 < d[\"entropy_bound_bytes\"] <= d[\"bytes_chosen\"]
" "$T/diff.json"'
check "diff text says exact" '"$B" diff "$T/tr/v0000.safetensors" "$T/tr/v0001.safetensors" | grep -q "round trip: exact"'

"$B" delta "$T/tr/v0001.safetensors" "$T/tr/v0002.safetensors" -o "$T/p12"
check "delta exit 0" '[ $? = 0 ] && [ -s "$T/p12" ]'
"$B" apply "$T/tr/v0001.safetensors" "$T/p12" -o "$T/out.safetensors"
check "apply exit 0" '[ $? = 0 ]'
check "OUT equals NEW byte for byte" 'cmp "$T/out.safetensors" "$T/tr/v0002.safetensors"'

# A flipped byte anywhere in the patch: refused, no OUT.
size=$(stat -c %s "$T/p12")
for off in 3 100 $((size / 2)) $((size - 3)); do
	cp "$T/p12" "$T/bad"
	"$PY" -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(int(sys.argv[2])); b=f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0]^0x10]))" "$T/bad" $off
	"$B" apply "$T/tr/v0001.safetensors" "$T/bad" -o "$T/out_bad.safetensors" 2>"$T/bad.err"
	rc=$?
	check "corrupt patch (byte $off) refused" '[ $rc != 0 ] && grep -qiE "checksum|trailer|corrupt|magic" "$T/bad.err" && [ ! -e "$T/out_bad.safetensors" ]'
done
head -c $((size - 100)) "$T/p12" >"$T/short"
check "truncated patch refused" '! "$B" apply "$T/tr/v0001.safetensors" "$T/short" -o "$T/out_bad.safetensors" 2>/dev/null && [ ! -e "$T/out_bad.safetensors" ]'

"$B" apply "$T/tr/v0000.safetensors" "$T/p12" -o "$T/out_wrong.safetensors" 2>"$T/wrong.err"
rc=$?
cat "$T/wrong.err"
check "mismatched BASE refused" '[ $rc != 0 ] && grep -q "wrong BASE" "$T/wrong.err" && [ ! -e "$T/out_wrong.safetensors" ]'
check "no temporary files left" '! ls "$T"/*.tmp.* 2>/dev/null'
exit $fail
