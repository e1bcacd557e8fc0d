"""Shared assertions of the chaos tests: a finished job has exactly one set of children, all its own."""

from __future__ import annotations

from tests.controlplane.conftest import Cluster
from tests.controlplane.operator.conftest import get, items, wait_phase


def assert_succeeded_once_with_one_set_of_children(cluster: Cluster, namespace: str, name: str) -> None:
    """Succeeded on attempt 1, with one ConfigMap, one Service and one Job, each owned by this job."""
    st = wait_phase(cluster, namespace, "Succeeded", name=name, timeout=90)
    assert st["attempt"] == 1, (name, st)
    owner = get(cluster, namespace, "finetunejob", name)["metadata"]["uid"]
    sel = f"finetune.dev/job-name={name}"
    kinds = ("configmaps", "services", "jobs")
    found = {k: items(cluster, namespace, k, sel) for k in kinds}
    names = {k: [c["metadata"]["name"] for c in objs] for k, objs in found.items()}
    assert names == {"configmaps": [f"{name}-config"], "services": [name], "jobs": [f"{name}-1"]}, name
    for objs in found.values():
        for c in objs:
            assert [r["uid"] for r in c["metadata"]["ownerReferences"]] == [owner], c["metadata"]["name"]
