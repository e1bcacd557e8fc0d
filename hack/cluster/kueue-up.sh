#!/usr/bin/env bash
# Start the real Kueue controller manager (built by `hack/cluster/build.sh kueue`) against a
# cluster started by up.sh, as a local process: installs Kueue's CRDs, the namespace
# kueue-system, and webhooks for batch/v1 Jobs and Kueue's objects that call kueue on a loopback
# port (serving cert = the apiserver's, signed by the cluster CA). down.sh stops it with the rest.
#
#   hack/cluster/up.sh && hack/cluster/kueue-up.sh
#
# Only Kueue's batch/v1 Job integration is enabled. The Job webhooks use failurePolicy Fail:
# once kueue-up.sh ran, creating Jobs needs kueue running; `kueue-up.sh --uninstall` stops kueue
# and removes the webhooks (the CRDs stay).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BIN=$("$HERE/build.sh" --print-bin)
D=${FTJOB_CLUSTER_DIR:-$REPO/.cluster}
TIMEOUT=${FTJOB_UP_TIMEOUT:-120}
KUBECTL=("$BIN/kubectl" --kubeconfig "$D/kubeconfig")
WEBHOOKS=(mutatingwebhookconfiguration/ftjob-kueue-mutating-webhook-configuration
  validatingwebhookconfiguration/ftjob-kueue-validating-webhook-configuration)

log() { printf '[kueue-up.sh %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 30000))
    [[ " ${TAKEN:-} " == *" $p "* ]] && continue
    port_busy "$p" || { TAKEN="${TAKEN:-} $p"; echo "$p"; return; }
  done
}
alive() { [[ -f $D/pids/kueue.pid ]] && kill -0 "$(cat "$D/pids/kueue.pid")" 2>/dev/null; }

if [[ ${1:-} == --uninstall ]]; then
  "${KUBECTL[@]}" delete --ignore-not-found "${WEBHOOKS[@]}"
  if alive; then kill -TERM "$(cat "$D/pids/kueue.pid")"; fi
  rm -f "$D/pids/kueue.pid"
  exit 0
fi

[[ -x $BIN/kueue ]] || die "$BIN/kueue missing; run hack/cluster/build.sh kueue"
"${KUBECTL[@]}" get --raw /readyz >/dev/null 2>&1 || die "no cluster answers via $D/kubeconfig; run up.sh"
if alive; then log "kueue already running"; exit 0; fi

t0=$SECONDS
K=$D/kueue
mkdir -p "$K/certs"
cp "$D/pki/apiserver.crt" "$K/certs/tls.crt"
cp "$D/pki/apiserver.key" "$K/certs/tls.key"
WEBHOOK_PORT=$(free_port); HEALTH_PORT=$(free_port); METRICS_PORT=$(free_port); VIS_PORT=$(free_port)

cat >"$K/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$HEALTH_PORT
metrics:
  bindAddress: 127.0.0.1:$METRICS_PORT
webhook:
  host: 127.0.0.1
  port: $WEBHOOK_PORT
  certDir: $K/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
integrations:
  frameworks: ["batch/job"]
EOF

log "installing Kueue CRDs and namespace"
"${KUBECTL[@]}" apply --server-side -f "$BIN/../kueue/crds/" >/dev/null
"${KUBECTL[@]}" wait --for=condition=Established -f "$BIN/../kueue/crds/" --timeout=60s >/dev/null
"${KUBECTL[@]}" create namespace kueue-system --dry-run=client -o yaml | "${KUBECTL[@]}" apply -f - >/dev/null

log "starting kueue"
# Private mount namespace: see kueue/run-in-private-etc.sh (needs root, as on the CI machine).
KUBECONFIG=$D/kubeconfig setsid unshare --mount --propagation private \
  "$HERE/kueue/run-in-private-etc.sh" "$K" "$BIN/kueue" --config="$K/config.yaml" \
  --visibility-server-port="$VIS_PORT" --feature-gates=VisibilityOnDemand=false \
  >"$D/logs/kueue.log" 2>&1 </dev/null &
echo $! >"$D/pids/kueue.pid"

deadline=$((SECONDS + TIMEOUT))
until port_busy "$HEALTH_PORT" && { ! command -v curl >/dev/null || curl -fs "http://127.0.0.1:$HEALTH_PORT/readyz" >/dev/null; }; do
  alive || { tail -n 30 "$D/logs/kueue.log" >&2; die "kueue exited (log: $D/logs/kueue.log)"; }
  ((SECONDS < deadline)) || die "timed out waiting for kueue /readyz"
  sleep 0.5
done
until port_busy "$WEBHOOK_PORT"; do
  ((SECONDS < deadline)) || die "timed out waiting for kueue's webhook server"
  sleep 0.5
done

CA=$(base64 <"$D/pki/ca.crt" | tr -d '\n')
sed -e "s#KUEUE_WEBHOOK_PORT#$WEBHOOK_PORT#g" -e "s#KUEUE_CA_BUNDLE#$CA#g" "$HERE/kueue/webhooks.yaml" |
  "${KUBECTL[@]}" apply -f - >/dev/null
log "kueue ready in $((SECONDS - t0))s (webhooks on 127.0.0.1:$WEBHOOK_PORT)"
