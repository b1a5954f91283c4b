# Sourced by scripts/bench_e2e.sh: the tools people use today, moving the
# same gen-trace versions to the same NCONS consumers, one version at a time.
#   bench_http DIR    nginx serves each version's patch file (`deltacast
#                     delta`); consumers curl it and `deltacast apply` it
#   bench_redis DIR   the same patch bytes as 1 MiB Redis pub/sub messages
#                     (tests/tools/bench_redis); subscribers reassemble, apply
#   bench_fs DIR      the whole checkpoint written to a shared folder (write,
#                     fsync, rename); every consumer reads it into memory
# Version 1 travels whole over each transport (the consumers start empty).
# Each writes, under DIR: start.log ("V EPOCH": the producer starts on V),
# cI.done ("V EPOCH": consumer I has V), cI.bytes ("V BYTES" it received),
# for scripts/bench_report.py.  Needs FILES, NVER, NCONS, DC, BUILD, die.
set -u
BENCH_SERVER_PIDS=()

# bench_stop_servers: a graceful stop first (nginx's master then stops its
# workers), then e2e_cleanup's SIGKILL.
bench_stop_servers() {
	local p
	for p in "${BENCH_SERVER_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${BENCH_SERVER_PIDS[@]}"; do wait "$p" 2>/dev/null; done
	BENCH_SERVER_PIDS=()
}

bench_stamp() { echo "$1 $EPOCHREALTIME" >>"$2"; }

# bench_wait_all DIR V: until every consumer has V (a "V FAIL" line fails).
bench_wait_all() {
	local d=$1 v=$2 i deadline=$((SECONDS + 120))
	for ((i = 1; i <= NCONS; i++)); do
		until grep -qs "^$v " "$d/c$i.done"; do
			[ $SECONDS -lt $deadline ] || die "$d: consumer $i never got version $v"
			sleep 0.02
		done
		grep -qs "^$v FAIL" "$d/c$i.done" && die "$d: consumer $i failed version $v (see $d/c$i.err)"
	done
	return 0
}

# bench_fan_out DIR V TAKE ARGS...: "TAKE DIR I V ARGS..." for every
# consumer I at once (each appends "V EPOCH" or "V FAIL" to DIR/cI.done),
# then until every consumer has V.
bench_fan_out() {
	local d=$1 v=$2 take=$3 i pids=()
	shift 3
	for ((i = 1; i <= NCONS; i++)); do
		"$take" "$d" "$i" "$v" "$@" &
		pids+=($!)
	done
	wait "${pids[@]}"
	bench_wait_all "$d" "$v"
}

# bench_check_final DIR: every consumer's file equals the newest version.
bench_check_final() {
	local d=$1 i
	for ((i = 1; i <= NCONS; i++)); do
		cmp -s "$d/c$i/model.safetensors" "${FILES[NVER - 1]}" ||
			die "$d: consumer $i's model differs from version $NVER"
	done
	echo "$(basename "$d"): all $NCONS consumers equal version $NVER" >&2
}

# A loopback port that was free a moment ago (the kernel's pick).
bench_free_port() {
	"$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# bench_start_server LOG NAME UP-COMMAND START-COMMAND...: start it on a
# free port ("PORT" in the arguments), retrying; sets BENCH_PORT.
bench_start_server() {
	local log=$1 name=$2 up=$3 try port pid
	shift 3
	for try in $(seq 0 9); do
		port=$(bench_free_port)
		"${@//PORT/$port}" >>"$log" 2>&1 &
		pid=$!
		if e2e_wait_for 50 bench_server_up "$pid" "${up//PORT/$port}"; then
			BENCH_PORT=$port
			e2e_track "$pid"
			BENCH_SERVER_PIDS+=("$pid")
			return 0
		fi
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
		echo "bench: $name did not come up on port $port, retrying" >>"$log"
	done
	die "$name did not start (see $log)"
}

bench_server_up() { kill -0 "$1" 2>/dev/null && eval "$2" >/dev/null 2>&1; }

# --- HTTP: nginx serving patch files -------------------------------------

# bench_nginx_run DIR PORT: nginx in the foreground (its master and one
# worker per core), everything it writes under DIR.
bench_nginx_run() {
	cat >"$1/nginx.conf" <<EOF
daemon off;
$([ "$(id -u)" = 0 ] && echo "user root;")
worker_processes $(nproc);
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 256; }
http {
	log_format bytes '\$uri \$bytes_sent';
	access_log $1/access.log bytes;
	client_body_temp_path $1/tmp; proxy_temp_path $1/tmp; fastcgi_temp_path $1/tmp;
	uwsgi_temp_path $1/tmp; scgi_temp_path $1/tmp;
	sendfile on; tcp_nopush on; tcp_nodelay on;
	types { } default_type application/octet-stream;
	server { listen 127.0.0.1:$2; root $1/www; }
}
EOF
	exec "$NGINX" -p "$1" -e "$1/error.log" -c "$1/nginx.conf"
}

# One HTTP consumer taking version V: fetch, apply (or take version 1 whole).
bench_http_take() {
	local d=$1 i=$2 v=$3 url=$4 c=$1/c$2
	if [ "$v" = 1 ]; then
		curl -sSf -o "$c/model.safetensors" "$url/v1.safetensors"
	else
		curl -sSf -o "$c/v$v.patch" "$url/v$v.patch" &&
			"$DC" apply "$c/model.safetensors" "$c/v$v.patch" -o "$c/model.next" >/dev/null &&
			mv -f "$c/model.next" "$c/model.safetensors" && rm -f "$c/v$v.patch"
	fi 2>>"$d/c$i.err" && bench_stamp "$v" "$d/c$i.done" || echo "$v FAIL" >>"$d/c$i.done"
}

# The producer's step for version V into folder DEST: DEST/vV.patch (or
# version 1 whole as DEST/v1.safetensors), written, fsynced and renamed.
bench_make_version() {
	local v=$1 dest=$2
	if [ "$v" = 1 ]; then
		"$BUILD/tools/bench_fs" put "${FILES[0]}" "$dest/v1.safetensors"
	else
		"$DC" delta "${FILES[v - 2]}" "${FILES[v - 1]}" -o "$dest/v$v.patch" >/dev/null
	fi
}

bench_consumer_dirs() {
	local i
	for ((i = 1; i <= NCONS; i++)); do mkdir -p "$1/c$i"; done
}

# HTTP: after the producer's step, every consumer fetches at once (the
# announcement costs nothing here; real deployments poll or get a message).
bench_http() {
	local d=$1 n=$1/nginx v
	mkdir -p "$n/www" "$n/tmp"
	bench_consumer_dirs "$d"
	bench_start_server "$d/server.log" nginx "curl -s -o /dev/null http://127.0.0.1:PORT/" \
		bench_nginx_run "$n" PORT
	for ((v = 1; v <= NVER; v++)); do
		bench_stamp "$v" "$d/start.log"
		bench_make_version "$v" "$n/www" || die "http: producer, version $v"
		bench_fan_out "$d" "$v" bench_http_take "http://127.0.0.1:$BENCH_PORT"
	done
	bench_stop_servers
	# "/vV.patch BYTES" (or /v1.safetensors) per request: bytes on the wire.
	awk '$1 ~ /^\/v[0-9]+\./ { v = substr($1, 3); sub(/\..*/, "", v); print v, $2 }' \
		"$n/access.log" >"$d/bytes.log"
	bench_check_final "$d"
}

# --- Redis pub/sub ---------------------------------------------------------

# One subscriber's applier: reads bench_redis sub's lines on stdin.
bench_redis_apply() {
	local d=$1 i=$2 c=$1/c$2 word v f b w
	while read -r word v f f b b w w; do
		if [ "$word" = subscribed ]; then
			bench_stamp 0 "$d/c$i.done"
		elif [ "$v" = 1 ]; then
			mv -f "$f" "$c/model.safetensors" && bench_stamp 1 "$d/c$i.done"
		else
			"$DC" apply "$c/model.safetensors" "$f" -o "$c/model.next" >/dev/null 2>>"$d/c$i.err" &&
				mv -f "$c/model.next" "$c/model.safetensors" && rm -f "$f" &&
				bench_stamp "$v" "$d/c$i.done" || echo "$v FAIL" >>"$d/c$i.done"
		fi
		[ "$word" = version ] && echo "$v $w" >>"$d/bytes.log"
	done
}

bench_redis() {
	local d=$1 v i
	mkdir -p "$d/prod" "$d/redis"
	bench_consumer_dirs "$d"
	bench_start_server "$d/server.log" redis-server "'$REDIS_CLI' -p PORT ping" \
		"$REDIS_SERVER" --port PORT --bind 127.0.0.1 --save "" --appendonly no --dir "$d/redis" \
		--protected-mode no --client-output-buffer-limit "pubsub 0 0 0"
	for ((i = 1; i <= NCONS; i++)); do
		mkdir -p "$d/c$i/in"
		mkfifo "$d/c$i.fifo"
		"$BUILD/tools/bench_redis" sub "$BENCH_PORT" bench "$d/c$i/in" "$NVER" >"$d/c$i.fifo" 2>>"$d/c$i.err" &
		e2e_track $!
		bench_redis_apply "$d" "$i" <"$d/c$i.fifo" &
		e2e_track $!
	done
	bench_wait_all "$d" 0
	for ((v = 1; v <= NVER; v++)); do
		bench_stamp "$v" "$d/start.log"
		bench_make_version "$v" "$d/prod" || die "redis: producer, version $v"
		"$BUILD/tools/bench_redis" pub "$BENCH_PORT" bench "$v" "$NCONS" "$d/prod/v$v".* ||
			die "redis: publish version $v"
		bench_wait_all "$d" "$v"
	done
	bench_stop_servers
	bench_check_final "$d"
}

# --- shared filesystem: the whole checkpoint, reloaded -----------------------

# One consumer reloading version V: "loaded EPOCH bytes B xxh3 H".
bench_fs_take() {
	local d=$1 i=$2 v=$3 want=$4 word t b w h
	read -r word t b b w h < <("$BUILD/tools/bench_fs" load "$d/shared/model.safetensors" 2>>"$d/c$i.err")
	if [ "${word:-}" = loaded ] && [ "$h" = "$want" ]; then
		echo "$v $t" >>"$d/c$i.done"
		echo "$v $b" >>"$d/bytes.log"
	else
		echo "$v FAIL" >>"$d/c$i.done"
	fi
}

bench_fs() {
	local d=$1 v want
	mkdir -p "$d/shared"
	for ((v = 1; v <= NVER; v++)); do
		want=$("$BUILD/tools/bench_fs" hash "${FILES[v - 1]}" | awk '{print $4}')
		bench_stamp "$v" "$d/start.log"
		"$BUILD/tools/bench_fs" put "${FILES[v - 1]}" "$d/shared/model.safetensors" ||
			die "fs: producer, version $v"
		bench_fan_out "$d" "$v" bench_fs_take "$want"
	done
	echo "$(basename "$d"): all $NCONS consumers loaded every version, hashes equal" >&2
}
