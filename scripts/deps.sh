#!/bin/sh
# Install the Debian packages deltacast needs, but only those pkg-config (or,
# for Python modules and tools, a probe) cannot find.  `apt-get update` runs
# once, before the first install, since a fresh machine's lists may be empty.
# `deps.sh bench` also installs what `make bench` compares against (nginx,
# redis-server, curl, matplotlib); `make test` never needs them.
# `deps.sh valgrind` adds valgrind, for `make test-valgrind`.
set -eu
missing=""
need_pc() { pkg-config --exists "$1" 2>/dev/null || missing="$missing $2"; }
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing="$missing $2"; }
need_py() { /usr/bin/python3 -c "import $1" >/dev/null 2>&1 || missing="$missing $2"; }

need_cmd pkg-config pkg-config
if command -v pkg-config >/dev/null 2>&1; then
  need_pc libzmq libzmq3-dev
  need_pc msgpack libmsgpack-dev
  need_pc liburing liburing-dev
  need_pc libxxhash libxxhash-dev
else
  missing="$missing libzmq3-dev libmsgpack-dev liburing-dev libxxhash-dev"
fi
need_cmd clang clang
need_py msgpack python3-msgpack
need_py numpy python3-numpy
need_py torch python3-torch   # the torch tests (they skip without it)
need_py prometheus_client python3-prometheus-client # tests: /metrics parsed for real
[ "${1:-}" != valgrind ] || need_cmd valgrind valgrind # make test-valgrind
if [ "${1:-}" = bench ]; then
  # nginx and redis-server live in /usr/sbin and /usr/bin; probe both.
  [ -x /usr/sbin/nginx ] || need_cmd nginx nginx
  need_cmd redis-server redis-server
  need_cmd redis-cli redis-tools
  need_cmd curl curl
  pkg-config --exists libzstd 2>/dev/null || missing="$missing libzstd-dev" # bench-cluster's peer row
  need_py matplotlib python3-matplotlib
fi
[ -z "$missing" ] && exit 0
echo "deps: installing$missing"
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
