"""Fixtures for the Helm chart tests: the helm binary, rendering, and the control-plane fixtures.

``helm`` (session) is the helm built by ``hack/cluster/build.sh`` (same cache as kubectl and the
apiserver), else a ``helm`` on PATH; when neither exists it runs ``build.sh``, or skips with a reason
under ``FTJOB_SKIP_CLUSTER_BUILD=1``. Pure tests (lint, template, snapshot) need only that binary;
tests marked ``controlplane`` also use ``cluster``/``namespace`` from tests/controlplane/conftest.py,
re-exported here so both directories share one session cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane.conftest import HACK, REPO, Cluster, cluster, kubectl, namespace, wait_until

__all__ = ["CHART", "REPO", "Cluster", "Helm", "cluster", "kubectl", "namespace", "wait_until"]

CHART = REPO / "charts" / "finetune-operator"


@dataclass
class Helm:
    """The helm binary plus the two calls the tests make most."""

    binary: Path

    def run(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "HELM_CACHE_HOME": "/tmp/ftjob-helm/cache", "HELM_CONFIG_HOME": "/tmp/ftjob-helm/config",
               "HELM_DATA_HOME": "/tmp/ftjob-helm/data"}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        proc = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def template(
        self, *, values: dict[str, Any] | None = None, release: str = "ftjob", namespace: str = "finetune-system",
        extra: Sequence[str] = (),
    ) -> str:
        """`helm template` of the chart with `values` (as a values file), returning the YAML text."""
        args = ["template", release, str(CHART), "--namespace", namespace, *extra]
        if values:
            args += ["--values", "-"]
            return self._with_stdin(args, yaml.safe_dump(values))
        return self.run(*args).stdout

    def _with_stdin(self, args: list[str], text: str) -> str:
        proc = subprocess.run([str(self.binary), *args], input=text, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}\nstderr: {proc.stderr}")
        return proc.stdout


def documents(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a helm output."""
    return [d for d in yaml.safe_load_all(text) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def _find_helm() -> Path | None:
    proc = subprocess.run([str(HACK / "build.sh"), "--print-bin"], capture_output=True, text=True, check=True)
    built = Path(proc.stdout.strip()) / "helm"
    if built.exists():
        return built
    on_path = shutil.which("helm")
    return Path(on_path) if on_path else None


@pytest.fixture(scope="session")
def helm() -> Helm:
    binary = _find_helm()
    if binary is None:
        if os.environ.get("FTJOB_SKIP_CLUSTER_BUILD") == "1":
            pytest.skip("no helm binary (hack/cluster/build.sh not run) and FTJOB_SKIP_CLUSTER_BUILD=1")
        subprocess.run([str(HACK / "build.sh")], cwd=REPO, check=True)
        binary = _find_helm()
        assert binary is not None, "hack/cluster/build.sh did not produce helm"
    return Helm(binary)


def release_name() -> str:
    return f"ft{uuid.uuid4().hex[:6]}"


def apply_chart_crds(cluster: Cluster) -> None:
    """Install the chart's CRDs (what `helm install` does first), as the dry run needs them."""
    for crd in sorted((CHART / "crds").glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=chart-tests", "-f", str(crd))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/finetunejobs.finetune.dev", "crd/clusterkopfpeerings.kopf.dev", "crd/kopfpeerings.kopf.dev")


def can_i(cluster: Cluster, user: str, *args: str) -> bool:
    """`kubectl auth can-i ARGS --as USER`: the API server's own authorization answer."""
    proc = cluster.kubectl("auth", "can-i", *args, "--as", user, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl auth can-i {args}: {proc.stdout} {proc.stderr}"
    return answer == "yes"


class Installed:
    """A release of the chart installed into `namespace`; uninstalled when the test ends."""

    def __init__(self, helm: Helm, cluster: Cluster, namespace: str, values: dict[str, Any], tmp: Path) -> None:
        self.helm, self.cluster, self.namespace = helm, cluster, namespace
        self.release = release_name()
        self.fullname = f"{self.release}-finetune-operator"
        self.sa = f"system:serviceaccount:{namespace}:{self.fullname}"
        values_file = tmp / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        helm.run("install", self.release, str(CHART), "--namespace", namespace, "--values", str(values_file),
                 kubeconfig=cluster.kubeconfig, timeout=180)

    def uninstall(self) -> None:
        self.helm.run("uninstall", self.release, "--namespace", self.namespace, "--wait",
                      kubeconfig=self.cluster.kubeconfig, check=False, timeout=180)


@pytest.fixture
def install(helm: Helm, cluster: Cluster, tmp_path: Path) -> Iterator[Any]:
    releases: list[Installed] = []

    def _install(namespace: str, values: dict[str, Any] | None = None) -> Installed:
        release = Installed(helm, cluster, namespace, values or {}, tmp_path)
        releases.append(release)
        return release

    yield _install
    for release in releases:
        release.uninstall()


@pytest.fixture
def other_namespace(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A second fresh namespace (the `namespace` fixture gives one)."""
    name = f"{namespace[:50]}-w"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Record each phase's report on the item (`item.rep_call`), so fixtures can tell a failed test."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
