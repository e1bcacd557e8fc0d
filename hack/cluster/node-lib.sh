# shellcheck shell=bash
# Shared by node-up.sh, node-down.sh and node-load.sh: where the real node keeps its state, what
# it is called, and how to reach its processes. The caller sets HERE and SCRIPT first.
#
# The node's daemons (containerd, kubelet, kube-proxy, CoreDNS, the volume provisioner) run in a
# network namespace and a mount namespace of their own, held open by one process (`holder`, an
# idle ftjob-pause). So every iptables chain, sysctl under net.*, pod network namespace file and
# mount they make lives in those namespaces and is gone once their last process exits: the host's
# iptables and mount table never see them.

# shellcheck source=versions.env
. "$HERE/versions.env"
# shellcheck source=network.env
. "$HERE/network.env"
REPO=$(cd "$HERE/../.." && pwd)
D=${FTJOB_CLUSTER_DIR:-$REPO/.cluster}
N=$D/node
BIN=$("$HERE/build.sh" --print-bin)
KUBECTL=("$BIN/kubectl" --kubeconfig "$D/kubeconfig")
SOCK=$N/containerd/containerd.sock
HOST_VETH=ftjob-node        # host end of the veth pair into the node's network namespace
NODE_LABEL=finetune.dev/real-node=true
NODE_TAINT=finetune.dev/real-node=true:NoSchedule
STORAGE_CLASS=local-path
# Directories the kubelet and the CNI plugins insist on using at fixed host paths. In the node's
# mount namespace each gets a private tmpfs; only the empty mount point may have to be created on
# the host (recorded in $N/host-dirs, removed by node-down.sh).
FIXED_DIRS=(/var/lib/cni /var/log/containers)
# Daemons in start order (node-down.sh stops them in reverse); `holder` comes before all.
DAEMONS=(containerd coredns kubelet kube-proxy local-path-provisioner)
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH

log() { printf '[%s %s] %s\n' "$SCRIPT" "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# pid_of NAME: the pid in pids/NAME.pid if that process still runs the binary we started there,
# in this node's network namespace (recorded in $N/netns): a reused pid is never taken for ours.
pid_of() {
  local f=$N/pids/$1.pid pid exe want=$1
  [[ $1 == holder ]] && want=ftjob-pause
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [[ $(basename "$exe") == "$want" ]] || return 1
  [[ ! -f $N/netns || $(readlink "/proc/$pid/ns/net" 2>/dev/null) == "$(<"$N/netns")" ]] || return 1
  echo "$pid"
}

# One real node per machine (fixed names and addresses): node-up and node-down of any cluster
# directory take this lock, on fd 8, which every process they start must close (`8>&-`).
NODE_LOCK=/tmp/ftjob-node.lock
node_lock() {
  exec 8>"$NODE_LOCK"
  flock -w 600 8 || die "$NODE_LOCK still locked after 10 min (another node-up or node-down?)"
}
node_unlock() { exec 8>&-; }

# node_owner: the cluster directory whose node is plugged into the host now (the host end of its
# veth pair carries it as alias), or nothing.
node_owner() { ip -o link show "$HOST_VETH" 2>/dev/null | sed -n 's/.*alias FTJOB_CLUSTER_DIR=//p'; }

# in_node CMD...: run CMD in the node's network and mount namespaces.
in_node() { nsenter --target "$(pid_of holder)" --net --mount -- "$@"; }

# api_ok: the control plane in $D answers.
api_ok() { [[ -f $D/kubeconfig ]] && "${KUBECTL[@]}" get --raw /readyz >/dev/null 2>&1; }
