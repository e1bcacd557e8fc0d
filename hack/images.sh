#!/usr/bin/env bash
# Build the Dockerfile's images with buildah: no Docker engine and no container registry needed.
#
#   hack/images.sh [--no-load] [--flash-attn] [--builder buildah|docker] [TARGET...]
#                                   build (TARGET: operator, trainer; default both; --flash-attn: the trainer from
#                                   the trainer-flash-attn target, which compiles flash-attn: needs the CUDA devel image)
#   hack/images.sh --print-env      the environment that points podman/buildah at the store
#   hack/images.sh --prune          drop untagged images and stale archives
#
# The images are localhost/finetune-operator/{operator,trainer}:dev (FTJOB_IMAGE_REPO, FTJOB_IMAGE_TAG). The steps,
# each one cached by content, so a second run with unchanged inputs builds nothing and takes seconds:
#  1. tools: buildah, podman, debootstrap and runc from Debian when missing (apt serialized by /tmp/ftjob-apt.lock,
#     since other scripts on the same machine run apt too). runc, not crun: crun 1.8 refuses a hybrid cgroup layout.
#  2. base: the Dockerfile's PYTHON_IMAGE, made here with debootstrap (Debian bookworm + python3) and made to behave
#     like python:3.11-slim: `pip install` goes to the system, `python` exists, the headers are there. Its tarball is
#     kept, keyed by the recipe (the make_base function's text), so only a changed recipe runs debootstrap again.
#  3. build: `buildah bud --layers --target T`; the image carries the hash of everything that goes into it (the
#     Dockerfile, pyproject.toml, README.md, api/, operator/, trainer/, the base image, the build arguments) in the
#     label finetune.dev/inputs, and a build whose hash matches the tagged image's is skipped. Downloaded and built
#     wheels stay in the Dockerfile's RUN --mount=type=cache directory, which buildah keeps under TMPDIR (set here
#     to the cache), so a changed dependency list downloads only what is new.
#  4. load: when a real node is up (.cluster/node/node.env names its containerd socket), each image is exported
#     once per image ID (`buildah push ... oci-archive:`, layers in zstd level 1: for the trainer image 1.5 min to
#     export and under 1 min to import, against 3.5 and 2.5 min with gzip; buildah 1.28 ignores
#     --disable-compression) and imported with hack/cluster/node-load.sh, unless containerd already holds that
#     manifest under that name.
#
# Everything lives outside the repository, under ${FTJOB_CACHE:-$HOME/.cache/finetune-operator}/images: the image
# store (storage/, run/), the configuration (conf/), the base tarball (base/), the wheel cache (tmp/), archives/.
# Needs root (debootstrap, chroot isolation, overlay mounts).
#
# --builder docker (FTJOB_IMAGE_BUILDER=docker), where a Docker engine runs: the same targets, labels and content
# check with `docker build` and the Dockerfile's own PYTHON_IMAGE (python:slim from Docker Hub); steps 1, 2 and 4
# do not apply (kind loads from Docker itself). Needs no root, only access to the engine.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

CACHE=${FTJOB_CACHE:-$HOME/.cache/finetune-operator}/images
IMAGE_REPO=${FTJOB_IMAGE_REPO:-localhost/finetune-operator}
TAG=${FTJOB_IMAGE_TAG:-dev}
BASE_IMAGE=$IMAGE_REPO/python:3.11-bookworm   # stands in for python:3.11.11-slim-bookworm
SUITE=bookworm
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt  # the host's trust store, mounted into RUN steps only
LABEL=finetune.dev/inputs
NODE_ENV=${FTJOB_CLUSTER_DIR:-$REPO/.cluster}/node/node.env   # written by hack/cluster/node-up.sh
NODE_LOAD=$REPO/hack/cluster/node-load.sh

log() { echo "images: $*" >&2; }
die() { log "$*"; exit 1; }

print_env() {
  echo "export CONTAINERS_CONF=$CACHE/conf/containers.conf CONTAINERS_STORAGE_CONF=$CACHE/conf/storage.conf" \
    "TMPDIR=$CACHE/tmp"
}

write_conf() {
  mkdir -p "$CACHE/conf" "$CACHE/tmp"
  # The VM's hard nofile limit (20000) cannot be raised, so the default 1048576 makes runc fail with EPERM.
  cat >"$CACHE/conf/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  cat >"$CACHE/conf/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$CACHE/storage"
runroot = "$CACHE/run"
EOF
}

ensure_tools() {
  local missing=()
  for t in buildah podman debootstrap runc; do command -v "$t" >/dev/null || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] && return
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  log "installing ${missing[*]} from Debian (apt, serialized by /tmp/ftjob-apt.lock)"
  flock /tmp/ftjob-apt.lock apt-get update -qq
  DEBIAN_FRONTEND=noninteractive flock /tmp/ftjob-apt.lock apt-get install -y -qq --no-install-recommends \
    buildah podman debootstrap runc conmon netavark containernetworking-plugins iptables >/dev/null
}

debian_mirror() {
  local m=${DEBIAN_MIRROR:-}
  [ -n "$m" ] || m=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$m" ] || m=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${m:-http://deb.debian.org/debian}"
}

# The base recipe. Its text is the base image's cache key: edit it and the next run makes a new base.
make_base() {
  local rootfs=$1 mirror=$2
  # libpython3-dev: python:slim ships the headers, and DeepSpeed's run-time op builds need them
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,libpython3-dev,ca-certificates \
    "$SUITE" "$rootfs" "$mirror" >"$CACHE/base/debootstrap.log" 2>&1
  rm -f "$rootfs"/usr/lib/python3.*/EXTERNALLY-MANAGED   # python:slim lets `pip install` write to the system
  ln -sf python3 "$rootfs/usr/bin/python"
  rm -f "$rootfs"/usr/lib/python3.*/config-*/libpython3.*.a   # static libraries: python:slim has none either
  rm -rf "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
}

ensure_base() {
  local mirror key tarball current c
  mirror=$(debian_mirror)
  key=$( (declare -f make_base; echo "$SUITE $mirror") | sha256sum | cut -c1-16)
  current=$(buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$LABEL\"}}" "$BASE_IMAGE" \
    2>/dev/null || true)
  [ "$current" = "$key" ] && return
  mkdir -p "$CACHE/base"
  tarball=$CACHE/base/python-3.11-$SUITE-$key.tar
  if [ ! -s "$tarball" ]; then
    log "base: debootstrap $SUITE from $mirror (about 2 min)"
    rm -rf "$CACHE/base/rootfs"
    make_base "$CACHE/base/rootfs" "$mirror"
    tar -C "$CACHE/base/rootfs" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$CACHE/base/rootfs"
    find "$CACHE/base" -maxdepth 1 -name 'python-*.tar' ! -name "${tarball##*/}" -delete
  fi
  log "base: importing $tarball as $BASE_IMAGE"
  c=$(buildah from --quiet scratch)
  buildah add --quiet "$c" "$tarball" / >/dev/null
  buildah config --env LANG=C.UTF-8 --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd '["python3"]' --label "$LABEL=$key" "$c"
  buildah commit --quiet --rm "$c" "$BASE_IMAGE" >/dev/null
}

# The image's inputs label, or nothing when there is no such image.
image_label() {
  if [ "$BUILDER" = docker ]; then
    docker image inspect --format "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null || true
  else
    buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null || true
  fi
}

image_size() {
  if [ "$BUILDER" = docker ]; then
    docker image inspect --format '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1 / 1e9}'
  else
    buildah images --format '{{.Size}}' "$1" 2>/dev/null | head -1
  fi
}

# What the Dockerfile's FROM ${PYTHON_IMAGE} resolves to: the local base's ID, or (Docker) the default's name.
base_identity() {
  if [ "$BUILDER" = docker ]; then
    echo "${FTJOB_PYTHON_IMAGE:-dockerfile-default}"
  else
    buildah inspect --type image --format '{{.FromImageID}}' "$BASE_IMAGE"
  fi
}

# The hash of everything the build reads; .dockerignore decides what reaches the build, so the same files count here.
inputs_hash() {
  local target=$1; shift
  {
    printf '%s\n' "$BUILDER" "$target" "$@" "$(base_identity)"
    find Dockerfile .dockerignore pyproject.toml README.md api operator trainer -type f \
      ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 2>/dev/null \
      | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-32
}

build() {
  local name=$1 target=$2 image=$IMAGE_REPO/$1:$TAG key started args=() cmd
  if [ "$BUILDER" = docker ]; then
    [ -z "${FTJOB_PYTHON_IMAGE:-}" ] || args+=(--build-arg "PYTHON_IMAGE=$FTJOB_PYTHON_IMAGE")
  else
    args+=(--build-arg "PYTHON_IMAGE=$BASE_IMAGE")
    [ "$target" = trainer-flash-attn ] || args+=(--pull=never)   # the base is local; flash-attn needs CUDA's
  fi
  key=$(inputs_hash "$target" "${args[@]}")
  if [ "$(image_label "$image")" = "$key" ]; then
    log "$image is up to date (inputs $key)"
    return
  fi
  if [ "$BUILDER" = docker ]; then
    cmd=(env DOCKER_BUILDKIT=1 docker build)
  else
    # pip reaches PyPI through the host network; the host's CA bundle (which may hold a TLS-intercepting proxy's
    # CA) is mounted for RUN steps only, so it does not end up in the image
    cmd=(buildah bud --layers --isolation chroot --network host)
    [ -f "$CA_BUNDLE" ] && cmd+=(-v "$CA_BUNDLE:$CA_BUNDLE:ro")
  fi
  local build_log=$CACHE/build-$BUILDER-$name.log
  log "building $image (target $target; log: $build_log)"
  started=$SECONDS
  if ! "${cmd[@]}" --target "$target" "${args[@]}" --label "$LABEL=$key" -t "$image" "$REPO" >"$build_log" 2>&1; then
    tail -40 "$build_log" >&2
    die "building $image failed (full log: $build_log)"
  fi
  log "built $image in $((SECONDS - started)) s ($(image_size "$image"))"
}

# containerd's manifest digest for REF on the node, or nothing.
node_digest() {
  local ref=$1
  command -v ctr >/dev/null || return 0
  ctr --address "$CONTAINERD_SOCK" -n k8s.io images ls "name==$ref" 2>/dev/null | awk 'NR > 1 {print $3}'
}

load_into_node() {
  if [ ! -f "$NODE_ENV" ]; then
    log "no real node is up (${NODE_ENV#"$REPO"/} missing): images not loaded (make node-up, then make images)"
    return
  fi
  local CONTAINERD_SOCK
  CONTAINERD_SOCK=$(sed -n 's/^CONTAINERD_SOCK=//p' "$NODE_ENV")
  if [ -z "$CONTAINERD_SOCK" ] || [ ! -S "$CONTAINERD_SOCK" ]; then
    log "the node's containerd socket (${CONTAINERD_SOCK:-unset}) is not there: images not loaded"
    return
  fi
  [ -x "$NODE_LOAD" ] || { log "${NODE_LOAD#"$REPO"/} is missing: images not loaded"; return; }
  local name image id archive digest started
  mkdir -p "$CACHE/archives"
  for name in "$@"; do
    image=$IMAGE_REPO/$name:$TAG
    id=$(buildah inspect --type image --format '{{.FromImageID}}' "$image")
    archive=$CACHE/archives/$name-${id:0:16}.tar
    if [ ! -s "$archive" ] || [ ! -s "$archive.digest" ]; then
      started=$SECONDS
      rm -f "$archive" "$archive.digest"
      buildah push --quiet --compression-format zstd --compression-level 1 --digestfile "$archive.digest.tmp" \
        "$image" "oci-archive:$archive.tmp:$image"
      mv "$archive.tmp" "$archive" && mv "$archive.digest.tmp" "$archive.digest"
      log "exported $image to $archive in $((SECONDS - started)) s ($(du -h "$archive" | cut -f1))"
      find "$CACHE/archives" -maxdepth 1 -name "$name-*.tar*" ! -name "${archive##*/}*" -delete
    fi
    digest=$(cat "$archive.digest")
    if [ "$(node_digest "$image")" = "$digest" ]; then
      log "$image is already in the node's containerd ($digest)"
      continue
    fi
    started=$SECONDS
    "$NODE_LOAD" "$archive"
    log "loaded $image into the node in $((SECONDS - started)) s"
  done
}

prune() {
  buildah rmi --prune >/dev/null || true
  local name id
  for name in operator trainer; do
    id=$(buildah inspect --type image --format '{{.FromImageID}}' "$IMAGE_REPO/$name:$TAG" 2>/dev/null || true)
    find "$CACHE/archives" -maxdepth 1 -name "$name-*.tar*" ! -name "$name-${id:0:16}.tar*" -delete 2>/dev/null || true
  done
  du -sh "$CACHE"/* 2>/dev/null || true
}

main() {
  local load=1 flash=${FTJOB_FLASH_ATTN:-0} names=()
  BUILDER=${FTJOB_IMAGE_BUILDER:-buildah}
  while [ $# -gt 0 ]; do
    case $1 in
      --print-env) print_env; return ;;
      --no-load) load=0 ;;
      --flash-attn) flash=1 ;;
      --builder) BUILDER=${2:-}; shift ;;
      --prune) [ "$(id -u)" = 0 ] || die "needs root"; write_conf; eval "$(print_env)"; prune; return ;;
      operator|trainer) names+=("$1") ;;
      -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; return ;;
      *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
  done
  [ ${#names[@]} -gt 0 ] || names=(operator trainer)
  case $BUILDER in buildah|docker) ;; *) die "unknown builder '$BUILDER' (buildah or docker)" ;; esac
  mkdir -p "$CACHE"
  exec 9>"$CACHE/lock"
  flock 9   # one build at a time per cache
  if [ "$BUILDER" = docker ]; then
    docker info >/dev/null 2>&1 || die "--builder docker: no Docker engine answers (docker info failed)"
  else
    [ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot isolation, overlay mounts); run it as root"
    write_conf
    eval "$(print_env)"
    ensure_tools
    ensure_base
  fi
  local name target
  for name in "${names[@]}"; do
    target=$name
    [ "$name" = trainer ] && [ "$flash" = 1 ] && target=trainer-flash-attn
    build "$name" "$target"
  done
  if [ "$load" = 1 ] && [ "$BUILDER" = buildah ]; then load_into_node "${names[@]}"; fi
}

main "$@"
