"""A SIGKILLed operator, restarted, finishes the job with no duplicate and no orphan child."""

from __future__ import annotations

import time

import pytest

from ..conftest import Cluster
from .conftest import Operator, apply, ftj, get, items, wait_phase

CHILD = "finetune.dev/job-name=demo"


@pytest.mark.parametrize("kill_after", [0.0, 0.15, 0.5], ids=["at once", "while creating", "after creating"])
def test_operator_killed_while_creating_children(cluster: Cluster, namespace: str, operator: Operator,
                                                 kill_after: float) -> None:
    apply(cluster, namespace, ftj("llama-70b-lora-2x8", run_seconds=3))
    time.sleep(kill_after)
    operator.kill()
    operator.start()
    st = wait_phase(cluster, namespace, "Succeeded", timeout=60)
    assert (st["attempt"], st["restarts"]) == (1, 0)
    owner = get(cluster, namespace, "finetunejob", "demo")["metadata"]["uid"]
    children = {kind: items(cluster, namespace, kind, CHILD) for kind in ("configmaps", "services", "jobs")}
    assert {k: [c["metadata"]["name"] for c in v] for k, v in children.items()} == {
        "configmaps": ["demo-config"], "services": ["demo"], "jobs": ["demo-1"],
    }
    for child in (c for group in children.values() for c in group):
        assert [r["uid"] for r in child["metadata"]["ownerReferences"]] == [owner]
    assert len(items(cluster, namespace, "pods", CHILD)) == 2
