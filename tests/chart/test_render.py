"""The chart renders, lints and says what we mean: only the helm binary, no cluster.

Covers `helm lint`/`helm template` for cluster-wide and namespaced mode, the CRD copy in the chart,
the strict values schema, least-privilege RBAC (never Secrets), the hardened Deployment and its
`ftjob operator` flags, and the `helm test` job staying equal to examples/tiny-cpu.yaml.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from .cases import CASES
from .conftest import CHART, REPO, Helm, documents, find

SYNC_HINT = (
    "charts/finetune-operator/crds/finetunejob.yaml must equal crds/finetunejob.yaml (Helm packages no "
    "symlinks). Sync it with:\n    cp crds/finetunejob.yaml charts/finetune-operator/crds/finetunejob.yaml"
)


def rendered(helm: Helm, case: str) -> list[dict[str, Any]]:
    return documents(helm.template(values=CASES[case]))


def release_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What `helm install` creates: everything but the `helm test` hooks."""
    return [d for d in docs if "helm.sh/hook" not in d["metadata"].get("annotations", {})]


def rules_of(docs: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, name, rule) for every rule of every Role and ClusterRole."""
    return [
        (d["kind"], d["metadata"]["name"], rule)
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        for rule in d.get("rules", [])
    ]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = find(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_chart_crd_is_a_copy_of_the_generated_crd() -> None:
    chart_crd = CHART / "crds" / "finetunejob.yaml"
    assert not chart_crd.is_symlink(), SYNC_HINT
    assert chart_crd.read_text() == (REPO / "crds" / "finetunejob.yaml").read_text(), SYNC_HINT


@pytest.mark.parametrize("case", ["default", "namespaced", "features"])
def test_helm_lint_passes(helm: Helm, case: str, tmp_path: Any) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(CASES[case]))
    out = helm.run("lint", "--strict", str(CHART), "--values", str(values)).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replica": 3}, "replica"),
        ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
        ({"progress": {"port": 70000}}, "port"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"metrics": {"port": 9090, "serviceMonitor": {"enable": True}}}, "enable"),
    ],
    ids=[
        "a misspelt top-level key is rejected",
        "a namespace that is no DNS label is rejected",
        "a port above 65535 is rejected",
        "an unknown pull policy is rejected",
        "a misspelt nested key is rejected",
    ],
)
def test_values_schema_is_strict(helm: Helm, values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(AssertionError) as failure:
        helm.template(values=values)
    assert "values don't meet the specifications of the schema" in str(failure.value)
    assert complaint in str(failure.value)


def test_default_install_is_cluster_wide_with_peering(helm: Helm) -> None:
    docs = release_objects(rendered(helm, "default"))
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == sorted(
        ["ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding", "Deployment", "NetworkPolicy", "Secret", "Service",
         "ServiceAccount"]
    )
    assert not find(docs, "Role") and not find(docs, "RoleBinding")
    (deployment,) = find(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    args = operator_container(docs)["args"]
    assert args[:2] == ["--all-namespaces", "--peering=ftjob-finetune-operator"]
    assert "--progress-url=https://ftjob-finetune-operator-progress.finetune-system.svc:8443" in args
    assert "--image=ghcr.io/finetune-operator/trainer:0.1.0" in args
    (peering,) = find(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "ftjob-finetune-operator"


def test_namespaced_mode_binds_a_role_in_each_watched_namespace(helm: Helm) -> None:
    docs = release_objects(rendered(helm, "namespaced"))
    roles = {(d["kind"], d["metadata"]["namespace"]) for d in find(docs, "Role") + find(docs, "RoleBinding")}
    assert roles == {(k, ns) for k in ("Role", "RoleBinding") for ns in ("team-a", "team-b")}
    assert [a for a in operator_container(docs)["args"] if a.startswith("--namespace")] == [
        "--namespace=team-a", "--namespace=team-b"
    ]
    assert "--all-namespaces" not in operator_container(docs)["args"]
    assert {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in find(docs, "KopfPeering")} == {
        ("team-a", "ftjob-finetune-operator"), ("team-b", "ftjob-finetune-operator")
    }
    assert not find(docs, "ClusterKopfPeering")
    # The operator's ClusterRole keeps only what cannot be namespaced.
    (cluster_role,) = find(docs, "ClusterRole", "ftjob-finetune-operator")
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {
        "tokenreviews", "customresourcedefinitions", "namespaces"
    }
    for rule in cluster_role["rules"]:
        if rule["resources"] == ["namespaces"]:
            assert rule["verbs"] == ["get", "list", "watch"]


@pytest.mark.parametrize("case", ["default", "namespaced", "features"])
def test_rbac_never_grants_secrets_or_wildcards(helm: Helm, case: str) -> None:
    for kind, name, rule in rules_of(rendered(helm, case)):
        assert "secrets" not in rule["resources"], f"{kind} {name} grants secrets: {rule}"
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(key, []), f"{kind} {name} has a wildcard: {rule}"


def test_operator_rules_are_exactly_what_the_operator_needs(helm: Helm) -> None:
    (role,) = find(rendered(helm, "default"), "ClusterRole", "ftjob-finetune-operator")
    granted = {
        (group, resource): sorted(rule["verbs"])
        for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]
    }
    assert granted == {
        ("authentication.k8s.io", "tokenreviews"): ["create"],
        ("apiextensions.k8s.io", "customresourcedefinitions"): ["get", "list", "watch"],
        ("finetune.dev", "finetunejobs"): ["delete", "get", "list", "patch", "watch"],
        ("finetune.dev", "finetunejobs/status"): ["get", "patch"],
        ("finetune.dev", "finetunejobs/finalizers"): ["update"],
        ("batch", "jobs"): ["create", "delete", "get", "list", "patch", "watch"],
        ("", "configmaps"): ["create", "delete", "get", "list", "patch", "watch"],
        ("", "services"): ["create", "delete", "get", "list", "patch", "watch"],
        ("", "pods"): ["get", "list", "watch"],
        ("", "events"): ["create"],
        ("kopf.dev", "clusterkopfpeerings"): ["get", "list", "patch", "watch"],
    }


def test_aggregated_roles_extend_admin_edit_and_view(helm: Helm) -> None:
    docs = rendered(helm, "default")
    edit = find(docs, "ClusterRole", "ftjob-finetune-operator-edit")
    view = find(docs, "ClusterRole", "ftjob-finetune-operator-view")
    labels = edit[0]["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view[0]["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert view[0]["rules"] == [
        {"apiGroups": ["finetune.dev"], "resources": ["finetunejobs", "finetunejobs/status"],
         "verbs": ["get", "list", "watch"]}
    ]
    assert not find(rendered(helm, "features"), "ClusterRole", "ftjob-finetune-operator-edit")


def test_deployment_is_hardened_and_probed(helm: Helm) -> None:
    docs = rendered(helm, "default")
    (deployment,) = find(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "progress": 8443, "metrics": 9090}
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    # The progress certificate arrives as a mounted Secret, not through the API.
    tls = next(v for v in pod["volumes"] if v["name"] == "progress-tls")
    assert tls["secret"]["secretName"] == "ftjob-finetune-operator-progress-tls"
    assert "--progress-cert=/etc/finetune-operator/tls/tls.crt" in container["args"]
    # Peering needs a distinct priority per replica (kopf pauses peers of equal priority).
    assert container["command"][:2] == ["python", "-c"] and "--priority" in container["command"][2]


def test_standalone_when_peering_is_off(helm: Helm) -> None:
    docs = rendered(helm, "features")
    container = operator_container(docs)
    assert container["command"] == ["ftjob", "operator"]
    assert "--standalone" in container["args"] and not any(a.startswith("--peering") for a in container["args"])
    assert not find(docs, "ClusterKopfPeering") and not find(docs, "Secret")
    (monitor,) = find(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_generated_progress_certificate_names_the_progress_service(helm: Helm) -> None:
    import base64

    from cryptography import x509

    (secret,) = find(rendered(helm, "default"), "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    svc = "ftjob-finetune-operator-progress"
    ns = "finetune-system"
    assert names == [svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert.verify_directly_issued_by(ca)


def test_helm_test_job_is_the_tiny_cpu_example(helm: Helm) -> None:
    docs = documents(helm.template(values=CASES["namespaced"]))
    hooks = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    (config_map,) = [d for d in hooks if d["kind"] == "ConfigMap"]
    job = yaml.safe_load(config_map["data"]["finetunejob.yaml"])
    example = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    assert job["spec"] == example["spec"]
    assert job["metadata"]["namespace"] == "team-a"  # the first watched namespace
    (pod,) = [d for d in hooks if d["kind"] == "Pod"]
    assert pod["spec"]["containers"][0]["command"] == ["python", "/etc/finetune-operator-test/run.py"]
    compile(config_map["data"]["run.py"], "run.py", "exec")


def test_packaged_chart_carries_the_crds_as_files(helm: Helm, tmp_path: Any) -> None:
    import tarfile

    helm.run("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("finetune-operator-*.tgz")
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
        crd = members["finetune-operator/crds/finetunejob.yaml"]
        assert crd.isfile()
        assert "finetune-operator/values.schema.json" in members
        assert "finetune-operator/crds/kopf-peering.yaml" in members
        extracted = tar.extractfile(crd)
        assert extracted is not None
        assert extracted.read().decode() == (REPO / "crds" / "finetunejob.yaml").read_text()
