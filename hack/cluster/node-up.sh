#!/usr/bin/env bash
# Add one real worker node to the running local control plane (after up.sh), so pods really run.
#
#   hack/cluster/node-up.sh      (or: make node-up)      node "ftjob-node", Ready
#   hack/cluster/node-down.sh    (or: make node-down)    remove it, leave the machine as found
#   hack/cluster/node-load.sh ARCHIVE...                 import OCI/docker image archives
#
# The KWOK nodes of up.sh only schedule: nothing runs there. This node runs pods for real:
# containerd + runc + CNI bridge networking, kubelet and kube-proxy (K8S_VERSION), CoreDNS for
# cluster.local, and a default StorageClass (`local-path`, rancher/local-path-provisioner). It is
# labelled finetune.dev/real-node=true and tainted finetune.dev/real-node=true:NoSchedule, so only
# pods that select and tolerate it land there.
#
# Layout (network.env): the node lives in its own network namespace, joined to the host by a veth
# pair plugged into up.sh's host-only bridge; NODE_IP (kubelet, kube-proxy) and DNS_IP (CoreDNS)
# are its addresses, pods get POD_CIDR on a bridge inside it and routes only to the service range
# and the host-only network (no default route: nothing leaves the machine). kube-proxy maps the
# `kubernetes` Service (KUBERNETES_SERVICE_IP:443) to the apiserver on APISERVER_ADDR, so pods use
# in-cluster config like anywhere else. The node also has its own mount namespace: every mount
# it makes disappears with its processes (node-lib.sh says why).
#
# Needs root, Go (build.sh node) and Debian packages, which it installs when missing
# (containerd, runc, containernetworking-plugins, iptables, buildah, openssl; busybox-static is
# only downloaded). Binaries and the two local images (pause; busybox + openssl for the volume
# helper pods and for tests) are cached like build.sh's, next to bin/.
#
# State: everything under ${FTJOB_CLUSTER_DIR:-.cluster}/node/: node.env (NODE_NAME, NODE_IP,
# DNS_IP, CONTAINERD_SOCK, the local image names, ...), containerd/ (root, state, socket),
# kubelet/, cni/, pki/, volumes/ (PV data), logs/<name>.log, pids/<name>.pid.
#
# Environment: FTJOB_CLUSTER_DIR, FTJOB_NODE_UP_TIMEOUT (seconds per wait, default 120).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT=node-up.sh
# shellcheck source=node-lib.sh
. "$HERE/node-lib.sh"
TIMEOUT=${FTJOB_NODE_UP_TIMEOUT:-120}
APT_LOCK=/tmp/ftjob-apt.lock

wait_for() {  # wait_for WHAT NAME CMD...: poll CMD until it succeeds, failing early if NAME died
  local what=$1 name=$2 deadline=$((SECONDS + TIMEOUT)); shift 2
  until "$@" >/dev/null 2>&1; do
    pid_of "$name" >/dev/null || { tail -n 30 "$N/logs/$name.log" >&2; die "$name exited (log: $N/logs/$name.log)"; }
    ((SECONDS < deadline)) || { tail -n 30 "$N/logs/$name.log" >&2; die "timed out waiting for $what"; }
    sleep 0.3
  done
}

# --- preflight ---------------------------------------------------------------------------------
preflight() {
  [[ $EUID == 0 ]] || die "needs root (network namespaces, mounts, containerd)"
  [[ -f $D/ports.env ]] && api_ok || die "no control plane answers in $D: run make cluster-up first"
  # shellcheck source=/dev/null
  . "$D/ports.env"
  [[ ${APISERVER_HOST:-127.0.0.1} == "$APISERVER_ADDR" ]] ||
    die "the control plane in $D listens on ${APISERVER_HOST:-127.0.0.1} only, where pods cannot reach it;" \
      "restart it as root (make cluster-down cluster-up) so kube-apiserver listens on $APISERVER_ADDR"
  if pid_of holder >/dev/null; then
    if node_ready; then log "node $NODE_NAME already up ($N/node.env)"; exit 0; fi
    die "node $NODE_NAME is half up; run hack/cluster/node-down.sh first"
  fi
  not_taken
  if [[ -d $N/pids ]]; then
    log "cleaning up after an earlier node in $N"
    "$HERE/node-down.sh"
  fi
  local cg
  for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d $cg ]] && die "$cg exists: another kubelet runs on this machine (or left it behind)"
  done
  # Unix socket paths are limited to 107 bytes; the kubelet's deepest is about this long.
  local probe=$N/kubelet/root/plugins_registry/csi.example.com-reg.sock
  ((${#probe} < 108)) || die "$N is too deep for unix sockets; set FTJOB_CLUSTER_DIR to a shorter path"
}

not_taken() {
  ip link show "$HOST_VETH" >/dev/null 2>&1 || return 0
  die "this machine's real node is up for FTJOB_CLUSTER_DIR=$(node_owner) (there is one per machine):" \
    "run make node-down there first"
}

node_ready() {
  [[ $("${KUBECTL[@]}" get node "$NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

# --- Debian packages ---------------------------------------------------------------------------
apt_get() {  # apt_get ARGS...: apt-get under the machine-wide apt lock (others may run apt too)
  DEBIAN_FRONTEND=noninteractive flock "$APT_LOCK" apt-get -q -o Dpkg::Use-Pty=0 "$@"
}

packages() {
  local need=() t0=$SECONDS
  command -v containerd >/dev/null && command -v containerd-shim-runc-v2 >/dev/null || need+=(containerd)
  command -v runc >/dev/null || need+=(runc)
  cni_bin_dir >/dev/null || need+=(containernetworking-plugins)
  command -v iptables >/dev/null || need+=(iptables)
  command -v buildah >/dev/null || need+=(buildah)
  command -v openssl >/dev/null || need+=(openssl)
  ((${#need[@]})) || return 0
  command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get to install them"
  log "installing ${need[*]}"
  apt_get install -y --no-install-recommends "${need[@]}" >"$N/logs/apt.log" 2>&1 ||
    { apt_get update >>"$N/logs/apt.log" 2>&1 &&
      apt_get install -y --no-install-recommends "${need[@]}" >>"$N/logs/apt.log" 2>&1; } ||
    { tail -n 20 "$N/logs/apt.log" >&2; die "apt-get install ${need[*]} failed (log: $N/logs/apt.log)"; }
  log "installed ${need[*]} in $((SECONDS - t0))s"
}

cni_bin_dir() {  # Debian puts the CNI plugins in /usr/lib/cni, upstream in /opt/cni/bin
  local d
  for d in /usr/lib/cni /opt/cni/bin; do [[ -x $d/bridge && -x $d/host-local && -x $d/loopback ]] && { echo "$d"; return; }; done
  return 1
}

# --- images: pause and busybox, built once into the cache, imported at every start --------------
IMAGES=$BIN/../node-images

# build_image NAME REF ROOTFS BUILDAH-CONFIG-ARGS...: $IMAGES/NAME.tar (oci-archive) unless its
# stamp already names REF.
build_image() {
  local name=$1 ref=$2 rootfs=$3 w c; shift 3
  [[ -f $IMAGES/$name.tar && $(cat "$IMAGES/.$name.stamp" 2>/dev/null) == "$ref" ]] && return
  w=$(mktemp -d "$IMAGES/.work-XXXXXX")
  local b=(buildah --root "$w/storage" --runroot "$w/run" --storage-driver vfs)
  c=$("${b[@]}" from scratch)
  "${b[@]}" copy --quiet "$c" "$rootfs" / >/dev/null
  "${b[@]}" config "$@" "$c"
  rm -f "$IMAGES/$name.tar"
  "${b[@]}" commit --quiet "$c" "oci-archive:$IMAGES/$name.tar:$ref" >/dev/null
  "${b[@]}" rm "$c" >/dev/null
  rm -rf "$w"
  echo "$ref" >"$IMAGES/.$name.stamp"
  log "built image $ref"
}

images() {
  mkdir -p "$IMAGES"
  local sum r
  # pause: the static ftjob-pause binary alone; the tag is its checksum.
  sum=$(cksum <"$BIN/ftjob-pause" | cut -d' ' -f1)
  PAUSE_IMAGE=localhost/ftjob/pause:$sum
  if [[ $(cat "$IMAGES/.pause.stamp" 2>/dev/null) != "$PAUSE_IMAGE" ]]; then
    r=$(mktemp -d); install -m 755 "$BIN/ftjob-pause" "$r/pause"
    build_image pause "$PAUSE_IMAGE" "$r" --entrypoint '["/pause"]' --user 65535:65535
    rm -rf "$r"
  fi
  # busybox: Debian's static busybox with its applet links, plus the host's openssl with the
  # libraries it links (busybox's own TLS client fails against Go's TLS servers; `openssl
  # s_client` checks the apiserver's certificate like in-cluster config does); /etc/passwd with
  # root, nobody and nonroot (65532); a /tmp. busybox-static is only downloaded (apt-get
  # download), never installed: the package would replace the host's busybox.
  local deb ver ossl
  ver=$(apt-cache policy busybox-static 2>/dev/null | sed -n 's/^ *Candidate: //p')
  if [[ -z $ver || $ver == "(none)" ]]; then
    apt_get update >>"$N/logs/apt.log" 2>&1 || die "apt-get update failed (log: $N/logs/apt.log)"
    ver=$(apt-cache policy busybox-static | sed -n 's/^ *Candidate: //p')
  fi
  ossl=$(dpkg-query -W -f '${Version}' openssl)
  BUSYBOX_IMAGE=localhost/ftjob/busybox:$(echo "${ver#*:}-openssl-$ossl" | tr -c 'A-Za-z0-9_.\n-' '-')
  [[ $(cat "$IMAGES/.busybox.stamp" 2>/dev/null) == "$BUSYBOX_IMAGE" ]] && return
  r=$(mktemp -d)
  (cd "$r" && apt-get -q download "busybox-static=$ver" >/dev/null 2>&1) ||
    die "apt-get download busybox-static=$ver failed"
  deb=$(echo "$r"/busybox-static_*.deb)
  mkdir -p "$r/x" "$r/root/bin" "$r/root/etc" "$r/root/tmp" "$r/root/home/nonroot"
  dpkg-deb -x "$deb" "$r/x"
  install -m 755 "$r/x/bin/busybox" "$r/root/bin/busybox"
  local a
  for a in $("$r/root/bin/busybox" --list); do [[ $a == busybox ]] || ln -s busybox "$r/root/bin/$a"; done
  install -m 755 /usr/bin/openssl "$r/root/bin/openssl"
  for a in $(ldd /usr/bin/openssl | grep -o '/[^ ]*'); do
    mkdir -p "$r/root$(dirname "$a")" && cp -L "$a" "$r/root$a"
  done
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh' >"$r/root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$r/root/etc/group"
  chmod 1777 "$r/root/tmp"; chown 65532:65532 "$r/root/home/nonroot"
  build_image busybox "$BUSYBOX_IMAGE" "$r/root" --cmd '["/bin/sh"]' --env PATH=/bin
  rm -rf "$r"
}

# --- certificates and kubeconfigs ----------------------------------------------------------------
certs() {
  "$BIN/ftjob-pki" -dir "$N/pki" -ca "$D/pki" \
    -client "kubelet=system:node:$NODE_NAME,system:nodes" \
    -client kube-proxy=system:kube-proxy \
    -client coredns=ftjob:coredns \
    -client local-path-provisioner=ftjob:local-path-provisioner \
    -serving "kubelet-serving=$NODE_NAME,$NODE_IP,$NODE_NAME"
  local b64 n
  b64() { base64 <"$1" | tr -d '\n'; }
  for n in kubelet kube-proxy coredns local-path-provisioner; do
    cat >"$N/pki/$n.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ftjob-local
  cluster:
    server: https://$APISERVER_ADDR:$APISERVER_PORT
    certificate-authority-data: $(b64 "$D/pki/ca.crt")
users:
- name: $n
  user:
    client-certificate-data: $(b64 "$N/pki/$n.crt")
    client-key-data: $(b64 "$N/pki/$n.key")
contexts:
- name: ftjob-local
  context: {cluster: ftjob-local, user: $n}
current-context: ftjob-local
EOF
    chmod 600 "$N/pki/$n.kubeconfig"
  done
}

# --- the node's namespaces ----------------------------------------------------------------------
# Values the kubelet insists on for global kernel settings (setupKernelTunables in
# pkg/kubelet/cm/container_manager_linux.go). It would write them into the host's kernel; with
# protectKernelDefaults it only checks them, and in the node's mount namespace it reads these
# values from files mounted over /proc/sys/..., so the host keeps its own.
KUBELET_SYSCTLS=(vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1
  kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000)

namespaces() {
  log "creating the node's network and mount namespaces"
  setsid unshare --net --mount --propagation private -- "$BIN/ftjob-pause" \
    >"$N/logs/holder.log" 2>&1 </dev/null 8>&- &
  echo $! >"$N/pids/holder.pid"
  local i holder
  for ((i = 0; i < 50; i++)); do
    holder=$(pid_of holder) && [[ $(readlink "/proc/$holder/ns/net") != "$(readlink /proc/self/ns/net)" ]] && break
    sleep 0.1
  done
  holder=$(pid_of holder) || die "the namespace holder did not start (log: $N/logs/holder.log)"
  readlink "/proc/$holder/ns/net" >"$N/netns"

  # Network: a veth pair from the host-only bridge into the namespace; NODE_IP and DNS_IP there.
  ip link add "$HOST_VETH" type veth peer name eth0 netns "$holder"
  ip link set "$HOST_VETH" alias "FTJOB_CLUSTER_DIR=$D"
  ip link set "$HOST_VETH" master "$HOSTNET_IF" up
  in_node ip link set lo up
  in_node ip addr add "$NODE_IP/${HOSTNET_CIDR#*/}" dev eth0
  in_node ip addr add "$DNS_IP/32" dev eth0
  in_node ip link set eth0 up
  in_node sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward'  # this namespace only: pods <-> host
  # ClusterIPs from the node's own processes (hostNetwork pods): the route only has to exist for
  # kube-proxy's DNAT to happen; an address it does not map dies unanswered on the bridge.
  in_node ip route add "$SERVICE_CIDR" dev eth0
  ip route add "$POD_CIDR" via "$NODE_IP" dev "$HOSTNET_IF"  # host -> pods (apiserver -> webhooks)

  # Mounts: a private /run (containerd's runc state and shim sockets, /run/netns for pod network
  # namespaces), private tmpfs on the fixed paths, and the kubelet's kernel settings.
  in_node mount -t tmpfs -o mode=0755 ftjob-node /run
  local d
  : >"$N/host-dirs"
  for d in "${FIXED_DIRS[@]}"; do
    [[ -d $d ]] || { mkdir -p "$d" && echo "$d" >>"$N/host-dirs"; }
    in_node mount -t tmpfs -o mode=0755 ftjob-node "$d"
  done
  local kv key
  mkdir -p "$N/sysctl"
  for kv in "${KUBELET_SYSCTLS[@]}"; do
    key=${kv%%=*}
    echo "${kv#*=}" >"$N/sysctl/${key//\//.}"
    in_node mount --bind "$N/sysctl/${key//\//.}" "/proc/sys/$key"
  done
}

# start NAME ARGS...: run NAME (a path, or a binary in $BIN) in the node's namespaces, detached;
# pid in pids/NAME.pid, output in logs/NAME.log.
start() {
  local name=$1 exe=$1; shift
  [[ $exe == /* ]] || exe=$BIN/$exe
  name=$(basename "$name")
  log "starting $name"
  setsid nsenter --target "$(pid_of holder)" --net --mount -- "$exe" "$@" \
    >"$N/logs/$name.log" 2>&1 </dev/null 8>&- &
  echo $! >"$N/pids/$name.pid"
  local i  # setsid and nsenter exec NAME in the same process: wait for that before anyone checks it
  for ((i = 0; i < 100; i++)); do pid_of "$name" >/dev/null && return; sleep 0.05; done
}

# --- configuration files ------------------------------------------------------------------------
configs() {
  local cni_dir runc restrict=true
  cni_dir=$(cni_bin_dir)
  runc=$(command -v runc)
  # A negative oom_score_adj (containerd gives pause containers -998) needs CAP_SYS_RESOURCE; where
  # we lack it (some VMs), containerd must clamp the value or every sandbox fails to start.
  (( (0x$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status) >> 24) & 1 )) && restrict=false

  mkdir -p "$N/containerd" "$N/cni/net.d" "$N/kubelet" "$N/kube-proxy" "$N/coredns" "$N/volumes"
  cat >"$N/containerd/config.toml" <<EOF
version = 2
root = "$N/containerd/root"
state = "$N/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$N/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = $restrict
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni_dir"
    conf_dir = "$N/cni/net.d"
    max_conf_num = 1
EOF

  # Pods: a bridge inside the node's namespace, routes only to the services and the host-only
  # network (no default route), no masquerading.
  cat >"$N/cni/net.d/10-ftjob.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "ftjob", "plugins": [
  {"type": "bridge", "bridge": "ftjob0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
            "routes": [{"dst": "$SERVICE_CIDR"}, {"dst": "$HOSTNET_CIDR"}]}}]}
EOF

  cat >"$N/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# kubelet 1.35 refuses cgroup v1 unless told otherwise; on cgroup v2 this changes nothing.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $N/pki/kubelet-serving.crt
tlsPrivateKeyFile: $N/pki/kubelet-serving.key
rotateCertificates: false
serverTLSBootstrap: false
# The apiserver authenticates with its kubelet client cert (up.sh); anyone else on the pod network
# gets 401/403 from the kubelet's API.
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $D/pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$DNS_IP]
# Pods resolve cluster names only: no host search domains or resolvers.
resolvConf: ""
protectKernelDefaults: true
registerNode: true
registerWithTaints:
  - {key: ${NODE_TAINT%%=*}, value: "true", effect: NoSchedule}
podLogsDir: $N/kubelet/pod-logs
maxPods: 110
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 10s
nodeStatusUpdateFrequency: 5s
EOF

  cat >"$N/kube-proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $N/pki/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$NODE_IP/32"]
iptables: {localhostNodePorts: false}
# 0: leave the kernel's conntrack table size and timeouts alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF

  # CoreDNS answers cluster.local (Services, pods, hostname.subdomain records) and reverse
  # lookups; with no forward plugin other names fail, as pods have no way out anyway.
  cat >"$N/coredns/Corefile" <<EOF
.:53 {
    bind $DNS_IP
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
        kubeconfig $N/pki/coredns.kubeconfig ftjob-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
}
EOF
}

# The provisioner's ConfigMap: volumes go under $N/volumes on every node; the helper pod runs the
# setup/teardown script in the busybox image.
local_path_config() {
  cat <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: local-path-config
  namespace: local-path-storage
data:
  config.json: |-
    {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": ["$N/volumes"]}]}
  setup: |-
    #!/bin/sh
    set -eu
    mkdir -m 0777 -p "\$VOL_DIR"
  teardown: |-
    #!/bin/sh
    set -eu
    rm -rf "\$VOL_DIR"
  helperPod.yaml: |-
    apiVersion: v1
    kind: Pod
    metadata:
      name: helper-pod
    spec:
      containers:
      - name: helper-pod
        image: $BUSYBOX_IMAGE
        imagePullPolicy: IfNotPresent
EOF
}

# --- main ----------------------------------------------------------------------------------------
main() {
  local t0=$SECONDS
  preflight
  # From here on a failure takes down what was started (the logs stay in $N/logs).
  trap 'rc=$?; if ((rc)); then log "failed; cleaning up (logs in $N/logs)"; node_unlock; "$HERE/node-down.sh" || true; fi' EXIT
  rm -rf --one-file-system "$N"
  mkdir -p "$N/logs" "$N/pids"
  packages
  "$HERE/build.sh" node
  images
  certs
  node_lock  # until the node is up; then check again that no other cluster took the machine's node
  not_taken
  namespaces
  configs

  start "$(command -v containerd)" --config "$N/containerd/config.toml"
  wait_for "containerd" containerd ctr --address "$SOCK" version
  local a
  for a in "$IMAGES/pause.tar" "$IMAGES/busybox.tar"; do
    ctr --address "$SOCK" -n k8s.io images import --all-platforms "$a" >/dev/null
  done

  "${KUBECTL[@]}" apply -f "$HERE/node/cluster-objects.yaml" >/dev/null
  local_path_config | "${KUBECTL[@]}" apply -f - >/dev/null

  start coredns -conf "$N/coredns/Corefile"
  wait_for "CoreDNS ready" coredns in_node curl -fsS http://127.0.0.1:8181/ready

  start kubelet --config="$N/kubelet/config.yaml" --kubeconfig="$N/pki/kubelet.kubeconfig" \
    --root-dir="$N/kubelet/root" --cert-dir="$N/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --node-labels="$NODE_LABEL" --v=1
  wait_for "node $NODE_NAME Ready" kubelet node_ready

  start kube-proxy --config="$N/kube-proxy/config.yaml" --v=1
  wait_for "kube-proxy /healthz" kube-proxy in_node curl -fsS http://127.0.0.1:10256/healthz

  start local-path-provisioner --debug start --kubeconfig "$N/pki/local-path-provisioner.kubeconfig" \
    --namespace local-path-storage --configmap-name local-path-config \
    --service-account-name local-path-provisioner-service-account \
    --helper-image "$BUSYBOX_IMAGE" --provisioner-name rancher.io/local-path
  sleep 1
  pid_of local-path-provisioner >/dev/null ||
    { tail -n 20 "$N/logs/local-path-provisioner.log" >&2; die "local-path-provisioner exited"; }

  cat >"$N/node.env" <<EOF
NODE_NAME=$NODE_NAME
NODE_IP=$NODE_IP
DNS_IP=$DNS_IP
POD_CIDR=$POD_CIDR
CONTAINERD_SOCK=$SOCK
CONTAINERD_NAMESPACE=k8s.io
NODE_LABEL=$NODE_LABEL
NODE_TAINT=$NODE_TAINT
STORAGE_CLASS=$STORAGE_CLASS
PAUSE_IMAGE=$PAUSE_IMAGE
BUSYBOX_IMAGE=$BUSYBOX_IMAGE
BUSYBOX_ARCHIVE=$(cd "$IMAGES" && pwd)/busybox.tar
KUBECONFIG=$D/kubeconfig
EOF
  log "node $NODE_NAME ready in $((SECONDS - t0))s: $NODE_IP, DNS $DNS_IP, StorageClass $STORAGE_CLASS (default)"
  log "pods run there with nodeSelector {${NODE_LABEL%%=*}: \"true\"} and a toleration for $NODE_TAINT"
}

main "$@"; exit
