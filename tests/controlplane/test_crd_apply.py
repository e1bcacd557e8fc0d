"""The generated CRD on the real API server: it installs, every example applies, each CEL rule refuses
what it should with its own message at `kubectl apply`, and the API server and `check_job` say the same.

The twin tests send each spec the tests hold (the unit tests' invalid specs, the rule-table edge cases
of tests/unit/test_rules.py, the cases here and the examples) to the API server as a dry-run create and
compare every violation of a rule-table entry it reports (field, reason, message) with what `check_job`
reports for the same spec: the CEL side and the Python side of each entry refuse the same specs, at the
same path, in the same words.
"""

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
import yaml
from kubernetes import client

from finetune_api import constants
from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.rules import transition_violations
from finetune_operator.validation import check_job
from tests.builders import job_body, with_spec
from tests.controlplane.conftest import Cluster, wait_until
from tests.unit.test_rules import MESSAGES, RULE_CASES, table_findings
from tests.unit.test_validation import INVALID

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


TWIN_CASES = [
    *[(f"check_job: {c[0]}", c[1]) for c in INVALID],
    *[(f"rule table: {name}", body) for name, body in RULE_CASES],
    *[(f"at apply: {c[0]}", c[1]) for c in REFUSED],
    *[
        (f"example: {p.stem}", doc)
        for p in EXAMPLES
        for doc in yaml.safe_load_all(p.read_text())
        if doc and doc.get("kind") == constants.KIND
    ],
]


@pytest.fixture(scope="module")
def dry_run_namespace(cluster: Cluster) -> Iterator[str]:
    """One namespace for this module's dry runs (they store nothing), deleted afterwards."""
    name = f"rule-twins-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def _custom_objects(cluster: Cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(cluster.api_client())


def _causes(call: Callable[[], object]) -> list[dict[str, str]] | None:
    """The API server's causes when it refuses the request (none for a strict-decoding refusal of an unknown
    field, 400), None when it accepts it."""
    try:
        call()
    except client.ApiException as exc:
        assert exc.status in (400, 422), exc.body
        causes: list[dict[str, str]] = json.loads(exc.body).get("details", {}).get("causes", [])
        return causes
    return None


def server_findings(causes: list[dict[str, str]] | None) -> list[tuple[str, str]]:
    """(field, message) of each cause that is a rule-table entry's, whose reason must be the entry's; the
    message of a cause is `<reason>: [<value>: ]<the rule's message>`."""
    found = []
    for cause in causes or []:
        for message, entry in MESSAGES.items():
            if cause["message"].endswith(f": {message}"):
                assert cause["reason"] == (entry.reason or "FieldValueInvalid"), cause
                found.append((cause["field"], message))
    return sorted(found)


def _manifest(body: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "namespace": namespace}}


@pytest.mark.parametrize("body", [c[1] for c in TWIN_CASES], ids=[c[0] for c in TWIN_CASES])
def test_the_api_server_and_check_job_break_the_same_rules_in_the_same_words(
    crd: None, cluster: Cluster, dry_run_namespace: str, body: dict[str, Any]
) -> None:
    manifest = _manifest(body, dry_run_namespace)
    causes = _causes(
        lambda: _custom_objects(cluster).create_namespaced_custom_object(
            constants.GROUP,
            constants.VERSION,
            dry_run_namespace,
            constants.PLURAL,
            manifest,
            dry_run="All",
            field_validation="Strict",
        )
    )
    assert table_findings(manifest) == server_findings(causes), causes
    if causes is not None:
        assert _refused_by_check_job(manifest), f"refused at apply, accepted by check_job: {causes}"


def _refused_by_check_job(body: dict[str, Any]) -> bool:
    try:
        return bool(check_job(FineTuneJob.from_body(body)))
    except InvalidSpecError:
        return True


IMMUTABLE = "the spec of a running job is immutable except runPolicy; set runPolicy.suspend: true first"
TRAINING = job_body()["spec"]["training"]
IMMUTABLE_CASES = [
    ("another model while running", {}, {"model": {"name": "meta-llama/Llama-2-13b-hf"}}, True),
    ("runPolicy while running", {}, {"runPolicy": {"backoffLimit": 7}}, False),
    ("a default written out while running", {}, {"training": {**TRAINING, "learningRate": 1e-4}}, True),
    ("an empty template added while running", {}, {"template": {}}, True),
    ("another model while suspended", {"runPolicy": {"suspend": True}}, {"model": {"name": "org/other"}}, False),
    (
        "the dataset while explicitly not suspended",
        {"runPolicy": {"suspend": False}},
        {"dataset": {"name": "org/other-data"}},
        True,
    ),
]


@pytest.mark.parametrize(
    ("stored", "change", "refused"), [c[1:] for c in IMMUTABLE_CASES], ids=[c[0] for c in IMMUTABLE_CASES]
)
def test_the_transition_rule_and_its_python_twin_agree(
    crd: None, cluster: Cluster, namespace: str, stored: dict[str, Any], change: dict[str, Any], refused: bool
) -> None:
    api = _custom_objects(cluster)
    body = job_body(name="twin")
    body["spec"].update(stored)
    old = api.create_namespaced_custom_object(
        constants.GROUP, constants.VERSION, namespace, constants.PLURAL, _manifest(body, namespace)
    )
    new = {**old, "spec": {**old["spec"], **change}}
    causes = _causes(
        lambda: api.replace_namespaced_custom_object(
            constants.GROUP, constants.VERSION, namespace, constants.PLURAL, "twin", new, dry_run="All"
        )
    )
    python = transition_violations(FineTuneJob.from_body(new), FineTuneJob.from_body(old))
    assert sorted((e.path, e.message) for e in python) == server_findings(causes), causes
    assert server_findings(causes) == ([("spec", IMMUTABLE)] if refused else [])
