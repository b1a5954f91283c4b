#!/usr/bin/env bash
# `make bench-cluster`: deltacast on a cluster of network namespaces
# (scripts/cluster_lib.sh, scripts/cluster_run.sh).  Rows, all by default,
# or those named in BENCH_CLUSTER_ROWS; for N workers in BENCH_CLUSTER_NS
# (default 8 16 32 64):
#   star   root (trainer + broker) and N `deltacast subscribe` workers: the
#          anchor (version 1, "full anchors") then BENCH_CLUSTER_DELTAS
#          ~1% deltas, one at a time
#   tree   the same through BENCH_CLUSTER_RELAYS relay brokers
#   http   nginx on root serving the whole model, curl on every worker
#   xorz   the format RL frameworks ship deltas in (NeMo-RL, slime): per
#          tensor the XOR of the bit patterns, zstd level 1
#          (tests/peers/xor_zstd), made on root for each delta version,
#          served by nginx, fetched with curl and applied by every worker,
#          which holds version 1 already
# For each: seconds from publish (or request) start to the last worker
# having it, and bytes on every link (the switch's counters).  The root's
# link (BENCH_CLUSTER_RATE) is the bottleneck, every other link runs at
# BENCH_CLUSTER_EDGE.  Once, not per N:
#   tree3  an equal-rate tree 3 levels deep: root feeds F relays, each
#          feeds F relays, each feeds F workers (F = BENCH_CLUSTER_TREE3_FAN,
#          default 4: 20 relays, 64 workers), every link at
#          BENCH_CLUSTER_TREE3_RATE; a BENCH_CLUSTER_TREE3_PARAMS model's
#          anchor then one ~1% delta, with every broker store and forward,
#          then every broker with --cut-through (a broker that refuses the
#          flag fails that row, and the script, once the report is out);
#          every tree3 broker also gets BENCH_CLUSTER_TREE3_FLAGS (default
#          --consumer-sndbuf-bytes 32768, set and empty: none; four
#          consumers' connections, twice that each in the kernel, about
#          fill a link's 100 ms tbf queue, so none starves a sibling:
#          docs/operations.md);
#          BENCH_CLUSTER_TREE3 names the modes run (default "sf ct"; "ct":
#          the cut-through row alone, print only)
# Writes the tables between the bench-cluster markers (the tree3 row: its
# own markers) in docs/benchmarks.md and docs/plots/bench_cluster_*.png
# (BENCH_DOC=0: print only).  BENCH_CLUSTER_QUICK=1: N = 8 16, a 4M model;
# tree3 at F = 2 (6 relays, 8 workers) and a 1M model; print only.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cluster_lib.sh"
. "$HERE/cluster_run.sh"
BUILD=${DELTACAST_BUILD:-$HERE/../build}
PY=${PYTHON:-/usr/bin/python3}
MODEL=m
QUICK=${BENCH_CLUSTER_QUICK:-0}
if [ "$QUICK" = 1 ]; then
	NS=${BENCH_CLUSTER_NS:-8 16} PARAMS=${BENCH_CLUSTER_PARAMS:-4M}
	T3_FAN=${BENCH_CLUSTER_TREE3_FAN:-2} T3_PARAMS=${BENCH_CLUSTER_TREE3_PARAMS:-1M}
else
	NS=${BENCH_CLUSTER_NS:-8 16 32 64} PARAMS=${BENCH_CLUSTER_PARAMS:-10M}
	T3_FAN=${BENCH_CLUSTER_TREE3_FAN:-4} T3_PARAMS=${BENCH_CLUSTER_TREE3_PARAMS:-4M}
fi
ROWS=${BENCH_CLUSTER_ROWS:-star tree http xorz tree3}
T3_RATE=${BENCH_CLUSTER_TREE3_RATE:-20mbit}
T3_CUT_FLAGS=${BENCH_CLUSTER_CUT_FLAGS:---cut-through}
T3_MODES=${BENCH_CLUSTER_TREE3:-sf ct}
T3_FLAGS=${BENCH_CLUSTER_TREE3_FLAGS---consumer-sndbuf-bytes 32768}
RATE=${BENCH_CLUSTER_RATE:-100mbit}
EDGE=${BENCH_CLUSTER_EDGE:-1gbit}
RELAYS=${BENCH_CLUSTER_RELAYS:-4}
DELTAS=${BENCH_CLUSTER_DELTAS:-3}
HB=${BENCH_CLUSTER_HEARTBEAT_MS:-10000}
CL_RANGE_ELEMS=${BENCH_CLUSTER_RANGE_ELEMS:-131072}
DOC=${BENCH_DOC:-$HERE/../docs/benchmarks.md}
[ "$QUICK" = 1 ] && DOC=${BENCH_DOC:-0}
FAILED=0
for row in $ROWS; do
	[[ $row =~ ^(star|tree|http|xorz|tree3)$ ]] ||
		{ echo "bench-cluster: BENCH_CLUSTER_ROWS: unknown row '$row' (rows: star tree http xorz tree3)" >&2; exit 2; }
done
for mode in $T3_MODES; do
	[[ $mode =~ ^(sf|ct)$ ]] ||
		{ echo "bench-cluster: BENCH_CLUSTER_TREE3: unknown mode '$mode' (modes: sf ct)" >&2; exit 2; }
done
[ "$T3_MODES" = "sf ct" ] || DOC=0
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
why=$(cl_usable)
[ -z "$why" ] || { echo "bench-cluster: cannot build network namespaces here: $why" >&2; exit 77; }
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/dcx-bench.XXXXXX")
trap 'cl_down; [ "${BENCH_KEEP:-0}" = 1 ] && echo "bench-cluster: kept $ROOT" >&2 || rm -rf "$ROOT"' EXIT
trap 'exit 130' INT TERM
die() { echo "bench-cluster: FAILED: $*" >&2; exit 1; }

# rss PID: "VmRSS VmHWM" in KiB.
rss() { awk '/^VmRSS/ { r = $2 } /^VmHWM/ { h = $2 } END { printf "[%d, %d]", r, h }' "/proc/$1/status"; }

# want ROW: ROW is one of BENCH_CLUSTER_ROWS.
want() { [[ " $ROWS " == *" $1 "* ]]; }

# cluster_versions SPEC RATE EDGE FLAGS...: SPEC's hosts, its brokers with
# the bench's flags and FLAGS, every worker, then each of VFILES published
# in turn (RUN/versions.jsonl); the workers keep running.  Returns 2 if a
# broker did not start (cl_start_broker: CL_BROKER_EXIT, RUN/HOST.broker.log).
cluster_versions() {
	local spec=$1 rate=$2 edge=$3
	shift 3
	mkdir -p "$RUN"
	cl_topology "$spec" "$rate" "$edge" 2>>"$ROOT/setup.log" || die "$spec: topology"
	cl_start_brokers --heartbeat-ms "$HB" --anchor-fraction 0 "$@" || return 2
	cl_start_workers $((${#VFILES[@]} + 1)) || die "$spec: workers did not join"
	echo "bench-cluster: $spec: ${#CL_WORKERS[@]} workers joined, publishing" >&2
	cl_run_versions "${VFILES[@]}" >"$RUN/versions.jsonl" || die "$spec: versions"
}

# cluster_done SPEC: stop the workers, check each holds the last of
# VFILES, tear the cluster down.
cluster_done() {
	local w
	for w in "${CL_WORKERS[@]}"; do eval "kill -TERM \$CL_WORKER_PID_$w"; done
	cl_check_final "${VFILES[-1]}" || die "$1: a worker's model is not the last version"
	cl_down
	rm -rf "$RUN"
}

# deltacast_row KIND N: star or tree, anchor + deltas; one JSON line.
deltacast_row() {
	local kind=$1 n=$2 spec pid brk
	RUN=$ROOT/$kind-$n
	VFILES=("${FILES[@]}")
	spec=star:$n
	[ "$kind" = tree ] && spec=tree:$RELAYS:$n
	cluster_versions "$spec" "$RATE" "$EDGE" || die "$spec: brokers"
	eval "pid=\$CL_WORKER_PID_w1"
	brk=$CL_BROKER_PID_root
	[ "$kind" = tree ] && brk=$CL_BROKER_PID_r1
	printf '{"row": "%s", "n": %d, "relays": %d, "broker_rss_kib": %s, "worker_rss_kib": %s, "versions": [%s]}\n' \
		"$kind" "$n" "${#CL_RELAYS[@]}" "$(rss "$brk")" "$(rss "$pid")" \
		"$(paste -sd, "$RUN/versions.jsonl")" >>"$ROOT/rows.jsonl"
	cluster_done "$spec"
}

# cut_refused: the root broker exited non-zero saying a --cut-through
# argument is unknown (a broker built without the flag).
cut_refused() {
	[ "${CL_BROKER_EXIT:-0}" != 0 ] && grep -qi "unknown.*cut-through" "$RUN/root.broker.log"
}

# tree3_row MODE: the equal-rate tree, every broker store and forward (sf)
# or with T3_CUT_FLAGS (ct), and T3_FLAGS either way; one JSON line, or a failed one where the
# broker refuses the flag.
tree3_row() {
	local mode=$1 spec=ktree:$T3_FAN:3 flags=() cut=() why
	RUN=$ROOT/tree3-$mode
	VFILES=("${T3_FILES[@]}")
	[ "$mode" = ct ] && read -ra cut <<<"$T3_CUT_FLAGS"
	read -ra flags <<<"$T3_FLAGS"
	flags+=("${cut[@]}")
	echo "bench-cluster: tree3, every link $T3_RATE, brokers ${cut[*]:-store and forward} $T3_FLAGS" >&2
	if ! cluster_versions "$spec" "$T3_RATE" "$T3_RATE" "${flags[@]}"; then
		cut_refused || die "$spec: brokers (${flags[*]})"
		why="deltacast-broker refuses $T3_CUT_FLAGS (exit $CL_BROKER_EXIT)"
		echo "bench-cluster: FAILED: tree3 cut-through row: $why: $(tail -n 1 "$RUN/root.broker.log")" >&2
		printf '{"row": "tree3-%s", "failed": "%s"}\n' "$mode" "$why" >>"$ROOT/rows.jsonl"
		FAILED=1
		cl_down
		rm -rf "$RUN"
		return
	fi
	printf '{"row": "tree3-%s", "fan": %d, "relays": %d, "n": %d, "versions": [%s]}\n' "$mode" "$T3_FAN" \
		"${#CL_RELAYS[@]}" "${#CL_WORKERS[@]}" "$(paste -sd, "$RUN/versions.jsonl")" >>"$ROOT/rows.jsonl"
	cluster_done "$spec"
}

# nginx_conf DIR: nginx serving DIR/www on port 8080 of every address.
nginx_conf() {
	cat >"$1/nginx.conf" <<EOF
daemon off;
user root;
worker_processes 2;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 1024; }
http {
	access_log off;
	client_body_temp_path $1/tmp; proxy_temp_path $1/tmp; fastcgi_temp_path $1/tmp;
	uwsgi_temp_path $1/tmp; scgi_temp_path $1/tmp;
	sendfile on; tcp_nopush on; tcp_nodelay on;
	types { } default_type application/octet-stream;
	server { listen 0.0.0.0:8080; root $1/www; }
}
EOF
}

# nginx_up NAME: a fresh star, nginx on root serving $RUN/nginx/www.
nginx_up() {
	mkdir -p "$RUN/nginx/www" "$RUN/nginx/tmp"
	nginx_conf "$RUN/nginx"
	cl_topology "star:$2" "$RATE" "$EDGE" 2>>"$ROOT/setup.log" || die "$1: topology"
	cl_bg root "$RUN/nginx.out" "$NGINX" -p "$RUN/nginx" -e "$RUN/nginx/error.log" -c "$RUN/nginx/nginx.conf"
	touch "$RUN/nginx/www/up"
	cl_wait_for 100 cl_exec w1 curl -sf -o /dev/null "http://$CL_ROOT_ADDR:8080/up" ||
		die "nginx did not start (see $RUN/nginx/error.log)"
}

# last_done T0: seconds from T0 to the last worker's stamp.
last_done() {
	cat "$RUN"/w*.done | awk -v t0="$1" '{ if ($1 > m) m = $1 } END { printf "%.3f", m - t0 }'
}

# http_take W: worker W fetches the whole model, then stamps the time.
http_take() {
	cl_exec "$1" curl -sSf -o "$RUN/$1.model" "http://$CL_ROOT_ADDR:8080/model.safetensors" \
		2>>"$RUN/$1.err" && echo "$EPOCHREALTIME" >"$RUN/$1.done"
}

# http_row N: nginx on root, every worker curls the whole model at once.
http_row() {
	local n=$1 w t0 t pids=()
	RUN=$ROOT/http-$n
	nginx_up http "$n"
	cp "${FILES[0]}" "$RUN/nginx/www/model.safetensors"
	cl_counters >"$RUN/c0"
	t0=$EPOCHREALTIME
	for w in "${CL_WORKERS[@]}"; do http_take "$w" & pids+=($!); done
	wait "${pids[@]}"
	cl_counters >"$RUN/c1"
	for w in "${CL_WORKERS[@]}"; do
		[ -s "$RUN/$w.done" ] || die "http: $w failed ($(cat "$RUN/$w.err"))"
		cmp -s "$RUN/$w.model" "${FILES[0]}" || die "http: $w's copy differs"
	done
	t=$(last_done "$t0")
	printf '{"row": "http", "n": %d, "versions": [{"v": 1, "t": %s, "links": %s, "rates": %s}]}\n' \
		"$n" "$t" "$(cl_link_delta "$RUN/c0" "$RUN/c1")" "$(cl_rates_json)" >>"$ROOT/rows.jsonl"
	cl_down
	rm -rf "$RUN"
}

# xorz_take W PATCH: worker W fetches PATCH, XORs it into its model, stamps.
xorz_take() {
	cl_exec "$1" curl -sSf -o "$RUN/$1.patch" "http://$CL_ROOT_ADDR:8080/$2" 2>>"$RUN/$1.err" &&
		"$XORZ" apply "$RUN/$1.model" "$RUN/$1.patch" 2>>"$RUN/$1.err" && echo "$EPOCHREALTIME" >"$RUN/$1.done"
}

# xorz_version K: version K+1's patch made on root (timed: the trainer's
# encode), fetched and applied by every worker; one JSON version.
xorz_version() {
	local k=$1 w t0 pids=()
	rm -f "$RUN"/w*.done
	cl_counters >"$RUN/c0"
	t0=$EPOCHREALTIME
	"$XORZ" make "${FILES[k - 1]}" "${FILES[k]}" "$RUN/nginx/www/v$k.xzp" || die "xorz: patch of version $((k + 1))"
	for w in "${CL_WORKERS[@]}"; do xorz_take "$w" "v$k.xzp" & pids+=($!); done
	wait "${pids[@]}"
	cl_counters >"$RUN/c1"
	for w in "${CL_WORKERS[@]}"; do
		[ -s "$RUN/$w.done" ] || die "xorz: $w failed ($(cat "$RUN/$w.err"))"
	done
	printf '{"v": %d, "t": %s, "links": %s, "rates": %s, "patch_bytes": %d}' "$((k + 1))" "$(last_done "$t0")" \
		"$(cl_link_delta "$RUN/c0" "$RUN/c1")" "$(cl_rates_json)" "$(stat -c %s "$RUN/nginx/www/v$k.xzp")"
}

# xorz_row N: every worker holds version 1; the deltas as XOR + zstd patches.
xorz_row() {
	local n=$1 w k vs="" want
	RUN=$ROOT/xorz-$n
	nginx_up xorz "$n"
	for w in "${CL_WORKERS[@]}"; do cp "${FILES[0]}" "$RUN/$w.model"; done
	for ((k = 1; k < ${#FILES[@]}; k++)); do vs+="${vs:+, }$(xorz_version "$k")" || die "xorz: version $((k + 1))"; done
	want=$("$BUILD/tools/fault_digest" "${FILES[-1]}" | cut -d' ' -f1)
	for w in "${CL_WORKERS[@]}"; do
		[ "$("$BUILD/tools/fault_digest" "$RUN/$w.model" | cut -d' ' -f1)" = "$want" ] ||
			die "xorz: $w's model is not the last version"
	done
	printf '{"row": "xorz", "n": %d, "versions": [%s]}\n' "$n" "$vs" >>"$ROOT/rows.jsonl"
	cl_down
	rm -rf "$RUN"
}

XORZ=$BUILD/peers/xor_zstd
want xorz && { [ -x "$XORZ" ] || die "no $XORZ (make bench-cluster builds it)"; }
want http || want xorz && { [ -x "$NGINX" ] || die "no nginx (scripts/deps.sh bench installs it)"; }
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
touch "$ROOT/rows.jsonl"
# trace DIR PARAMS STEPS: a gen-trace model, an anchor then STEPS ~1% deltas.
trace() {
	"$BUILD/deltacast" gen-trace --params "$2" --steps "$3" --density 0.01 -o "$1" \
		2>"$1.log" || die "gen-trace $2 (see $1.log)"
}
MODEL_BYTES=0 T3_MODEL_BYTES=0
if [[ " $ROWS " =~ \ (star|tree|http|xorz)\  ]]; then
	trace "$ROOT/trace" "$PARAMS" "$DELTAS"
	FILES=("$ROOT"/trace/v*.safetensors)
	MODEL_BYTES=$(stat -c %s "${FILES[0]}")
	echo "bench-cluster: N = $NS, $PARAMS params ($MODEL_BYTES bytes), root link $RATE, others $EDGE" >&2
fi
for n in $NS; do
	[ "$MODEL_BYTES" = 0 ] && break
	want star && deltacast_row star "$n"
	want tree && deltacast_row tree "$n"
	want http && { echo "bench-cluster: http, $n workers" >&2; http_row "$n"; }
	want xorz && { echo "bench-cluster: xor + zstd, $n workers" >&2; xorz_row "$n"; }
done
if want tree3; then
	trace "$ROOT/trace3" "$T3_PARAMS" 1
	T3_FILES=("$ROOT"/trace3/v*.safetensors)
	T3_MODEL_BYTES=$(stat -c %s "${T3_FILES[0]}")
	for mode in $T3_MODES; do tree3_row "$mode"; done
fi
CMD="make bench-cluster"
[ "$QUICK" = 1 ] && CMD+=" BENCH_CLUSTER_QUICK=1"
[ -n "${BENCH_CLUSTER_ROWS:-}" ] && CMD+=" BENCH_CLUSTER_ROWS='$ROWS'"
COMMIT=$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo unknown)
META=$(printf '{"cmd": "%s", "params": "%s", "model_bytes": %d, "rate": "%s", "edge": "%s", "relays": %d, "deltas": %d, "heartbeat_ms": %d, "range_elems": %d, "cpus": %d, "load0": "%s", "load1": "%s", "seconds": %d, "netem": %d, "t3_fan": %d, "t3_params": "%s", "t3_model_bytes": %d, "t3_rate": "%s", "t3_cut_flags": "%s", "t3_flags": "%s", "date": "%s", "commit": "%s"}' \
	"$CMD" "$PARAMS" "$MODEL_BYTES" "$RATE" "$EDGE" "$RELAYS" "$DELTAS" "$HB" "$CL_RANGE_ELEMS" "$(nproc)" \
	"$LOAD0" "$(cut -d' ' -f1-3 /proc/loadavg)" "$SECONDS" "$((1 - ${CL_NO_NETEM:-0}))" \
	"$T3_FAN" "$T3_PARAMS" "$T3_MODEL_BYTES" "$T3_RATE" "$T3_CUT_FLAGS" "$T3_FLAGS" "$(date -u +%F)" "$COMMIT")
if [ "$DOC" = 0 ]; then
	"$PY" "$HERE/bench_cluster_report.py" "$ROOT/rows.jsonl" "$META"
else
	"$PY" "$HERE/bench_cluster_report.py" "$ROOT/rows.jsonl" "$META" "$DOC" "$(dirname "$DOC")/plots" || die "report"
fi
[ "$FAILED" = 0 ] || die "a row failed (see the FAILED line above)"
