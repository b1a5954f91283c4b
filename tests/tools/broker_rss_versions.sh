#!/usr/bin/env bash
# Measure the broker's resident memory (VmRSS, /proc/PID/status) with 1 vs
# VERSIONS versions in its log, without broker-made anchors
# (--anchor-fraction 0) and with the default folding (--anchor-fraction 0.5),
# which adds the host copy of the state and keeps the log near one model.
# Usage: tests/tools/broker_rss_versions.sh [ELEMS] [VERSIONS] [DENSITY_PPM]
# (run from the repo root; 3 BF16 tensors of ELEMS elements).
. "$(dirname "$0")/broker_lib.sh"
ELEMS=${1:-1048576}
VERSIONS=${2:-20}
PPM=${3:-20000}
rss() { local pid; eval "pid=\$${1}_PID"; awk '/VmRSS/ {print $2}' "/proc/$pid/status"; }
# metric NAME KEY: broker NAME's /metrics value of deltacast_KEY.
metric() {
	local m
	eval "m=\$${1}_METRICS"
	"$BUILD/deltacast" status --broker "$m" --raw 2>/dev/null | awk -v k="deltacast_$2" '$1 == k { print $2 }'
}
# settled NAME: broker NAME has handled the producer's BYE, holds no state
# for a broker-made anchor, and has given its freed heap back to the system
# since the log last changed (deltacast_heap_trim_due 0: trimmed on a quiet
# turn).  A cut queued and not yet begun shows the same: the broker exports
# no fold queue.
settled() {
	[ "$(metric "$1" producers_connected)" = 0 ] && [ "$(metric "$1" fold_state_bytes)" = 0 ] &&
		[ "$(metric "$1" heap_trim_due)" = 0 ]
}
log_payload() { sed -n "s/.*model $2: .*(\(anchor\|delta\), [0-9]* chunks, \([0-9]*\) bytes).*/\2/p" "$TMP/$1.log" | awk '{s+=$1} END {print s+0}'; }

measure() { # NAME FRACTION
	local name=$1 ep r0 r1 rn
	start_broker_metrics "$name" --anchor-fraction "$2"
	eval "ep=\$${name}_PROD"
	r0=$(rss "$name")
	"$WC" produce "$ep" "v$name" --versions 1 --elems "$ELEMS" --density-ppm "$PPM" 2>"$TMP/p1$name.err" || fail producer
	wait_for 10 settled "$name" || fail "broker $name did not settle"
	r1=$(rss "$name")
	"$WC" produce "$ep" "v$name" --versions "$VERSIONS" --elems "$ELEMS" --density-ppm "$PPM" 2>"$TMP/pn$name.err" || fail producer
	wait_for 10 settled "$name" || fail "broker $name did not settle"
	rn=$(rss "$name")
	echo "--anchor-fraction $2: rss_kb start=$r0 1_version=$r1 ${VERSIONS}_versions=$rn" \
		"(payload committed: $(log_payload "$name" "v$name") bytes; made anchors: $(grep -c 'made anchor' "$TMP/$name.log"))"
	stop_broker "$name"
}

echo "model: 3 x $ELEMS BF16 = $((3 * ELEMS * 2)) bytes; $VERSIONS versions at $PPM ppm density"
measure off 0
measure fold 0.5
