"""The operator's watch connections are dropped mid-run (the apiserver stays up): it reconnects, a job
created after the drops gets its children and finishes within 30 s (well inside the 270-300 s resync, so
the watches themselves must be back), and no job gets a second set of children.

The operator talks to the apiserver through a TCP proxy (`proxy.ApiProxy`) that closes every open
connection on `cut()`: kopf's long-lived watch streams of FineTuneJobs, Jobs, pods, ConfigMaps and
Services, and any pooled keep-alive connection of the operator's own client.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from tests.controlplane.conftest import Cluster, wait_until
from tests.controlplane.operator.conftest import Operator, apply, ftj, status, wait_phase

from .checks import assert_succeeded_once_with_one_set_of_children
from .conftest import size
from .proxy import ApiProxy

pytestmark = pytest.mark.controlplane
WATCHED_KINDS = 5  # finetunejobs, jobs, pods, configmaps, services: one stream (connection) each


def apiserver_address(kubeconfig: Path) -> tuple[int, str]:
    """(port, host) of the kubeconfig's server (127.0.0.1, or up.sh's host-only address as root)."""
    server = urlparse(yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
    return int(server.port or 443), server.hostname or "127.0.0.1"


def test_operator_recovers_when_its_watch_connections_drop(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    proxy = ApiProxy(*apiserver_address(cluster.kubeconfig))
    proxied = Cluster(kubeconfig=proxy.kubeconfig(cluster.kubeconfig, tmp_path / "kubeconfig"), bin_dir=cluster.bin_dir)
    op = Operator(proxied, namespace, tmp_path / "operator.log")
    op.start()
    rng = random.Random(30)
    try:
        for i in range(3):
            apply(cluster, namespace, ftj("tiny-cpu", name=f"before-{i}", run_seconds=8))
        for i in range(3):
            wait_phase(cluster, namespace, "Running", name=f"before-{i}", timeout=60)
        cuts = []
        for i in range(size(3, 20)):  # drop everything while jobs are created and run
            apply(cluster, namespace, ftj("tiny-cpu", name=f"mid-{i}", run_seconds=2 + i % 3))
            time.sleep(rng.uniform(0.2, 1.5))
            cuts.append(proxy.cut())
        # Each watch stream is a connection of its own: both ends of all of them were closed at least once.
        assert max(cuts) >= 2 * WATCHED_KINDS, cuts
        accepted_before = proxy.accepted
        t0 = time.monotonic()
        apply(cluster, namespace, ftj("tiny-cpu", name="after", run_seconds=2))
        wait_until(
            lambda: status(cluster, namespace, "after").get("phase") == "Succeeded",
            timeout=30,
            interval=0.2,
            what="a job created after the drops running to Succeeded on fresh watches",
        )
        recovered = time.monotonic() - t0
        assert proxy.accepted > accepted_before, "the operator did not reconnect"
        names = [f"before-{i}" for i in range(3)] + [f"mid-{i}" for i in range(len(cuts))] + ["after"]
        for name in names:
            assert_succeeded_once_with_one_set_of_children(cluster, namespace, name)
        assert op.proc is not None and op.proc.poll() is None, "operator died"
        assert "Traceback" not in op.log_path.read_text(errors="replace")
        print(f"{len(cuts)} cuts closed {sum(cuts)} sockets; a new job Succeeded {recovered:.1f}s after the last cut")
    finally:
        op.stop()
        proxy.stop()
