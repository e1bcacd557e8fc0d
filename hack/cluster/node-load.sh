#!/usr/bin/env bash
# Import container image archives into the real node's containerd (namespace k8s.io), where its
# kubelet finds them: nothing is pulled from a registry, so a pod's image must be loaded first
# (and use imagePullPolicy IfNotPresent or Never; a non-`latest` tag defaults to IfNotPresent).
#
#   hack/cluster/node-load.sh ARCHIVE...
#
# ARCHIVE: an OCI archive (`buildah push IMG oci-archive:FILE:IMG`, `podman save --format
# oci-archive`) or a docker archive (`podman save`, `docker save`). The images keep the names in
# the archive (e.g. localhost/finetune-operator/operator:dev). Prints the names imported.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT=node-load.sh
# shellcheck source=node-lib.sh
. "$HERE/node-lib.sh"

(($#)) || die "usage: hack/cluster/node-load.sh ARCHIVE..."
[[ -S $SOCK ]] && pid_of containerd >/dev/null || die "no real node is up in $N (make node-up)"
for a in "$@"; do
  [[ -f $a ]] || die "$a: no such file"
  t0=$SECONDS
  out=$(ctr --address "$SOCK" -n k8s.io images import --all-platforms "$a") ||
    die "ctr images import $a failed"
  # ctr prints "unpacking NAME (sha256:...)...done" per image.
  names=$(echo "$out" | sed -n 's/^unpacking \([^ ]*\) .*/\1/p')
  [[ -n $names ]] || die "$a: no image name in the archive (ctr said: $out)"
  log "$a: $(echo "$names" | tr '\n' ' ')($((SECONDS - t0))s)"
  echo "$names"
done
