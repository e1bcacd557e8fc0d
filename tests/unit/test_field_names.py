"""Field and column names read well where people see them: `kubectl describe ftj` and `kubectl get ftj`.

`kubectl describe` of a custom resource prints each field name through `smartLabelFor`
(k8s.io/kubectl/pkg/describe): a name holding anything but letters and `-` is printed as it is;
otherwise it is split at case changes by fatih/camelcase's `Split` (runs of lower, upper, digit and
other characters, and an upper run's last letter moves to a lower run after it: `PDFLoader` -> `PDF`,
`Loader`), and each word is upper-cased when it is one of API, URL, UID, OSB, GUID, else title-cased by
golang.org/x/text/cases (first letter upper, the rest lower: `GPU` prints `Gpu`). So
`estimatedGpuMemoryGiB` read "Estimated Gpu Memory Gi B"; a name split into words must have no
one-letter word. The splitter here is that algorithm, checked on camelcase's own examples first and,
in tests/controlplane/operator/test_operator_progress.py, against a real `kubectl describe`.
"""

from collections.abc import Iterator
from typing import Any

import pytest

from finetune_api.v1alpha1.status import FineTuneJobStatus, PlanSummary, Progress
from finetune_operator.crd import PRINTER_COLUMNS, build_crd
from finetune_operator.planreport import memory_quantity

COMMON_ACRONYMS = ("API", "URL", "UID", "OSB", "GUID")
"""Words `smartLabelFor` upper-cases."""
SPEC_EXCEPTIONS = {"spec.distributed.gpuMemoryGiB": "Gpu Memory Gi B"}
"""Spec fields users write in their manifests (examples/, every job file), kept until a spec version renames
them; each with how describe shows it, so a change of either is noticed."""


def _char_class(char: str) -> int:
    return 1 if char.islower() else 2 if char.isupper() else 3 if char.isdigit() else 4


def camelcase_split(src: str) -> list[str]:
    """fatih/camelcase `Split`, as kubectl vendors it."""
    runs: list[list[str]] = []
    last = 0
    for char in src:
        cls = _char_class(char)
        if runs and cls == last:
            runs[-1].append(char)
        else:
            runs.append([char])
        last = cls
    for i in range(len(runs) - 1):
        if runs[i] and runs[i][0].isupper() and runs[i + 1][0].islower():
            runs[i + 1].insert(0, runs[i].pop())
    return ["".join(run) for run in runs if run]


def describe_label(field: str) -> str:
    """kubectl's `smartLabelFor`: how `kubectl describe` heads a field of a custom resource."""
    if any(not (char.isalpha() or char == "-") for char in field):
        return field
    words = [part for part in camelcase_split(field) if part != "_"]
    return " ".join(w.upper() if w.upper() in COMMON_ACRONYMS else w[:1].upper() + w[1:].lower() for w in words)


def field_paths(node: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """(path, name) of every property under a structural schema node, arrays' items included."""
    for name, child in (node.get("properties") or {}).items():
        yield f"{path}.{name}", name
        yield from field_paths(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from field_paths(node["items"], f"{path}[]")


def schema_root() -> dict[str, Any]:
    root: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


def badly_split(name: str) -> bool:
    words = describe_label(name).split(" ")
    return len(words) > 1 and any(len(word) == 1 for word in words)


@pytest.mark.parametrize(
    ("src", "words"),
    [
        ("lowercase", ["lowercase"]), ("Class", ["Class"]), ("MyClass", ["My", "Class"]), ("MyC", ["My", "C"]),
        ("HTML", ["HTML"]), ("PDFLoader", ["PDF", "Loader"]), ("AString", ["A", "String"]),
        ("SimpleXMLParser", ["Simple", "XML", "Parser"]), ("vimRPCPlugin", ["vim", "RPC", "Plugin"]),
        ("GL11Version", ["GL", "11", "Version"]), ("99Bottles", ["99", "Bottles"]), ("May5", ["May", "5"]),
        ("BFG9000", ["BFG", "9000"]),
    ],
)
def test_the_splitter_is_camelcases(src: str, words: list[str]) -> None:
    assert camelcase_split(src) == words


def test_describe_labels_as_kubectl_prints_them() -> None:
    assert describe_label("apiVersion") == "API Version"
    assert describe_label("containerStatuses") == "Container Statuses"
    assert describe_label("url") == "URL"
    assert describe_label("zero3Init") == "zero3Init"  # a digit: printed as it is
    assert describe_label("estimatedGpuMemoryGiB") == "Estimated Gpu Memory Gi B"  # the name this test retired
    assert badly_split("estimatedGpuMemoryGiB") and not badly_split("r")


def test_no_status_field_splits_into_one_letter_words() -> None:
    status = schema_root()["properties"]["status"]
    labels = {path: describe_label(name) for path, name in field_paths(status, "status")}
    assert len(labels) > 30, labels  # the whole status was walked, nested objects included
    bad = {path: label for path, label in labels.items() if badly_split(path.rsplit(".", 1)[-1])}
    assert bad == {}
    assert labels["status.plan.estimatedGPUMemory"] == "Estimated Gpu Memory"
    assert labels["status.progress.summary"] == "Summary"


def test_spec_fields_split_well_but_the_known_exceptions() -> None:
    spec = schema_root()["properties"]["spec"]
    bad = {path: describe_label(name) for path, name in field_paths(spec, "spec") if badly_split(name)}
    assert bad == SPEC_EXCEPTIONS


def _schema_at(json_path: str) -> dict[str, Any]:
    node = schema_root()
    for part in json_path.strip(".").split("."):
        node = node["properties"][part]
    return node


def test_printer_columns_name_one_word_and_point_at_real_fields() -> None:
    for column in PRINTER_COLUMNS:
        assert column["name"].isalpha() and column["name"][0].isupper(), column
        if not column["jsonPath"].startswith(".metadata."):
            field = _schema_at(str(column["jsonPath"]))
            assert column["type"] == ("date" if field.get("format") == "date-time" else field["type"]), column
    progress = next(c for c in PRINTER_COLUMNS if c["name"] == "Progress")
    assert progress["jsonPath"] == ".status.progress.summary"  # a formatted string, not a raw float


@pytest.mark.parametrize(
    ("progress", "text"),
    [
        (Progress(step=7, total_steps=10, percent=70.0), "70% (7/10)"),
        (Progress(step=1, total_steps=3, percent=100 / 3), "33% (1/3)"),
        (Progress(step=29, total_steps=30), "96% (29/30)"),  # no percent: from the steps, rounded down
        (Progress(step=30, total_steps=30, percent=100.0), "100% (30/30)"),
        (Progress(step=0, total_steps=30), "0% (0/30)"),
        (Progress(step=5, percent=12.5), "12%"),
        (Progress(step=7), "step 7"),
    ],
)
def test_progress_summary_reads_as_a_percentage_and_steps(progress: Progress, text: str) -> None:
    assert progress.summary_text() == text
    assert Progress.model_validate({**progress.to_dict(exclude_none=True), "summary": text}).summary == text


@pytest.mark.parametrize(("gib", "quantity"), [(70.73, "70.7Gi"), (1.0, "1.0Gi"), (0.4, "410Mi"), (0.0, "0Mi")])
def test_plan_memory_is_a_quantity_with_its_unit(gib: float, quantity: str) -> None:
    assert memory_quantity(gib) == quantity
    plan = PlanSummary.model_validate({"zeroStage": 3, "offload": "none", "estimatedGPUMemory": quantity})
    assert plan.to_dict()["estimatedGPUMemory"] == quantity


def test_a_plan_stored_under_the_old_name_reads_as_absent() -> None:
    old = {"phase": "Running", "attempt": 1,
           "plan": {"zeroStage": 3, "offload": "none", "estimatedGpuMemoryGiB": 70.7, "reason": "fits"}}
    status = FineTuneJobStatus.model_validate(old)
    assert (status.phase, status.attempt, status.plan) == ("Running", 1, None)
    with pytest.raises(ValueError, match="estimatedGPUMemory"):
        PlanSummary.model_validate({"zeroStage": 3, "offload": "none", "estimatedGPUMemory": "70.7 GiB"})
