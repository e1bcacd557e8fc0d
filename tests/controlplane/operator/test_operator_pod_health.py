"""What keeps a job's pods from running, on the FineTuneJob itself within seconds: the `PodsHealthy` condition
and `status.message` quote the scheduler (no node with that many GPUs, a nodeSelector nobody matches, a claim
that does not exist) and the kubelet (an image it cannot pull, an OOM kill with the memory limit, an eviction),
and the condition clears once the problem goes.

The scheduler's answers are real here. KWOK nodes run no containers, so what their kubelet would report (a
container waiting on its image, killed for memory, a pod evicted) is written into the pod's status the way the
failure tests do, and the operator reads it from the same pod watch either way; one test on the real node
(`node`, when it is up) gets `ErrImageNeverPull` from a real kubelet. Each test measures the time from the
pod showing a problem to the FineTuneJob showing it and prints it; the bound it checks (10 s) is what a user
may wait, far above the event path's second.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from finetune_api.constants import GROUP, PLURAL, VERSION
from tests.e2e.node.conftest import RealNode, node_ready, real_node

from ..conftest import Cluster, wait_until
from .conftest import POLICY_FLAGS, Operator, apply, condition, ftj, items, status, wait_phase

CHILD = "finetune.dev/job-name=demo"
VISIBLE_WITHIN = 10.0
"""Seconds from a pod showing a problem to the FineTuneJob showing it."""
POLL = 0.05
__all__ = ["real_node"]  # the real node's session fixture, for the one test that uses it when it is up


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Watcher:
    """Reads the job's status and its pods through the API client (a poll costs milliseconds, not a kubectl)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.namespace = namespace
        self.core = client.CoreV1Api(cluster.api_client())
        self.custom = client.CustomObjectsApi(cluster.api_client())

    def status(self) -> dict[str, Any]:
        body = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, "demo")
        return dict(body.get("status") or {})

    def pods(self) -> list[dict[str, Any]]:
        answer = self.core.list_namespaced_pod(self.namespace, label_selector=CHILD, _preload_content=False)
        return list(json.loads(answer.data)["items"])

    def shown(
        self, case: str, job_shows: Callable[[dict[str, Any]], bool],
        pod_shows: Callable[[list[dict[str, Any]]], bool] | None = None, *, since: float | None = None,
        pod_timeout: float = 60.0,
    ) -> dict[str, Any]:
        """Wait until the job shows it, at most VISIBLE_WITHIN s after a pod did (`pod_shows`, or the moment
        `since` the test wrote the pod's status); print the delay and return the job's status."""
        pod_at = since
        deadline = time.monotonic() + pod_timeout
        last: dict[str, Any] = {}
        while True:
            t = time.monotonic()
            if pod_at is None and pod_shows is not None and pod_shows(self.pods()):
                pod_at = t
            last = self.status()
            if job_shows(last):
                pod_at = t if pod_at is None else pod_at  # the pod changed between the two reads
                seconds = time.monotonic() - pod_at
                sys.stderr.write(f"\n[pod health] {case}: on the FineTuneJob {seconds:.2f} s after the pod\n")
                return last
            if pod_at is not None and t - pod_at > VISIBLE_WITHIN:
                raise AssertionError(f"{case}: not on the FineTuneJob {VISIBLE_WITHIN} s after the pod: {last}")
            if pod_at is None and t > deadline:
                raise AssertionError(f"{case}: no pod showed it within {pod_timeout} s: {self.pods()}")
            time.sleep(POLL)


def unhealthy(reason: str, *words: str, in_message: bool = True) -> Callable[[dict[str, Any]], bool]:
    """The job's PodsHealthy condition is False with `reason` and `words`, and status.message says it too."""

    def shows(st: dict[str, Any]) -> bool:
        cond = condition(st, "PodsHealthy")
        if (cond.get("status"), cond.get("reason")) != ("False", reason):
            return False
        texts = [cond.get("message") or ""] + ([st.get("message") or ""] if in_message else [])
        return all(w in text for w in words for text in texts)

    return shows


def healthy(st: dict[str, Any]) -> bool:
    cond = condition(st, "PodsHealthy")
    return (cond.get("status"), cond.get("reason")) == ("True", "PodsHealthy")


def scheduler_says(*words: str) -> Callable[[list[dict[str, Any]]], bool]:
    def shows(pods: list[dict[str, Any]]) -> bool:
        conditions = [c for p in pods for c in p.get("status", {}).get("conditions") or []]
        return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                   and all(w in (c.get("message") or "") for w in words) for c in conditions)  # fmt: skip

    return shows


def all_running(pods: list[dict[str, Any]]) -> bool:
    return bool(pods) and all(p.get("status", {}).get("phase") == "Running" for p in pods)


def write_pod_status(cluster: Cluster, namespace: str, name: str, status: dict[str, Any]) -> float:
    """Write a pod's status as its kubelet would (KWOK runs none); returns when the write was sent (so a delay
    measured from it includes kubectl's own start, an upper bound)."""
    sent = time.monotonic()
    cluster.kubectl("-n", namespace, "patch", "pod", name, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": status}))  # fmt: skip
    return sent


def running_pod(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return wait_until(lambda: next((p for p in items(cluster, namespace, "pods", CHILD)
                                    if p["status"].get("phase") == "Running"), None),
                      timeout=30, what="a running trainer pod")  # fmt: skip


def not_ready(reason: str) -> list[dict[str, Any]]:
    stamp = now()
    return [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
        {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
        {"type": "Ready", "status": "False", "reason": reason, "lastTransitionTime": stamp},
        {"type": "ContainersReady", "status": "False", "reason": reason, "lastTransitionTime": stamp},
    ]


def waiting(pod: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    """A Pending pod whose trainer container waits (`ErrImagePull`, `ErrImageNeverPull`, ...)."""
    (container,) = pod["spec"]["containers"]
    return {
        "phase": "Pending",
        "conditions": not_ready("ContainersNotReady"),
        "containerStatuses": [{"name": container["name"], "image": container["image"], "ready": False,
                               "restartCount": 0, "started": False,
                               "state": {"waiting": {"reason": reason, "message": message}}}],
    }  # fmt: skip


def running(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    stamp = now()
    return {
        "phase": "Running",
        "conditions": [{"type": t, "status": "True", "lastTransitionTime": stamp}
                       for t in ("PodScheduled", "Initialized", "Ready", "ContainersReady")],
        "containerStatuses": [{"name": container["name"], "image": container["image"], "ready": True,
                               "restartCount": 0, "started": True, "state": {"running": {"startedAt": stamp}}}],
    }  # fmt: skip


def gpus_per_node(cluster: Cluster) -> int:
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return max(int(n["status"].get("capacity", {}).get("nvidia.com/gpu", 0)) for n in nodes)


def test_more_gpus_than_any_node_has_is_unschedulable_with_the_schedulers_words(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    if gpus_per_node(cluster) >= 16:
        pytest.skip("a node has 16 GPUs, the most a pod may ask for")
    body = ftj("llama-70b-lora-2x8")
    body["spec"]["distributed"]["gpusPerNode"] = 16
    apply(cluster, namespace, body)
    st = Watcher(cluster, namespace).shown(
        "Unschedulable (16 GPUs)", unhealthy("Unschedulable", "Insufficient nvidia.com/gpu", "0/"),
        scheduler_says("Insufficient nvidia.com/gpu"),
    )
    assert st["phase"] == "Pending"
    assert st["message"].startswith("attempt 1: 0/2 node(s) ready; pod") and ": Unschedulable: 0/" in st["message"]
    # The second pod's news alone changes only the message: batched (a second at most), then written.
    names = [p["metadata"]["name"] for p in items(cluster, namespace, "pods", CHILD)]
    assert len(names) == 2
    wait_until(lambda: all(n in condition(status(cluster, namespace), "PodsHealthy")["message"] for n in names),
               timeout=VISIBLE_WITHIN, interval=0.1, what="both pods named on the job")  # fmt: skip


@pytest.fixture
def pool(cluster: Cluster, namespace: str) -> Iterator[tuple[str, str]]:
    """A node label key no node has (`test-pool.finetune.dev/<namespace>`) and a Ready KWOK node to put it on
    later; taken off that node afterwards."""
    key = f"test-pool.finetune.dev/{namespace}"
    nodes = json.loads(cluster.kubectl("get", "nodes", "-l", "type=kwok", "-o", "json").stdout)["items"]
    ready = [n["metadata"]["name"] for n in nodes if condition(n["status"], "Ready").get("status") == "True"
             and not n["metadata"].get("labels", {}).get("kwok.finetune.dev/lost")]  # fmt: skip
    assert ready, "no Ready KWOK node"
    yield key, ready[0]
    cluster.kubectl("label", "node", ready[0], f"{key}-", check=False)


def test_a_node_selector_nobody_matches_shows_and_clears_once_a_node_matches(
    cluster: Cluster, namespace: str, operator: Operator, pool: tuple[str, str]
) -> None:
    body = ftj("tiny-cpu", hold=True)
    key, node = pool
    body["spec"]["template"]["nodeSelector"] = {key: "true"}
    apply(cluster, namespace, body)
    watcher = Watcher(cluster, namespace)
    st = watcher.shown(
        "Unschedulable (nodeSelector)", unhealthy("Unschedulable", "didn't match Pod's node affinity/selector"),
        scheduler_says("didn't match Pod's node affinity/selector"),
    )
    assert st["phase"] == "Pending"
    cluster.kubectl("label", "node", node, f"{key}=true")
    st = watcher.shown("cleared (node labelled)", healthy, all_running)
    assert condition(st, "PodsHealthy")["message"] == "no pod of the current attempt shows a problem"
    assert wait_phase(cluster, namespace, "Running", timeout=30)["message"] == "attempt 1: 1/1 node(s) running"


@pytest.fixture
def claim_volume(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The name of a PersistentVolume made for the test's claim (deleted afterwards)."""
    name = f"ftjob-{namespace}"[:63]
    yield name
    cluster.kubectl("delete", "pv", name, "--ignore-not-found", "--wait=false", check=False)


def test_a_missing_checkpoint_claim_shows_and_clears_once_it_exists(
    cluster: Cluster, namespace: str, operator: Operator, claim_volume: str
) -> None:
    body = ftj("tiny-cpu", hold=True)
    body["spec"]["output"]["checkpoints"] = {"persistentVolumeClaim": {"claimName": "ft-ckpt-shared"}}
    apply(cluster, namespace, body)
    watcher = Watcher(cluster, namespace)
    st = watcher.shown(
        "missing PVC", unhealthy("Unschedulable", 'persistentvolumeclaim "ft-ckpt-shared" not found'),
        scheduler_says('persistentvolumeclaim "ft-ckpt-shared" not found'),
    )
    assert st["phase"] == "Pending"
    # A volume bound to the claim in advance (KWOK mounts nothing), then the claim: the pod schedules.
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": claim_volume},
              "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                       "hostPath": {"path": "/nonexistent"}, "persistentVolumeReclaimPolicy": "Retain",
                       "claimRef": {"namespace": namespace, "name": "ft-ckpt-shared"}}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ft-ckpt-shared"},
             "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": claim_volume,
                      "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(volume))
    apply(cluster, namespace, claim)
    st = watcher.shown("cleared (claim created)", healthy, all_running)
    assert wait_phase(cluster, namespace, "Running", timeout=30)["attempt"] == 1


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("ErrImagePull", 'failed to pull and unpack image "{image}": failed to resolve reference "{image}": '
                         "pull access denied, repository does not exist or may require authorization"),
        ("ErrImageNeverPull", 'Container image "{image}" is not present with pull policy of Never'),
    ],
)  # fmt: skip
def test_an_image_the_kubelet_cannot_get_shows_with_the_image_and_clears_once_it_runs(
    cluster: Cluster, namespace: str, operator: Operator, reason: str, message: str
) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", hold=True))
    wait_phase(cluster, namespace, "Running", timeout=30)
    pod = running_pod(cluster, namespace)
    image = pod["spec"]["containers"][0]["image"]
    watcher = Watcher(cluster, namespace)
    since = write_pod_status(cluster, namespace, pod["metadata"]["name"],
                             waiting(pod, reason, message.format(image=image)))  # fmt: skip
    st = watcher.shown(reason, unhealthy(reason, f'container trainer, image "{image}"', message.format(image=image)),
                       since=since)  # fmt: skip
    assert st["message"].startswith(f"attempt 1: 0/1 node(s) ready; pod {pod['metadata']['name']}: {reason}: ")
    since = write_pod_status(cluster, namespace, pod["metadata"]["name"], running(pod))
    st = watcher.shown(f"{reason} cleared", healthy, since=since)
    assert st["phase"] == "Running" and st["message"] == "attempt 1: 1/1 node(s) running"


def test_an_oom_kill_shows_the_container_and_its_memory_limit(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    body = ftj("tiny-cpu", hold=True, backoffLimit=0)
    body["spec"]["template"]["resources"] = {"limits": {"memory": "48Gi"}}
    apply(cluster, namespace, body)
    wait_phase(cluster, namespace, "Running", timeout=30)
    pod = running_pod(cluster, namespace)
    stamp = now()
    killed = {"exitCode": 137, "reason": "OOMKilled", "startedAt": stamp, "finishedAt": stamp}
    oom_killed = {
        "phase": "Failed",
        "conditions": not_ready("PodFailed"),
        "containerStatuses": [{"name": "trainer", "image": pod["spec"]["containers"][0]["image"], "ready": False,
                               "restartCount": 0, "started": False, "state": {"terminated": killed}}],
    }  # fmt: skip
    since = write_pod_status(cluster, namespace, pod["metadata"]["name"], oom_killed)
    words = "container trainer was killed for using more than its memory limit of 48Gi"
    st = Watcher(cluster, namespace).shown("OOMKilled", unhealthy("OOMKilled", words), since=since)
    final = wait_phase(cluster, namespace, "Failed", timeout=30)  # backoffLimit 0: the OOM kill ends the job
    assert condition(final, "Failed")["reason"] == "BackoffLimitExceeded"
    assert f"exited with code 137 (OOMKilled: {words})" in final["message"]
    assert condition(final, "PodsHealthy")["reason"] == "OOMKilled"
    assert st["phase"] in ("Running", "Failed")  # shown while the Job controller is yet to fail the attempt, or after


def test_an_eviction_shows_the_kubelets_message(cluster: Cluster, namespace: str, operator: Operator) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", hold=True, backoffLimit=0))
    wait_phase(cluster, namespace, "Running", timeout=30)
    pod = running_pod(cluster, namespace)
    said = ("The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. Container "
            "trainer was using 61Gi, request is 0, has larger consumption of memory.")  # fmt: skip
    stamp = now()
    evicted = {
        "phase": "Failed",
        "reason": "Evicted",
        "message": said,
        "conditions": [*not_ready("PodFailed"), {"type": "DisruptionTarget", "status": "True",
                                                 "reason": "TerminationByKubelet", "message": said,
                                                 "lastTransitionTime": stamp}],
        "containerStatuses": [{"name": "trainer", "image": pod["spec"]["containers"][0]["image"], "ready": False,
                               "restartCount": 0, "started": False,
                               "state": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": stamp,
                                                        "finishedAt": stamp}}}],
    }  # fmt: skip
    since = write_pod_status(cluster, namespace, pod["metadata"]["name"], evicted)
    Watcher(cluster, namespace).shown("Evicted", unhealthy("Evicted", said), since=since)
    final = wait_phase(cluster, namespace, "Failed", timeout=30)
    assert f"was lost (Evicted: {said})" in final["message"]


@pytest.fixture
def up_real_node(cluster: Cluster, request: pytest.FixtureRequest) -> RealNode:
    """The real node (`real_node`), only when it is already up: starting one takes minutes and root."""
    if node_ready(cluster) is None:
        pytest.skip("the real node is not up (make node-up)")
    node: RealNode = request.getfixturevalue("real_node")
    return node


@pytest.mark.node
def test_an_image_that_is_not_on_the_real_node_gives_err_image_never_pull(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path, up_real_node: RealNode
) -> None:
    node = up_real_node
    image = "localhost/finetune-operator/not-loaded:v0"
    policy = (*POLICY_FLAGS, "--allowed-image=localhost/finetune-operator/not-loaded",
              f"--allowed-toleration={node.taint[0]}")  # fmt: skip
    op = Operator(cluster, namespace, tmp_path / "operator.log", policy=policy)
    op.start()
    try:
        body = ftj("tiny-cpu")
        template = body["spec"]["template"]
        template.update(image=image, imagePullPolicy="Never", annotations={})
        template.update(node.place({}))
        apply(cluster, namespace, body)
        st = Watcher(cluster, namespace).shown(
            "ErrImageNeverPull (real node)",
            unhealthy("ErrImageNeverPull", f'Container image "{image}" is not present with pull policy of Never'),
            lambda pods: any((c.get("state") or {}).get("waiting", {}).get("reason") == "ErrImageNeverPull"
                             for p in pods for c in p.get("status", {}).get("containerStatuses") or []),
            pod_timeout=120,
        )  # fmt: skip
        assert st["phase"] == "Pending"
    except BaseException:
        sys.stderr.write(f"\n--- operator log ({namespace}) ---\n{op.log()}\n")
        raise
    finally:
        op.stop()
