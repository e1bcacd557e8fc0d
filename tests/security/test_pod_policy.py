"""The pod policy on a real control plane, attacked by a user who may only create FineTuneJobs.

The author holds nothing but the chart's FineTuneJob edit role (rendered from the chart and bound
alone in the namespace): no pods, no Secrets. Each attack of the report that led to the policy is a
FineTuneJob of theirs; the operator runs with the chart's default policy, and each job either is
refused at `kubectl apply` by the CRD's CEL rules or fails with reason `InvalidSpec` naming the field,
before any child exists. A job within the policy runs in a namespace that enforces Pod Security
`restricted`: the Job controller's pods are admitted, carry the restricted securityContext, and KWOK
runs them to the end. The chart's ValidatingAdmissionPolicy keeps the author from naming a Secret they
cannot read in the job's own secret references, which reach the pods as HF_TOKEN.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.v1alpha1.spec import RESERVED_LABELS_MESSAGE, TOLERATE_EVERYTHING_MESSAGE
from tests.controlplane.conftest import REPO, Cluster, wait_until
from tests.controlplane.operator.conftest import Operator, condition, ftj, get, items, wait_phase

pytestmark = pytest.mark.controlplane

AUTHOR = "ftj-author"
CHART = REPO / "charts" / "finetune-operator"
POLICY = "is not allowed by the operator's pod policy"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def chart_edit_role(cluster: Cluster) -> dict[str, Any]:
    """The chart's FineTuneJob edit ClusterRole, as `helm template` renders it."""
    helm = cluster.bin_dir / "helm"
    if not helm.exists():
        pytest.skip(f"no helm in {cluster.bin_dir} (hack/cluster/build.sh builds it)")
    text = subprocess.run(
        [
            str(helm),
            "template",
            "ftjob",
            str(CHART),
            "--show-only",
            "templates/rbac-aggregated.yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    roles = [d for d in yaml.safe_load_all(text) if d and d["metadata"]["name"].endswith("-edit")]
    assert len(roles) == 1, text
    return dict(roles[0])


@pytest.fixture
def author(cluster: Cluster, crd: None, namespace: str) -> Kubectl:
    """kubectl as a user bound only to the chart's FineTuneJob edit role in the namespace."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "finetunejob-edit", "namespace": namespace},
        "rules": chart_edit_role(cluster)["rules"],
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
    cluster.kubectl(
        "-n", namespace, "create", "rolebinding", "finetunejob-edit", "--role=finetunejob-edit", f"--user={AUTHOR}"
    )

    def can(verb: str, resource: str) -> bool:
        proc = cluster.kubectl("-n", namespace, "auth", "can-i", verb, resource, f"--as={AUTHOR}", check=False)
        return proc.stdout.strip() == "yes"

    wait_until(lambda: can("create", "finetunejobs.finetune.dev"), timeout=20, what="the edit role in effect")
    assert not can("create", "pods") and not can("get", "secrets") and not can("create", "jobs.batch")

    def kubectl(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl("-n", namespace, f"--as={AUTHOR}", *args, **kwargs)

    return kubectl


@pytest.fixture
def targets(cluster: Cluster, namespace: str) -> None:
    """What the attacks reach for: a namespace-admin ServiceAccount, a Secret the author cannot read,
    and a Service whose selector a trainer pod's labels could match."""
    cluster.kubectl("-n", namespace, "create", "serviceaccount", "ns-admin")
    cluster.kubectl(
        "-n",
        namespace,
        "create",
        "rolebinding",
        "ns-admin",
        "--clusterrole=admin",
        f"--serviceaccount={namespace}:ns-admin",
    )
    cluster.kubectl("-n", namespace, "create", "secret", "generic", "db-credentials", "--from-literal=password=s3cret")
    cluster.kubectl("-n", namespace, "create", "service", "clusterip", "postgres", "--tcp=5432")


def start_operator(cluster: Cluster, namespace: str, log: Path, *flags: str) -> Operator:
    """`ftjob operator` with the default pod policy (an operator installed by the chart) plus `flags`."""
    op = Operator(cluster, namespace, log, policy=flags)
    op.start()
    return op


@pytest.fixture
def default_operator(cluster: Cluster, crd: None, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    op = start_operator(cluster, namespace, tmp_path / "operator.log")
    try:
        yield op
    finally:
        op.stop()


def attack(name: str, **template: Any) -> dict[str, Any]:
    body = ftj("tiny-cpu", name=name, run_seconds=None)
    body["spec"]["template"] = template
    return body


def children(cluster: Cluster, namespace: str, name: str) -> dict[str, list[str]]:
    selector = f"finetune.dev/job-name={name}"
    return {
        kind: [o["metadata"]["name"] for o in items(cluster, namespace, kind, selector)]
        for kind in ("configmaps", "services", "jobs", "pods")
    }


REFUSED_BY_THE_OPERATOR = [
    (
        "the namespace-admin ServiceAccount",
        attack("sa", serviceAccountName="ns-admin"),
        f"spec.template.serviceAccountName: 'ns-admin' {POLICY} (allowed: default)",
    ),
    (
        "a Secret the author cannot read, as env",
        attack(
            "secret", env=[{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db-credentials", "key": "password"}}}]
        ),
        "spec.template.env[0].valueFrom.secretKeyRef: Secret 'db-credentials' key 'password' is not one of the "
        "job's own secret references (none); a pod reads only the Secret keys its spec names",
    ),
    (
        "any image",
        attack("image", image="docker.io/library/busybox:1.37"),
        f"spec.template.image: 'docker.io/library/busybox:1.37' {POLICY} (allowed: ghcr.io/finetune-operator/trainer)",
    ),
    (
        "AppArmor unconfined through an annotation",
        attack("apparmor", annotations={"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}),
        "spec.template.annotations[container.apparmor.security.beta.kubernetes.io/trainer]: sets an AppArmor or "
        "seccomp profile ('unconfined'), which is not allowed by the operator's pod policy (security level: "
        "restricted; use securityContext where it allows)",
    ),
    (
        "the system-node-critical priority class",
        attack("priority", priorityClassName="system-node-critical"),
        f"spec.template.priorityClassName: 'system-node-critical' {POLICY} (allowed: *; * excludes system-* classes)",
    ),
    (
        "a privileged container",
        attack("privileged", securityContext={"privileged": True}),
        f"spec.template.securityContext.privileged: true {POLICY} (security level restricted: false)",
    ),
    (
        "a toleration of a control-plane taint",
        attack("controlplane", tolerations=[{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]),
        f"spec.template.tolerations[0].key: 'node-role.kubernetes.io/control-plane' {POLICY} "
        "(allowed: nvidia.com/gpu, node.kubernetes.io/not-ready, node.kubernetes.io/unreachable)",
    ),
]


@pytest.mark.parametrize(
    ("body", "error"), [c[1:] for c in REFUSED_BY_THE_OPERATOR], ids=[c[0] for c in REFUSED_BY_THE_OPERATOR]
)
def test_an_attack_fails_as_invalid_spec_before_any_child_exists(
    cluster: Cluster,
    namespace: str,
    author: Kubectl,
    targets: None,
    default_operator: Operator,
    body: dict[str, Any],
    error: str,
) -> None:
    name = body["metadata"]["name"]
    author("apply", "-f", "-", input=yaml.safe_dump(body))
    st = wait_phase(cluster, namespace, "Failed", name=name, timeout=30)
    assert condition(st, "Failed")["reason"] == "InvalidSpec"
    assert error in st["message"], st["message"]
    time.sleep(2)  # a reconcile round or two later, still nothing
    assert children(cluster, namespace, name) == {"configmaps": [], "services": [], "jobs": [], "pods": []}


REFUSED_AT_APPLY = [
    (
        "a toleration of every taint",
        attack("everything", tolerations=[{"operator": "Exists"}]),
        f"spec.template.tolerations[0]: Invalid value: {TOLERATE_EVERYTHING_MESSAGE}",
    ),
    (
        "the operator's own label, to pass as another job's pod",
        attack("labels", labels={"finetune.dev/job-name": "victim"}),
        f"spec.template.labels: Invalid value: {RESERVED_LABELS_MESSAGE}",
    ),
    (
        "a whole Secret through envFrom",
        attack("envfrom", envFrom=[{"secretRef": {"name": "db-credentials"}}]),
        'unknown field "spec.template.envFrom"',
    ),
]


@pytest.mark.parametrize(("body", "error"), [c[1:] for c in REFUSED_AT_APPLY], ids=[c[0] for c in REFUSED_AT_APPLY])
def test_an_attack_the_crd_refuses_never_becomes_an_object(
    cluster: Cluster, namespace: str, author: Kubectl, body: dict[str, Any], error: str
) -> None:
    proc = author("apply", "-f", "-", input=yaml.safe_dump(body), check=False)
    assert proc.returncode != 0 and error in proc.stderr, proc.stderr
    assert get(cluster, namespace, "finetunejob", body["metadata"]["name"]) is None


def test_labels_matching_another_service_are_refused_where_label_prefixes_are_narrowed(
    cluster: Cluster, crd: None, namespace: str, author: Kubectl, targets: None, tmp_path: Path
) -> None:
    """`app: postgres` would draw the postgres Service's traffic; the default policy allows any key outside
    the reserved ones, an operator with `--allowed-label-prefix` only its prefixes."""
    op = start_operator(cluster, namespace, tmp_path / "operator.log", "--allowed-label-prefix=team.example.com/")
    try:
        author("apply", "-f", "-", input=yaml.safe_dump(attack("hijack", labels={"app": "postgres"})))
        st = wait_phase(cluster, namespace, "Failed", name="hijack", timeout=30)
    finally:
        op.stop()
    assert f"spec.template.labels[app]: 'app' {POLICY} (allowed: team.example.com/)" in st["message"]
    assert children(cluster, namespace, "hijack") == {"configmaps": [], "services": [], "jobs": [], "pods": []}


def test_a_job_within_the_policy_runs_in_a_restricted_namespace(
    cluster: Cluster, namespace: str, author: Kubectl, default_operator: Operator
) -> None:
    cluster.kubectl(
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    # Enforcement is on: a plain pod without a securityContext is refused here.
    plain = cluster.kubectl("-n", namespace, "run", "plain", "--image=busybox", "--restart=Never", check=False)
    assert plain.returncode != 0 and 'violates PodSecurity "restricted:latest"' in plain.stderr, plain.stderr
    body = ftj("tiny-cpu", name="within", run_seconds=None)
    body["spec"]["template"] = {
        "image": "ghcr.io/finetune-operator/trainer:0.1.0",
        "serviceAccountName": "default",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "labels": {"team": "nlp"},
    }
    author("apply", "-f", "-", input=yaml.safe_dump(body))
    pods = wait_until(
        lambda: items(cluster, namespace, "pods", "finetune.dev/job-name=within"),
        timeout=60,
        what="trainer pods created by the Job controller",
    )
    (pod,) = pods
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/tmp", "/home/ftjob/.cache"}
    st = wait_phase(cluster, namespace, "Succeeded", name="within", timeout=60)
    assert condition(st, "Succeeded")["status"] == "True"


@pytest.fixture
def secret_policy(cluster: Cluster, namespace: str) -> Iterator[None]:
    """The chart's secret-reference ValidatingAdmissionPolicy (its own release name), bound to this namespace
    only as the chart binds the watched namespaces, until the test ends."""
    helm = cluster.bin_dir / "helm"
    if not helm.exists():
        pytest.skip(f"no helm in {cluster.bin_dir} (hack/cluster/build.sh builds it)")
    text = subprocess.run(
        [
            str(helm),
            "template",
            f"sec{uuid.uuid4().hex[:6]}",
            str(CHART),
            "--namespace",
            namespace,
            "--api-versions",
            "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
            "--set-json",
            f"watchNamespaces={json.dumps([namespace])}",
            "--show-only",
            "templates/finetunejob-policy.yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cluster.kubectl("apply", "-f", "-", input=text)
    try:
        yield
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input=text, check=False)


def test_a_job_naming_a_secret_its_author_cannot_read_is_refused_at_apply(
    cluster: Cluster, namespace: str, author: Kubectl, targets: None, secret_policy: None
) -> None:
    body = ftj("tiny-cpu", name="token", run_seconds=None)
    body["spec"]["model"]["tokenSecretRef"] = {"name": "db-credentials", "key": "password"}
    text = yaml.safe_dump(body)
    refused = (
        "spec.model.tokenSecretRef: Secret db-credentials is not one the author may read; a FineTuneJob may name "
        "only Secrets its author may get"
    )
    # The API server loads a new policy within a moment; a server-side dry run goes through admission too.
    wait_until(
        lambda: refused in author("apply", "--dry-run=server", "-f", "-", input=text, check=False).stderr,
        timeout=30,
        what="the secret-reference policy in effect",
    )
    proc = author("apply", "-f", "-", input=text, check=False)
    assert proc.returncode != 0 and refused in proc.stderr, proc.stderr
    assert get(cluster, namespace, "finetunejob", "token") is None
    # Whoever may read the Secret may name it; the author may then change the job's metadata, not its spec.
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=text)
    author("label", "finetunejob", "token", "team=nlp")
    proc = author(
        "patch", "finetunejob", "token", "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}', check=False
    )
    assert proc.returncode != 0 and refused in proc.stderr, proc.stderr
