# shellcheck shell=bash
# The host-only bridge that carries APISERVER_ADDR (network.env), sourced by up.sh and down.sh.
#
# Every local cluster on this machine shares it (each apiserver listens on its own port): the first
# up.sh creates it, and the down.sh that leaves no apiserver listening on it and no node plugged
# into it deletes it. A lock file serializes the two, and up.sh keeps holding it until its
# apiserver listens, so a concurrent down.sh cannot delete the bridge in between.
# The lock is held on fd 9: every process started while it is held must close it (`9>&-`), or
# that process would keep the lock for as long as it runs.
HOSTNET_LOCK=/tmp/ftjob-hostnet.lock

hostnet_lock() {
  exec 9>"$HOSTNET_LOCK"
  flock -w 120 9 || { echo "hostnet.sh: $HOSTNET_LOCK still locked after 120 s" >&2; return 1; }
}
hostnet_unlock() { exec 9>&-; }

# hostnet_up: make APISERVER_ADDR a local address on HOSTNET_IF, holding the lock until
# hostnet_unlock. Fails (and holds nothing) when not root or the bridge cannot be made.
hostnet_up() {
  [[ $EUID == 0 ]] && command -v ip >/dev/null && command -v flock >/dev/null || return 1
  hostnet_lock || return 1
  if { ip link show "$HOSTNET_IF" >/dev/null 2>&1 || ip link add "$HOSTNET_IF" type bridge; } &&
     { [[ $(ip -o addr show dev "$HOSTNET_IF") == *" $APISERVER_ADDR/"* ]] ||
       ip addr add "$APISERVER_ADDR/${HOSTNET_CIDR#*/}" dev "$HOSTNET_IF"; } &&
     ip link set "$HOSTNET_IF" up; then
    return 0
  fi
  hostnet_unlock
  return 1
}

# hostnet_down: delete HOSTNET_IF if nothing listens on APISERVER_ADDR and no node is plugged in.
hostnet_down() {
  [[ $EUID == 0 ]] && ip link show "$HOSTNET_IF" >/dev/null 2>&1 || return 0
  hostnet_lock || return 0
  if [[ -z $(ss -Hltn src "$APISERVER_ADDR") && -z $(ip -o link show master "$HOSTNET_IF") ]]; then
    ip link del "$HOSTNET_IF"
  fi
  hostnet_unlock
}
