"""The end-to-end tests of tests/e2e/node on a kind cluster, plus the tiny CPU example and `helm test`.

The same test functions as on the local control plane's real node (imported from
tests/e2e/node/test_finetunejob_e2e.py), with this module's `e2e_cluster`: both images built by hack/images.sh
with Docker, loaded with `kind load docker-image`, and no placement (every kind node
is real). Runs where `docker info` succeeds and `kind` is on PATH; skipped with the reason elsewhere:

    venv/bin/pytest tests/e2e/kind -m kind -s

Environment (optional): FTJOB_KIND_CLUSTER=<name> reuses an existing kind cluster and keeps it;
FTJOB_KIND_KEEP=1 keeps the cluster this suite created; FTJOB_E2E_TIMEOUT_SCALE multiplies every wait.
helm and kubectl come from hack/cluster/build.sh's cache, else from PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.e2e.node.product import (
    ADAPTER_WRITTEN,
    REPO,
    TIMEOUT_SCALE,
    FineTuneJobs,
    Image,
    Placement,
    ProductCluster,
    Release,
    fake_hub,
    ftjob,
    operator_release,
)
from tests.e2e.node.test_finetunejob_e2e import (
    test_deleted_trainer_pod_restarts_the_gang_from_the_newest_checkpoint,
    test_operator_runs_in_a_pod_under_the_charts_service_account,
    test_permanent_error_fails_after_one_attempt_without_elastic_retries,
    test_sigkilled_training_process_is_restarted_in_its_pod_by_torch_elastic,
    test_sigterm_saves_a_checkpoint_that_the_next_attempt_resumes_from,
    test_two_node_job_trains_reports_progress_and_pushes_the_adapter,
)

__all__ = [  # fixtures and test functions shared with tests/e2e/node, collected here by name
    "fake_hub",
    "ftjob",
    "operator_release",
    "test_deleted_trainer_pod_restarts_the_gang_from_the_newest_checkpoint",
    "test_operator_runs_in_a_pod_under_the_charts_service_account",
    "test_permanent_error_fails_after_one_attempt_without_elastic_retries",
    "test_sigkilled_training_process_is_restarted_in_its_pod_by_torch_elastic",
    "test_sigterm_saves_a_checkpoint_that_the_next_attempt_resumes_from",
    "test_two_node_job_trains_reports_progress_and_pushes_the_adapter",
]

pytestmark = [pytest.mark.kind, pytest.mark.timeout(7200)]

TAG = "kind-e2e"
OPERATOR_IMAGE = Image("finetune-operator/operator", TAG)
TRAINER_IMAGE = Image("finetune-operator/trainer", TAG)


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


def tool(name: str) -> Path:
    """helm/kubectl from the hack/cluster cache (same releases the other tests use), else PATH."""
    proc = subprocess.run([str(REPO / "hack" / "cluster" / "build.sh"), "--print-bin"], capture_output=True, text=True)
    built = Path(proc.stdout.strip()) / name
    found = str(built) if proc.returncode == 0 and built.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not found (run hack/cluster/build.sh or install it)")
    return Path(found)


def run(*cmd: str, timeout: float = 1800, check: bool = True) -> subprocess.CompletedProcess[str]:
    print(f"[kind-e2e] {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\nstdout: {proc.stdout[-5000:]}\n"
                             f"stderr: {proc.stderr[-5000:]}")
    return proc


@dataclass
class KindCluster:
    name: str
    kubeconfig: Path


@pytest.fixture(scope="module")
def kind_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindCluster]:
    """A kind cluster (made here unless FTJOB_KIND_CLUSTER names one); skipped, with why, without Docker/kind."""
    reason = missing_prerequisite()
    if reason:
        pytest.skip(f"kind e2e skipped: {reason}")
    reuse = os.environ.get("FTJOB_KIND_CLUSTER")
    name = reuse or "ftjob-e2e"
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    created = name not in run("kind", "get", "clusters").stdout.split()
    if created:
        run("kind", "create", "cluster", "--name", name, "--wait", "120s", timeout=600)
    kubeconfig.write_text(run("kind", "get", "kubeconfig", "--name", name).stdout)
    try:
        yield KindCluster(name, kubeconfig)
    finally:
        if created and not reuse and os.environ.get("FTJOB_KIND_KEEP") != "1":
            run("kind", "delete", "cluster", "--name", name, check=False, timeout=300)


@pytest.fixture(scope="module")
def e2e_cluster(kind_cluster: KindCluster) -> ProductCluster:
    """Both images built from this checkout by hack/images.sh with Docker (the targets, build arguments and
    content check of `make images`), loaded into the kind nodes; no placement needed."""
    run("env", f"FTJOB_IMAGE_REPO={OPERATOR_IMAGE.repository.rsplit('/', 1)[0]}", f"FTJOB_IMAGE_TAG={TAG}",
        str(REPO / "hack" / "images.sh"), "--builder", "docker", "--no-load", "operator", "trainer", timeout=3600)
    for image in (OPERATOR_IMAGE, TRAINER_IMAGE):
        run("kind", "load", "docker-image", image.ref, "--name", kind_cluster.name, timeout=900)
    return ProductCluster(
        description=f"kind cluster {kind_cluster.name}",
        kubeconfig=kind_cluster.kubeconfig,
        kubectl_bin=tool("kubectl"),
        helm_bin=tool("helm"),
        operator_image=OPERATOR_IMAGE,
        trainer_image=TRAINER_IMAGE,
        placement=Placement(),
    )


def test_tiny_cpu_example_trains_to_succeeded_with_an_adapter(ftjob: FineTuneJobs) -> None:
    """examples/tiny-cpu.yaml as it is (one pod, two processes, emptyDir checkpoints)."""
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    job["spec"].setdefault("runPolicy", {})["ttlSecondsAfterFinished"] = 3600  # keep the pod for its log
    run_ = ftjob.create(job)
    run_.wait_phase("Succeeded", timeout=1800)
    rank0 = run_.logs.of(attempt=1, index=0)
    assert ADAPTER_WRITTEN.search(rank0), rank0[-5000:]


def test_helm_test_hook_passes(operator_release: Release) -> None:
    out = operator_release.cluster.helm("test", operator_release.name, "--namespace", operator_release.namespace,
                                        "--logs", "--timeout", f"{int(1800 * TIMEOUT_SCALE)}s",
                                        timeout=2400 * TIMEOUT_SCALE).stdout
    assert "Phase:          Succeeded" in out or "phase=Succeeded" in out, out
