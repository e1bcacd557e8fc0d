#!/bin/sh
# run-in-private-etc.sh DIR CMD...: run CMD (exec, same pid) in the current mount namespace with
# /etc replaced by a tmpfs of symlinks to the real /etc entries plus DIR/certs/tls.{crt,key} as
# /etc/kueue/metrics/certs. kueue-up.sh calls it under `unshare --mount`, so the host's /etc is
# never touched: kueue v0.17.0 reads its metrics serving cert from that fixed path whenever its
# internal cert management is off.
set -e
K=$1; shift
mkdir -p "$K/host-etc"
mount --bind /etc "$K/host-etc"
mount -t tmpfs tmpfs /etc
for f in "$K"/host-etc/* "$K"/host-etc/.[!.]*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  ln -s "$f" "/etc/${f##*/}"
done
mkdir -p /etc/kueue/metrics/certs
cp "$K/certs/tls.crt" "$K/certs/tls.key" /etc/kueue/metrics/certs/
exec "$@"
