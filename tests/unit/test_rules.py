"""Each rule between fields is one table entry, and the CRD's CEL is exactly the CEL side of the tables.

(1) Every CEL rule of the generated CRD is a table entry at the same path, with the same message and reason,
and every table entry is in the CRD. (2) Every entry fires somewhere in `RULE_CASES`, at its path with its
message, through `check_job` (or the parse, for a value rule), so a new rule needs a case; the control-plane
half (tests/controlplane/test_crd_apply.py) applies the same cases to a real API server and compares its
answers with `check_job`'s. (3) The machinery: transition rules, value rules, and tables of subclasses.
"""

import re
import types
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

from finetune_api.v1alpha1.errors import FieldError, InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.rules import Reason, ValueRule, rule, rules_of, transition_violations, violations
from finetune_api.v1alpha1.spec import (
    FP8_NEEDS_BF16,
    FP8_NEEDS_GPUS,
    FP8_NO_MERGE,
    FP8_NO_QUANTIZATION,
    FP8_NO_ZERO3,
    OFFLOAD_NEEDS_CHECKPOINTING,
    AdapterSpec,
    DeepSpeedSpec,
)
from finetune_operator.crd import build_crd
from finetune_operator.validation import check_job
from tests.builders import job_body, with_spec


@dataclass(frozen=True)
class Entry:
    """A table entry or a CRD rule where it applies: `path` is a schema path (`spec.template.tolerations[]`)."""

    path: str
    cel: str
    message: str
    reason: Reason | None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _type_entries(annotation: Any, path: str) -> list[Entry]:
    """The entries of the models and value rules inside one field's type."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return table_entries(annotation, path)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        own = [Entry(path, m.cel, m.message, m.reason) for m in args[1:] if isinstance(m, ValueRule)]
        return own + _type_entries(args[0], path)
    if origin is list:
        return _type_entries(args[0], f"{path}[]")
    if origin is dict:
        return _type_entries(args[1], f"{path}{{}}")
    if origin in (Union, types.UnionType):
        return [entry for arg in args for entry in _type_entries(arg, path)]
    return []


def table_entries(model: type[BaseModel], path: str = "") -> list[Entry]:
    """Every table entry reachable from `model`, each at the schema path where the API server reports it."""
    found = [Entry(e.path(path), e.cel, e.message, e.reason) for e in rules_of(model)]
    for name, info in model.model_fields.items():
        here = _join(path, info.alias or name)
        found += [Entry(here, m.cel, m.message, m.reason) for m in info.metadata if isinstance(m, ValueRule)]
        found += _type_entries(info.annotation, here)
    return found


def crd_entries(node: dict[str, Any], path: str = "") -> list[Entry]:
    """Every `x-kubernetes-validations` rule of a CRD schema, at the path where the API server reports it."""
    found = []
    for v in node.get("x-kubernetes-validations", []):
        field = v.get("fieldPath", "")
        at = f"{path}{field}" if path else field.removeprefix(".")
        found.append(Entry(at, v["rule"], v["message"], v.get("reason")))
    for name, child in node.get("properties", {}).items():
        found += crd_entries(child, _join(path, name))
    if isinstance(node.get("items"), dict):
        found += crd_entries(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        found += crd_entries(node["additionalProperties"], f"{path}{{}}")
    for branch in [*node.get("anyOf", []), *node.get("oneOf", [])]:
        found += crd_entries(branch, path)
    return found


TABLE = table_entries(FineTuneJob)
MESSAGES = {entry.message: entry for entry in TABLE}


def schema_path(path: str) -> str:
    """`spec.template.tolerations[2]` -> `spec.template.tolerations[]`."""
    return re.sub(r"\[[^\]]*\]", "[]", path)


def table_findings(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, message) of each table entry `check_job` finds broken in a manifest, value rules included (the
    parse reports those); the other errors are dropped."""
    try:
        errors = check_job(FineTuneJob.from_body(body))
    except InvalidSpecError as exc:
        errors = exc.errors
    return sorted((e.path, e.message) for e in errors if e.message in MESSAGES)


def _with_deepspeed(**deepspeed: Any) -> dict[str, Any]:
    body = job_body()
    body["spec"]["distributed"]["deepspeed"] = deepspeed
    return body


def _cpu(**distributed: Any) -> dict[str, Any]:
    return with_spec("distributed", {"gpusPerNode": 0, **distributed})


RULE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("a name too long for its children", job_body(name="n" * 56)),
    ("a name just short enough", job_body(name="n" * 55)),
    ("params offloaded at zero stage 2", job_body(zero=2, offload_params="cpu")),
    ("params offloaded at zero stage auto", job_body(zero="auto", offload_params="cpu")),
    ("the optimizer offloaded at zero stage 0", job_body(zero=0, offload_optimizer="cpu")),
    ("the optimizer offloaded with no zero stage written (3)", _with_deepspeed(offloadOptimizer="cpu")),
    ("nvme offload without a path", _with_deepspeed(offloadParams="nvme")),
    ("nvme offload with an empty path", _with_deepspeed(offloadOptimizer="nvme", nvmePath="")),
    ("nvme offload with a null path", _with_deepspeed(offloadOptimizer="nvme", nvmePath=None)),
    ("nvme offload with a path", _with_deepspeed(offloadOptimizer="nvme", nvmePath="/nvme")),
    ("a zero stage of 4", job_body(zero=4)),
    ("a zero stage of -1", job_body(zero=-1)),
    ("a zero stage that is a word", job_body(zero="most")),
    ("saveStrategy steps without saveSteps", with_spec("training.saveStrategy", "steps")),
    ("saveStrategy steps with null saveSteps", with_spec("training", {"saveStrategy": "steps", "saveSteps": None})),
    ("saveStrategy steps with saveSteps", with_spec("training", {"saveStrategy": "steps", "saveSteps": 10})),
    (
        "activations offloaded without checkpointing",
        with_spec("training", {"gradientCheckpointing": False, "offloadActivations": True}),
    ),
    ("activations offloaded with checkpointing by default", with_spec("training", {"offloadActivations": True})),
    ("a warm-up as both a ratio and steps", with_spec("training", {"warmupRatio": 0.03, "warmupSteps": 10})),
    ("a warm-up ratio with warmupSteps 0", with_spec("training", {"warmupRatio": 0.03, "warmupSteps": 0})),
    ("a null warm-up ratio with steps", with_spec("training", {"warmupRatio": None, "warmupSteps": 10})),
    ("a CPU job without processesPerNode", _cpu()),
    ("a CPU job with processesPerNode", _cpu(processesPerNode=2)),
    ("distributed with no gpusPerNode written (8)", with_spec("distributed", {"nodes": 2})),
    ("QLoRA with an adapter whose type is not written", job_body(qlora=True, adapter={"r": 16})),
    ("a reserved label key", with_spec("template.labels", {"finetune.dev/job-name": "other"})),
    ("the Job controller's label", with_spec("template.labels", {"batch.kubernetes.io/job-name": "x", "team": "a"})),
    ("labels of one's own", with_spec("template.labels", {"team.example.com/owner": "nlp"})),
    (
        "a toleration of every taint, second in the list",
        with_spec("template.tolerations", [{"key": "nvidia.com/gpu", "operator": "Exists"}, {"operator": "Exists"}]),
    ),
    (
        "a toleration with a null key and Exists",
        with_spec("template.tolerations", [{"key": None, "operator": "Exists"}]),
    ),
    ("a toleration with an empty key and Equal", with_spec("template.tolerations", [{"key": "", "value": "x"}])),
    ("fp8 with ZeRO-3 written", with_spec("training.precision", "fp8")),
    ("fp8 with no zero stage written (3)", with_spec("training.precision", "fp8", distributed={"gpusPerNode": 8})),
    ("fp8 at zero stage 2", with_spec("training.precision", "fp8", zero=2)),
    ("fp8 at zero stage auto", with_spec("training.precision", "fp8", zero="auto")),
    ("fp8 without ZeRO (0)", with_spec("training.precision", "fp8", zero=0)),
    ("the default precision at ZeRO-3", with_spec("training.precision", "default")),
    ("fp8 with fp16", with_spec("training", {"precision": "fp8", "mixedPrecision": "fp16"}, zero=2)),
    ("fp8 with mixedPrecision no", with_spec("training", {"precision": "fp8", "mixedPrecision": "no"}, zero=2)),
    ("fp8 with bf16 written", with_spec("training", {"precision": "fp8", "mixedPrecision": "bf16"}, zero=2)),
    ("fp8 merging the adapter", with_spec("training", {"precision": "fp8", "mergeAdapter": True}, zero=1)),
    ("fp8 not merging the adapter", with_spec("training", {"precision": "fp8", "mergeAdapter": False}, zero=1)),
    ("fp8 with a 4-bit base", with_spec("training.precision", "fp8", zero=2, qlora=True)),
    (
        "fp8 on a CPU",
        with_spec(
            "training.precision",
            "fp8",
            distributed={"gpusPerNode": 0, "processesPerNode": 1, "deepspeed": {"zeroStage": 0}},
        ),
    ),
    (
        "fp8 with every problem at once",
        with_spec(
            "training",
            {"precision": "fp8", "mixedPrecision": "fp16", "mergeAdapter": True},
            qlora=True,
            distributed={"gpusPerNode": 0, "processesPerNode": 2},
        ),
    ),
    (
        "several rules at once",
        with_spec(
            "training",
            {"saveStrategy": "steps"},
            name="x" * 60,
            distributed={"deepspeed": {"zeroStage": 0, "offloadOptimizer": "nvme"}},
        ),
    ),
]
"""Specs at the edges of each table entry: absent, null and empty values (CEL reads them as written, Python
as the model's defaults), list items other than the first, and several violations in one spec."""

UNREACHABLE = {
    "model.quantization (QLoRA) needs a LoRA adapter (adapter.type: lora)": "adapter.type has one value, lora",
    "the spec of a running job is immutable except runPolicy; set runPolicy.suspend: true first": "a transition",
}
"""Entries no single manifest can break, each with the reason; tested below by other means."""


def test_every_cel_rule_in_the_crd_is_a_table_entry_and_back() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    in_crd = sorted(crd_entries(schema), key=repr)
    assert in_crd == sorted(TABLE, key=repr)
    assert {e.path for e in TABLE} >= {"metadata.name", "spec", "spec.template.tolerations[]", "spec.template.labels"}


def test_messages_are_unique_so_a_message_names_its_rule() -> None:
    assert len(MESSAGES) == len(TABLE)


def test_the_unreachable_entries_are_entries() -> None:
    assert set(UNREACHABLE) <= set(MESSAGES)


REACHABLE = [entry for entry in TABLE if entry.message not in UNREACHABLE]


@pytest.mark.parametrize("entry", REACHABLE, ids=[e.message[:60] for e in REACHABLE])
def test_every_entry_fires_at_its_path_for_some_case(entry: Entry) -> None:
    fired = {
        schema_path(path)
        for _, body in RULE_CASES
        for path, message in table_findings(body)
        if message == entry.message
    }
    assert fired == {entry.path}


CASE_FINDINGS = {
    "a name too long for its children": [
        ("metadata.name", "metadata.name must be at most 55 characters so every child's name stays a valid DNS label")
    ],
    "the optimizer offloaded with no zero stage written (3)": [],
    "nvme offload with a null path": [
        (
            "spec.distributed.deepspeed.nvmePath",
            "distributed.deepspeed.nvmePath is required with nvme offload; set it to a local NVMe mount",
        )
    ],
    "a zero stage that is a word": [("spec.distributed.deepspeed.zeroStage", "zeroStage must be 0, 1, 2, 3 or 'auto'")],
    "a toleration of every taint, second in the list": [
        (
            "spec.template.tolerations[1]",
            "an empty key with operator Exists tolerates every taint (control-plane and node-problem taints "
            "included); name the taint's key",
        )
    ],
    "fp8 with no zero stage written (3)": [("spec.training.precision", FP8_NO_ZERO3)],
    "fp8 at zero stage 2": [],
    "fp8 at zero stage auto": [],
    "fp8 without ZeRO (0)": [],
    "the default precision at ZeRO-3": [],
    "fp8 with mixedPrecision no": [("spec.training.precision", FP8_NEEDS_BF16)],
    "fp8 with bf16 written": [],
    "fp8 merging the adapter": [("spec.training.precision", FP8_NO_MERGE)],
    "fp8 not merging the adapter": [],
    "fp8 with a 4-bit base": [("spec.training.precision", FP8_NO_QUANTIZATION)],
    "fp8 on a CPU": [("spec.training.precision", FP8_NEEDS_GPUS)],
    "fp8 with every problem at once": sorted(
        ("spec.training.precision", m)
        for m in (FP8_NEEDS_BF16, FP8_NO_MERGE, FP8_NO_QUANTIZATION, FP8_NO_ZERO3, FP8_NEEDS_GPUS)
    ),
    "several rules at once": [
        ("metadata.name", "metadata.name must be at most 55 characters so every child's name stays a valid DNS label"),
        (
            "spec.distributed.deepspeed.nvmePath",
            "distributed.deepspeed.nvmePath is required with nvme offload; set it to a local NVMe mount",
        ),
        (
            "spec.distributed.deepspeed.offloadOptimizer",
            "distributed.deepspeed.offloadOptimizer needs zeroStage >= 1; set zeroStage: 1, 2 or 3, or "
            "offloadOptimizer: none",
        ),
        ("spec.training.saveSteps", "training.saveSteps is required with saveStrategy: steps"),
    ],
}


@pytest.mark.parametrize("name", CASE_FINDINGS)
def test_check_job_reports_each_broken_entry_once_with_its_path_and_message(name: str) -> None:
    body = dict(RULE_CASES)[name]
    assert table_findings(body) == CASE_FINDINGS[name]


def test_a_spec_within_every_rule_breaks_none() -> None:
    assert violations(FineTuneJob.from_body(job_body())) == []


def test_qlora_needs_lora_in_python_too() -> None:
    """No manifest reaches this entry today (adapter.type allows only lora); a model built past validation does."""
    spec = FineTuneJob.from_body(job_body(qlora=True)).spec
    other = spec.model_copy(update={"adapter": AdapterSpec.model_construct(type="dora")})
    assert violations(other, "spec") == [
        FieldError("spec.model.quantization", "model.quantization (QLoRA) needs a LoRA adapter (adapter.type: lora)")
    ]
    assert violations(spec, "spec") == []


IMMUTABLE = "the spec of a running job is immutable except runPolicy; set runPolicy.suspend: true first"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (job_body(), job_body(model="meta-llama/Llama-2-13b-hf"), [FieldError("spec", IMMUTABLE)]),
        (job_body(), with_spec("runPolicy", {"backoffLimit": 7}), []),
        (job_body(), with_spec("training.learningRate", 1e-4), [FieldError("spec", IMMUTABLE)]),
        (job_body(), with_spec("template", {}), [FieldError("spec", IMMUTABLE)]),
        (with_spec("runPolicy", {"suspend": True}), job_body(model="meta-llama/Llama-2-13b-hf"), []),
        (
            with_spec("runPolicy", {"suspend": False}),
            with_spec("dataset.packing", False),
            [FieldError("spec", IMMUTABLE)],
        ),
    ],
    ids=[
        "another model while running",
        "runPolicy while running",
        "a default written out while running (CEL compares the object as written)",
        "an empty template added while running",
        "another model while suspended",
        "a dataset change while explicitly not suspended",
    ],
)
def test_the_transition_rule_compares_the_spec_as_written(
    old: dict[str, Any], new: dict[str, Any], expected: list[FieldError]
) -> None:
    assert transition_violations(FineTuneJob.from_body(new), FineTuneJob.from_body(old)) == expected
    assert check_job(FineTuneJob.from_body(new)) == [], "check_job sees no old version"


def test_a_value_rule_says_its_message_where_pydantic_parses_the_value() -> None:
    for bad in (7, -1, "most", True, 2.0):
        with pytest.raises(ValidationError) as info:
            DeepSpeedSpec.model_validate({"zeroStage": bad})
        assert InvalidSpecError.from_pydantic(info.value, prefix="spec.distributed.deepspeed").errors == [
            FieldError("spec.distributed.deepspeed.zeroStage", "zeroStage must be 0, 1, 2, 3 or 'auto'")
        ], bad
    assert [DeepSpeedSpec.model_validate({"zeroStage": ok}).zero_stage for ok in (0, 3, "auto")] == [0, 3, "auto"]


def test_a_value_rule_adds_its_cel_to_the_type_schema() -> None:
    even = ValueRule("self % 2 == 0", lambda n: isinstance(n, int) and n % 2 == 0, "must be even")

    class Model(BaseModel):
        n: Annotated[int, even] = 0

    assert Model.model_json_schema()["properties"]["n"]["x-kubernetes-validations"] == [
        {"rule": "self % 2 == 0", "message": "must be even"}
    ]
    with pytest.raises(ValidationError, match="must be even"):
        Model(n=3)


def test_a_subclass_extends_its_base_table() -> None:
    class Base(BaseModel):
        a: int = 0

        @rule(".a", "self.a >= 0", "a must not be negative")
        def a_not_negative(self) -> bool:
            return self.a >= 0

    class Child(Base):
        b: int = 0

        @rule(".b", "self.b <= self.a", "b must not exceed a")
        def b_within_a(self) -> bool:
            return self.b <= self.a

    assert [e.name for e in rules_of(Child)] == ["a_not_negative", "b_within_a"]
    assert violations(Child(a=-1, b=0), "x") == [
        FieldError("x.a", "a must not be negative"),
        FieldError("x.b", "b must not exceed a"),
    ]

    class Redefined(Child):
        def b_within_a(self) -> bool:  # the same name without a rule drops the base's entry
            return True

    assert [e.name for e in rules_of(Redefined)] == ["a_not_negative"]


@pytest.mark.parametrize("value", [True, False, "auto"])
def test_gradient_checkpointing_takes_a_boolean_or_auto(value: object) -> None:
    assert (
        FineTuneJob.from_body(with_spec("training.gradientCheckpointing", value)).spec.training.gradient_checkpointing
        == value
    )


@pytest.mark.parametrize("value", ["sometimes", "true", "yes", 1, 0])
def test_gradient_checkpointing_refuses_anything_else_at_its_path(value: object) -> None:
    """The CRD keeps any value there (no structural schema types bool | 'auto'); the model refuses the rest."""
    with pytest.raises(InvalidSpecError) as caught:
        FineTuneJob.from_body(with_spec("training.gradientCheckpointing", value))
    assert {e.path for e in caught.value.errors} == {"spec.training.gradientCheckpointing"}


@pytest.mark.parametrize(("checkpointing", "refused"), [(False, True), (True, False), ("auto", False), (None, False)])
def test_offloaded_activations_need_checkpointing_on_or_auto(checkpointing: object, refused: bool) -> None:
    """The model's rule alone: CEL cannot read the untyped gradientCheckpointing (the API server refuses such a CRD)."""
    training: dict[str, Any] = {"offloadActivations": True}
    if checkpointing is not None:
        training["gradientCheckpointing"] = checkpointing
    body = with_spec("training", training)
    if not refused:
        assert FineTuneJob.from_body(body).spec.training.offload_activations
        return
    with pytest.raises(InvalidSpecError) as caught:
        FineTuneJob.from_body(body)
    assert [(e.path, e.message) for e in caught.value.errors] == [
        ("spec.training.offloadActivations", OFFLOAD_NEEDS_CHECKPOINTING)
    ]
