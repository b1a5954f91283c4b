#!/usr/bin/env bash
# /metrics is valid Prometheus text exposition, read by a
# real parser (python3-prometheus-client): with four models (one named with a
# double quote and a backslash, one with a newline, one non-ASCII) and five
# consumers connected, every sample belongs to a typed family of its own
# name, no family appears twice, label values round-trip exactly, and each
# consumer has one version and one lag sample.  `deltacast status` still
# lists the five consumers.
. "$(dirname "$0")/tools/broker_lib.sh"
PY=/usr/bin/python3
if ! "$PY" -c 'import prometheus_client' 2>/dev/null; then
	echo "SKIP: $PY has no prometheus_client (scripts/deps.sh installs python3-prometheus-client)"
	exit 77
fi

MODELS=(plain 'we"ird\name' $'two\nlines' 'modèle-ü')
SMALL=(--tensors 1 --elems 4096 --chunk-elems 4096)
start_broker_metrics m

for i in "${!MODELS[@]}"; do
	"$WC" produce "$m_PROD" "${MODELS[$i]}" --versions 2 "${SMALL[@]}" 2>"$TMP/p$i.err" ||
		fail "producer of model $i exited $?"
done
consumers=(0 0 1 2 3) # model index of each consumer: two on "plain"
for k in "${!consumers[@]}"; do
	bg "c$k" "$WC" consume "$m_CONS" "${MODELS[${consumers[$k]}]}" --until 1000 "${SMALL[@]}" \
		--stats "$TMP/c$k.stats"
done
for k in "${!consumers[@]}"; do
	wait_for 20 grep -qs "applied=2 " "$TMP/c$k.stats" || fail "consumer $k did not apply version 2"
done

cat >"$TMP/check.py" <<'EOF'
# argv: metrics address, then the model of each consumer.  Exit 0 when the
# page parses as wanted, else 1 with the reasons on stdout.
import re, sys, urllib.request
from collections import Counter
from prometheus_client.parser import text_string_to_metric_families

addr, want_models = sys.argv[1], sys.argv[2:]
text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode("utf-8")
bad = []
fams = list(text_string_to_metric_families(text))
names = Counter(f.name for f in fams)
bad += [f"family {n} appears {k} times" for n, k in names.items() if k > 1]
for f in fams:
    if f.type not in ("counter", "gauge"):
        bad.append(f"family {f.name}: type {f.type} (a sample outside its typed family)")
    if not re.fullmatch(r"deltacast_[a-z_]+", f.name):
        bad.append(f"family name {f.name!r}")
    ok = {f.name, f.name + "_total"} if f.type == "counter" else {f.name}
    bad += [f"sample {s.name} in family {f.name}" for s in f.samples if s.name not in ok]
by = {f.name: f for f in fams}
for want in ("deltacast_versions_committed", "deltacast_consumers_connected",
             "deltacast_model_version", "deltacast_consumer_version",
             "deltacast_consumer_lag_versions", "deltacast_errors"):
    if want not in by:
        bad.append(f"no family {want}")
def labels(name, key, value):
    f = by.get(name)
    return Counter(s.labels.get(key) for s in f.samples if s.value == value) if f else Counter()
if labels("deltacast_consumer_version", "model", 2) != Counter(want_models):
    bad.append(f"consumer_version at 2: {labels('deltacast_consumer_version', 'model', 2)}")
if labels("deltacast_consumer_lag_versions", "model", 0) != Counter(want_models):
    bad.append(f"consumer_lag_versions at 0: {labels('deltacast_consumer_lag_versions', 'model', 0)}")
if labels("deltacast_model_version", "model", 2) != Counter(set(want_models)):
    bad.append(f"model_version at 2: {labels('deltacast_model_version', 'model', 2)}")
print("\n".join(bad) if bad else "ok")
sys.exit(1 if bad else 0)
EOF
want=()
for k in "${consumers[@]}"; do want+=("${MODELS[$k]}"); done
# The consumers' ACKs travel asynchronously: wait for the page to show them.
page_ok() { "$PY" "$TMP/check.py" "$m_METRICS" "${want[@]}" >"$TMP/check.out" 2>&1; }
wait_for 10 page_ok || fail "metrics page: $(cat "$TMP/check.out")"

"$BUILD/deltacast" status --broker "$m_METRICS" >"$TMP/st.out" 2>&1 || fail "status exited $?"
rows=$(grep -cE '^[0-9]+ +wire_client-[0-9]+ ' "$TMP/st.out")
[ "$rows" = 5 ] || fail "status lists $rows consumers, not 5: $(cat "$TMP/st.out")"
stop_broker m
echo "test_broker_metrics_format: ok"
