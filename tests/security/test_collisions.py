"""Objects that hold one of a job's child names but are not its own are never touched.

A FineTuneJob's children have fixed names: `<job>-config` (ConfigMap), `<job>` (headless Service) and
`<job>-<attempt>` (Job). Each victim below is created first by someone else (the admin, with kubectl), then a
FineTuneJob of that name: once with a valid spec, once with a spec whose Job the API server refuses (an invalid
toleration; that path rolls back what the round created). The victim must come out byte for byte the same (uid,
resourceVersion, labels, owners, data, spec, selector: the whole object), also after the FineTuneJob is deleted
and the garbage collector has processed that deletion, and the job must fail with reason NameConflict and a
message naming the object. The operator runs as the admin here, so no RBAC or admission policy stands between
it and the victims: this checks the operator's own behaviour.

A job re-created under the name of a deleted one finds the old job's children still there for a moment (the
garbage collector removes them in the background): it waits for them instead of failing, and then runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.controlplane.conftest import Cluster, wait_until
from tests.controlplane.operator.conftest import Operator, apply, condition, ftj, get, wait_phase

pytestmark = pytest.mark.controlplane
JOB = "web"
CHILD_LABEL = "finetune.dev/job-name"
# Within the pod policy (an allowed key), free-form to the CRD, refused by the API server (no such operator).
INVALID_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Sometimes"}]


@dataclass(frozen=True)
class Victim:
    """Somebody else's object under one of the job's child names."""

    kind: str  # as the status message names it
    resource: str  # for kubectl
    name: str
    manifest: Callable[[str], dict[str, Any]]


def _config_map(labels: dict[str, str]) -> Callable[[str], dict[str, Any]]:
    return lambda name: {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"app.conf": "listen 8080\n"},
    }


def _service(headless: bool) -> Callable[[str], dict[str, Any]]:
    def manifest(name: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"selector": {"app": "web-frontend"}, "ports": [{"name": "http", "port": 80}]}
        if headless:
            spec["clusterIP"] = "None"
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": spec,
        }

    return manifest


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app": "nightly-report"}},
        "spec": {
            "suspend": True,  # no pods: the Job controller writes its status once, then leaves it
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "report", "image": "busybox:1.36", "command": ["true"]}],
                }
            },
        },
    }


VICTIMS = {
    "configmap": Victim("ConfigMap", "configmap", f"{JOB}-config", _config_map({"app": "web"})),
    # Labels alone make no owner: a ConfigMap that looks like a child to a label selector is still not ours.
    "configmap-labelled-like-a-child": Victim(
        "ConfigMap",
        "configmap",
        f"{JOB}-config",
        _config_map({CHILD_LABEL: JOB, "app.kubernetes.io/managed-by": "finetune-operator"}),
    ),
    "clusterip-service": Victim("Service", "service", JOB, _service(headless=False)),
    "headless-service": Victim("Service", "service", JOB, _service(headless=True)),
    "job": Victim("Job", "job", f"{JOB}-1", _job),
}


def snapshot(cluster: Cluster, namespace: str, victim: Victim) -> dict[str, Any]:
    found = get(cluster, namespace, victim.resource, victim.name)
    assert found is not None, f"{victim.kind} {victim.name} is gone"
    return dict(found)


def settled(cluster: Cluster, namespace: str, victim: Victim) -> dict[str, Any]:
    """The victim once nobody but us would write it any more (a suspended Job: after its Suspended condition)."""
    if victim.kind != "Job":
        return snapshot(cluster, namespace, victim)

    def suspended() -> dict[str, Any] | None:
        body = snapshot(cluster, namespace, victim)
        conditions = (body.get("status") or {}).get("conditions") or []
        return body if any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions) else None

    return wait_until(suspended, timeout=30, what=f"Job {victim.name} suspended by the Job controller")


def ours(cluster: Cluster, namespace: str, uid: str) -> list[str]:
    """Every ConfigMap, Service and Job controlled by the FineTuneJob with this uid."""
    found = []
    for resource in ("configmaps", "services", "jobs"):
        for item in (get(cluster, namespace, resource) or {"items": []})["items"]:
            refs = item["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid and r.get("controller") for r in refs):
                found.append(f"{item['kind']} {item['metadata']['name']}")
    return found


def delete_and_wait_for_gc(cluster: Cluster, namespace: str, uid: str) -> None:
    """Delete the FineTuneJob and wait until the garbage collector has acted on it: a canary ConfigMap owned by
    the job (created before the delete) is gone."""
    canary = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "gc-canary",
            "ownerReferences": [
                {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "name": JOB, "uid": uid}
            ],
        },
    }
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(canary))
    cluster.kubectl("-n", namespace, "delete", "finetunejob", JOB, "--wait=true", "--timeout=30s")
    wait_until(
        lambda: get(cluster, namespace, "configmap", "gc-canary") is None,
        timeout=60,
        what="the garbage collector to delete the deleted job's dependents",
    )


@pytest.mark.parametrize("spec", ["valid-spec", "rejected-spec"])
@pytest.mark.parametrize("which", sorted(VICTIMS))
def test_an_object_under_a_child_name_survives_byte_for_byte(
    cluster: Cluster, namespace: str, operator: Operator, which: str, spec: str
) -> None:
    victim = VICTIMS[which]
    cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(victim.manifest(victim.name)))
    before = settled(cluster, namespace, victim)

    body = ftj("tiny-cpu", name=JOB)
    if spec == "rejected-spec":
        body["spec"]["template"]["tolerations"] = INVALID_TOLERATION
    apply(cluster, namespace, body)
    st = wait_phase(cluster, namespace, "Failed", name=JOB, timeout=30)
    failed = condition(st, "Failed")
    if victim.kind == "Job" and spec == "rejected-spec":
        # The API server validates a Job before it looks at its name: the refusal is the spec's, and the round that
        # made the ConfigMap and Service takes them back; the Job under the name is left as it was all the same.
        assert failed["reason"] == "InvalidSpec" and "tolerations" in st["message"], st
    else:
        assert failed["reason"] == "NameConflict", st
        assert f"{victim.kind} {victim.name} already exists and is not this job's" in st["message"], st
        assert "another name" in st["message"], st
    assert snapshot(cluster, namespace, victim) == before

    uid = get(cluster, namespace, "finetunejob", JOB)["metadata"]["uid"]
    wait_until(lambda: ours(cluster, namespace, uid) == [], timeout=20, what="this round's own children rolled back")
    assert snapshot(cluster, namespace, victim) == before

    delete_and_wait_for_gc(cluster, namespace, uid)
    assert snapshot(cluster, namespace, victim) == before
    assert operator.proc is not None and operator.proc.poll() is None, "operator died"


def test_a_job_recreated_under_a_deleted_jobs_name_waits_for_its_leftovers_then_runs(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", name=JOB, hold=True))
    wait_phase(cluster, namespace, "Running", name=JOB, timeout=30)
    old_uid = get(cluster, namespace, "finetunejob", JOB)["metadata"]["uid"]
    # A finalizer keeps the old ConfigMap after the garbage collector deletes it: the leftover the new job meets.
    hold = json.dumps({"metadata": {"finalizers": ["example.com/hold"]}})
    cluster.kubectl("-n", namespace, "patch", "configmap", f"{JOB}-config", "--type=merge", "-p", hold)
    cluster.kubectl("-n", namespace, "delete", "finetunejob", JOB, "--wait=true", "--timeout=30s")
    wait_until(
        lambda: (
            (get(cluster, namespace, "configmap", f"{JOB}-config") or {}).get("metadata", {}).get("deletionTimestamp")
        ),
        timeout=60,
        what="the garbage collector to delete the old ConfigMap (held by its finalizer)",
    )

    apply(cluster, namespace, ftj("tiny-cpu", name=JOB, run_seconds=1))
    new_uid = get(cluster, namespace, "finetunejob", JOB)["metadata"]["uid"]
    assert new_uid != old_uid
    wait_until(lambda: "not yet garbage-collected" in operator.log(), timeout=20, what="the operator to wait")
    status = (get(cluster, namespace, "finetunejob", JOB) or {}).get("status") or {}
    assert status.get("phase") != "Failed", status  # waiting, not a NameConflict
    leftover = get(cluster, namespace, "configmap", f"{JOB}-config")
    assert leftover["metadata"]["ownerReferences"][0]["uid"] == old_uid  # not taken over

    cluster.kubectl(
        "-n",
        namespace,
        "patch",
        "configmap",
        f"{JOB}-config",
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/metadata/finalizers"}]',
    )
    wait_phase(cluster, namespace, "Succeeded", name=JOB, timeout=60)
    assert sorted(ours(cluster, namespace, new_uid)) == [f"ConfigMap {JOB}-config", f"Job {JOB}-1", f"Service {JOB}"]
    assert ours(cluster, namespace, old_uid) == []
