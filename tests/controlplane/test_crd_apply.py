"""The generated CRD on the real API server: it installs, every example applies, and each CEL rule
refuses what it should with its own message, at `kubectl apply`."""

from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml

from tests.builders import job_body, with_spec
from tests.controlplane.conftest import Cluster, wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
Kubectl = Callable[..., CompletedProcess[str]]


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds" / "finetunejob.yaml"))
    wait_until(
        lambda: (
            "True"
            in cluster.kubectl(
                "get",
                "crd",
                "finetunejobs.finetune.dev",
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Established')].status}",
            ).stdout
        ),
        what="CRD established",
    )


def apply(kubectl: Kubectl, namespace: str, body: dict[str, Any], *extra: str) -> CompletedProcess[str]:
    body = {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "namespace"}}
    return kubectl("apply", "-n", namespace, *extra, "-f", "-", input=yaml.safe_dump(body), check=False)


def test_crd_dry_run_client(kubectl: Kubectl) -> None:
    proc = kubectl("apply", "--dry-run=client", "-f", str(REPO / "crds" / "finetunejob.yaml"))
    assert "finetunejobs.finetune.dev" in proc.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_applies(crd: None, kubectl: Kubectl, namespace: str, example: Path) -> None:
    for mode in ("--dry-run=client", "--dry-run=server"):
        proc = kubectl("apply", "-n", namespace, mode, "-f", str(example), check=False)
        assert proc.returncode == 0, proc.stderr
    assert kubectl("get", "ftj", "-n", namespace, "-o", "name").stdout == ""


REFUSED = [
    ("offload params without stage 3", job_body(zero=2, offload_params="cpu"), "offloadParams needs zeroStage 3"),
    (
        "offload optimizer at stage 0",
        job_body(zero=0, offload_optimizer="cpu"),
        "offloadOptimizer needs zeroStage >= 1",
    ),
    (
        "nvme offload without a path",
        with_spec("distributed.deepspeed", {"zeroStage": 3, "offloadParams": "nvme"}),
        "nvmePath is required with nvme offload",
    ),
    ("a zero stage of 4", job_body(zero=4), "zeroStage must be 0, 1, 2, 3 or 'auto'"),
    ("a zero stage that is a word", job_body(zero="most"), "zeroStage must be 0, 1, 2, 3 or 'auto'"),
    ("a name too long for its children", job_body(name="n" * 56), "at most 55 characters"),
    ("saveStrategy steps without saveSteps", with_spec("training.saveStrategy", "steps"), "saveSteps is required"),
    (
        "offloadActivations without checkpointing",
        with_spec("training", {"gradientCheckpointing": False, "offloadActivations": True}),
        "offloadActivations needs gradientCheckpointing: true",
    ),
    (
        "a cpu job without processesPerNode",
        with_spec("distributed", {"gpusPerNode": 0}),
        "processesPerNode must be set when gpusPerNode is 0",
    ),
    ("an unknown enum value", with_spec("training.mixedPrecision", "fp8"), "Unsupported value"),
    ("a typo in a field name", with_spec("training.learningRat", 0.1), "unknown field"),
]


@pytest.mark.parametrize(("body", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_cel_and_schema_refuse_at_apply(
    crd: None, kubectl: Kubectl, namespace: str, body: dict[str, Any], message: str
) -> None:
    proc = apply(kubectl, namespace, body)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_running_spec_is_immutable_except_run_policy(crd: None, kubectl: Kubectl, namespace: str) -> None:
    body = job_body(name="immutable")
    assert apply(kubectl, namespace, body).returncode == 0

    changed = job_body(name="immutable", model="meta-llama/Llama-2-13b-hf")
    refused = apply(kubectl, namespace, changed)
    assert refused.returncode != 0 and "immutable except runPolicy" in refused.stderr

    body["spec"]["runPolicy"] = {"backoffLimit": 7, "suspend": True}
    assert apply(kubectl, namespace, body).returncode == 0, "runPolicy may change while running"

    changed["spec"]["runPolicy"] = {"backoffLimit": 7, "suspend": True}
    proc = apply(kubectl, namespace, changed)
    assert proc.returncode == 0, f"a suspended job may be edited: {proc.stderr}"
