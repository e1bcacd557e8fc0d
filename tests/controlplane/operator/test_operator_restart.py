"""A SIGKILLed operator, restarted, finishes the job with no duplicate and no orphan child."""

from __future__ import annotations

import time

import pytest
from kubernetes import client, watch

from ..conftest import Cluster
from .conftest import Operator, apply, ftj, get, items, wait_phase

CHILD = "finetune.dev/job-name=demo"


def kill_on_first_child(cluster: Cluster, namespace: str, operator: Operator) -> str:
    """SIGKILL the operator the moment its first child (the ConfigMap) appears: between the
    ConfigMap and the attempt Job, i.e. in the middle of creating children."""
    core = client.CoreV1Api(cluster.api_client())
    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_config_map, namespace, label_selector=CHILD, timeout_seconds=30):
        operator.kill()
        stream.stop()
        return str(event["object"].metadata.name)
    raise AssertionError("no ConfigMap appeared within 30 s")


@pytest.mark.parametrize("kill_after", [0.0, None, 1.0], ids=["before anything", "between children", "after"])
def test_operator_killed_while_creating_children(cluster: Cluster, namespace: str, operator: Operator,
                                                 kill_after: float | None) -> None:
    apply(cluster, namespace, ftj("llama-70b-lora-2x8", run_seconds=3))
    if kill_after is None:
        assert kill_on_first_child(cluster, namespace, operator) == "demo-config"
    else:
        time.sleep(kill_after)
        operator.kill()
    time.sleep(1)  # whatever the dead operator left half done stays half done for a moment
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
