"""Bad input is rejected with the field path and the rule, all problems at once, by `ftjob render` too."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.cli import EXIT_INVALID, main
from finetune_operator.render import render_all
from tests.builders import job_body, with_spec

INVALID = [
    (
        "offload params without stage 3 is rejected",
        job_body(zero=2, offload_params="cpu"),
        "spec.distributed.deepspeed.offloadParams",
        "needs zeroStage 3; set zeroStage: 3 or offloadParams: none",
    ),
    (
        "offload optimizer with stage 0 is rejected",
        job_body(zero=0, offload_optimizer="cpu"),
        "spec.distributed.deepspeed.offloadOptimizer",
        "needs zeroStage >= 1",
    ),
    (
        "nvme offload without a path is rejected",
        with_spec("distributed.deepspeed", {"zeroStage": 3, "offloadParams": "nvme"}),
        "spec.distributed.deepspeed.nvmePath",
        "is required with nvme offload",
    ),
    (
        "a zero stage of 4 is rejected",
        job_body(zero=4),
        "spec.distributed.deepspeed.zeroStage",
        "zeroStage must be 0, 1, 2, 3 or 'auto'",
    ),
    (
        "an unknown field is rejected as a typo",
        with_spec("training.learningRat", 1e-4),
        "spec.training.learningRat",
        "unknown field",
    ),
    (
        "a negative learning rate is rejected",
        with_spec("training.learningRate", -1.0),
        "spec.training.learningRate",
        "greater than 0",
    ),
    (
        "a name too long for child DNS labels is rejected",
        job_body(name="x" * 60),
        "metadata.name",
        "at most 55 characters so every child's name stays a valid DNS label",
    ),
    (
        "a cpu job without processesPerNode is rejected",
        job_body(gpus=0),
        "spec.distributed.processesPerNode",
        "must be set when gpusPerNode is 0",
    ),
    (
        "qlora on cpu is rejected",
        job_body(gpus=0, qlora=True, distributed={"gpusPerNode": 0, "processesPerNode": 1}),
        "spec.model.quantization",
        "needs GPUs",
    ),
    (
        "saveStrategy steps without saveSteps is rejected",
        with_spec("training.saveStrategy", "steps"),
        "spec.training.saveSteps",
        "is required",
    ),
    (
        "offloading activations without checkpointing is rejected",
        with_spec("training", {"gradientCheckpointing": False, "offloadActivations": True}),
        "spec.training.offloadActivations",
        "needs gradientCheckpointing: true",
    ),
    (
        "evaluation without an eval split is rejected",
        with_spec("dataset.splits", ["train"]),
        "spec.dataset.splits",
        "needs an eval split",
    ),
    (
        "a reserved env var is rejected",
        with_spec("template.env", [{"name": "HF_TOKEN", "value": "x"}]),
        "spec.template.env[0].name",
        "is set by the operator",
    ),
    (
        "a hub repo without org is rejected",
        with_spec("output", {"hub": {"repoId": "noslash", "tokenSecretRef": {"name": "s"}}}),
        "spec.output.hub.repoId",
        "String should match pattern",
    ),
    (
        "auto on an unknown model without shape is rejected",
        job_body(zero="auto", model="acme/secret-model"),
        "spec.distributed.deepspeed.zeroStage",
        "not a known model",
    ),
    (
        "auto that cannot fit is rejected",
        job_body(
            zero="auto",
            model="meta-llama/Llama-2-70b-hf",
            gpus=1,
            distributed={"nodes": 1, "gpusPerNode": 1, "gpuMemoryGiB": 4, "deepspeed": {"zeroStage": "auto"}},
        ),
        "spec.distributed",
        "no ZeRO strategy fits 4 GiB",
    ),
    (
        "an override of the zero stage is rejected",
        job_body(overrides={"zero_optimization": {"stage": 0}}),
        "spec.distributed.deepspeed.overrides.zero_optimization.stage",
        "use zeroStage instead",
    ),
    (
        "both checkpoint volumes are rejected",
        with_spec("output", {"checkpoints": {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "c"}}}),
        "spec.output.checkpoints",
        "exactly one",
    ),
]


def _errors(body: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidSpecError) as info:
        render_all(FineTuneJob.from_body(body))
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize(("body", "path", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_spec_names_the_field_and_the_rule(body: dict[str, Any], path: str, message: str) -> None:
    errors = _errors(body)
    assert any(e.startswith(f"{path}:") and message in e for e in errors), errors


@pytest.mark.parametrize(("body", "path", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_ftjob_render_exits_2_with_the_message(
    body: dict[str, Any], path: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(body))
    assert main(["render", str(job_file), "--out", str(tmp_path / "out")]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert path in err and message in err
    assert not (tmp_path / "out").exists(), "nothing is written for an invalid spec"


def test_all_problems_are_reported_at_once() -> None:
    body = job_body(zero=0, offload_optimizer="cpu", offload_params="cpu")
    body["spec"]["training"]["saveStrategy"] = "steps"
    paths = {e.split(":")[0] for e in _errors(body)}
    assert paths == {
        "spec.distributed.deepspeed.offloadParams",
        "spec.distributed.deepspeed.offloadOptimizer",
        "spec.training.saveSteps",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [("kind: Pod\n", "holds no document of kind FineTuneJob"), ("a: [unclosed\n", "not valid YAML")],
    ids=["a file without a FineTuneJob", "a file that is not YAML"],
)
def test_unreadable_job_files_exit_2(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(text)
    assert main(["render", str(job_file), "--out", str(tmp_path / "out")]) == EXIT_INVALID
    assert message in capsys.readouterr().err
