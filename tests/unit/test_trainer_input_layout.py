"""trainer.json is the spec's own sections (resolved), the operator's decisions in `strategy`, and no secrets.

The sections are the API's models, so a spec option reaches the trainer with no edit in the renderer; these tests
hold that true for every field the API has now and any it gains later.
"""

from typing import Any

import pytest

from finetune_api.trainer_input import TrainerInput
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.spec import AdapterSpec, DatasetSpec, TrainingSpec
from finetune_operator.cli import load_job
from finetune_operator.render import render_all
from tests.builders import job, job_body

SECRETS = {
    "model.tokenSecretRef": {"name": "hf-read", "key": "token"},
    "output.hub": {"repoId": "org/adapter", "tokenSecretRef": {"name": "hf-write"}},
}


def _with(body: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any]:
    """`body` with each dotted camelCase spec path set to its value."""
    for path, value in updates.items():
        node = body["spec"]
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return body


def test_the_sections_are_the_specs_own_models_with_defaults_filled_in() -> None:
    ftj = load_job("examples/llama-70b-qlora-zero3.yaml")
    spec, trainer = ftj.spec, render_all(ftj).trainer
    assert trainer.dataset == spec.dataset and type(trainer.dataset) is DatasetSpec
    assert trainer.adapter == spec.adapter and type(trainer.adapter) is AdapterSpec
    assert trainer.training == spec.training and type(trainer.training) is TrainingSpec
    assert trainer.model.to_dict() == spec.model.to_dict(exclude={"token_secret_ref"})
    assert trainer.output.hub is not None and spec.output.hub is not None
    assert trainer.output.hub.to_dict() == spec.output.hub.to_dict(exclude={"token_secret_ref"})
    written = TrainerInput.model_validate_json(render_all(ftj).files["trainer.json"])
    assert written.to_dict()["training"] == spec.training.to_dict()  # camelCase, every default written out


def test_every_training_field_reaches_trainer_json_under_its_api_name() -> None:
    """What makes a new training option two edits: no renderer line names a field."""
    training = render_all(job()).trainer.to_dict()["training"]
    api_names = {field.alias or name for name, field in TrainingSpec.model_fields.items()}
    assert set(training) == api_names


def test_no_secret_reference_reaches_the_trainer() -> None:
    files = render_all(FineTuneJob.from_body(_with(job_body(), SECRETS))).files
    assert "tokenSecretRef" not in files["trainer.json"]
    assert "hf-read" not in files["trainer.json"] and "hf-write" not in files["trainer.json"]


def test_a_token_secret_ref_in_trainer_json_is_rejected() -> None:
    """The trainer's model and hub sections have no such field: a hand-written one is a typo, not a channel."""
    raw = render_all(FineTuneJob.from_body(_with(job_body(), SECRETS))).trainer.to_dict()
    raw["model"]["tokenSecretRef"] = {"name": "hf-read"}
    with pytest.raises(ValueError, match=r"model\.tokenSecretRef"):
        TrainerInput.model_validate(raw)


@pytest.mark.parametrize(
    ("spec", "dtype"),
    [
        ({"training.mixedPrecision": "bf16"}, "bfloat16"),
        ({"training.mixedPrecision": "fp16"}, "float16"),
        ({"training.mixedPrecision": "no"}, "float32"),
        ({"model.quantization": {"storageDtype": "float16"}, "training.mixedPrecision": "bf16"}, "float16"),
        ({"model.quantization": {}, "training.mixedPrecision": "no"}, "bfloat16"),
    ],
    ids=[
        "bf16 mixed precision loads the model in bfloat16",
        "fp16 mixed precision loads it in float16",
        "no mixed precision loads it in float32",
        "QLoRA loads it in the 4-bit storage dtype, whatever the precision",
        "QLoRA's default storage dtype is bfloat16",
    ],
)
def test_strategy_dtype_is_decided_from_quantization_and_mixed_precision(spec: dict[str, Any], dtype: str) -> None:
    body = _with(job_body(), spec)
    assert render_all(FineTuneJob.from_body(body)).trainer.strategy.dtype == dtype


def test_strategy_carries_the_planners_zero_stage_and_the_topology() -> None:
    rendered = render_all(job(zero="auto", nodes=2, gpus=8))
    strategy = rendered.trainer.strategy
    assert (strategy.zero_stage, strategy.num_machines, strategy.num_processes, strategy.use_cpu) == (
        rendered.plan.strategy.zero_stage,
        2,
        16,
        False,
    )
