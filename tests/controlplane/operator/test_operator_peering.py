"""Two replicas with kopf peering: only the higher-priority one acts."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import REPO, Cluster, wait_until
from .conftest import Operator, apply, ftj, wait_phase

PEERING_CRDS = REPO / "charts" / "finetune-operator" / "crds" / "kopf-peering.yaml"


@pytest.fixture
def replicas(cluster: Cluster, crd: None, namespace: str, tmp_path: Path) -> list[Operator]:
    if not PEERING_CRDS.exists():
        pytest.skip("the chart's kopf peering CRDs are not there")
    cluster.kubectl("apply", "-f", str(PEERING_CRDS))
    cluster.kubectl("wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev", "--timeout=30s")
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    input="apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata: {name: ftjob}\n")
    ops = [Operator(cluster, namespace, tmp_path / f"op-{p}.log", mode=("--peering", "ftjob", "--priority", str(p)))
           for p in (10, 20)]
    return ops


def test_only_the_higher_priority_replica_acts(cluster: Cluster, namespace: str, replicas: list[Operator]) -> None:
    low, high = replicas
    try:
        low.start()
        high.start()
        wait_until(lambda: "Pausing operations" in low.log(), timeout=30, what="the low-priority replica pausing")
        apply(cluster, namespace, ftj("tiny-cpu", run_seconds=1))
        wait_phase(cluster, namespace, "Succeeded", timeout=60)
    finally:
        for op in replicas:
            op.stop()
    assert "created Job demo-1" in high.log()
    assert "created Job" not in low.log() and "Completed" not in low.log()
