"""The committed CRD is what `ftjob crd` generates, and it is structural."""

from pathlib import Path
from typing import Any

import yaml

from finetune_operator.cli import main
from finetune_operator.crd import build_crd

CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "finetunejob.yaml"


def test_committed_crd_is_not_stale(tmp_path: Path) -> None:
    out = tmp_path / "crd.yaml"
    assert main(["crd", "--out", str(out)]) == 0
    assert out.read_text() == CRD_FILE.read_text(), "run `ftjob crd --out crds/finetunejob.yaml` and commit"


def _walk(node: Any, path: str, problems: list[str], *, in_branch: bool = False) -> None:
    if not isinstance(node, dict):
        return
    if "$ref" in node:
        problems.append(f"{path}: $ref")
    if in_branch:
        problems += [
            f"{path}: {k} inside anyOf/oneOf"
            for k in ("type", "description", "default", "nullable")
            if k in node
        ]
    typed = (
        "type" in node
        or node.get("x-kubernetes-int-or-string")
        or node.get("x-kubernetes-preserve-unknown-fields")
        or "anyOf" in node
    )
    if not in_branch and not typed:
        problems.append(f"{path}: no type")
    if "default" in node:
        problems.append(f"{path}: default (the model applies defaults)")
    for name, child in node.get("properties", {}).items():
        _walk(child, f"{path}.{name}", problems)
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}[]", problems)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}{{}}", problems)
    for key in ("anyOf", "oneOf"):
        for i, branch in enumerate(node.get(key, [])):
            _walk(branch, f"{path}.{key}[{i}]", problems, in_branch=True)


def test_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    problems: list[str] = []
    _walk(schema, "", problems)
    assert problems == []


def test_crd_names_and_columns() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    spec = crd["spec"]
    version = spec["versions"][0]
    assert (
        crd["metadata"]["name"],
        spec["group"],
        version["name"],
        spec["names"]["kind"],
        spec["scope"],
    ) == ("finetunejobs.finetune.dev", "finetune.dev", "v1alpha1", "FineTuneJob", "Namespaced")
    assert spec["names"]["shortNames"] == ["ftj"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c] == [
        "Phase",
        "Progress",
        "Loss",
        "Nodes",
        "Age",
    ]


def test_cel_rules_sit_beside_the_fields_they_guard() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec_rules = [r["message"] for r in schema["properties"]["spec"]["x-kubernetes-validations"]]
    assert any("offloadParams needs zeroStage 3" in m for m in spec_rules)
    assert any("offloadOptimizer needs zeroStage >= 1" in m for m in spec_rules)
    assert any("quantization (QLoRA) needs a LoRA adapter" in m for m in spec_rules)
    assert any("nvmePath is required" in m for m in spec_rules)
    assert any("immutable except runPolicy" in m for m in spec_rules)
    assert "at most 55 characters" in schema["x-kubernetes-validations"][0]["message"]
    stage = schema["properties"]["spec"]["properties"]["distributed"]["properties"]["deepspeed"][
        "properties"
    ]["zeroStage"]
    assert stage["x-kubernetes-int-or-string"] is True and stage["x-kubernetes-validations"]
