#!/usr/bin/env bash
# Start the local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
# KWOK with fake GPU nodes, all as host processes, and wait until it is ready.
#
# Everything listens on 127.0.0.1, except kube-apiserver when run as root: it then listens on
# APISERVER_ADDR (network.env, 172.31.255.1) on a host-only bridge (hostnet.sh) and advertises that
# address (lease endpoint reconciler), so pods on the real node (node-up.sh) reach it through the
# `kubernetes` Service. The kubeconfig names whichever address is used.
#
#   hack/cluster/up.sh        (or: make cluster-up)
#   export KUBECONFIG=$PWD/.cluster/kubeconfig
#
# Environment (all optional):
#   FTJOB_CLUSTER_DIR       state directory (default <repo>/.cluster): kubeconfig, pki/, etcd/,
#                           logs/<name>.log, pids/<name>.pid, ports.env (ports and APISERVER_HOST)
#   FTJOB_NODES             number of fake GPU nodes (default 4)
#   FTJOB_GPUS_PER_NODE     nvidia.com/gpu per node (default 8)
#   FTJOB_NODE_CPU / FTJOB_NODE_MEMORY / FTJOB_NODE_PODS   node capacity (96 / 1Ti / 110)
#   FTJOB_TOLERATION_SECONDS  default not-ready/unreachable toleration added to pods (default 5),
#                           i.e. how long pods stay on a lost node before being evicted
#   FTJOB_ETCD_PORT, FTJOB_ETCD_PEER_PORT, FTJOB_APISERVER_PORT, FTJOB_KCM_PORT,
#   FTJOB_SCHEDULER_PORT    ports (default: free loopback ports)
#   FTJOB_KEEP_DATA=1       keep etcd data from the last run (default: start empty)
#   FTJOB_UP_TIMEOUT        seconds to wait for readiness (default 120)
#   FTJOB_APISERVER_PROFILING=true  serve /debug/pprof on the apiserver (bench/operator/README.md)
# The binaries come from hack/cluster/build.sh (run it first; up.sh does not build).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=network.env
. "$HERE/network.env"
# shellcheck source=hostnet.sh
. "$HERE/hostnet.sh"
BIN=$("$HERE/build.sh" --print-bin)
D=${FTJOB_CLUSTER_DIR:-$REPO/.cluster}
NODES=${FTJOB_NODES:-4}
GPUS=${FTJOB_GPUS_PER_NODE:-8}
TIMEOUT=${FTJOB_UP_TIMEOUT:-120}
TOLERATION=${FTJOB_TOLERATION_SECONDS:-5}
# Components in start order; down.sh stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { printf '[up.sh %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok ftjob-pki; do
  [[ -x $BIN/$b ]] || die "$BIN/$b missing; run hack/cluster/build.sh first"
done
KUBECTL=("$BIN/kubectl" --kubeconfig "$D/kubeconfig")

port_busy() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }  # port_busy PORT [ADDR]
# Below the kernel's ephemeral range: a port picked there can be taken by any outgoing connection
# before the component binds it (seen: kube-scheduler "address already in use").
EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
free_port() {  # a loopback port nobody listens on, not handed out earlier in this run
  local p
  while :; do
    p=$((10000 + RANDOM % (EPHEMERAL_LOW - 10000)))
    [[ " ${TAKEN:-} " == *" $p "* ]] && continue
    port_busy "$p" || { TAKEN="${TAKEN:-} $p"; echo "$p"; return; }
  done
}

alive() { [[ -f $D/pids/$1.pid ]] && kill -0 "$(cat "$D/pids/$1.pid")" 2>/dev/null; }

start() {  # start NAME ARGS... : run $BIN/NAME detached, pid in pids/NAME.pid, log in logs/NAME.log
  local name=$1; shift
  log "starting $name"
  setsid "$BIN/$name" "$@" >"$D/logs/$name.log" 2>&1 </dev/null 9>&- &  # 9: hostnet.sh's lock
  echo $! >"$D/pids/$name.pid"
}

wait_for() {  # wait_for WHAT NAME CMD... : poll CMD until it succeeds, failing early if NAME died
  local what=$1 name=$2 deadline=$((SECONDS + TIMEOUT)); shift 2
  until "$@" >/dev/null 2>&1; do
    alive "$name" || { tail -n 30 "$D/logs/$name.log" >&2; die "$name exited (log: $D/logs/$name.log)"; }
    ((SECONDS < deadline)) || { tail -n 30 "$D/logs/$name.log" >&2; die "timed out waiting for $what"; }
    sleep 0.5
  done
}

https_ok() {  # https_ok PORT PATH: GET https://127.0.0.1:PORT/PATH answers 2xx (port open without curl)
  if command -v curl >/dev/null; then curl -fsk --max-time 2 "https://127.0.0.1:$1$2"; else port_busy "$1"; fi
}

# --- already up? ---------------------------------------------------------------------------
if [[ -f $D/kubeconfig ]] && alive kube-apiserver && "${KUBECTL[@]}" get --raw /readyz >/dev/null 2>&1; then
  log "cluster already running ($D/kubeconfig)"
  exit 0
fi
if compgen -G "$D/pids/*.pid" >/dev/null; then
  log "stopping leftovers of an earlier run"
  "$HERE/down.sh"
fi

t0=$SECONDS
mkdir -p "$D/pki" "$D/logs" "$D/pids"
[[ ${FTJOB_KEEP_DATA:-0} == 1 ]] || rm -rf "$D/etcd"

# The apiserver's address: APISERVER_ADDR on the host-only bridge when we may create it (root),
# else loopback, where pods of a real node cannot reach it (node-up.sh then refuses).
if hostnet_up; then
  API_HOST=$APISERVER_ADDR
else
  API_HOST=127.0.0.1
  log "not root or no bridge: kube-apiserver on 127.0.0.1 only (a real node cannot join this cluster)"
fi

"$BIN/ftjob-pki" -dir "$D/pki" -apiserver-ip "$KUBERNETES_SERVICE_IP" -apiserver-ip "$API_HOST"
P=$D/pki

ETCD_PORT=${FTJOB_ETCD_PORT:-$(free_port)}
ETCD_PEER_PORT=${FTJOB_ETCD_PEER_PORT:-$(free_port)}
API_PORT=${FTJOB_APISERVER_PORT:-$(free_port)}
KCM_PORT=${FTJOB_KCM_PORT:-$(free_port)}
SCHED_PORT=${FTJOB_SCHEDULER_PORT:-$(free_port)}
for p in "$ETCD_PORT" "$ETCD_PEER_PORT" "$API_PORT" "$KCM_PORT" "$SCHED_PORT"; do
  port_busy "$p" && die "port $p is in use"
done
port_busy "$API_PORT" "$API_HOST" && die "port $API_HOST:$API_PORT is in use"
cat >"$D/ports.env" <<EOF
APISERVER_HOST=$API_HOST
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
APISERVER_PORT=$API_PORT
KCM_PORT=$KCM_PORT
SCHEDULER_PORT=$SCHED_PORT
EOF

b64() { base64 <"$1" | tr -d '\n'; }
kubeconfig() {  # kubeconfig FILE CERT-NAME USER
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ftjob-local
  cluster:
    server: https://$API_HOST:$API_PORT
    certificate-authority-data: $(b64 "$P/ca.crt")
users:
- name: $3
  user:
    client-certificate-data: $(b64 "$P/$2.crt")
    client-key-data: $(b64 "$P/$2.key")
contexts:
- name: ftjob-local
  context: {cluster: ftjob-local, user: $3}
current-context: ftjob-local
EOF
  chmod 600 "$1"
}
kubeconfig "$D/kubeconfig" admin admin
kubeconfig "$P/kube-controller-manager.kubeconfig" kube-controller-manager system:kube-controller-manager
kubeconfig "$P/kube-scheduler.kubeconfig" kube-scheduler system:kube-scheduler

# --- etcd ------------------------------------------------------------------------------------
start etcd --name=ftjob --data-dir="$D/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="ftjob=http://127.0.0.1:$ETCD_PEER_PORT" \
  --unsafe-no-fsync=true --log-level=warn
wait_for "etcd /health" etcd port_busy "$ETCD_PORT"

# --- kube-apiserver --------------------------------------------------------------------------
start kube-apiserver \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address="$API_HOST" --advertise-address="$API_HOST" --secure-port="$API_PORT" \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
  --client-ca-file="$P/ca.crt" \
  --kubelet-client-certificate="$P/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$P/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$P/ca.crt" \
  --kubelet-preferred-address-types=InternalIP,Hostname \
  --authorization-mode=Node,RBAC \
  --enable-admission-plugins=NodeRestriction \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --endpoint-reconciler-type="$([[ $API_HOST == 127.0.0.1 ]] && echo none || echo lease)" \
  --allow-privileged=true \
  --default-not-ready-toleration-seconds="$TOLERATION" \
  --default-unreachable-toleration-seconds="$TOLERATION" \
  --max-requests-inflight=1000 --max-mutating-requests-inflight=500 \
  --profiling="${FTJOB_APISERVER_PROFILING:-false}"
wait_for "kube-apiserver /readyz" kube-apiserver "${KUBECTL[@]}" get --raw /readyz
hostnet_unlock  # our apiserver listens on the bridge now; down.sh of another cluster will see it

# --- kube-controller-manager -----------------------------------------------------------------
KCM_KC=$P/kube-controller-manager.kubeconfig
start kube-controller-manager \
  --kubeconfig="$KCM_KC" --authentication-kubeconfig="$KCM_KC" --authorization-kubeconfig="$KCM_KC" \
  --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
  --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
  --leader-elect=false \
  --controllers='*' \
  --use-service-account-credentials=true \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
  --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
  --kube-api-qps=200 --kube-api-burst=400 \
  --node-monitor-period=2s
wait_for "kube-controller-manager /healthz" kube-controller-manager https_ok "$KCM_PORT" /healthz

# --- kube-scheduler --------------------------------------------------------------------------
SCH_KC=$P/kube-scheduler.kubeconfig
start kube-scheduler \
  --kubeconfig="$SCH_KC" --authentication-kubeconfig="$SCH_KC" --authorization-kubeconfig="$SCH_KC" \
  --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" \
  --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
  --leader-elect=false
wait_for "kube-scheduler /healthz" kube-scheduler https_ok "$SCHED_PORT" /healthz

# --- KWOK and its fake GPU nodes -------------------------------------------------------------
start kwok \
  --kubeconfig="$D/kubeconfig" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --cidr=10.244.0.0/16 --node-ip=10.1.0.1 \
  --node-lease-duration-seconds=40 \
  --config="$HERE/kwok/stages.yaml"

nodes_yaml() {
  local i name
  for ((i = 0; i < NODES; i++)); do
    name=kwok-gpu-$i
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $name
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels:
    type: kwok
    kubernetes.io/hostname: $name
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.count: "$GPUS"
    nvidia.com/gpu.product: NVIDIA-H200
status:
  capacity: &cap
    cpu: "${FTJOB_NODE_CPU:-96}"
    memory: ${FTJOB_NODE_MEMORY:-1Ti}
    ephemeral-storage: 10Ti
    pods: "${FTJOB_NODE_PODS:-110}"
    nvidia.com/gpu: "$GPUS"
  allocatable: *cap
EOF
  done
}
nodes_ready() {  # at least $NODES nodes report Ready=True, from one list call
  # (`kubectl wait --all --timeout=2s` checks node by node and never passes with ~100+ nodes on 2 cores)
  local ready
  ready=$("${KUBECTL[@]}" get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
    grep -c '^True$') || return 1
  ((ready >= NODES))
}
nodes_yaml | "${KUBECTL[@]}" apply -f - >/dev/null
wait_for "$NODES nodes Ready" kwok nodes_ready
# kube-controller-manager's serviceaccount controller creates the default ServiceAccount, which
# the ServiceAccount admission plugin needs before any pod in a namespace can be created.
wait_for "default ServiceAccount" kube-controller-manager "${KUBECTL[@]}" -n default get serviceaccount default

log "cluster ready in $((SECONDS - t0))s: $NODES nodes x $GPUS nvidia.com/gpu; API https://$API_HOST:$API_PORT"
log "export KUBECONFIG=$D/kubeconfig"
