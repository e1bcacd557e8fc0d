"""The CustomResourceDefinition, generated from the pydantic models. `ftjob crd` is its only writer.

pydantic's JSON schema is turned into a structural OpenAPI v3 schema: `$ref`s inlined, titles and
defaults dropped (the model applies defaults; API-server defaulting would rewrite stored objects),
`X | None` turned into a nullable X, and CEL rules kept beside the field they guard. The CEL rules are
the CEL side of each API object's rule table (`finetune_api.v1alpha1.rules`), which pydantic writes into
the JSON schema; the root's come from `FineTuneJob`'s table.
"""

from typing import Any

from finetune_api import constants
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.rules import rules_of
from finetune_api.v1alpha1.spec import FineTuneJobSpec
from finetune_api.v1alpha1.status import FineTuneJobStatus

_DROP = {"title", "default"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline every $ref, collapse single-item allOf, drop titles/defaults, make Optional nullable."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **extra}, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _resolve({**node["allOf"][0], **rest}, defs)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b != {"type": "null"}]
        if len(branches) < len(node["anyOf"]):
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            merged = _resolve(branches[0] if len(branches) == 1 else {"anyOf": branches}, defs)
            return {**merged, **_resolve(rest, defs), "nullable": True}
        if all(b.get("type") in ("string", "array") for b in branches):
            # str | list[str] (targetModules): no structural form exists for a union, so the field keeps
            # any value and the model rejects a wrong one (InvalidSpec in status). CEL cannot type it.
            return {
                **{k: _resolve(v, defs) for k, v in node.items() if k not in ("anyOf", *_DROP)},
                "x-kubernetes-preserve-unknown-fields": True,
            }
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "properties":
            out[key] = {name: _resolve(prop, defs) for name, prop in value.items()}
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = _resolve(value, defs)
    if "enum" in out and "type" not in out:
        types = {type(v) for v in out["enum"]}
        out["type"] = "string" if types == {str} else "integer" if types == {int} else "string"
    if "exclusiveMinimum" in out and not isinstance(out["exclusiveMinimum"], bool):
        out["minimum"], out["exclusiveMinimum"] = out["exclusiveMinimum"], True
    if "exclusiveMaximum" in out and not isinstance(out["exclusiveMaximum"], bool):
        out["maximum"], out["exclusiveMaximum"] = out["exclusiveMaximum"], True
    if out.get("type") == "object" and "additionalProperties" in out and out["additionalProperties"] is False:
        del out["additionalProperties"]
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    return out


def structural_schema(model: type[FineTuneJobSpec] | type[FineTuneJobStatus]) -> dict[str, Any]:
    """A structural OpenAPI v3 schema of one model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _resolve(raw, defs)
    return schema


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Progress",
        "type": "string",
        "jsonPath": ".status.progress.summary",
        "description": "Percent and optimizer steps done, e.g. 70% (7/10)",
    },
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.distributed.nodes"},
    {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt", "priority": 1},
    {"name": "Zero", "type": "integer", "jsonPath": ".status.plan.zeroStage", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    """The whole CRD object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{constants.PLURAL}.{constants.GROUP}",
            "labels": {"app.kubernetes.io/name": "finetune-operator"},
        },
        "spec": {
            "group": constants.GROUP,
            "names": {
                "kind": constants.KIND,
                "listKind": f"{constants.KIND}List",
                "plural": constants.PLURAL,
                "singular": constants.SINGULAR,
                "shortNames": [constants.SHORT_NAME],
                "categories": ["all", "finetune"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": constants.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "FineTuneJob fine-tunes a language model with TRL + PEFT on "
                            "accelerate + DeepSpeed across one or more GPU nodes.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                # The name's type only, so that a rule's fieldPath may name it (the API server
                                # allows a CRD no other metadata schema).
                                "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
                                "spec": structural_schema(FineTuneJobSpec),
                                "status": {
                                    **structural_schema(FineTuneJobStatus),
                                    # kopf keeps its own bookkeeping under status when asked; allow it.
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                            },
                            "x-kubernetes-validations": [entry.validation() for entry in rules_of(FineTuneJob)],
                        }
                    },
                }
            ],
        },
    }
