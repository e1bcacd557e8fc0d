#!/usr/bin/env bash
# Build the local control plane from the Go module proxy, into a cache outside the repo.
#
#   hack/cluster/build.sh          etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#                                  kubectl, kwok, helm
#   hack/cluster/build.sh kueue    also Kueue's controller manager (bin/kueue) and its CRDs (kueue/crds)
#   hack/cluster/build.sh node     also the real node's binaries (hack/cluster/node-up.sh): kubelet,
#                                  kube-proxy, coredns, local-path-provisioner, ftjob-pause
#   hack/cluster/build.sh --print-bin   print the bin directory and exit
#
# Binaries land in ${FTJOB_CACHE:-$HOME/.cache/finetune-operator}/controlplane/<versions-key>/bin.
# Each binary has a stamp file; a binary whose stamp matches is not rebuilt, so a second run
# builds nothing. GOMODCACHE and GOCACHE live under the same cache directory.
# Needs only Go (>= 1.25; the go directives pick a newer toolchain from the proxy if needed).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
. "$HERE/versions.env"

CACHE=${FTJOB_CACHE:-$HOME/.cache/finetune-operator}/controlplane
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
BIN=$CACHE/$KEY/bin

export GOMODCACHE=$CACHE/gomod
export GOCACHE=$CACHE/gocache
export GOFLAGS=-mod=mod
export CGO_ENABLED=0
export GOPROXY=${GOPROXY:-https://proxy.golang.org,direct}

log() { printf '[build.sh %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# fresh NAME VERSION: true when bin/NAME exists and was built from VERSION.
fresh() { [[ -x $BIN/$1 && -f $BIN/.$1.stamp && $(cat "$BIN/.$1.stamp") == "$2" ]]; }
stamp() { echo "$2" >"$BIN/.$1.stamp"; }

timed() {  # timed LABEL CMD... : run and report the duration
  local label=$1 t0=$SECONDS; shift
  log "building $label ..."
  "$@"
  log "built $label in $((SECONDS - t0))s"
}

# --- Kubernetes: wrapper module hack/cluster/k8s --------------------------------------------
k8s_gomod() {
  # (Re)generate go.mod when it is missing or pins another release: require k8s.io/kubernetes
  # and replace each staging module (read from the release's own go.mod) with v0.<minor>.<patch>.
  local dir=$HERE/k8s
  if [[ -f $dir/go.mod ]] && grep -q "k8s.io/kubernetes ${K8S_VERSION}\$" "$dir/go.mod"; then return; fi
  log "generating $dir/go.mod for k8s.io/kubernetes ${K8S_VERSION}"
  rm -f "$dir/go.mod" "$dir/go.sum"
  (cd "$dir" && go mod init finetune.dev/hack/cluster/k8s >/dev/null 2>&1)
  local upstream staging_v=v0.${K8S_VERSION#v1.}
  upstream=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  local m
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/.*#\1#p' "$upstream"); do
    (cd "$dir" && go mod edit -replace="$m=$m@$staging_v")
  done
  # Ask for no newer Go than the release itself does (go mod init writes the local version).
  (cd "$dir" && go mod edit -go="$(sed -n 's/^go //p' "$upstream")" \
    -require="k8s.io/kubernetes@${K8S_VERSION}" && go mod tidy)
}

build_k8s() {  # build_k8s NAME...: the commands k8s.io/kubernetes/cmd/NAME, in one `go build`
  local names=("$@") n todo=0 pkgs=()
  for n in "${names[@]}"; do fresh "$n" "$K8S_VERSION" || todo=1; pkgs+=("k8s.io/kubernetes/cmd/$n"); done
  ((todo)) || { log "kubernetes ${K8S_VERSION} (${names[*]}): cached"; return; }
  k8s_gomod
  local v=${K8S_VERSION#v} major minor ldf="-s -w" p
  major=${v%%.*}; minor=${v#*.}; minor=${minor%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $p.gitVersion=${K8S_VERSION} -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ldf+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$HERE/k8s" && timed "kubernetes ${K8S_VERSION} (${names[*]})" \
    go build -trimpath -ldflags "$ldf" -o "$BIN/" "${pkgs[@]}")
  for n in "${names[@]}"; do stamp "$n" "$K8S_VERSION"; done
}

# --- etcd: wrapper module hack/cluster/etcd ---------------------------------------------------
build_etcd() {
  fresh etcd "$ETCD_VERSION" && { log "etcd ${ETCD_VERSION}: cached"; return; }
  local dir=$HERE/etcd
  if ! { [[ -f $dir/go.mod ]] && grep -q "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}\$" "$dir/go.mod"; }; then
    log "generating $dir/go.mod for etcd ${ETCD_VERSION}"
    rm -f "$dir/go.mod" "$dir/go.sum"
    (cd "$dir" && go mod init finetune.dev/hack/cluster/etcd >/dev/null 2>&1 &&
      go mod edit -go=1.22.0 -require="go.etcd.io/etcd/server/v3@${ETCD_VERSION}" && go mod tidy)
  fi
  # Name the output explicitly: `-o dir/` would call it `server`.
  (cd "$dir" && timed "etcd ${ETCD_VERSION}" go build -trimpath \
    -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_VERSION}" \
    -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
  stamp etcd "$ETCD_VERSION"
}

# --- modules without replace directives: plain `go install pkg@version` ----------------------
go_install() {  # go_install NAME PKG VERSION [LDFLAGS]
  local name=$1 pkg=$2 ver=$3 ldf="-s -w ${4:-}"
  fresh "$name" "$ver" && { log "$name ${ver}: cached"; return; }
  (cd "$BIN" && export GOBIN=$BIN && timed "$name ${ver}" go install -trimpath -ldflags "$ldf" "$pkg@$ver")
  [[ $name == "$(basename "$pkg")" ]] || mv "$BIN/$(basename "$pkg")" "$BIN/$name"
  stamp "$name" "$ver"
}

# --- our own small commands, standard library only: stamped with a checksum of their source ----
build_local() {  # build_local NAME DIR: hack/cluster/DIR -> bin/NAME
  local name=$1 dir=$HERE/$2 sum
  sum=$(cat "$dir/go.mod" "$dir"/*.go | cksum | cut -d' ' -f1)
  fresh "$name" "$sum" && return
  (cd "$dir" && timed "$name" go build -trimpath -ldflags "-s -w" -o "$BIN/$name" .)
  stamp "$name" "$sum"
}

# Kueue's CRDs (for hack/cluster/kueue-up.sh), copied from the module next to bin/.
kueue_crds() {
  local out=$BIN/../kueue/crds src
  [[ -f $out/.stamp && $(cat "$out/.stamp") == "$KUEUE_VERSION" ]] && return
  src=$(cd "$BIN" && go mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  rm -rf "$out" && mkdir -p "$out"
  cp "$src"/config/components/crd/bases/*.yaml "$out/"
  chmod 644 "$out"/*.yaml
  echo "$KUEUE_VERSION" >"$out/.stamp"
  log "kueue CRDs in $out"
}

main() {
  local want_kueue=0 want_node=0 arg t0
  for arg in "$@"; do
    case $arg in
      kueue) want_kueue=1 ;;
      node) want_node=1 ;;
      --print-bin) echo "$BIN"; exit 0 ;;
      -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
      *) log "unknown argument: $arg"; exit 2 ;;
    esac
  done
  command -v go >/dev/null || { log "go is not installed (need Go >= 1.25)"; exit 1; }
  mkdir -p "$BIN"

  t0=$SECONDS
  log "cache: $BIN"
  build_local ftjob-pki pki
  build_etcd
  go_install kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}"
  build_k8s kube-apiserver kube-controller-manager kube-scheduler kubectl
  go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
  if ((want_kueue)); then
    go_install kueue sigs.k8s.io/kueue/cmd/kueue "$KUEUE_VERSION" "-X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}"
    kueue_crds
  fi
  if ((want_node)); then
    build_local ftjob-pause pause
    build_k8s kubelet kube-proxy
    go_install coredns github.com/coredns/coredns "$COREDNS_VERSION"
    go_install local-path-provisioner github.com/rancher/local-path-provisioner "$LOCAL_PATH_PROVISIONER_VERSION" \
      "-X main.VERSION=${LOCAL_PATH_PROVISIONER_VERSION}"
  fi
  log "done in $((SECONDS - t0))s; binaries in $BIN"
}

# Everything runs from main, which bash parses whole before running: editing this file while a
# build is running cannot derail that build.
main "$@"; exit  # one line: bash has read it whole before running it
