"""The real worker node of the local cluster, for end-to-end tests whose pods must really run.

The control plane of ``tests/controlplane`` (``cluster``) only has KWOK nodes: they schedule pods
but run nothing. ``hack/cluster/node-up.sh`` adds one real node to it (containerd, kubelet,
kube-proxy, CoreDNS, a default StorageClass); this module gives it to tests:

* ``real_node`` (session): a :class:`RealNode`. It reuses a Ready node labelled
  ``finetune.dev/real-node=true`` (``make node-up``, or another pytest session), and otherwise runs
  ``hack/cluster/node-up.sh`` (which builds and installs what is missing: minutes the first time)
  and, at the end of the session, ``hack/cluster/node-down.sh`` - only if this session started it
  and no other session still uses it. Skipped, with the reason, when not root or when Go or apt are
  missing; fails with node-up's own message otherwise (for example a control plane started without
  root listens on 127.0.0.1, where pods cannot reach it).
* ``RealNode.place(pod_spec)``: a pod spec that selects the node and tolerates its taint.
* ``RealNode.load(archive)``: import an image archive into the node (``hack/cluster/node-load.sh``);
  the node pulls nothing, so e2e tests load their images first. ``RealNode.busybox_image`` is
  always there (its OCI archive is ``RealNode.busybox_archive``).

Other test directories use it like ``tests/chart`` uses the control-plane fixtures::

    from tests.e2e.node.conftest import RealNode, cluster, kubectl, namespace, real_node

Tests here are marked ``node`` and ``controlplane``. A node restart (the down/up cycle test) loses
the images loaded into it, so that test is moved to the very end of the session.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane.conftest import HACK, REPO, Cluster, _live_users, cluster, kubectl, namespace

__all__ = ["HACK", "REPO", "Cluster", "RealNode", "cluster", "kubectl", "namespace", "real_node"]

# Tests that restart the node; they run after every other test of the session.
LAST = "node_restart"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{LAST}: takes the real node down and up again; runs last in the session")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.node)
            item.add_marker(pytest.mark.controlplane)
    # Stable partition: restarting tests last, everything else in collection order.
    items.sort(key=lambda item: item.get_closest_marker(LAST) is not None)


def read_env(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (node.env, ports.env) as a dict."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


@dataclass(frozen=True)
class RealNode:
    """The node as ``hack/cluster/node-up.sh`` describes it in ``.cluster/node/node.env``."""

    name: str
    ip: str
    dns_ip: str
    pod_cidr: str
    containerd_sock: Path
    label: tuple[str, str]
    taint: tuple[str, str, str]
    storage_class: str
    busybox_image: str
    busybox_archive: Path | None  # None in a node.env of an older node-up.sh
    pause_image: str
    state_dir: Path
    started_here: bool = False

    @classmethod
    def from_env(cls, state_dir: Path, *, started_here: bool = False) -> RealNode:
        env = read_env(state_dir / "node.env")
        label_key, label_value = env["NODE_LABEL"].split("=", 1)
        taint_key, rest = env["NODE_TAINT"].split("=", 1)
        taint_value, taint_effect = rest.split(":", 1)
        return cls(
            name=env["NODE_NAME"],
            ip=env["NODE_IP"],
            dns_ip=env["DNS_IP"],
            pod_cidr=env["POD_CIDR"],
            containerd_sock=Path(env["CONTAINERD_SOCK"]),
            label=(label_key, label_value),
            taint=(taint_key, taint_value, taint_effect),
            storage_class=env["STORAGE_CLASS"],
            busybox_image=env["BUSYBOX_IMAGE"],
            busybox_archive=Path(env["BUSYBOX_ARCHIVE"]) if "BUSYBOX_ARCHIVE" in env else None,
            pause_image=env["PAUSE_IMAGE"],
            state_dir=state_dir,
            started_here=started_here,
        )

    def place(self, pod_spec: dict[str, Any]) -> dict[str, Any]:
        """``pod_spec`` plus a nodeSelector for this node and a toleration of its taint."""
        key, value, effect = self.taint
        return {
            **pod_spec,
            "nodeSelector": {**pod_spec.get("nodeSelector", {}), self.label[0]: self.label[1]},
            "tolerations": [
                *pod_spec.get("tolerations", []),
                {"key": key, "operator": "Equal", "value": value, "effect": effect},
            ],
        }

    def load(self, *archives: Path) -> list[str]:
        """Import OCI/docker image archives into the node's containerd; returns the image names."""
        proc = _run_script("node-load.sh", *map(str, archives), env=_env(self.state_dir.parent))
        return proc.stdout.split()


def _env(cluster_dir: Path) -> dict[str, str]:
    return {**os.environ, "FTJOB_CLUSTER_DIR": str(cluster_dir)}


def _run_script(name: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a hack/cluster script; on failure raise with the end of its output (its own message)."""
    print(f"[node] running hack/cluster/{name} {' '.join(args)}", file=sys.stderr, flush=True)
    proc = subprocess.run([str(HACK / name), *args], cwd=REPO, env=env, capture_output=True, text=True)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-25:])
        raise RuntimeError(f"hack/cluster/{name} failed with exit code {proc.returncode}:\n{tail}")
    return proc


def node_ready(cluster: Cluster) -> str | None:
    """Name of a Ready node labelled finetune.dev/real-node=true, if there is one."""
    proc = cluster.kubectl(
        "get", "nodes", "-l", "finetune.dev/real-node=true", "-o",
        'jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}',
        check=False,
    )
    ready = [line.split("=")[0] for line in proc.stdout.split() if line.endswith("=True")]
    return ready[0] if ready else None


def other_node_users(cluster_dir: Path) -> list[str]:
    """Pids of other live pytest sessions that hold the ``real_node`` fixture of this cluster."""
    users = cluster_dir / "node-fixture-users"
    return [u.name for u in _live_users(users) if u.name != str(os.getpid())] if users.is_dir() else []


def node_up(cluster_dir: Path) -> None:
    _run_script("node-up.sh", env=_env(cluster_dir))


def node_down(cluster_dir: Path) -> None:
    _run_script("node-down.sh", env=_env(cluster_dir))


@contextlib.contextmanager
def _node_locked(cluster_dir: Path) -> Iterator[None]:
    """Serialize the fixture's node start/stop between pytest sessions sharing a cluster directory
    (a lock of its own: a cold start takes minutes, and sessions that need only the cluster should
    not wait for it)."""
    with open(cluster_dir / "node-fixture.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _skip_reason() -> str | None:
    """Why node-up cannot work on this machine at all (as opposed to failing on a real problem)."""
    if os.geteuid() != 0:
        return "the real node needs root (network namespaces, mounts, containerd)"
    if shutil.which("go") is None:
        return "the real node's binaries are built with Go, which is not installed"
    needed = ("containerd", "runc", "iptables", "buildah")
    if shutil.which("apt-get") is None and not all(shutil.which(b) for b in needed):
        return f"no apt-get to install {', '.join(b for b in needed if not shutil.which(b))}"
    return None


@pytest.fixture(scope="session")
def real_node(cluster: Cluster) -> Iterator[RealNode]:
    """The real node of the session's cluster; started (and finally stopped) here only if needed.

    Sessions sharing a cluster directory share the node like they share the cluster: each
    registers in ``<dir>/node-fixture-users/<pid>``, and a node this fixture started is stopped by
    the last session to leave. A node started by ``make node-up`` is left running.
    """
    cluster_dir = cluster.kubeconfig.parent
    state_dir = cluster_dir / "node"
    marker = cluster_dir / "node-started-by-pytest"
    users = cluster_dir / "node-fixture-users"
    me = users / str(os.getpid())
    started = False
    with _node_locked(cluster_dir):
        if not (node_ready(cluster) and (state_dir / "node.env").exists()):
            reason = _skip_reason()
            if reason:
                pytest.skip(reason)
            node_up(cluster_dir)
            marker.write_text(f"{os.getpid()}\n")
            started = True
        users.mkdir(exist_ok=True)
        me.touch()
    try:
        yield RealNode.from_env(state_dir, started_here=started)
    finally:
        with _node_locked(cluster_dir):
            me.unlink(missing_ok=True)
            if marker.exists() and not _live_users(users):
                with contextlib.suppress(RuntimeError):  # reported on stderr; the cluster goes next anyway
                    node_down(cluster_dir)
                marker.unlink(missing_ok=True)
