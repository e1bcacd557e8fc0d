#!/usr/bin/env bash
# Stop the local control plane started by up.sh: each process by the pid in
# .cluster/pids/<name>.pid (never by name): the apiserver's clients, then kube-apiserver, then
# etcd; SIGTERM, then SIGKILL after 10 s. A real node of this cluster (node-up.sh) is removed
# first; the host-only bridge goes when no other cluster uses it (hostnet.sh).
#
#   hack/cluster/down.sh            stop; keep .cluster/ (logs, pki, etcd data)
#   hack/cluster/down.sh --purge    stop and delete .cluster/
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
D=${FTJOB_CLUSTER_DIR:-$REPO/.cluster}
# shellcheck source=network.env
. "$HERE/network.env"
# shellcheck source=hostnet.sh
. "$HERE/hostnet.sh"

log() { printf '[down.sh %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# ours NAME: print the pid from pids/NAME.pid if that process still is the binary we started
# (pids get reused); drop stale pid files.
ours() {
  local f=$D/pids/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(cat "$f")
  if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null &&
     [[ $(basename "$(readlink "/proc/$pid/exe" 2>/dev/null || true)") == "$1" ]]; then
    echo "$pid"
  else
    rm -f "$f"; return 1
  fi
}

stop() {  # stop NAME...: SIGTERM them together, wait up to 10 s, then SIGKILL what is left
  local name pid i pids=() names=()
  for name in "$@"; do
    pid=$(ours "$name") || continue
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    pids+=("$pid"); names+=("$name")
  done
  for ((i = 0; i < 100; i++)); do
    kill -0 "${pids[@]}" 2>/dev/null || break  # true while any is alive
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      log "${names[$i]} (pid ${pids[$i]}) ignored SIGTERM; sending SIGKILL"
      kill -KILL "${pids[$i]}" 2>/dev/null || true
    fi
    rm -f "$D/pids/${names[$i]}.pid"
  done
}

# A real node of this cluster first, while the apiserver can still take its Node object away.
if [[ -e $D/node/node.env || -e $D/node/pids ]]; then
  FTJOB_CLUSTER_DIR=$D "$HERE/node-down.sh"
fi
# Clients of the apiserver first (together), then the apiserver, then etcd.
stop kueue kwok kube-scheduler kube-controller-manager
stop kube-apiserver
stop etcd
hostnet_down
if [[ ${1:-} == --purge ]]; then
  log "deleting $D"
  rm -rf "$D"
fi
