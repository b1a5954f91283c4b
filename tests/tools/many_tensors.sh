#!/usr/bin/env bash
# Models of many tensors against ones of few, the same parameters and
# density: a dense Llama-shaped gen-trace, a mixture-of-experts one
# (`gen-trace --experts E`: 3E + 7 tensors a layer) and the same experts
# stacked (`--stacked`: one tensor per layer and projection).  Per trace: the
# tensor and chunk counts, `deltacast publish` ms per 1% delta with no
# consumer (median over the deltas: the producer's diff, the broker's ACK),
# and one library consumer's CPU per delta (tests/tools/delta_cpu.sh: every
# thread of its process).  The last lines give each MoE figure over the
# dense one, measured in the same run.  The probe behind docs/benchmarks.md,
# "Many tensors".
# Usage: [MANY_PARAMS=100M MANY_EXPERTS=128 MANY_STEPS=9] tests/tools/many_tensors.sh
# (run from the repo root after `make`; traces are kept under
# build/many-*, made once: 2 GB each at the defaults).
. "$(dirname "$0")/broker_lib.sh"

PARAMS=${MANY_PARAMS:-100M}
EXPERTS=${MANY_EXPERTS:-128}
STEPS=${MANY_STEPS:-9}

# trace DIR [--experts E]: make DIR once.
trace() {
	local dir=$1
	shift
	[ -f "$dir/v$(printf %04d "$STEPS").safetensors" ] && return 0
	rm -rf "$dir"
	"$BUILD/deltacast" gen-trace --params "$PARAMS" --steps "$STEPS" --density 0.01 "$@" -o "$dir" \
		2>"$TMP/gen.err" || fail "gen-trace: $(tail -n 1 "$TMP/gen.err")"
}

# publish_ms DIR: "MS CHUNKS" into $TMP/pub.out: the median ms of
# `deltacast publish` over the deltas, and the chunks a version has.
publish_ms() {
	start_broker p
	"$BUILD/deltacast" publish --broker "$p_PROD" --model many "$1"/v*.safetensors 2>"$TMP/pub.err" ||
		fail "publish: $(tail -n 1 "$TMP/pub.err")"
	stop_broker p
	awk '$1 == "version" && $3 == "delta" { print $NF }' "$TMP/pub.err" | sort -n |
		awk '{ ms[NR] = $1 } END { printf "%.1f ", ms[int((NR + 1) / 2)] }' >"$TMP/pub.out"
	awk '$1 == "version" { split($(NF - 2), c, "/"); n = c[2] } END { print n }' "$TMP/pub.err" >>"$TMP/pub.out"
}

# consumer_ms DIR: one library consumer's CPU ms per delta.
consumer_ms() {
	bash "$(dirname "$0")/delta_cpu.sh" "$1" 2>&1 |
		awk '/^consumer CPU over/ { printf "%.1f\n", $(NF - 3) / substr($(NF - 1), 2) }'
}

tensors() {
	"$PY" -c "import json,struct,sys; f=open(sys.argv[1],'rb'); h=json.loads(f.read(struct.unpack('<Q',f.read(8))[0])); print(len([k for k in h if k != '__metadata__']))" "$1"
}

PY=${PYTHON:-/usr/bin/python3}
DENSE=$BUILD/many-dense-$PARAMS-$STEPS
MOE=$BUILD/many-moe$EXPERTS-$PARAMS-$STEPS
STACKED=$BUILD/many-stacked$EXPERTS-$PARAMS-$STEPS
trace "$DENSE"
trace "$MOE" --experts "$EXPERTS"
trace "$STACKED" --experts "$EXPERTS" --stacked
printf '%-22s %8s %8s %18s %22s\n' model tensors chunks "publish ms/delta" "consumer CPU ms/delta"
for t in dense:"$DENSE" moe:"$MOE" stacked:"$STACKED"; do
	name=${t%%:*} dir=${t#*:}
	publish_ms "$dir"
	read -r pub chunks <"$TMP/pub.out"
	cons=$(consumer_ms "$dir")
	[ -n "$cons" ] || fail "no consumer CPU for $dir"
	printf '%-22s %8s %8s %18s %22s\n' "$name $PARAMS" "$(tensors "$dir/v0000.safetensors")" "$chunks" "$pub" "$cons"
	eval "${name}_pub=$pub ${name}_cons=$cons"
done
ratio() { # NAME: its publish and consumer figures over the dense ones
	local pub=${1}_pub cons=${1}_cons
	awk -v a="${!pub}" -v c="${!cons}" -v b="$dense_pub" -v d="$dense_cons" -v n="$1$EXPERTS" \
		'BEGIN { printf "%s over dense: publish %.2fx, consumer CPU %.2fx\n", n, a / b, c / d }'
}
ratio moe
ratio stacked
