#!/usr/bin/env bash
# `make demo`: deltacast end to end on loopback.  A broker; a gen-trace model
# (DEMO_PARAMS bf16 parameters, DEMO_VERSIONS versions at DEMO_DENSITY); one
# producer (`deltacast publish`, the first version an anchor, then deltas);
# four consumers (`deltacast subscribe`): c4 joins late (after version
# DEMO_LATE_AT) and c3 is SIGKILLed after version DEMO_KILL_AT and restarted
# from its directory.  Live progress per consumer, then a summary table and
# a check that every consumer's weights equal the producer's last version.
# Exit 0 only when they all do.  Every process started here is killed on
# any exit.
set -u
. "$(dirname "$0")/e2e_lib.sh"

PARAMS=${DEMO_PARAMS:-300M}
VERSIONS=${DEMO_VERSIONS:-10}
DENSITY=${DEMO_DENSITY:-0.01}
LATE_AT=${DEMO_LATE_AT:-4}
KILL_AT=${DEMO_KILL_AT:-5}
DEADLINE_S=${DEMO_TIMEOUT_S:-175}
# A consumer busy applying and folding a large anchor does not heartbeat; the
# broker drops a peer silent for 3 heartbeats.
HEARTBEAT_MS=${DEMO_HEARTBEAT_MS:-5000}
MODEL=demo
TMP=$(mktemp -d "${TMPDIR:-/tmp}/deltacast-demo.XXXXXX")
T0=$EPOCHREALTIME
C3_PID=
declare -A CPID # each consumer's running process

finish() {
	e2e_cleanup
	if [ -n "${DEMO_KEEP:-}" ]; then echo "demo: files kept in $TMP"; else rm -rf "$TMP"; fi
}
trap finish EXIT
trap 'exit 130' INT TERM

die() {
	echo "demo: FAILED: $*" >&2
	for f in "$TMP"/*.err "$TMP"/broker.log; do
		[ -s "$f" ] && { echo "--- $f"; tail -n 8 "$f"; } >&2
	done
	exit 1
}

elapsed() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%6.1fs", b - a }'; }

# Live lines: "[  12.3s] c1  v5 delta   3.1 MB  stage 120.0 ms  apply 40.1 ms".
e2e_show() {
	local who=$1 line=$2
	set -- $line ? ? ? ? ? ? ? ? ? ? ? ? ? ? ? ?
	case "$1" in
	version)
		if [ "$who" = producer ]; then
			printf '[%s] %-9s v%-3s %-6s %10s bytes (%s of the model) in %s ms\n' "$(elapsed)" \
				"$who" "$2" "$3" "$5" "${8#(}" "${15}"
		else
			printf '[%s] %-9s v%-3s %-6s %10s bytes  stage %8s ms  apply %7s ms\n' "$(elapsed)" \
				"$who" "$2" "$3" "$5" "$7" "$9"
		fi ;;
	loaded) printf '[%s] %-9s resumed from its directory at version %s\n' "$(elapsed)" "$who" "$3" ;;
	*) printf '[%s] %-9s %s\n' "$(elapsed)" "$who" "$line" ;;
	esac
}

# start_consumer NAME: deltacast subscribe into $TMP/NAME until the last version.
start_consumer() {
	local name=$1
	echo "$EPOCHREALTIME start" >>"$TMP/$name.events"
	"$DC" subscribe --broker "$CONS_EP" --model "$MODEL" --dir "$TMP/$name" --until "$VERSIONS" \
		> >(e2e_stamp "$TMP/$name.log" "$name") 2>>"$TMP/$name.err" &
	LAST_PID=$!
	CPID[$name]=$LAST_PID
	e2e_track "$LAST_PID"
}

now_s() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", b - a }'; }

[ -x "$DC" ] && [ -x "$BROKER_BIN" ] || die "build first: make (missing $DC or $BROKER_BIN)"
echo "demo: $PARAMS bf16 parameters, $VERSIONS versions at ~$DENSITY density, 4 consumers; files in $TMP"

# 1. The trace: v0000 .. v(VERSIONS-1), version k+1 = file k.
if [ -n "${DEMO_TRACE:-}" ]; then
	TRACE=$DEMO_TRACE
else
	TRACE=$TMP/trace
	echo "[$(elapsed)] gen-trace: writing $VERSIONS checkpoints to $TRACE"
	"$DC" gen-trace --params "$PARAMS" --steps $((VERSIONS - 1)) --density "$DENSITY" -o "$TRACE" \
		2> >(e2e_stamp "$TMP/gentrace.log" gen-trace) || die "gen-trace failed"
fi
FILES=()
for ((k = 0; k < VERSIONS; k++)); do
	f=$(printf '%s/v%04d.safetensors' "$TRACE" "$k")
	[ -f "$f" ] || die "trace file $f missing"
	FILES+=("$f")
done

# 2. Broker, three consumers, the producer.
# shellcheck disable=SC2086
e2e_start_broker "$TMP/broker.log" --heartbeat-ms "$HEARTBEAT_MS" ${DEMO_BROKER_FLAGS:-} ||
	die "no broker started"
echo "[$(elapsed)] broker up: producers $PROD_EP, consumers $CONS_EP (pid $BROKER_PID)"
for c in c1 c2 c3; do
	start_consumer "$c"
	[ "$c" = c3 ] && C3_PID=$LAST_PID
done
echo "$EPOCHREALTIME start" >"$TMP/producer.events"
"$DC" publish --broker "$PROD_EP" --model "$MODEL" "${FILES[@]}" \
	2> >(e2e_stamp "$TMP/producer.log" producer) &
PUB_PID=$!
e2e_track "$PUB_PID"

# 3. Events driven by progress: the late join, the kill and the restart.
late_started=0 killed=0 restarted=0 pub_rc=
while :; do
	[ "$(now_s)" -lt "$DEADLINE_S" ] || die "not done after ${DEADLINE_S}s"
	# The publisher's exit status says whether it published every version:
	# its log lines reach producer.log through a stamper, maybe later.
	if [ -z "$pub_rc" ] && ! kill -0 "$PUB_PID" 2>/dev/null; then
		wait "$PUB_PID"
		pub_rc=$?
		[ "$pub_rc" = 0 ] || die "publish exited $pub_rc after version $(e2e_last_version "$TMP/producer.log")"
	fi
	if [ $late_started = 0 ] && [ "$(e2e_last_version "$TMP/producer.log")" -ge "$LATE_AT" ]; then
		echo "[$(elapsed)] c4        joins late (the producer has published version $LATE_AT)"
		start_consumer c4
		late_started=1
	fi
	if [ $killed = 0 ] && [ "$(e2e_last_version "$TMP/c3.log")" -ge "$KILL_AT" ]; then
		kill -9 "$C3_PID" 2>/dev/null
		wait "$C3_PID" 2>/dev/null
		echo "$EPOCHREALTIME kill" >>"$TMP/c3.events"
		echo "[$(elapsed)] c3        SIGKILLed after version $KILL_AT"
		killed=1
		sleep 1
		echo "[$(elapsed)] c3        restarted on its directory"
		start_consumer c3
		restarted=1
	fi
	# Done: every consumer has exited, which `deltacast subscribe --until`
	# does once it holds the last version and has written it to its
	# model.safetensors (a version line comes before that write).
	done_n=0
	for c in c1 c2 c3 c4; do
		[ -n "${CPID[$c]:-}" ] && ! kill -0 "${CPID[$c]}" 2>/dev/null && done_n=$((done_n + 1))
	done
	[ $done_n = 4 ] && [ $late_started = 1 ] && [ $restarted = 1 ] && break
	sleep 0.1
done
for c in c1 c2 c3 c4; do
	wait "${CPID[$c]}" || die "$c: deltacast subscribe exited $? (see $TMP/$c.err)"
done
if [ -z "$pub_rc" ]; then wait "$PUB_PID" || die "publish exited $?"; fi
sleep 0.2 # let the stampers drain

# 4. Summary and the equality check.
"$PY" "$E2E_ROOT/scripts/e2e_report.py" demo "$TMP" || die "summary failed"
# model digest of a file (tests/tools/fault_digest.h); one retry, in case a
# concurrent `make` is relinking the tool.
digest() { "$BUILD/tools/fault_digest" "$1" 2>/dev/null || { sleep 1; "$BUILD/tools/fault_digest" "$1"; }; }
want=$(digest "${FILES[VERSIONS - 1]}" | cut -d' ' -f1)
[ -n "$want" ] || die "no digest of ${FILES[VERSIONS - 1]}"
bad=0
for c in c1 c2 c3 c4; do
	got=$(digest "$TMP/$c/model.safetensors" | cut -d' ' -f1)
	echo "  $c: version $(e2e_last_version "$TMP/$c.log") digest ${got:-unreadable}"
	[ "$got" = "$want" ] || bad=$((bad + 1))
done
[ $bad = 0 ] || die "$bad consumer(s) differ from the producer's version $VERSIONS (digest $want)"
echo "demo: OK: all 4 consumers' weights equal the producer's version $VERSIONS (digest $want) in $(elapsed | tr -d ' ')"
