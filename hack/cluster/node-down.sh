#!/usr/bin/env bash
# Remove the real node that node-up.sh added, and leave the machine as node-up.sh found it.
#
#   hack/cluster/node-down.sh     (or: make node-down)
#
# In order: cordon the node and delete its pods through the API (the kubelet stops them: SIGTERM,
# grace period, CNI teardown); stop the provisioner, kube-proxy, CoreDNS and the kubelet; delete
# the Node object and the API objects node-up.sh made (StorageClass, RBAC, local-path-storage,
# the node's PersistentVolumes); stop containerd; kill what is left in the node's namespaces or
# cgroups, by pid; stop the namespace holder, which takes the namespaces with every mount,
# iptables chain and pod network in them; then delete the host's veth and route, the kubelet's
# cgroups and the state in .cluster/node/ (logs/ stays until the next node-up).
# Without a reachable API server it still does everything on the machine.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT=node-down.sh
# shellcheck source=node-lib.sh
. "$HERE/node-lib.sh"

# stop NAME...: SIGTERM them together, wait up to 15 s, then SIGKILL what is left.
stop() {
  local name pid i pids=() names=()
  for name in "$@"; do
    pid=$(pid_of "$name") || { rm -f "$N/pids/$name.pid"; continue; }
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    pids+=("$pid"); names+=("$name")
  done
  ((${#pids[@]})) || return 0
  for ((i = 0; i < 150; i++)); do
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      log "${names[$i]} (pid ${pids[$i]}) ignored SIGTERM; sending SIGKILL"
      kill -KILL "${pids[$i]}" 2>/dev/null || true
    fi
    rm -f "$N/pids/${names[$i]}.pid"
  done
}

# leftovers: pids of processes in the node's network namespace (containerd's shims, anything that
# escaped) and, when the machine's node is ours (MINE), in the kubelet's cgroups (containers);
# never the holder.
leftovers() {
  local netns holder p cg
  netns=$(cat "$N/netns" 2>/dev/null) || netns=
  holder=$(pid_of holder) || holder=
  {
    if [[ -n $netns ]]; then
      for p in /proc/[0-9]*; do
        [[ $(readlink "$p/ns/net" 2>/dev/null) == "$netns" ]] && echo "${p#/proc/}"
      done
    fi
    if ((MINE)); then
      for cg in /sys/fs/cgroup/pids/kubepods /sys/fs/cgroup/kubepods; do
        [[ -d $cg ]] && find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null
      done
    fi
  } | sort -un | grep -vx "${holder:-none}" || true
}

api_cleanup_pods() {
  "${KUBECTL[@]}" get node "$NODE_NAME" >/dev/null 2>&1 || return 0
  log "cordoning $NODE_NAME and deleting its pods"
  "${KUBECTL[@]}" cordon "$NODE_NAME" >/dev/null || true
  "${KUBECTL[@]}" delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --wait=true --timeout=90s \
    >/dev/null 2>&1 || log "some pods did not stop within 90 s; they are killed below"
}

api_cleanup_objects() {
  local pvs
  # Pods the kubelet could not finish (it is stopped now) and the node itself.
  "${KUBECTL[@]}" delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --force --grace-period=0 \
    >/dev/null 2>&1 || true
  "${KUBECTL[@]}" delete node "$NODE_NAME" --ignore-not-found >/dev/null
  # Volumes of the StorageClass: their data was on this node, and the provisioner is gone.
  pvs=$("${KUBECTL[@]}" get pv -o jsonpath="{range .items[?(@.spec.storageClassName==\"$STORAGE_CLASS\")]}{.metadata.name}{\"\\n\"}{end}")
  if [[ -n $pvs ]]; then
    log "deleting PersistentVolumes of StorageClass $STORAGE_CLASS: $(echo "$pvs" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    "${KUBECTL[@]}" patch pv $pvs --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    # shellcheck disable=SC2086
    "${KUBECTL[@]}" delete pv $pvs --ignore-not-found --wait=false >/dev/null
  fi
  "${KUBECTL[@]}" delete -f "$HERE/node/cluster-objects.yaml" --ignore-not-found --wait=true --timeout=60s >/dev/null ||
    log "some API objects of the node were not deleted (see kubectl get ns local-path-storage)"
}

main() {
  local t0=$SECONDS api=0 owner
  [[ $EUID == 0 ]] || die "needs root"
  node_lock
  # The machine's node (veth, route, kubelet cgroups) is ours unless another cluster directory's
  # node is plugged in; then only what is left in $N (our own pids, namespaces) is cleaned up.
  owner=$(node_owner)
  MINE=1
  [[ -n $owner && $owner != "$D" ]] && MINE=0
  if [[ ! -d $N/pids ]] && { ((!MINE)) || [[ -z $owner ]]; }; then
    log "no real node in $N"
    return 0
  fi
  ((MINE)) || log "this machine's node belongs to FTJOB_CLUSTER_DIR=$owner; cleaning up only what is left in $N"
  api_ok && api=1
  ((api)) && pid_of kubelet >/dev/null && api_cleanup_pods

  stop local-path-provisioner kube-proxy coredns kubelet
  ((api)) && api_cleanup_objects

  if pid_of containerd >/dev/null; then
    # Containers the kubelet did not stop (it always should): kill their tasks.
    local t
    for t in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$SOCK" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
    done
  fi
  stop containerd

  local pids i
  for ((i = 0; i < 3; i++)); do
    pids=$(leftovers)
    [[ -n $pids ]] || break
    log "killing leftover processes of the node: $(echo "$pids" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.5
  done
  stop holder
  if ((MINE)); then
    # The namespaces go with their last process; the host end of the veth pair goes with them.
    for ((i = 0; i < 50; i++)); do
      ip link show "$HOST_VETH" >/dev/null 2>&1 || break
      sleep 0.1
    done
    ip link del "$HOST_VETH" 2>/dev/null || true
    ip route del "$POD_CIDR" via "$NODE_IP" 2>/dev/null || true

    # The kubelet's cgroups (QoS classes and pods), deepest first.
    local cg
    for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
      [[ -d $cg ]] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [[ -d $cg ]] && log "WARNING: could not remove $cg (processes left in it?)"
    done
  fi
  local d
  if [[ -f $N/host-dirs ]]; then
    while read -r d; do [[ -n $d ]] && rmdir "$d" 2>/dev/null || true; done <"$N/host-dirs"
  fi

  # No mount of the node is visible here (they lived in its mount namespace), so this deletes
  # only files; --one-file-system guards against anything mounted on the host all the same.
  find "$N" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf --one-file-system {} +
  log "node $NODE_NAME removed in $((SECONDS - t0))s$( ((api)) || echo ' (no API server: Node object left)')"
}

main "$@"; exit
