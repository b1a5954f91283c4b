#!/usr/bin/env bash
# The metrics port cannot stall the broker.  While a
# slow-loris client trickles a request (one byte every 150 ms for 3 s) and
# another client connects and sends nothing, a producer publishes versions
# 2..N and the consumer applies all of them before the slow-loris is done:
# a broker that waits in recv() for a metrics client moves nothing for those
# 3 s.  The broker closes both clients after its per-connection time (2 s),
# closes requests over 8 KiB unanswered without growing, and closes clients
# beyond 16 at once; /metrics still answers afterwards.
. "$(dirname "$0")/tools/broker_lib.sh"
PY=/usr/bin/python3
N=10
SMALL=(--tensors 1 --elems 4096 --chunk-elems 4096)

cat >"$TMP/clients.py" <<'EOF'
# Metrics clients: loris ADDR STARTED STATS | idle ADDR | many ADDR K |
# oversize ADDR K | get ADDR.  Each prints one line of results.
import select, socket, sys, time

def dial(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.settimeout(None)  # with a timeout, Python waits even under MSG_DONTWAIT
    return s

def wait_closed(s, limit_s):
    """ms until the peer closes s (EOF or reset), -1 if not within limit_s."""
    t0 = time.monotonic()
    s.settimeout(limit_s)
    try:
        while s.recv(65536):
            pass
    except socket.timeout:
        return -1
    except OSError:
        pass
    return int((time.monotonic() - t0) * 1000)

def peer_closed(s):
    try:
        return s.recv(1, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True

WINDOW_S = 3.0

def trickle(s, t0, req, started):
    """Send req a byte every 150 ms until WINDOW_S from t0: True when the
    peer closed the connection first."""
    for i in range(len(req)):
        if time.monotonic() - t0 >= WINDOW_S:
            return False
        if peer_closed(s):
            return True
        try:
            s.send(req[i:i + 1])
        except OSError:
            return True
        if started:
            open(started, "w").close()
        time.sleep(0.15)  # the pacing is the scenario
    return False

def loris(addr, started, stats):
    # Never a whole request; a closed connection is opened again at once,
    # as an attacker would, until the window is over.
    req = b"GET /metrics HTTP/1.0\r\nX: " + b"a" * 64
    t0, first, conns = time.monotonic(), -1, 0
    while time.monotonic() - t0 < WINDOW_S:
        s = dial(addr)
        conns += 1
        if trickle(s, t0, req, started if conns == 1 else None) and first < 0:
            first = int((time.monotonic() - t0) * 1000)
        if time.monotonic() - t0 >= WINDOW_S:
            # The consumer's progress, read before the last close: a broker
            # stuck in this client's recv() is still stuck now.
            progress = open(stats).read().strip()
        s.close()
    print(f"closed_ms={first} connections={conns} {progress}")

def idle(addr):
    t0, first, conns = time.monotonic(), -1, 0
    while (left := WINDOW_S - (time.monotonic() - t0)) > 0:
        s = dial(addr)
        conns += 1
        ms = wait_closed(s, left)
        first = ms if first < 0 else first
        s.close()
    print(f"closed_ms={first} connections={conns}")

def closed_within(socks, limit_s):
    """How many of socks the peer closes within limit_s, waiting on all."""
    deadline, open_ = time.monotonic() + limit_s, set(socks)
    while open_ and (left := deadline - time.monotonic()) > 0:
        for s in select.select(list(open_), [], [], left)[0]:
            if peer_closed(s):
                open_.discard(s)
    return len(socks) - len(open_)

def many(addr, k):
    socks = [dial(addr) for _ in range(k)]
    early = closed_within(socks, 0.5)
    print(f"early={early} late={closed_within(socks, 5)}")

def oversize(addr, k):
    pad = b"GET /metrics HTTP/1.0\r\n" + b"X-Pad: " + b"a" * (100 * 1024) + b"\r\n\r\n"
    answered = unclosed = 0
    for _ in range(k):
        s = dial(addr)
        try:
            s.sendall(pad)
        except OSError:
            pass
        s.settimeout(5)
        try:
            answered += s.recv(64).startswith(b"HTTP/")
        except socket.timeout:
            unclosed += 1
        except OSError:
            pass
        s.close()
    print(f"answered={answered} unclosed={unclosed}")

def get(addr):
    s = dial(addr)
    s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    print("status=" + data.split(b"\r\n", 1)[0].decode().replace(" ", "_"))

cmd, args = sys.argv[1], sys.argv[2:]
if cmd in ("many", "oversize"):
    args[1] = int(args[1])
{"loris": loris, "idle": idle, "many": many, "oversize": oversize, "get": get}[cmd](*args)
EOF
clients() { "$PY" "$TMP/clients.py" "$@"; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

start_broker_metrics s
"$WC" produce "$s_PROD" stall --versions 1 "${SMALL[@]}" 2>"$TMP/p1.err" || fail "producer (version 1) exited $?"
bg cons "$WC" consume "$s_CONS" stall --until "$N" "${SMALL[@]}" --stats "$TMP/cons.stats"
CONS_PID=$LAST_PID
wait_for 10 grep -qs "applied=1 " "$TMP/cons.stats" || fail "consumer did not apply version 1"

# For 3 s, the two clients connect (again when closed); the producer
# starts once the slow-loris has sent its first byte.
bg idle clients idle "$s_METRICS"
IDLE_PID=$LAST_PID
bg loris clients loris "$s_METRICS" "$TMP/loris.started" "$TMP/cons.stats"
LORIS_PID=$LAST_PID
wait_for 10 test -e "$TMP/loris.started" || fail "slow-loris client did not start: $(cat "$TMP/loris.err")"
"$WC" produce "$s_PROD" stall --versions "$N" "${SMALL[@]}" 2>"$TMP/p2.err" || fail "producer (2..$N) exited $?"
wait "$LORIS_PID" || fail "slow-loris client exited $?: $(cat "$TMP/loris.err")"
echo "slow-loris: $(cat "$TMP/loris.out")"
grep -q "applied=$N " "$TMP/loris.out" ||
	fail "the consumer did not reach version $N while the slow-loris was trickling: $(cat "$TMP/loris.out")"
closed=$(sed -n 's/^closed_ms=\(-*[0-9]*\) .*/\1/p' "$TMP/loris.out")
[ "$closed" -ge 0 ] || fail "the broker kept the slow-loris connection open for 3 s"
wait "$CONS_PID" || fail "consumer exited $?"
wait "$IDLE_PID" || fail "idle client exited $?: $(cat "$TMP/idle.err")"
echo "silent client: $(cat "$TMP/idle.out")"
idle_ms=$(sed -n 's/^closed_ms=\(-*[0-9]*\) .*/\1/p' "$TMP/idle.out")
[ "$idle_ms" -ge 1500 ] && [ "$idle_ms" -le 5000 ] ||
	fail "silent client closed after $idle_ms ms, not about 2000"

# Oversized requests: closed unanswered, the broker's memory unchanged.
clients get "$s_METRICS" >/dev/null || fail "GET /metrics failed"
before=$(rss_kb "$s_PID")
clients oversize "$s_METRICS" 20 >"$TMP/big.out" || fail "oversize client exited $?"
after=$(rss_kb "$s_PID")
echo "oversized: $(cat "$TMP/big.out"), broker RSS ${before} -> ${after} kB"
grep -q "answered=0 unclosed=0" "$TMP/big.out" || fail "oversized requests: $(cat "$TMP/big.out")"
[ $((after - before)) -lt 2048 ] || fail "broker RSS grew from $before to $after kB"

# 20 silent clients at once: 16 are kept (until their time is up), 4 closed at once.
clients many "$s_METRICS" 20 >"$TMP/many.out" || fail "many clients exited $?"
echo "20 clients: $(cat "$TMP/many.out")"
grep -q "early=4 late=20" "$TMP/many.out" || fail "client limit: $(cat "$TMP/many.out")"
clients get "$s_METRICS" >"$TMP/get.out" || fail "GET /metrics failed"
grep -q "status=HTTP/1.0_200_OK" "$TMP/get.out" || fail "GET /metrics: $(cat "$TMP/get.out")"
stop_broker s
echo "test_broker_metrics_stall: ok"
