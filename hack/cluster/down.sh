#!/usr/bin/env bash
# Stop the local control plane started by up.sh: each process by the pid in
# .cluster/pids/<name>.pid (never by name), in reverse start order; SIGTERM, then SIGKILL after 10 s.
#
#   hack/cluster/down.sh            stop; keep .cluster/ (logs, pki, etcd data)
#   hack/cluster/down.sh --purge    stop and delete .cluster/
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
D=${FTJOB_CLUSTER_DIR:-$REPO/.cluster}
COMPONENTS=(kueue kwok kube-scheduler kube-controller-manager kube-apiserver etcd)

log() { printf '[down.sh %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

stop() {
  local name=$1 f=$D/pids/$1.pid pid i
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  # Only signal the process if it still is the binary we started (pids get reused).
  if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null &&
     [[ $(basename "$(readlink "/proc/$pid/exe" 2>/dev/null || true)") == "$name" ]]; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$f"
}

for c in "${COMPONENTS[@]}"; do stop "$c"; done
if [[ ${1:-} == --purge ]]; then
  log "deleting $D"
  rm -rf "$D"
fi
