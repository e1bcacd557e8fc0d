"""The local control plane is real: API server validation, RBAC, tokens, scheduler, Job and
garbage-collector controllers, and the KWOK contract the operator tests rely on
(hack/cluster/kwok/stages.yaml)."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pytest
import yaml

from .conftest import HACK, REPO, Cluster, wait_until

GPU = "nvidia.com/gpu"


def versions() -> dict[str, str]:
    lines = (line.strip() for line in (HACK / "versions.env").read_text().splitlines())
    pairs = (line.split("=", 1) for line in lines if line and not line.startswith("#"))
    return {k: v for k, v in pairs}


def get(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def apply(cluster: Cluster, obj: dict[str, Any], namespace: str | None = None) -> None:
    ns = ["-n", namespace] if namespace else []
    cluster.kubectl(*ns, "apply", "-f", "-", input=yaml.safe_dump(obj))


def gpu_nodes(cluster: Cluster) -> list[dict[str, Any]]:
    nodes = get(cluster, "nodes", "-l", "type=kwok")["items"]
    return [n for n in nodes if int(n["status"]["allocatable"].get(GPU, "0")) > 0]


def indexed_job(
    name: str,
    *,
    pods: int,
    gpus: int,
    annotations: dict[str, str] | None = None,
    backoff_limit: int = 0,
) -> dict[str, Any]:
    """An Indexed Job like the operator's: one pod per node, each asking for ``gpus`` GPUs."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"annotations": {"kwok.finetune.dev/run-seconds": "1", **(annotations or {})}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "example.invalid/trainer:test",
                            "resources": {"limits": {GPU: str(gpus)}, "requests": {"cpu": "1", "memory": "1Gi"}},
                        }
                    ],
                },
            },
        },
    }


def pods_of(cluster: Cluster, ns: str, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(cluster, "-n", ns, "pods", "-l", f"job-name={job}")["items"]
    return items


def job_condition(cluster: Cluster, ns: str, job: str) -> str | None:
    """'Complete' or 'Failed' once the Job controller has decided, else None."""
    conds = get(cluster, "-n", ns, "job", job).get("status", {}).get("conditions", [])
    for c in conds:
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return str(c["type"])
    return None


def test_apiserver_reports_the_built_release(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("get", "--raw", "/version").stdout)
    assert version["gitVersion"] == versions()["K8S_VERSION"]


def test_finetunejob_crd_installs(cluster: Cluster) -> None:
    crd = REPO / "crds" / "finetunejob.yaml"
    if not crd.exists():
        pytest.skip("crds/finetunejob.yaml is not written yet")
    cluster.kubectl("apply", "-f", str(crd))
    cluster.kubectl("wait", "--for=condition=Established", "crd/finetunejobs.finetune.dev", "--timeout=30s")
    assert cluster.kubectl("get", "finetunejobs", "-A").returncode == 0
    assert cluster.kubectl("get", "ftj", "-A").returncode == 0


CEL_GROUP = "celtest.finetune.dev"


@pytest.fixture
def cel_crd(cluster: Cluster) -> Any:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"ranges.{CEL_GROUP}"},
        "spec": {
            "group": CEL_GROUP,
            "names": {"kind": "Range", "plural": "ranges", "singular": "range"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
                                    "x-kubernetes-validations": [
                                        {"rule": "self.min <= self.max", "message": "min must not exceed max"}
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    apply(cluster, crd)
    cluster.kubectl("wait", "--for=condition=Established", f"crd/ranges.{CEL_GROUP}", "--timeout=30s")
    yield crd
    cluster.kubectl("delete", "crd", f"ranges.{CEL_GROUP}", "--wait=false", check=False)


def test_cel_rule_violation_is_refused_with_its_message(cluster: Cluster, namespace: str, cel_crd: Any) -> None:
    def obj(name: str, lo: int, hi: int) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": f"{CEL_GROUP}/v1",
                "kind": "Range",
                "metadata": {"name": name},
                "spec": {"min": lo, "max": hi},
            }
        )

    # The CRD may take a moment to be served after Established.
    wait_until(
        lambda: (
            cluster.kubectl("-n", namespace, "apply", "-f", "-", input=obj("good", 1, 2), check=False).returncode == 0
        ),
        timeout=30,
        what="a valid Range to be accepted",
    )
    bad = cluster.kubectl("-n", namespace, "apply", "-f", "-", input=obj("bad", 3, 2), check=False)
    assert bad.returncode != 0
    assert "min must not exceed max" in bad.stderr
    assert cluster.kubectl("-n", namespace, "get", "range", "bad", check=False).returncode != 0


def test_gpu_jobs_wait_for_free_gpus_then_run_and_succeed(cluster: Cluster, namespace: str) -> None:
    nodes = gpu_nodes(cluster)
    assert nodes, "no KWOK GPU nodes"
    per_node = int(nodes[0]["status"]["allocatable"][GPU])
    # Job "big" takes every GPU in the cluster (one pod per node) and holds them.
    apply(
        cluster,
        indexed_job("big", pods=len(nodes), gpus=per_node, annotations={"kwok.finetune.dev/hold": "true"}),
        namespace,
    )

    def all_running() -> list[dict[str, Any]] | None:
        pods = pods_of(cluster, namespace, "big")
        ok = len(pods) == len(nodes) and all(p["status"].get("phase") == "Running" for p in pods)
        return pods if ok else None

    running = wait_until(
        all_running,
        timeout=60,
        what="all pods of job big Running",
    )
    assert len({p["spec"]["nodeName"] for p in running}) == len(nodes), "one pod per GPU node"
    assert sorted(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in running) == [
        str(i) for i in range(len(nodes))
    ]

    # Job "small" needs one GPU: none is free, so the scheduler leaves it Pending/Unschedulable.
    apply(cluster, indexed_job("small", pods=1, gpus=1), namespace)

    def unschedulable() -> bool:
        pods = pods_of(cluster, namespace, "small")
        conds = pods[0]["status"].get("conditions", []) if pods else []
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)

    wait_until(unschedulable, timeout=30, what="pod of job small Unschedulable")
    [small] = pods_of(cluster, namespace, "small")
    assert small["status"]["phase"] == "Pending" and not small["spec"].get("nodeName")

    # Releasing the hold lets "big" finish; then "small" gets a GPU, runs and succeeds.
    cluster.kubectl("-n", namespace, "annotate", "pods", "-l", "job-name=big", "kwok.finetune.dev/hold-")
    assert wait_until(lambda: job_condition(cluster, namespace, "big"), timeout=60, what="job big done") == "Complete"
    for p in pods_of(cluster, namespace, "big"):
        assert p["status"]["phase"] == "Succeeded"
        assert p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert (
        wait_until(lambda: job_condition(cluster, namespace, "small"), timeout=60, what="job small done") == "Complete"
    )
    [small] = pods_of(cluster, namespace, "small")
    assert small["spec"]["nodeName"] in {n["metadata"]["name"] for n in nodes}
    assert small["status"]["phase"] == "Succeeded"


def test_failed_pod_carries_the_requested_exit_code(cluster: Cluster, namespace: str) -> None:
    annotations = {"kwok.finetune.dev/fail": "true", "kwok.finetune.dev/exit-code": "42"}
    apply(cluster, indexed_job("crash", pods=1, gpus=1, annotations=annotations), namespace)
    assert wait_until(lambda: job_condition(cluster, namespace, "crash"), timeout=60, what="job crash done") == "Failed"
    [pod] = pods_of(cluster, namespace, "crash")
    assert pod["status"]["phase"] == "Failed"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 42
    assert terminated["reason"] == "Error"


def test_deleting_an_owner_deletes_its_children(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("-n", namespace, "create", "configmap", "owner")
    owner = get(cluster, "-n", namespace, "configmap", "owner")
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
            ],
        },
    }
    apply(cluster, child, namespace)
    apply(cluster, indexed_job("held", pods=1, gpus=1, annotations={"kwok.finetune.dev/hold": "true"}), namespace)
    wait_until(lambda: pods_of(cluster, namespace, "held"), timeout=30, what="pod of job held")

    cluster.kubectl("-n", namespace, "delete", "configmap", "owner")
    cluster.kubectl("-n", namespace, "delete", "job", "held", "--cascade=background")
    wait_until(
        lambda: cluster.kubectl("-n", namespace, "get", "configmap", "child", check=False).returncode != 0,
        timeout=60,
        what="child ConfigMap garbage-collected",
    )
    wait_until(lambda: not pods_of(cluster, namespace, "held"), timeout=60, what="pods of deleted job gone")


def test_service_account_token_is_bound_to_its_audience(cluster: Cluster, namespace: str) -> None:
    from kubernetes import client

    core = client.CoreV1Api(cluster.api_client())
    authn = client.AuthenticationV1Api(cluster.api_client())
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata={"name": "trainer"}))
    audience = f"ftjob-progress-{uuid.uuid4().hex[:6]}"
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[audience], expiration_seconds=600)
    )
    status = core.create_namespaced_service_account_token("trainer", namespace, request).status
    assert status is not None and status.token
    token = status.token

    def review(aud: str) -> Any:
        spec = client.V1TokenReviewSpec(token=token, audiences=[aud])
        return authn.create_token_review(client.V1TokenReview(spec=spec)).status

    ok = review(audience)
    assert ok.authenticated is True
    assert ok.user.username == f"system:serviceaccount:{namespace}:trainer"
    assert ok.audiences == [audience]
    wrong = review("someone-else")
    assert not wrong.authenticated
    assert wrong.error


def test_user_without_a_role_is_forbidden(cluster: Cluster, namespace: str) -> None:
    denied = cluster.kubectl("-n", namespace, "get", "pods", "--as=jane", check=False)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr
    assert (
        cluster.kubectl("-n", namespace, "auth", "can-i", "list", "pods", "--as=jane", check=False).stdout.strip()
        == "no"
    )

    # A real credential too: a ServiceAccount token with no RoleBinding.
    cluster.kubectl("-n", namespace, "create", "serviceaccount", "nobody")
    token = cluster.kubectl("-n", namespace, "create", "token", "nobody").stdout.strip()
    server = cluster.kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").stdout
    as_sa = ["--kubeconfig=/dev/null", f"--server={server}", f"--token={token}", "--insecure-skip-tls-verify"]
    kubectl = str(cluster.bin_dir / "kubectl")
    proc = subprocess.run([kubectl, *as_sa, "-n", namespace, "get", "pods"], capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "Forbidden" in proc.stderr

    # ...and RBAC really is what decides: a RoleBinding grants it.
    cluster.kubectl("-n", namespace, "create", "role", "pod-reader", "--verb=list,get", "--resource=pods")
    cluster.kubectl("-n", namespace, "create", "rolebinding", "jane", "--role=pod-reader", "--user=jane")
    wait_until(
        lambda: cluster.kubectl("-n", namespace, "get", "pods", "--as=jane", check=False).returncode == 0,
        timeout=15,
        what="jane allowed after RoleBinding",
    )


@pytest.fixture
def restore_nodes(cluster: Cluster) -> Any:
    """Undo node chaos after a test: drop the lost label and wait until every GPU node is Ready
    and untainted again, so later tests see the full GPU capacity."""
    yield
    cluster.kubectl("label", "nodes", "-l", "type=kwok", "kwok.finetune.dev/lost-")

    def healthy() -> bool:
        for n in gpu_nodes(cluster):
            ready = [c for c in n["status"].get("conditions", []) if c["type"] == "Ready"]
            if not ready or ready[0]["status"] != "True" or n["spec"].get("taints"):
                return False
        return True

    wait_until(healthy, timeout=90, what="all GPU nodes Ready and untainted again")


def test_pods_on_a_lost_node_fail_the_job(cluster: Cluster, namespace: str, restore_nodes: Any) -> None:
    apply(cluster, indexed_job("victim", pods=1, gpus=1, annotations={"kwok.finetune.dev/hold": "true"}), namespace)
    [pod] = wait_until(
        lambda: [p for p in pods_of(cluster, namespace, "victim") if p["status"].get("phase") == "Running"],
        timeout=60,
        what="pod of job victim Running",
    )
    node = pod["spec"]["nodeName"]
    cluster.kubectl("label", "node", node, "kwok.finetune.dev/lost=true")

    def not_ready() -> bool:
        conds = get(cluster, "node", node)["status"]["conditions"]
        return any(c["type"] == "Ready" and c["status"] != "True" for c in conds)

    wait_until(not_ready, timeout=30, what=f"node {node} NotReady")
    assert (
        wait_until(lambda: job_condition(cluster, namespace, "victim"), timeout=90, what="job victim done") == "Failed"
    )
    job = get(cluster, "-n", namespace, "job", "victim")
    assert job["status"].get("failed", 0) >= 1


def test_pods_on_a_deleted_node_are_garbage_collected_and_fail_the_job(
    cluster: Cluster, namespace: str, restore_nodes: Any
) -> None:
    """The slow path (pod GC: 40 s quarantine + up to 20 s period); the lost label is faster."""
    apply(cluster, indexed_job("orphan", pods=1, gpus=1, annotations={"kwok.finetune.dev/hold": "true"}), namespace)
    [pod] = wait_until(
        lambda: [p for p in pods_of(cluster, namespace, "orphan") if p["status"].get("phase") == "Running"],
        timeout=60,
        what="pod of job orphan Running",
    )
    node = get(cluster, "node", pod["spec"]["nodeName"])
    cluster.kubectl("delete", "node", node["metadata"]["name"])
    try:
        done = wait_until(lambda: job_condition(cluster, namespace, "orphan"), timeout=120, what="job orphan done")
        assert done == "Failed"
        assert not [p for p in pods_of(cluster, namespace, "orphan") if p["metadata"]["uid"] == pod["metadata"]["uid"]]
    finally:
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            node["metadata"].pop(key, None)
        node["metadata"].get("annotations", {}).pop("kubectl.kubernetes.io/last-applied-configuration", None)
        node.pop("spec", None)
        node["status"] = {k: node["status"][k] for k in ("capacity", "allocatable")}
        apply(cluster, node)


def test_kueue_admits_gpu_jobs_one_at_a_time_within_quota(cluster: Cluster, namespace: str, kueue: Any) -> None:
    cq = f"cq-{namespace}"[:63]
    objs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "ftjob-default"}},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", GPU],
                        "flavors": [
                            {
                                "name": "ftjob-default",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "100"},
                                    {"name": "memory", "nominalQuota": "1Ti"},
                                    {"name": GPU, "nominalQuota": "8"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    ]
    for obj in objs:
        apply(cluster, obj)
    apply(
        cluster,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "lq"},
            "spec": {"clusterQueue": cq},
        },
        namespace,
    )
    try:
        for name, hold in (("first", "true"), ("second", "false")):
            job = indexed_job(name, pods=1, gpus=8, annotations={"kwok.finetune.dev/hold": hold})
            job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "lq"}
            apply(cluster, job, namespace)

        def running(name: str) -> bool:
            return any(p["status"].get("phase") == "Running" for p in pods_of(cluster, namespace, name))

        wait_until(lambda: running("first"), timeout=60, what="first job admitted and Running")
        # Kueue suspended "second" in its webhook and keeps it so: the quota of 8 GPUs is in use.
        second = get(cluster, "-n", namespace, "job", "second")
        assert second["spec"]["suspend"] is True
        assert not pods_of(cluster, namespace, "second")

        cluster.kubectl("-n", namespace, "annotate", "pods", "-l", "job-name=first", "kwok.finetune.dev/hold-")
        assert (
            wait_until(lambda: job_condition(cluster, namespace, "first"), timeout=60, what="first done") == "Complete"
        )
        assert (
            wait_until(lambda: job_condition(cluster, namespace, "second"), timeout=90, what="second done")
            == "Complete"
        )
    finally:
        cluster.kubectl("-n", namespace, "delete", "jobs", "--all", "--wait=false", check=False)
        cluster.kubectl("-n", namespace, "delete", "localqueue", "lq", "--wait=false", check=False)
        cluster.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)
