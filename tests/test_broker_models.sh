#!/usr/bin/env bash
# Model names are freed: every name used to hold one of
# the --max-models slots forever, restored again from --data-dir, so new
# trainers got DCAST_EBUSY (and, since producer keys were tied to models,
# the broker crashed on that HELLO).  Here, with --max-models 2 and a real
# data dir:
#  - deletion: a third model is refused; `deltacast model delete` over
#    --admin-socket removes one (its consumer is dropped and waits, its
#    segments and run file go); the third model then gets its slot; a
#    restart does not restore the deleted model; the name published again
#    is a new run, and a subscriber holding the old run's version drops it
#    and ends bit-exact on the new one;
#  - idle expiry (--model-idle-s 2): a model whose producer left expires
#    (log line, deltacast_models_expired_total) and frees its slot, a model
#    with a connected consumer does not, and a restart restores only it.
. "$(dirname "$0")/tools/broker_lib.sh"

count() { grep -c -- "$2" "$TMP/$1.log"; }
model_dir() { ls "$1" | grep -c "^$2-"; }
metric() { "$BUILD/deltacast" status --broker "$1" --raw | sed -n "s/^$2 //p"; }
# admin_raw SOCKET BYTES [RUNAS...]: send BYTES (printf escapes), print the answer.
admin_raw() {
	local sock=$1 req=$2
	shift 2
	"$@" /usr/bin/python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode("latin1").decode("unicode_escape").encode("latin1"))
if not sys.argv[2].endswith("HOLD"): s.shutdown(socket.SHUT_WR)
print(s.recv(4096).decode("latin1") or "closed", end="")' "$sock" "$req"
}

# ---- deletion ----
SOCK=$TMP/admin.sock
start_broker_metrics d --max-models 2 --data-dir "$TMP/data" --admin-socket "$SOCK" --anchor-fraction 0
[ "$(stat -c %a "$SOCK")" = 600 ] || fail "admin socket mode $(stat -c %a "$SOCK"), want 600"
"$WC" produce "$d_PROD" a --versions 2 --seed 1 >"$TMP/a1.log" 2>&1 || fail "producer of a refused"
"$WC" produce "$d_PROD" b --versions 2 >"$TMP/b1.log" 2>&1 || fail "producer of b refused"
timeout 60 "$BUILD/deltacast" subscribe --broker "$d_CONS" --model a --dir "$TMP/sub" --until 2 \
	>"$TMP/sub1.out" 2>"$TMP/sub1.err" || fail "subscriber of a did not reach version 2"
! "$WC" produce "$d_PROD" c --versions 1 >"$TMP/c1.log" 2>&1 || fail "a third model was accepted"
grep -q "DCAST_EBUSY.*--max-models 2" "$TMP/c1.log" || fail "no EBUSY for c: $(tail -1 "$TMP/c1.log")"
kill -0 "$d_PID" || fail "the broker died on a HELLO past --max-models"
[ "$(model_dir "$TMP/data" a)" = 1 ] && [ -f "$TMP/data/runs/61" ] || fail "no files of a"

bg cons "$WC" consume "$d_CONS" a --until 99 --timeout-ms 60000
wait_consumer d a "wire_client-$LAST_PID" 2
! "$BUILD/deltacast" model delete nosuch --admin-socket "$SOCK" 2>"$TMP/nosuch.err" ||
	fail "deleting a model that does not exist succeeded"
grep -q "DCAST_ENOTFOUND: no model \"nosuch\"" "$TMP/nosuch.err" || fail "unclear: $(cat "$TMP/nosuch.err")"
"$BUILD/deltacast" model delete a --admin-socket "$SOCK" >"$TMP/del.out" 2>&1 || fail "delete a failed"
grep -q '^ok model "a" deleted' "$TMP/del.out" || fail "answer: $(cat "$TMP/del.out")"
grep -q "model a: removed (deleted): operator request" "$TMP/d.log" || fail "no removal line"
check_metric d deltacast_models_deleted_total 1
grep -q "consumer wire_client-$LAST_PID of a: dropped: the model was removed" "$TMP/d.log" ||
	fail "the consumer of a was not dropped"
wait_for 10 grep -q "model a: segments deleted from" "$TMP/d.log" || fail "files of a not deleted"
[ "$(model_dir "$TMP/data" a)" = 0 ] && [ ! -e "$TMP/data/runs/61" ] || fail "files of a left: $(ls -R "$TMP/data")"
"$WC" produce "$d_PROD" c --versions 1 >"$TMP/c2.log" 2>&1 || fail "c refused after a was deleted"
stop_broker d
[ ! -e "$SOCK" ] || fail "the admin socket file is left after shutdown"

start_broker d2 --max-models 2 --data-dir "$TMP/data" --admin-socket "$SOCK" --anchor-fraction 0
grep -q "segment: model b:" "$TMP/d2.log" && grep -q "segment: model c:" "$TMP/d2.log" ||
	fail "b and c not restored"
[ "$(count d2 "model a")" = 0 ] || fail "the deleted model came back: $(grep -m1 'model a' "$TMP/d2.log")"
# Hostile or careless requests get a clear error line and change nothing.
expect_answer() { # REQUEST PATTERN
	local got
	got=$(admin_raw "$SOCK" "$1")
	[[ "$got" == $2* ]] || fail "request '$1': answer '$got', want '$2'"
}
expect_answer 'frobnicate\n' 'error DCAST_EINVAL: unknown request "frobnicate"'
expect_answer 'delete \n' 'error DCAST_EINVAL: model name of 0 bytes'
expect_answer 'delete b' 'error DCAST_EINVAL: the request is not one line'
expect_answer 'delete b\x00c\n' 'error DCAST_EINVAL: a NUL byte'
expect_answer "delete $(printf 'x%.0s' $(seq 600))" 'error DCAST_ETOO_LARGE'
expect_answer 'delete \xff\xfe\n' 'error DCAST_ENOTFOUND: no model "\\xff\\xfe"'
! LC_ALL=C grep -q $'[\x80-\xff]' "$TMP/d2.log" || fail "raw bytes of a request reached the log"
[ "$(admin_raw "$SOCK" 'HOLD')" = closed ] || fail "a silent admin client was not closed"
chmod 711 "$TMP" && chmod 666 "$SOCK"
got=$(admin_raw "$SOCK" 'delete b\n' setpriv --reuid=65534 --regid=65534 --clear-groups)
chmod 700 "$TMP" && chmod 600 "$SOCK"
[[ "$got" == "error DCAST_EAUTH"* ]] || fail "another uid was served: '$got'"
grep -q "admin: refused a peer (uid 65534" "$TMP/d2.log" || fail "no refusal line for another uid"
"$BUILD/deltacast" model delete c --admin-socket "$SOCK" >/dev/null || fail "delete c failed"
"$WC" produce "$d2_PROD" a --versions 3 --seed 2 >"$TMP/a2.log" 2>&1 || fail "a refused after c was deleted"
run_old=$(sed -n 's/.*model a: created, run \([0-9a-f]*\).*/\1/p' "$TMP/d.log")
run_new=$(sed -n 's/.*model a: created, run \([0-9a-f]*\).*/\1/p' "$TMP/d2.log")
[ -n "$run_new" ] && [ "$run_old" != "$run_new" ] || fail "a created again is not a new run ($run_old, $run_new)"
timeout 60 "$BUILD/deltacast" subscribe --broker "$d2_CONS" --model a --dir "$TMP/sub" --until 3 \
	>"$TMP/sub2.out" 2>"$TMP/sub2.err" || fail "subscriber did not move to the new run: $(tail -2 "$TMP/sub2.err")"
grep -q "belongs to run $run_old" "$TMP/sub2.err" || fail "old run's state not dropped: $(tail -3 "$TMP/sub2.err")"
stop_broker d2

# ---- idle expiry ----
start_broker_metrics e --max-models 2 --model-idle-s 2 --data-dir "$TMP/data2" --anchor-fraction 0
"$WC" produce "$e_PROD" kept --versions 1 >"$TMP/k.log" 2>&1 || fail "producer of kept refused"
bg keeper "$WC" consume "$e_CONS" kept --until 99 --timeout-ms 60000
wait_consumer e kept "wire_client-$LAST_PID" 1
"$WC" produce "$e_PROD" idle1 --versions 1 >"$TMP/i1.log" 2>&1 || fail "producer of idle1 refused"
! "$WC" produce "$e_PROD" idle2 --versions 1 >"$TMP/i2a.log" 2>&1 || fail "a third model was accepted"
wait_metric e deltacast_models_expired_total 1 20
grep -q "model idle1: removed (expired): no producer, no consumer" "$TMP/e.log" ||
	fail "idle1 did not expire: $(grep -m1 'removed' "$TMP/e.log")"
wait_for 10 grep -q "model idle1: segments deleted" "$TMP/e.log" || fail "files of idle1 not deleted"
[ "$(model_dir "$TMP/data2" idle1)" = 0 ] || fail "files of idle1 left"
"$WC" produce "$e_PROD" idle2 --versions 1 >"$TMP/i2b.log" 2>&1 || fail "idle2 refused after idle1 expired"
# idle2's producer left after kept's: once idle2 expires, kept has been
# without a producer longer than --model-idle-s, and only its consumer keeps it.
wait_metric e deltacast_models_expired_total 2 20
grep -q "model idle2: removed (expired)" "$TMP/e.log" || fail "idle2 did not expire"
check_metric e 'deltacast_model_version{model="kept"}' 1 # a model with a connected consumer does not expire
[ "$(metric "$e_METRICS" deltacast_models_expired_total)" = 2 ] || fail "deltacast_models_expired_total not 2"
stop_broker e
start_broker e2 --max-models 2 --data-dir "$TMP/data2" --anchor-fraction 0
grep -q "segment: model kept:" "$TMP/e2.log" || fail "kept not restored"
[ "$(count e2 "model idle")" = 0 ] || fail "an expired model came back: $(grep -m1 'model idle' "$TMP/e2.log")"
stop_broker e2

# ---- deletion while the model's write is in flight ----
# The writer deletes the files only after the write queued before: no
# segment comes back, nothing is ACKed, the producer hears why.
DELTACAST_BROKER_FAULT=slowdisk:1000 start_broker_metrics w --data-dir "$TMP/data3" \
	--admin-socket "$TMP/admin3.sock" --anchor-fraction 0
bg slowpub "$WC" produce "$w_PROD" slow --versions 1
wait_metric w 'deltacast_model_version{model="slow"}' 1 # slow committed version 1
"$BUILD/deltacast" model delete slow --admin-socket "$TMP/admin3.sock" >/dev/null || fail "delete slow failed"
wait_for 10 grep -q "model slow: segments deleted" "$TMP/w.log" || fail "files of slow not deleted"
! wait "$LAST_PID" || fail "the producer of slow was ACKed"
grep -q "DCAST_ENOTFOUND: model slow deleted: operator request" "$TMP/slowpub.err" ||
	fail "the producer was not told: $(tail -2 "$TMP/slowpub.err")"
[ "$(model_dir "$TMP/data3" slow)" = 0 ] || fail "files of slow left: $(ls -R "$TMP/data3")"
stop_broker w
start_broker w2 --data-dir "$TMP/data3" --anchor-fraction 0
[ "$(count w2 "model slow")" = 0 ] || fail "slow came back: $(grep -m1 'model slow' "$TMP/w2.log")"
stop_broker w2

# ---- a relay of a model deleted and created again upstream ----
# The relay's log belongs to the earlier run: it is dropped, not served
# under the new run's id (its consumers get the new run's versions).
start_broker u --admin-socket "$TMP/adminu.sock" --anchor-fraction 0
start_broker r --upstream "$u_CONS" --upstream-model ra --data-dir "$TMP/data4" --anchor-fraction 0
"$WC" produce "$u_PROD" ra --versions 3 --seed 1 >"$TMP/ra1.log" 2>&1 || fail "producer of ra refused"
"$WC" consume "$r_CONS" ra --until 3 --seed 1 >"$TMP/rc1.log" 2>&1 || fail "relay did not serve run 1"
"$BUILD/deltacast" model delete ra --admin-socket "$TMP/adminu.sock" >/dev/null || fail "delete ra failed"
"$WC" produce "$u_PROD" ra --versions 2 --seed 2 >"$TMP/ra2.log" 2>&1 || fail "ra not created again"
wait_for 10 grep -q "relay ra: upstream serves run .*: the earlier run's log is dropped" "$TMP/r.log" ||
	fail "the relay kept the earlier run's log"
"$WC" consume "$r_CONS" ra --until 2 --seed 2 >"$TMP/rc2.log" 2>&1 ||
	fail "the relay served the earlier run: $(tail -1 "$TMP/rc2.log")"
stop_broker r
start_broker r2 --upstream "$u_CONS" --upstream-model ra --data-dir "$TMP/data4" --anchor-fraction 0
grep -q "segment: model ra: 2 version(s) up to 2" "$TMP/r2.log" || fail "relay restored: $(grep -m1 'model ra:' "$TMP/r2.log")"
stop_broker r2
stop_broker u
echo "test_broker_models: ok"
