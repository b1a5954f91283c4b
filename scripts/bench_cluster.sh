#!/usr/bin/env bash
# `make bench-cluster`: deltacast on a cluster of network namespaces
# (scripts/cluster_lib.sh, scripts/cluster_run.sh), for N workers in
# BENCH_CLUSTER_NS (default 8 16 32 64):
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
# BENCH_CLUSTER_EDGE.  Writes the table between the bench-cluster markers
# at the end of docs/benchmarks.md and docs/plots/bench_cluster_*.png
# (BENCH_DOC=0: print only).  BENCH_CLUSTER_QUICK=1: N = 8 16, a 4M model.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/cluster_lib.sh"
. "$HERE/cluster_run.sh"
BUILD=${DELTACAST_BUILD:-$HERE/../build}
PY=${PYTHON:-/usr/bin/python3}
MODEL=m
if [ "${BENCH_CLUSTER_QUICK:-0}" = 1 ]; then
	NS=${BENCH_CLUSTER_NS:-8 16} PARAMS=${BENCH_CLUSTER_PARAMS:-4M}
else
	NS=${BENCH_CLUSTER_NS:-8 16 32 64} PARAMS=${BENCH_CLUSTER_PARAMS:-10M}
fi
RATE=${BENCH_CLUSTER_RATE:-100mbit}
EDGE=${BENCH_CLUSTER_EDGE:-1gbit}
RELAYS=${BENCH_CLUSTER_RELAYS:-4}
DELTAS=${BENCH_CLUSTER_DELTAS:-3}
HB=${BENCH_CLUSTER_HEARTBEAT_MS:-10000}
CL_RANGE_ELEMS=${BENCH_CLUSTER_RANGE_ELEMS:-131072}
DOC=${BENCH_DOC:-$HERE/../docs/benchmarks.md}
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
why=$(cl_usable)
[ -z "$why" ] || { echo "bench-cluster: cannot build network namespaces here: $why" >&2; exit 77; }
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/dcx-bench.XXXXXX")
trap 'cl_down; [ "${BENCH_KEEP:-0}" = 1 ] && echo "bench-cluster: kept $ROOT" >&2 || rm -rf "$ROOT"' EXIT
trap 'exit 130' INT TERM
die() { echo "bench-cluster: FAILED: $*" >&2; exit 1; }

# rss PID: "VmRSS VmHWM" in KiB.
rss() { awk '/^VmRSS/ { r = $2 } /^VmHWM/ { h = $2 } END { printf "[%d, %d]", r, h }' "/proc/$1/status"; }

# deltacast_row KIND N: star or tree, anchor + deltas; one JSON line.
deltacast_row() {
	local kind=$1 n=$2 spec w pid brk
	RUN=$ROOT/$kind-$n
	mkdir -p "$RUN"
	spec=star:$n
	[ "$kind" = tree ] && spec=tree:$RELAYS:$n
	cl_topology "$spec" "$RATE" "$EDGE" 2>>"$ROOT/setup.log" || die "$spec: topology"
	cl_start_brokers --heartbeat-ms "$HB" --anchor-fraction 0 || die "$spec: brokers"
	cl_start_workers $((DELTAS + 2)) || die "$spec: workers did not join" # kept running
	echo "bench-cluster: $spec: $n workers joined, publishing" >&2
	cl_run_versions "${FILES[@]}" >"$RUN/versions.jsonl" || die "$spec: versions"
	eval "pid=\$CL_WORKER_PID_w1"
	brk=$CL_BROKER_PID_root
	[ "$kind" = tree ] && brk=$CL_BROKER_PID_r1
	printf '{"row": "%s", "n": %d, "relays": %d, "broker_rss_kib": %s, "worker_rss_kib": %s, "versions": [%s]}\n' \
		"$kind" "$n" "${#CL_RELAYS[@]}" "$(rss "$brk")" "$(rss "$pid")" \
		"$(paste -sd, "$RUN/versions.jsonl")" >>"$ROOT/rows.jsonl"
	for w in "${CL_WORKERS[@]}"; do eval "kill -TERM \$CL_WORKER_PID_$w"; done
	cl_check_final "${FILES[-1]}" || die "$spec: a worker's model is not the last version"
	cl_down
	rm -rf "$RUN"
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
[ -x "$XORZ" ] || die "no $XORZ (make bench-cluster builds it)"
[ -x "$NGINX" ] || die "no nginx (scripts/deps.sh bench installs it)"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
"$BUILD/deltacast" gen-trace --params "$PARAMS" --steps "$DELTAS" --density 0.01 -o "$ROOT/trace" \
	2>"$ROOT/gentrace.log" || die "gen-trace"
FILES=("$ROOT"/trace/v*.safetensors)
MODEL_BYTES=$(stat -c %s "${FILES[0]}")
echo "bench-cluster: N = $NS, $PARAMS params ($MODEL_BYTES bytes), root link $RATE, others $EDGE" >&2
for n in $NS; do
	deltacast_row star "$n"
	deltacast_row tree "$n"
	echo "bench-cluster: http, $n workers" >&2
	http_row "$n"
	echo "bench-cluster: xor + zstd, $n workers" >&2
	xorz_row "$n"
done
CMD="make bench-cluster"
[ "${BENCH_CLUSTER_QUICK:-0}" = 1 ] && CMD+=" BENCH_CLUSTER_QUICK=1"
META=$(printf '{"cmd": "%s", "params": "%s", "model_bytes": %d, "rate": "%s", "edge": "%s", "relays": %d, "deltas": %d, "heartbeat_ms": %d, "range_elems": %d, "cpus": %d, "load0": "%s", "load1": "%s", "seconds": %d, "netem": %d}' \
	"$CMD" "$PARAMS" "$MODEL_BYTES" "$RATE" "$EDGE" "$RELAYS" "$DELTAS" "$HB" "$CL_RANGE_ELEMS" "$(nproc)" \
	"$LOAD0" "$(cut -d' ' -f1-3 /proc/loadavg)" "$SECONDS" "$((1 - ${CL_NO_NETEM:-0}))")
if [ "$DOC" = 0 ]; then
	"$PY" "$HERE/bench_cluster_report.py" "$ROOT/rows.jsonl" "$META"
else
	"$PY" "$HERE/bench_cluster_report.py" "$ROOT/rows.jsonl" "$META" "$DOC" "$(dirname "$DOC")/plots" || die "report"
fi
