"""Property tests: any generated spec either renders a self-consistent set of files or is rejected
with InvalidSpecError naming fields; it never crashes."""

import json
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finetune_api.trainer_input import TrainerInput
from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render import render_all
from tests.builders import with_spec

MODELS = ["meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf", "builtin:tiny-llama", "acme/unknown"]
maybe = st.one_of(st.none(), st.integers(-2, 600), st.text(max_size=4), st.booleans())

specs = st.fixed_dictionaries(
    {
        "model": st.fixed_dictionaries(
            {"name": st.sampled_from(MODELS)},
            optional={
                "quantization": st.just({"quantType": "nf4"}),
                "attnImplementation": st.sampled_from(["sdpa", "eager", "flash_attention_2", "bogus"]),
            },
        ),
        "dataset": st.fixed_dictionaries(
            {"name": st.just("org/data")},
            optional={
                "splits": st.lists(st.sampled_from(["train", "test"]), max_size=3),
                "maxSeqLen": st.integers(-5, 9000),
                "packing": st.booleans(),
            },
        ),
        "training": st.fixed_dictionaries(
            {},
            optional={
                "perDeviceTrainBatchSize": st.integers(0, 64),
                "gradientAccumulationSteps": st.integers(0, 8),
                "saveStrategy": st.sampled_from(["no", "steps", "epoch"]),
                "saveSteps": maybe,
                "evalStrategy": st.sampled_from(["no", "epoch", "steps"]),
                "mixedPrecision": st.sampled_from(["no", "fp16", "bf16", "fp8"]),
                "gradientCheckpointing": st.booleans(),
            },
        ),
        "distributed": st.fixed_dictionaries(
            {},
            optional={
                "nodes": st.integers(0, 5),
                "gpusPerNode": st.integers(0, 9),
                "processesPerNode": st.integers(0, 9),
                "deepspeed": st.fixed_dictionaries(
                    {},
                    optional={
                        "zeroStage": st.sampled_from([0, 1, 2, 3, 4, "auto", "3"]),
                        "offloadOptimizer": st.sampled_from(["none", "cpu", "nvme", "gpu"]),
                        "offloadParams": st.sampled_from(["none", "cpu", "nvme"]),
                        "nvmePath": st.just("/nvme"),
                        "overrides": st.dictionaries(
                            st.sampled_from(["zero_optimization", "x"]),
                            st.dictionaries(st.just("stage"), st.integers(0, 3)),
                            max_size=1,
                        ),
                    },
                ),
            },
        ),
    }
)


def _zero_stages(rendered: Any) -> set[int]:
    stages = {rendered.plan.strategy.zero_stage, rendered.trainer.strategy.zero_stage}
    ds = rendered.accelerate.get("deepspeed_config", {})
    if "zero_stage" in ds:
        stages.add(ds["zero_stage"])
    if rendered.deepspeed is not None:
        stages.add(rendered.deepspeed["zero_optimization"]["stage"])
    if not ds:
        stages.add(0)
    return stages


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs)
def test_render_is_consistent_or_rejects(spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "prop"},
        "spec": spec,
    }
    try:
        rendered = render_all(FineTuneJob.from_body(body))
    except InvalidSpecError as exc:
        assert exc.errors and all(e.path and e.message for e in exc.errors)
        return
    job_spec = FineTuneJob.from_body(body).spec
    dist = job_spec.distributed
    per_node = dist.processes_per_node or dist.gpus_per_node
    assert rendered.accelerate["num_processes"] == dist.nodes * per_node
    assert rendered.accelerate["num_machines"] == dist.nodes
    assert rendered.trainer.strategy.num_processes == dist.nodes * per_node
    assert len(_zero_stages(rendered)) == 1, "every file names the same ZeRO stage"
    job = rendered.job["spec"]
    assert job["completions"] == job["parallelism"] == dist.nodes
    assert rendered.config_map["data"] == rendered.files
    assert TrainerInput.model_validate_json(rendered.files["trainer.json"]) == rendered.trainer
    assert yaml.safe_load(rendered.files["accelerate.yaml"]) == rendered.accelerate
    command = rendered.command
    assert command[command.index("--num_processes") + 1] == str(dist.nodes * per_node)
    assert command[command.index("--rdzv_backend") + 1] == dist.rendezvous.backend


def test_an_emoji_in_the_spec_survives_the_configmap_apply_body() -> None:
    """kubernetes_asyncio sends server-side apply bodies as json.dumps (ASCII, surrogate pairs for emoji), which
    the apiserver decodes as YAML and rejects; trainer.json escapes them itself, so the body has none."""
    rendered = render_all(FineTuneJob.from_body(with_spec("dataset.textField", "text😀é")))
    data = rendered.config_map["data"]
    assert max(ord(c) for text in data.values() for c in text) <= 0xFFFF  # so json.dumps emits no surrogate pair
    assert "\\ud83d\\ude00" in data["trainer.json"]
    assert rendered.trainer.dataset.text_field == "text😀é"
    assert TrainerInput.model_validate_json(rendered.files["trainer.json"]) == rendered.trainer
    assert json.loads(rendered.files["trainer.json"]) == json.loads(rendered.trainer.to_json())
