"""The chart's bound on the operator itself: ValidatingAdmissionPolicies that the API server enforces on every
request of the operator's ServiceAccount, whatever the operator's code does.

Rendering (helm only): the two policies and their bindings appear where the API server serves
admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, and not with `admissionPolicy.enabled=false`; they
match the ServiceAccount's username only, the label they ask for is the operator's own managed-by label
(`finetune_api.constants`), and the template is compared with tests/security/snapshots/admission-policy.yaml.

On the real API server (`helm install`, cluster-wide mode, whose RBAC lets the ServiceAccount create Jobs in every
namespace): server-side dry runs as the ServiceAccount (`kubectl --as`). A privileged hostPath Job in kube-system
is refused, so is each single pod-template escape in a user namespace, any unlabelled child, any child in
kube-system, labelling or deleting somebody else's object; the operator's own rendered children, Events, status
patches, TokenReviews and its peering object pass. The same requests as the admin pass: only the operator is bound.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api import constants
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render import render_all
from tests.chart.conftest import Helm, Installed, apply_chart_crds, documents, find
from tests.controlplane.conftest import REPO, Cluster, wait_until

SNAPSHOT = Path(__file__).parent / "snapshots" / "admission-policy.yaml"
VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
POLICY_KINDS = ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def policy_docs(helm: Helm, values: dict[str, Any] | None = None, served: bool = True) -> list[dict[str, Any]]:
    """The operator-bounding policies and bindings (templates/admission-policy.yaml) the chart renders."""
    extra = ("--api-versions", VAP) if served else ()
    docs = documents(helm.template(values=values, extra=extra))
    return [d for d in docs if d["kind"] in POLICY_KINDS and d["metadata"]["name"].endswith(("-children", "-pods"))]


def test_the_policies_render_only_where_the_api_server_serves_them(helm: Helm) -> None:
    docs = policy_docs(helm)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ValidatingAdmissionPolicy", "ftjob-finetune-operator-children"),
        ("ValidatingAdmissionPolicy", "ftjob-finetune-operator-pods"),
        ("ValidatingAdmissionPolicyBinding", "ftjob-finetune-operator-children"),
        ("ValidatingAdmissionPolicyBinding", "ftjob-finetune-operator-pods"),
    ]
    assert policy_docs(helm, served=False) == []  # an API server before 1.30: nothing it would refuse
    assert policy_docs(helm, {"admissionPolicy": {"enabled": False}}) == []


def test_the_policies_bind_the_operators_service_account_and_its_own_label(helm: Helm) -> None:
    docs = policy_docs(helm)
    for policy in find(docs, "ValidatingAdmissionPolicy"):
        (match,) = policy["spec"]["matchConditions"]
        assert match["expression"] == (
            'request.userInfo.username == "system:serviceaccount:finetune-system:ftjob-finetune-operator"'
        )
        assert policy["spec"]["failurePolicy"] == "Fail"
    (binding,) = find(docs, "ValidatingAdmissionPolicyBinding", "ftjob-finetune-operator-children")
    assert binding["spec"]["validationActions"] == ["Deny"]
    (children,) = find(docs, "ValidatingAdmissionPolicy", "ftjob-finetune-operator-children")
    rules = {
        (tuple(r["apiGroups"]), tuple(r["resources"])) for r in children["spec"]["matchConstraints"]["resourceRules"]
    }
    assert rules == {(("batch",), ("jobs",)), (("",), ("configmaps", "services"))}  # no events, status, tokenreviews
    variables = {v["name"]: v["expression"] for v in children["spec"]["variables"]}
    label = f'variables.target.metadata.labels["{constants.LABEL_MANAGED_BY}"] == "{constants.MANAGED_BY}"'
    assert label in variables["managed"]
    expressions = [v["expression"] for v in children["spec"]["validations"]]
    assert '!(request.namespace in ["kube-system","kube-public","kube-node-lease"])' in expressions
    renamed = policy_docs(helm, {"serviceAccount": {"name": "ops"}})
    assert all("finetune-system:ops" in json.dumps(d["spec"]) for d in find(renamed, "ValidatingAdmissionPolicy"))


def test_the_policy_template_matches_its_snapshot(helm: Helm, update_golden: bool) -> None:
    text = helm.template(extra=("--api-versions", VAP, "--show-only", "templates/admission-policy.yaml"))
    if update_golden:
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), f"differs from {SNAPSHOT}; if intended, rerun with --update-golden"


# --- on the real API server ------------------------------------------------------------------------------------

LABELS = {constants.LABEL_MANAGED_BY: constants.MANAGED_BY}


def job(namespace: str, name: str = "fine", labels: dict[str, str] | None = None, **pod: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}], **pod}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": LABELS if labels is None else labels},
        "spec": {"template": {"spec": spec}},
    }


def escaped(namespace: str) -> dict[str, Any]:
    """Every escape at once: host network, a hostPath of the node's root, a privileged container."""
    body = job(namespace, name="evil", hostNetwork=True, volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    body["spec"]["template"]["spec"]["containers"][0].update(
        securityContext={"privileged": True}, volumeMounts=[{"name": "root", "mountPath": "/host"}]
    )
    return body


def privileged_init(namespace: str) -> dict[str, Any]:
    body = job(namespace, name="init")
    body["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "setup", "image": "busybox:1.36", "securityContext": {"privileged": True}}
    ]
    return body


def config_map(namespace: str, name: str = "cm", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": LABELS if labels is None else labels},
    }


def service(namespace: str, name: str = "svc", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": LABELS if labels is None else labels},
        "spec": {"clusterIP": "None", "selector": {"app": "x"}, "ports": [{"port": 29500}]},
    }


def dry_run(
    cluster: Cluster, as_user: str | None, *args: str, body: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    who = ["--as", as_user] if as_user else []
    data = json.dumps(body) if body is not None else None
    return cluster.kubectl(
        *args, "--dry-run=server", *who, *(["-f", "-"] if body is not None else []), input=data, check=False
    )


def refused_by_policy(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode != 0 and "ValidatingAdmissionPolicy" in proc.stderr


@pytest.fixture
def bound(install: Any, cluster: Cluster, namespace: str) -> Installed:
    """The chart installed cluster-wide (its RBAC may create Jobs everywhere), once its policies are in force."""
    apply_chart_crds(cluster)
    release: Installed = install(namespace)
    assert cluster.kubectl("get", "validatingadmissionpolicy", f"{release.fullname}-children").returncode == 0
    wait_until(
        lambda: refused_by_policy(dry_run(cluster, release.sa, "create", body=config_map(namespace, labels={}))),
        timeout=30,
        what="the admission policies to take effect",
    )
    return release


@pytest.mark.controlplane
def test_a_privileged_hostpath_job_in_kube_system_is_refused(bound: Installed, cluster: Cluster) -> None:
    proc = dry_run(cluster, bound.sa, "create", body=escaped("kube-system"))
    assert refused_by_policy(proc), proc.stderr
    # RBAC alone would let it through (cluster-wide mode); the admin, not bound by the policy, may.
    can_i = cluster.kubectl("auth", "can-i", "create", "jobs.batch", "-n", "kube-system", "--as", bound.sa)
    assert can_i.stdout.strip() == "yes"
    assert dry_run(cluster, None, "create", body=escaped("kube-system")).returncode == 0
    # Nothing at all there, not even a labelled, harmless child.
    for body in (job("kube-system"), config_map("kube-system"), service("kube-system")):
        proc = dry_run(cluster, bound.sa, "create", body=body)
        assert refused_by_policy(proc) and "in namespace kube-system" in proc.stderr, proc.stderr


def privileged(namespace: str) -> dict[str, Any]:
    body = job(namespace)
    body["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return body


ESCAPES = {
    "hostNetwork": lambda ns: job(ns, hostNetwork=True),
    "hostPID": lambda ns: job(ns, hostPID=True),
    "hostIPC": lambda ns: job(ns, hostIPC=True),
    "hostPath volume": lambda ns: job(ns, volumes=[{"name": "v", "hostPath": {"path": "/var/run"}}]),
    "privileged container": privileged,
    "privileged initContainer": privileged_init,
}


@pytest.mark.controlplane
def test_each_pod_template_escape_is_refused_in_a_user_namespace(
    bound: Installed, cluster: Cluster, namespace: str
) -> None:
    for what, make in ESCAPES.items():
        proc = dry_run(cluster, bound.sa, "create", body=make(namespace))
        assert refused_by_policy(proc), f"{what}: {proc.stderr}"
        assert dry_run(cluster, None, "create", body=make(namespace)).returncode == 0, what  # the admin: not bound


@pytest.mark.controlplane
def test_the_operators_own_children_pass_and_unlabelled_ones_do_not(
    bound: Installed, cluster: Cluster, namespace: str
) -> None:
    body = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    body["metadata"] = {"name": "demo", "namespace": namespace, "uid": "u-demo"}
    rendered = render_all(FineTuneJob.from_body(body))
    for child in rendered.manifests:  # exactly what the operator creates for a job
        assert child["metadata"]["labels"][constants.LABEL_MANAGED_BY] == constants.MANAGED_BY
        proc = dry_run(cluster, bound.sa, "create", body=child)
        assert proc.returncode == 0, f"{child['kind']}: {proc.stderr}"
    for child in rendered.manifests:
        unlabelled = copy.deepcopy(child)
        del unlabelled["metadata"]["labels"][constants.LABEL_MANAGED_BY]
        proc = dry_run(cluster, bound.sa, "create", body=unlabelled)
        assert refused_by_policy(proc) and "labelled app.kubernetes.io/managed-by" in proc.stderr, proc.stderr


@pytest.mark.controlplane
def test_somebody_elses_object_can_be_neither_labelled_nor_deleted(
    bound: Installed, cluster: Cluster, namespace: str
) -> None:
    theirs = service(namespace, name="db", labels={"app": "db"})
    cluster.kubectl("create", "-f", "-", input=json.dumps(theirs))
    cluster.kubectl("create", "-f", "-", input=json.dumps(config_map(namespace, name="db-config", labels={})))
    hijack = service(namespace, name="db", labels={**LABELS, "finetune.dev/job-name": "db"})
    hijack["spec"]["selector"] = {"finetune.dev/job-name": "db"}
    proc = dry_run(
        cluster,
        bound.sa,
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=finetune-operator",
        body=hijack,
    )
    assert refused_by_policy(proc), proc.stderr
    for kind, name in (("service", "db"), ("configmap", "db-config")):
        assert refused_by_policy(dry_run(cluster, bound.sa, "-n", namespace, "delete", kind, name))
    # Its own (labelled) objects it may change and delete.
    cluster.kubectl("create", "-f", "-", input=json.dumps(config_map(namespace, name="ours-config")))
    assert dry_run(cluster, bound.sa, "-n", namespace, "delete", "configmap", "ours-config").returncode == 0
    patch = json.dumps({"data": {"trainer.json": "{}"}})
    assert dry_run(cluster, bound.sa, "-n", namespace, "patch", "configmap", "ours-config", "-p", patch).returncode == 0


@pytest.mark.controlplane
def test_events_status_tokenreviews_and_peering_are_not_blocked(
    bound: Installed, cluster: Cluster, namespace: str
) -> None:
    body = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    body["metadata"] = {"name": "demo", "namespace": namespace}
    cluster.kubectl("create", "-f", "-", input=json.dumps(body))
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "demo.1", "namespace": namespace},
        "involvedObject": {
            "apiVersion": constants.API_VERSION,
            "kind": constants.KIND,
            "name": "demo",
            "namespace": namespace,
        },
        "reason": "Created",
        "message": "m",
        "type": "Normal",
    }
    assert dry_run(cluster, bound.sa, "create", body=event).returncode == 0
    status = json.dumps({"status": {"phase": "Pending", "message": "m"}})
    proc = dry_run(
        cluster,
        bound.sa,
        "-n",
        namespace,
        "patch",
        "finetunejob",
        "demo",
        "--subresource=status",
        "--type=merge",
        "-p",
        status,
    )
    assert proc.returncode == 0, proc.stderr
    peering = json.dumps({"status": {"probe": None}})
    proc = dry_run(cluster, bound.sa, "patch", "clusterkopfpeering", bound.fullname, "--type=merge", "-p", peering)
    assert proc.returncode == 0, proc.stderr
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "not-a-token"}}
    proc = cluster.kubectl("create", "--as", bound.sa, "-o", "json", "-f", "-", input=json.dumps(review), check=False)
    assert proc.returncode == 0 and json.loads(proc.stdout)["status"].get("authenticated") is not True, proc.stderr
