"""The whole product on a kind cluster: both images built, the chart installed, the tiny CPU example
trained to Succeeded for real, its adapter written, and `helm test` green.

Runs where `docker info` succeeds and `kind` is on PATH; skipped with the reason elsewhere. One command
(docs/helm.md):

    venv/bin/pytest tests/e2e/kind -m kind -s

Environment (optional): FTJOB_KIND_CLUSTER=<name> reuses an existing kind cluster and keeps it;
FTJOB_KIND_KEEP=1 keeps the cluster this suite created; FTJOB_KIND_TIMEOUT (seconds, default 1800) bounds
the training wait. helm and kubectl come from hack/cluster/build.sh's cache, else from PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.kind

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "finetune-operator"
TAG = "kind-e2e"
OPERATOR_IMAGE = f"finetune-operator/operator:{TAG}"
TRAINER_IMAGE = f"finetune-operator/trainer:{TAG}"
NAMESPACE = "finetune-system"
JOBS_NAMESPACE = "ml"
TIMEOUT = float(os.environ.get("FTJOB_KIND_TIMEOUT", "1800"))


def missing_prerequisite() -> str | None:
    """Why this suite cannot run here (every reason), or None."""
    reasons = []
    if shutil.which("docker") is None:
        reasons.append("docker is not installed")
    else:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
        if info.returncode != 0:
            detail = (info.stderr.strip().splitlines() or ["no output"])[-1][:160]
            reasons.append(f"docker has no working engine (`docker info` failed: {detail})")
    if shutil.which("kind") is None:
        reasons.append("kind is not installed (https://kind.sigs.k8s.io)")
    if not (REPO / "Dockerfile").exists():
        reasons.append("no Dockerfile at the repository root")
    return "; ".join(reasons) or None


def tool(name: str) -> str:
    """helm/kubectl from the hack/cluster cache (same releases the other tests use), else PATH."""
    proc = subprocess.run([str(REPO / "hack" / "cluster" / "build.sh"), "--print-bin"], capture_output=True, text=True)
    built = Path(proc.stdout.strip()) / name
    found = str(built) if proc.returncode == 0 and built.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not found (run hack/cluster/build.sh or install it)")
    return found


def run(
    *cmd: str, input: str | None = None, timeout: float = 1800, check: bool = True
) -> subprocess.CompletedProcess[str]:
    print(f"[kind-e2e] {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\nstdout: {proc.stdout[-5000:]}\n"
                             f"stderr: {proc.stderr[-5000:]}")
    return proc


@dataclass
class Kind:
    name: str
    kubeconfig: Path
    helm: str
    kubectl_bin: str

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args, input=input, check=check, timeout=300)

    def helm_run(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return run(self.helm, "--kubeconfig", str(self.kubeconfig), *args, timeout=timeout)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


@pytest.fixture(scope="module")
def kind_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    reason = missing_prerequisite()
    if reason:
        pytest.skip(f"kind e2e skipped: {reason}")
    reuse = os.environ.get("FTJOB_KIND_CLUSTER")
    name = reuse or "ftjob-e2e"
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    existing = run("kind", "get", "clusters").stdout.split()
    created = name not in existing
    if created:
        run("kind", "create", "cluster", "--name", name, "--wait", "120s", timeout=600)
    kubeconfig.write_text(run("kind", "get", "kubeconfig", "--name", name).stdout)
    try:
        yield Kind(name, kubeconfig, tool("helm"), tool("kubectl"))
    finally:
        if created and not reuse and os.environ.get("FTJOB_KIND_KEEP") != "1":
            run("kind", "delete", "cluster", "--name", name, check=False, timeout=300)


@pytest.fixture(scope="module")
def installed(kind_cluster: Kind) -> Kind:
    """Both images built and loaded into kind, the chart installed, the operator rolled out."""
    for target, image in (("operator", OPERATOR_IMAGE), ("trainer", TRAINER_IMAGE)):
        run("docker", "build", "--target", target, "--tag", image, str(REPO), timeout=3600)
        run("kind", "load", "docker-image", image, "--name", kind_cluster.name, timeout=900)
    kind_cluster.kubectl("create", "namespace", JOBS_NAMESPACE, check=False)
    values = {
        "image": {"repository": OPERATOR_IMAGE.split(":")[0], "tag": TAG, "pullPolicy": "Never"},
        "trainer": {"image": TRAINER_IMAGE},
        "test": {"namespace": JOBS_NAMESPACE},
    }
    values_file = kind_cluster.kubeconfig.parent / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    kind_cluster.helm_run("upgrade", "--install", "ftjob", str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                          "--values", str(values_file), "--wait", "--timeout", "10m")
    kind_cluster.kubectl("-n", NAMESPACE, "rollout", "status", "deployment/ftjob-finetune-operator", "--timeout=300s")
    return kind_cluster


def wait_phase(cluster: Kind, namespace: str, name: str, timeout: float) -> dict[str, Any]:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        status = cluster.get("-n", namespace, "finetunejob", name).get("status") or {}
        if status.get("phase") != last:
            last = status.get("phase")
            print(f"[kind-e2e] {namespace}/{name}: {last} {status.get('progress')}", file=sys.stderr, flush=True)
        if last in ("Succeeded", "Failed"):
            return status
        time.sleep(5)
    raise AssertionError(f"{namespace}/{name} not finished after {timeout:.0f}s (phase {last})")


def test_tiny_cpu_example_trains_to_succeeded_with_an_adapter(installed: Kind) -> None:
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    job["metadata"] = {"name": "tiny-cpu", "namespace": JOBS_NAMESPACE}
    job["spec"].setdefault("runPolicy", {})["ttlSecondsAfterFinished"] = 3600  # keep the pod for its log
    installed.kubectl("-n", JOBS_NAMESPACE, "delete", "finetunejob", "tiny-cpu", "--ignore-not-found", "--wait")
    installed.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    status = wait_phase(installed, JOBS_NAMESPACE, "tiny-cpu", TIMEOUT)
    pods = installed.get("-n", JOBS_NAMESPACE, "pods", "-l", "finetune.dev/job-name=tiny-cpu")["items"]
    logs = "\n".join(
        installed.kubectl("-n", JOBS_NAMESPACE, "logs", p["metadata"]["name"], "--all-containers", check=False).stdout
        for p in pods
    )
    assert status["phase"] == "Succeeded", f"status: {status}\nlogs:\n{logs[-5000:]}"
    assert "adapter written to /checkpoints/adapter" in logs, logs[-5000:]


def test_helm_test_hook_passes(installed: Kind) -> None:
    out = installed.helm_run("test", "ftjob", "--namespace", NAMESPACE, "--logs", "--timeout", "30m",
                             timeout=2400).stdout
    assert "Phase:          Succeeded" in out or "phase=Succeeded" in out, out
