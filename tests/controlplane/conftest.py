"""Fixtures for tests against the real local control plane (hack/cluster).

The ``cluster`` fixture (session scope) gives a running etcd + kube-apiserver +
kube-controller-manager + kube-scheduler + KWOK with fake GPU nodes:

* it reuses a cluster that already answers ``/readyz`` through ``.cluster/kubeconfig``
  (``make cluster-up``), and then leaves it running;
* otherwise it builds the binaries if needed (``hack/cluster/build.sh``; with
  ``FTJOB_SKIP_CLUSTER_BUILD=1`` and no binaries the tests are skipped instead), starts the
  cluster with ``hack/cluster/up.sh`` and stops it with ``hack/cluster/down.sh`` at session end.

``namespace`` gives each test a fresh namespace (with its default ServiceAccount in place, so
pods can be created at once) and deletes it afterwards. Every test under this directory is
marked ``controlplane``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack" / "cluster"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")

T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "controlplane: needs the real control plane from hack/cluster")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.controlplane)


def wait_until(
    probe: Callable[[], T | None], *, timeout: float = 60.0, interval: float = 0.5, what: str = "condition"
) -> T:
    """Poll ``probe`` until it returns something truthy; return that, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@dataclass
class Cluster:
    """A running local control plane: where its kubeconfig and binaries are, plus helpers."""

    kubeconfig: Path
    bin_dir: Path
    started_here: bool = False
    _api: Any = field(default=None, repr=False)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the cluster's own kubectl (same release as the apiserver) against this cluster."""
        cmd = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for the admin user (shared for the session)."""
        if self._api is None:
            from kubernetes import config

            self._api = config.new_client_from_config(config_file=str(self.kubeconfig))
        return self._api

    def readyz(self) -> bool:
        try:
            return self.kubectl("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False


def _script(name: str, *args: str) -> None:
    """Run a hack/cluster script, streaming its progress to the terminal (pytest -s) or log."""
    print(f"[controlplane] running hack/cluster/{name} {' '.join(args)}", file=sys.stderr, flush=True)
    proc = subprocess.run([str(HACK / name), *args], cwd=REPO)  # inherits pytest's (captured) fds
    if proc.returncode != 0:
        raise RuntimeError(f"hack/cluster/{name} failed with exit code {proc.returncode}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    cluster_dir = Path(os.environ.get("FTJOB_CLUSTER_DIR", REPO / ".cluster"))
    bin_dir = Path(
        subprocess.run([str(HACK / "build.sh"), "--print-bin"], capture_output=True, text=True, check=True).stdout.strip()
    )
    c = Cluster(kubeconfig=cluster_dir / "kubeconfig", bin_dir=bin_dir)
    if c.kubeconfig.exists() and all((bin_dir / b).exists() for b in BINARIES) and c.readyz():
        yield c
        return
    if not all((bin_dir / b).exists() for b in BINARIES):
        if os.environ.get("FTJOB_SKIP_CLUSTER_BUILD") == "1":
            pytest.skip(f"control-plane binaries missing in {bin_dir} and FTJOB_SKIP_CLUSTER_BUILD=1")
        _script("build.sh")
    _script("up.sh")
    c.started_here = True
    try:
        yield c
    finally:
        _script("down.sh")


@pytest.fixture
def kubectl(cluster: Cluster) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``kubectl(*args, input=None, check=True)`` against the test cluster."""
    return cluster.kubectl


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test (default ServiceAccount ready), deleted afterwards."""
    base = request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")
    base = "".join(ch for ch in base if ch.isalnum() or ch == "-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    wait_until(
        lambda: cluster.kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode == 0,
        timeout=30,
        what=f"default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
