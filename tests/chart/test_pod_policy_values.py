"""The chart's `podPolicy` values become `ftjob operator` flags, and those flags the policy the values say.

Read end to end: values -> `helm template` -> the Deployment's args -> the operator's own argument
parser -> `PodPolicy`. Empty lists keep the operator's defaults (the trainer image's repository for
images), `[""]` empties a list, and the schema refuses a security level that does not exist. The
ValidatingAdmissionPolicy that lets a FineTuneJob name only Secrets its author may read checks every
SecretKeyRef field of the API.
"""

from __future__ import annotations

import re
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from finetune_api.v1alpha1.spec import FineTuneJobSpec, SecretKeyRef
from finetune_operator.cli import build_parser
from finetune_operator.policy import PodPolicy, policy_from_flags

from .conftest import Helm, documents, find


def policy_of(helm: Helm, values: dict[str, Any]) -> PodPolicy:
    (deployment,) = find(documents(helm.template(values=values)), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(["operator", *container["args"]])
    return policy_from_flags(args, image=args.image)


CASES: list[tuple[str, dict[str, Any], PodPolicy]] = [
    (
        "the default values give the operator's default policy for the chart's trainer image",
        {},
        PodPolicy(allowed_images=("ghcr.io/finetune-operator/trainer",)),
    ),
    (
        "the allowed images follow trainer.image when podPolicy names none",
        {"trainer": {"image": "localhost/finetune-operator/trainer:dev"}},
        PodPolicy(allowed_images=("localhost/finetune-operator/trainer",)),
    ),
    (
        "every list and the security level reach the operator",
        {
            "podPolicy": {
                "allowedImages": ["registry.example.com/ml/", "ghcr.io/finetune-operator/trainer"],
                "allowedServiceAccounts": ["default", "trainer"],
                "allowedPriorityClasses": ["*", "system-cluster-critical"],
                "allowedAnnotationPrefixes": ["prometheus.io/"],
                "allowedLabelPrefixes": ["team.example.com/"],
                "allowedTolerations": ["nvidia.com/gpu", "dedicated"],
                "securityLevel": "baseline",
            }
        },
        PodPolicy(
            allowed_images=("registry.example.com/ml/", "ghcr.io/finetune-operator/trainer"),
            allowed_service_accounts=("default", "trainer"),
            allowed_priority_classes=("*", "system-cluster-critical"),
            allowed_annotation_prefixes=("prometheus.io/",),
            allowed_label_prefixes=("team.example.com/",),
            allowed_tolerations=("nvidia.com/gpu", "dedicated"),
            security_level="baseline",
        ),
    ),
    (
        "a list of one empty string allows nothing",
        {"podPolicy": {"allowedServiceAccounts": [""], "allowedTolerations": [""]}},
        PodPolicy(
            allowed_images=("ghcr.io/finetune-operator/trainer",), allowed_service_accounts=(), allowed_tolerations=()
        ),
    ),
]


@pytest.mark.parametrize(("values", "policy"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_values_become_the_operators_policy(helm: Helm, values: dict[str, Any], policy: PodPolicy) -> None:
    assert policy_of(helm, values) == policy


def test_extra_args_still_come_last(helm: Helm) -> None:
    (deployment,) = find(documents(helm.template(values={"extraArgs": ["--allowed-image=*"]})), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--pod-security-level=restricted", "--allowed-image=*"]


def test_the_schema_refuses_an_unknown_security_level(helm: Helm) -> None:
    with pytest.raises(AssertionError) as failure:
        helm.template(values={"podPolicy": {"securityLevel": "root"}})
    assert "values don't meet the specifications of the schema" in str(failure.value)
    assert "securityLevel" in str(failure.value)


VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"


def secret_ref_fields(model: type[BaseModel], path: str) -> list[str]:
    """Every SecretKeyRef field under `model` (not the template: its env is the operator's own rule). A field in a
    list of models comes out as `path[].field`, which the policy's per-field checks do not cover yet."""
    found: list[str] = []
    for name, field in model.model_fields.items():
        wire = f"{path}.{field.alias or name}"
        kinds = [a for a in get_args(field.annotation) if a is not type(None)] or [field.annotation]
        for kind in kinds:
            if get_origin(kind) is list:  # a list of models: its items' fields as `path[].field`
                kind, wire = get_args(kind)[0], f"{wire}[]"
            if kind is SecretKeyRef:
                found.append(wire)
            elif isinstance(kind, type) and issubclass(kind, BaseModel) and wire != "spec.template":
                found += secret_ref_fields(kind, wire)
    return found


def test_the_secret_reference_policy_covers_every_secret_field_of_the_api(helm: Helm) -> None:
    docs = documents(helm.template(extra=["--api-versions", VAP_API]))
    (policy,) = find(docs, "ValidatingAdmissionPolicy", "ftjob-finetune-operator-secret-references")
    checked = [re.match(r"'([\w.]+): Secret ", v["messageExpression"]) for v in policy["spec"]["validations"]]
    assert [m.group(1) for m in checked if m] == secret_ref_fields(FineTuneJobSpec, "spec")
    assert secret_ref_fields(FineTuneJobSpec, "spec") == ["spec.model.tokenSecretRef", "spec.output.hub.tokenSecretRef"]
    (binding,) = find(docs, "ValidatingAdmissionPolicyBinding", policy["metadata"]["name"])
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_the_secret_reference_policy_binds_the_watched_namespaces_and_can_be_left_out(helm: Helm) -> None:
    docs = documents(helm.template(values={"watchNamespaces": ["team-a"]}, extra=["--api-versions", VAP_API]))
    (binding,) = find(docs, "ValidatingAdmissionPolicyBinding", "ftjob-finetune-operator-secret-references")
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]
        }
    }
    off = documents(
        helm.template(values={"podPolicy": {"readableSecretsOnly": False}}, extra=["--api-versions", VAP_API])
    )
    assert not find(off, "ValidatingAdmissionPolicy", "ftjob-finetune-operator-secret-references")
    assert not find(
        documents(helm.template()), "ValidatingAdmissionPolicy", "ftjob-finetune-operator-secret-references"
    )
