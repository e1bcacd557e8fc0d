"""Fixtures for tests against the real local control plane (hack/cluster).

The ``cluster`` fixture (session scope) gives a running etcd + kube-apiserver +
kube-controller-manager + kube-scheduler + KWOK with fake GPU nodes:

* it reuses a cluster that already answers ``/readyz`` through ``.cluster/kubeconfig``
  (``make cluster-up``), and then leaves it running;
* otherwise it builds the binaries if needed (``hack/cluster/build.sh``; with
  ``FTJOB_SKIP_CLUSTER_BUILD=1`` and no binaries the tests are skipped instead), starts the
  cluster with ``hack/cluster/up.sh`` and stops it with ``hack/cluster/down.sh`` at session end
  (when no other pytest session is still using it).

``namespace`` gives each test a fresh namespace (with its default ServiceAccount in place, so
pods can be created at once) and deletes it afterwards. Every test under this directory is
marked ``controlplane``.
"""

from __future__ import annotations

import contextlib
import fcntl
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

            self._api = config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]
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


@contextlib.contextmanager
def _locked(cluster_dir: Path) -> Iterator[None]:
    """Serialize fixture start/stop between concurrent pytest sessions sharing one cluster dir."""
    cluster_dir.mkdir(parents=True, exist_ok=True)
    with open(cluster_dir / "fixture.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _live_users(users: Path) -> list[Path]:
    """Sessions (by pid file name) still using the cluster; forget those that died."""
    live = []
    for f in users.glob("*"):
        try:
            os.kill(int(f.name), 0)
        except (ValueError, ProcessLookupError):
            f.unlink(missing_ok=True)
            continue
        except PermissionError:
            pass
        live.append(f)
    return live


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The running local control plane; started (and finally stopped) here only if needed.

    Several pytest sessions may share one cluster directory: each registers itself in
    ``<dir>/fixture-users/<pid>``; a cluster that a fixture started is stopped by the last
    session to leave, and one started by ``make cluster-up`` is left running.
    """
    cluster_dir = Path(os.environ.get("FTJOB_CLUSTER_DIR", REPO / ".cluster"))
    bin_dir = Path(
        subprocess.run(
            [str(HACK / "build.sh"), "--print-bin"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    c = Cluster(kubeconfig=cluster_dir / "kubeconfig", bin_dir=bin_dir)
    marker = cluster_dir / "started-by-pytest"
    users = cluster_dir / "fixture-users"
    me = users / str(os.getpid())
    with _locked(cluster_dir):
        have_bins = all((bin_dir / b).exists() for b in BINARIES)
        if not (have_bins and c.kubeconfig.exists() and c.readyz()):
            if not have_bins:
                if os.environ.get("FTJOB_SKIP_CLUSTER_BUILD") == "1":
                    pytest.skip(f"control-plane binaries missing in {bin_dir} and FTJOB_SKIP_CLUSTER_BUILD=1")
                _script("build.sh")
            _script("up.sh")
            marker.write_text(f"{os.getpid()}\n")
            c.started_here = True
        users.mkdir(exist_ok=True)
        me.touch()
    try:
        yield c
    finally:
        with _locked(cluster_dir):
            me.unlink(missing_ok=True)
            if marker.exists() and not _live_users(users):
                _script("down.sh")
                marker.unlink(missing_ok=True)


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


@pytest.fixture(scope="module")
def kueue(cluster: Cluster) -> Iterator[None]:
    """Real Kueue (hack/cluster/kueue-up.sh) for one test module, uninstalled after it (its Job webhooks
    fail closed, so other modules must not depend on it running); skipped when not built."""
    if not (cluster.bin_dir / "kueue").exists():
        pytest.skip("kueue not built (run hack/cluster/build.sh kueue; CI does not, it takes ~30 min)")
    env = {**os.environ, "FTJOB_CLUSTER_DIR": str(cluster.kubeconfig.parent)}
    subprocess.run([str(HACK / "kueue-up.sh")], check=True, env=env)
    yield
    subprocess.run([str(HACK / "kueue-up.sh"), "--uninstall"], check=False, env=env)
