"""The operator on the real control plane: children, status walk, invalid spec, GC on delete."""

from __future__ import annotations

from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render import RenderOptions, render_all

from ..conftest import Cluster, wait_until
from .conftest import POLICY, Operator, apply, condition, events, ftj, get, items, status, wait_phase

CHILD = "finetune.dev/job-name=demo"


def test_example_runs_to_success_with_the_rendered_children(cluster: Cluster, namespace: str,
                                                             operator: Operator) -> None:
    body = ftj("llama-70b-lora-2x8", run_seconds=3)
    apply(cluster, namespace, body)
    seen: list[str] = []
    wait_phase(cluster, namespace, "Running", seen=seen, timeout=30)
    # Children: exactly the rendered ConfigMap, a headless Service and attempt 1's Indexed Job.
    applied = FineTuneJob.from_body({**body, "metadata": {**body["metadata"], "namespace": namespace}})
    config_map = get(cluster, namespace, "configmap", "demo-config")
    url = f"https://127.0.0.1:{operator.progress_port}/v1/namespaces/{namespace}/finetunejobs/demo/progress"
    ca = config_map["data"]["progress-ca.crt"]
    rendered = render_all(applied, RenderOptions(progress_url=url, progress_ca=ca, policy=POLICY))
    assert config_map["data"] == rendered.files
    local = render_all(applied, RenderOptions(policy=POLICY))  # = ftjob render with the operator's pod policy
    assert rendered.files.keys() - {"progress-ca.crt"} == local.files.keys()
    service = get(cluster, namespace, "service", "demo")
    assert (service["spec"]["clusterIP"], service["spec"]["publishNotReadyAddresses"]) == ("None", True)
    (job,) = items(cluster, namespace, "jobs", CHILD)
    assert job["metadata"]["name"] == "demo-1"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (want,) = rendered.job["spec"]["template"]["spec"]["containers"]
    assert {k: container[k] for k in ("command", "env", "image", "volumeMounts")} == {
        k: want[k] for k in ("command", "env", "image", "volumeMounts")
    }
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert "finalizers" not in get(cluster, namespace, "finetunejob", "demo")["metadata"]
    owner = get(cluster, namespace, "finetunejob", "demo")["metadata"]["uid"]
    for child in (config_map, service, job):
        (ref,) = child["metadata"]["ownerReferences"]
        assert (ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (owner, True, True)
        assert child["metadata"]["labels"]["finetune.dev/job-name"] == "demo"
    pods = items(cluster, namespace, "pods", CHILD)
    assert len(pods) == 2 and all(p["spec"]["nodeName"].startswith("kwok-gpu-") for p in pods)
    st = wait_phase(cluster, namespace, "Succeeded", seen=seen, timeout=30)
    assert seen[-2:] == ["Running", "Succeeded"] and set(seen) <= {"Pending", "Running", "Succeeded"}
    assert (st["attempt"], st["restarts"], st["plan"]["zeroStage"]) == (1, 0, 3)
    assert st["startTime"] <= st["completionTime"]
    assert condition(st, "Succeeded")["status"] == "True"
    reasons = [e["reason"] for e in events(cluster, namespace)]
    assert "AllNodesReady" in reasons and "Completed" in reasons
    assert "finetune_jobs_succeeded_total" in operator.metrics()


def test_tiny_cpu_example_succeeds(cluster: Cluster, namespace: str, operator: Operator) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", name="demo", run_seconds=1))
    st = wait_phase(cluster, namespace, "Succeeded", timeout=30)
    assert st["nodes"] == 1


def test_invalid_spec_fails_with_the_field_and_creates_nothing(cluster: Cluster, namespace: str,
                                                               operator: Operator) -> None:
    body = ftj("llama-70b-lora-2x8")
    body["spec"]["distributed"]["processesPerNode"] = 16  # passes CEL, cannot share 8 GPUs
    apply(cluster, namespace, body)
    st = wait_phase(cluster, namespace, "Failed", timeout=20)
    assert condition(st, "Failed")["reason"] == "InvalidSpec"
    assert "spec.distributed.processesPerNode" in st["message"]
    for kind in ("configmaps", "services", "jobs", "pods"):
        assert items(cluster, namespace, kind, CHILD) == []
    assert any(e["reason"] == "InvalidSpec" and e["type"] == "Warning" for e in events(cluster, namespace))
    # The operator keeps working for the next job.
    apply(cluster, namespace, ftj("tiny-cpu", name="next", run_seconds=1))
    wait_phase(cluster, namespace, "Succeeded", name="next", timeout=30)


def test_deleting_a_job_removes_every_child(cluster: Cluster, namespace: str, operator: Operator) -> None:
    apply(cluster, namespace, ftj("llama-70b-lora-2x8", hold=True))
    wait_phase(cluster, namespace, "Running", timeout=30)
    cluster.kubectl("-n", namespace, "delete", "finetunejob", "demo", "--wait=false")

    def gone() -> bool:
        return all(items(cluster, namespace, k, CHILD) == [] for k in ("configmaps", "services", "jobs", "pods"))

    wait_until(gone, timeout=60, what="children garbage-collected")
    assert get(cluster, namespace, "finetunejob", "demo") is None
    assert status(cluster, namespace) == {}


def test_a_child_the_api_server_rejects_fails_the_job_and_leaves_no_child(cluster: Cluster, namespace: str,
                                                                         operator: Operator) -> None:
    body = ftj("tiny-cpu")
    body["spec"]["template"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Sometimes"}]  # a str to us
    apply(cluster, namespace, body)
    st = wait_phase(cluster, namespace, "Failed", timeout=20)
    assert condition(st, "Failed")["reason"] == "InvalidSpec" and "tolerations" in st["message"]

    def gone() -> bool:
        return all(items(cluster, namespace, k, CHILD) == [] for k in ("configmaps", "services", "jobs"))

    wait_until(gone, timeout=20, what="half-created children removed")
