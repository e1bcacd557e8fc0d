"""runPolicy on the real control plane: suspend/resume, activeDeadlineSeconds, TTL, Kueue."""

from __future__ import annotations

import json
import time
from typing import Any

import yaml

from ..conftest import Cluster, wait_until
from .conftest import Operator, apply, condition, ftj, get, items, sleep, status, wait_phase

CHILD = "finetune.dev/job-name=demo"


def patch_run_policy(cluster: Cluster, namespace: str, **fields: object) -> None:
    patch = json.dumps({"spec": {"runPolicy": fields}})
    cluster.kubectl("-n", namespace, "patch", "finetunejob", "demo", "--type=merge", "-p", patch)


def test_suspend_deletes_pods_and_resume_brings_them_back(cluster: Cluster, namespace: str, operator: Operator) -> None:
    apply(cluster, namespace, ftj("llama-70b-lora-2x8", hold=True, activeDeadlineSeconds=3600))
    first = wait_phase(cluster, namespace, "Running", timeout=30)
    patch_run_policy(cluster, namespace, suspend=True)
    st = wait_phase(cluster, namespace, "Suspended", timeout=30)
    assert condition(st, "Suspended")["status"] == "True" and "startTime" not in st
    assert get(cluster, namespace, "job", "demo-1")["spec"]["suspend"] is True
    wait_until(lambda: items(cluster, namespace, "pods", CHILD) == [], timeout=30, what="pods deleted")
    time.sleep(1)
    patch_run_policy(cluster, namespace, suspend=False)
    st = wait_phase(cluster, namespace, "Running", timeout=30)
    assert st["attempt"] == 1 and st["restarts"] == 0
    assert condition(st, "Suspended")["status"] == "False"
    assert st["startTime"] > first["startTime"]  # the deadline restarts with the running period


def test_active_deadline_fails_the_job_and_stops_its_pods(cluster: Cluster, namespace: str, operator: Operator) -> None:
    apply(cluster, namespace, ftj("llama-70b-lora-2x8", hold=True, activeDeadlineSeconds=3))
    wait_phase(cluster, namespace, "Running", timeout=30)
    st = wait_phase(cluster, namespace, "Failed", timeout=20)
    assert condition(st, "Failed")["reason"] == "DeadlineExceeded"
    wait_until(lambda: items(cluster, namespace, "jobs", CHILD) == [], timeout=30, what="attempt Job deleted")
    time.sleep(2)
    assert items(cluster, namespace, "jobs", CHILD) == []


def test_ttl_deletes_the_finished_job_and_nothing_comes_back(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", run_seconds=0.5, ttlSecondsAfterFinished=2))
    wait_phase(cluster, namespace, "Succeeded", timeout=30)
    wait_until(lambda: get(cluster, namespace, "finetunejob", "demo") is None, timeout=20, what="TTL deletion")
    wait_until(
        lambda: all(items(cluster, namespace, k, CHILD) == [] for k in ("configmaps", "jobs")),
        timeout=30,
        what="children garbage-collected",
    )
    time.sleep(2)
    assert items(cluster, namespace, "jobs", CHILD) == []


def test_a_queued_job_is_created_suspended_and_waits_for_kueue(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    """Our half of the Kueue contract; needs no Kueue: label propagated, Job suspended, status says why."""
    body = ftj("tiny-cpu", run_seconds=1)
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    apply(cluster, namespace, body)

    def waiting() -> dict[str, object] | None:
        st = (get(cluster, namespace, "finetunejob", "demo") or {}).get("status") or {}
        return st if "team-a" in str(st.get("message")) else None

    st = wait_until(waiting, timeout=30, what="waiting for Kueue admission")
    assert st["phase"] == "Pending" and condition(st, "Suspended")["reason"] == "WaitingForAdmission"
    job = get(cluster, namespace, "job", "demo-1")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    # Admission is Kueue unsuspending the Job; play that part and the job runs to the end.
    cluster.kubectl("-n", namespace, "patch", "job", "demo-1", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_phase(cluster, namespace, "Succeeded", timeout=30)


def _queue(cluster: Cluster, namespace: str, gpus: int) -> str:
    """A ClusterQueue with `gpus` GPUs of quota and a LocalQueue `lq` in the namespace; returns the CQ."""
    cq = f"cq-{namespace}"[:63]
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "ftjob-default"}}
    quota = [
        {"name": "cpu", "nominalQuota": "100"},
        {"name": "memory", "nominalQuota": "1Ti"},
        {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
    ]
    cluster_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": cq},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [{"name": "ftjob-default", "resources": quota}],
                }
            ],
        },
    }
    for obj in (flavor, cluster_queue):
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
    local = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "lq"},
        "spec": {"clusterQueue": cq},
    }
    apply(cluster, namespace, local)
    return cq


def test_kueue_admits_a_queued_job(cluster: Cluster, namespace: str, operator: Operator, kueue: None) -> None:
    """Real Kueue, 16 GPUs of quota, two 2 x 8-GPU jobs: the second waits, with no pod, until the first ends."""
    cq = _queue(cluster, namespace, gpus=16)
    try:
        first, second = ftj(name="first", hold=True), ftj(name="second", run_seconds=1)
        for body in (first, second):
            body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "lq"}
        apply(cluster, namespace, first)
        wait_phase(cluster, namespace, "Running", name="first", timeout=60)
        apply(cluster, namespace, second)

        def waiting() -> dict[str, Any] | None:
            st = status(cluster, namespace, "second")
            return st if "lq" in str(st.get("message")) else None

        st = wait_until(waiting, timeout=30, what="second job waiting for admission")
        assert st["phase"] == "Pending" and condition(st, "Suspended")["reason"] == "WaitingForAdmission"
        sleep(3)  # Kueue has had its chance to admit; the quota is in use by the first job
        assert get(cluster, namespace, "job", "second-1")["spec"]["suspend"] is True
        assert items(cluster, namespace, "pods", "finetune.dev/job-name=second") == []

        cluster.kubectl(
            "-n", namespace, "annotate", "pods", "-l", "finetune.dev/job-name=first", "kwok.finetune.dev/hold-"
        )
        wait_phase(cluster, namespace, "Succeeded", name="first", timeout=60)
        wait_phase(cluster, namespace, "Succeeded", name="second", timeout=90)
    finally:
        cluster.kubectl("-n", namespace, "delete", "finetunejobs", "--all", "--wait=false", check=False)
        cluster.kubectl("-n", namespace, "delete", "localqueue", "lq", "--wait=false", check=False)
        cluster.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)


def test_a_spec_edited_while_suspended_resumes_with_the_new_pod_template(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    apply(cluster, namespace, ftj("llama-70b-lora-2x8", hold=True))
    wait_phase(cluster, namespace, "Running", timeout=30)
    patch_run_policy(cluster, namespace, suspend=True)
    wait_phase(cluster, namespace, "Suspended", timeout=30)
    old_uid = get(cluster, namespace, "job", "demo-1")["metadata"]["uid"]
    edit = {
        "spec": {
            "template": {"image": "ghcr.io/finetune-operator/trainer:v2"},  # within the default pod policy
            "training": {"learningRate": 5e-5},
            "runPolicy": {"suspend": False},
        }
    }
    cluster.kubectl("-n", namespace, "patch", "finetunejob", "demo", "--type=merge", "-p", json.dumps(edit))

    def replaced() -> dict[str, object] | None:
        job = get(cluster, namespace, "job", "demo-1")
        return job if job and job["metadata"]["uid"] != old_uid else None

    job = wait_until(replaced, timeout=30, what="attempt 1's Job recreated from the edited spec")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/finetune-operator/trainer:v2"
    st = wait_phase(cluster, namespace, "Running", timeout=30)
    assert (st["attempt"], st["restarts"]) == (1, 0)
    trainer_json = json.loads(get(cluster, namespace, "configmap", "demo-config")["data"]["trainer.json"])
    assert "5e-05" in json.dumps(trainer_json)
