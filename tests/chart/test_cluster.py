"""The chart against the real control plane (hack/cluster): the rendered objects are accepted by the
API server, `helm install` works, and the RBAC it grants is really enforced: the operator's
ServiceAccount can do what the operator needs, is refused everything else (Secrets above all), and
namespace users get FineTuneJob rights through the aggregated admin/edit/view roles.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from .conftest import CHART, Cluster, Helm, apply_chart_crds, can_i, release_name, wait_until

pytestmark = pytest.mark.controlplane


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_rendered_objects_pass_server_side_dry_run(helm: Helm, cluster: Cluster, namespace: str, mode: str) -> None:
    apply_chart_crds(cluster)
    values = {"watchNamespaces": [namespace]} if mode == "namespaced" else {}
    text = helm.template(values=values, release=release_name(), namespace=namespace)
    # The ServiceAccount admission plugin looks up a pod's ServiceAccount even in a dry run, so the
    # ServiceAccounts (namespaced, gone with the test namespace) are created for real first.
    accounts = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "ServiceAccount"]
    cluster.kubectl("apply", "--namespace", namespace, "-f", "-", input=yaml.safe_dump_all(accounts))
    proc = cluster.kubectl("apply", "--dry-run=server", "--namespace", namespace, "-f", "-", input=text)
    applied = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(applied) == len([d for d in yaml.safe_load_all(text) if d]), proc.stdout
    assert all("(server dry run)" in line for line in applied), proc.stdout


def test_helm_install_cluster_wide_rbac_is_enforced(install: Any, cluster: Cluster, namespace: str) -> None:
    release = install(namespace)
    sa = release.sa
    objects = json.loads(cluster.kubectl("-n", namespace, "get", "deployment,service,secret,serviceaccount",
                                         "-l", f"app.kubernetes.io/instance={release.release}", "-o", "json").stdout)
    kinds = sorted(o["kind"] for o in objects["items"])
    assert kinds == ["Deployment", "Secret", "Service", "Service", "ServiceAccount"]
    assert cluster.kubectl("get", "clusterkopfpeering", release.fullname, check=False).returncode == 0

    anywhere = ["--namespace", "default"]
    allowed = [
        ("watch", "finetunejobs.finetune.dev", "--all-namespaces"),
        ("patch", "finetunejobs.finetune.dev", *anywhere),
        ("patch", "finetunejobs.finetune.dev", "--subresource=status", *anywhere),
        ("create", "jobs.batch", *anywhere),
        ("delete", "jobs.batch", *anywhere),
        ("create", "configmaps", *anywhere),
        ("create", "services", *anywhere),
        ("list", "pods", "--all-namespaces"),
        ("get", "pods", *anywhere),
        ("create", "events", *anywhere),
        ("create", "tokenreviews.authentication.k8s.io"),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
        ("patch", f"clusterkopfpeerings.kopf.dev/{release.fullname}"),
    ]
    forbidden = [
        ("get", "secrets", "--namespace", namespace),
        ("list", "secrets", "--all-namespaces"),
        ("get", f"secrets/{release.fullname}-progress-tls", "--namespace", namespace),
        ("create", "finetunejobs.finetune.dev", *anywhere),
        ("update", "finetunejobs.finetune.dev", *anywhere),
        ("create", "pods", *anywhere),
        ("delete", "pods", *anywhere),
        ("create", "pods", "--subresource=exec", *anywhere),
        ("update", "deployments.apps", "--namespace", namespace),
        ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
        ("list", "nodes"),
    ]
    assert [a for a in allowed if not can_i(cluster, sa, *a)] == []
    assert [f for f in forbidden if can_i(cluster, sa, *f)] == []


def test_helm_install_namespaced_rbac_only_reaches_watched_namespaces(
    install: Any, cluster: Cluster, namespace: str, other_namespace: str
) -> None:
    release = install(namespace, {"watchNamespaces": [other_namespace]})
    sa, watched = release.sa, ["--namespace", other_namespace]
    assert can_i(cluster, sa, "watch", "finetunejobs.finetune.dev", *watched)
    assert can_i(cluster, sa, "create", "jobs.batch", *watched)
    assert can_i(cluster, sa, "patch", f"kopfpeerings.kopf.dev/{release.fullname}", *watched)
    assert can_i(cluster, sa, "create", "tokenreviews.authentication.k8s.io")
    assert not can_i(cluster, sa, "get", "secrets", *watched)
    # Not the release namespace, not any other namespace, not cluster-wide.
    for elsewhere in (["--namespace", namespace], ["--namespace", "default"], ["--all-namespaces"]):
        assert not can_i(cluster, sa, "list", "finetunejobs.finetune.dev", *elsewhere), elsewhere
        assert not can_i(cluster, sa, "create", "jobs.batch", *elsewhere), elsewhere
    assert not can_i(cluster, sa, "patch", "clusterkopfpeerings.kopf.dev")
    kopf_peering = cluster.kubectl("-n", other_namespace, "get", "kopfpeering", release.fullname, check=False)
    assert kopf_peering.returncode == 0, kopf_peering.stderr


def test_aggregated_roles_let_namespace_users_manage_finetunejobs(
    install: Any, cluster: Cluster, namespace: str
) -> None:
    install(namespace)
    for user, role in (("alice", "edit"), ("bob", "view"), ("carol", "admin")):
        cluster.kubectl("-n", namespace, "create", "rolebinding", f"{user}-{role}",
                        f"--clusterrole={role}", f"--user={user}")
    ns = ["--namespace", namespace]
    # The clusterrole-aggregation controller copies our rules into admin/edit/view shortly after install.
    wait_until(lambda: can_i(cluster, "alice", "create", "finetunejobs.finetune.dev", *ns), timeout=30,
               what="edit to include finetunejobs")
    wait_until(lambda: can_i(cluster, "bob", "list", "finetunejobs.finetune.dev", *ns), timeout=30,
               what="view to include finetunejobs")
    wait_until(lambda: can_i(cluster, "carol", "delete", "finetunejobs.finetune.dev", *ns), timeout=30,
               what="admin to include finetunejobs")
    assert can_i(cluster, "alice", "delete", "finetunejobs.finetune.dev", *ns)
    assert not can_i(cluster, "bob", "create", "finetunejobs.finetune.dev", *ns)
    assert not can_i(cluster, "alice", "list", "finetunejobs.finetune.dev", "--namespace", "default")


def test_upgrade_keeps_the_generated_progress_certificate(
    install: Any, helm: Helm, cluster: Cluster, namespace: str
) -> None:
    release = install(namespace)

    def certificate() -> str:
        secret = json.loads(cluster.kubectl("-n", namespace, "get", "secret", f"{release.fullname}-progress-tls",
                                            "-o", "json").stdout)
        return str(secret["data"]["tls.crt"])

    before = certificate()
    helm.run("upgrade", release.release, str(CHART), "--namespace", namespace, "--reuse-values",
             "--set", "verbose=true", kubeconfig=cluster.kubeconfig, timeout=180)
    assert certificate() == before  # `lookup` reused it: trainer pods that pinned the CA keep working
