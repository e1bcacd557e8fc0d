"""Hypothesis-generated FineTuneJobs (valid and invalid), applied with kubectl: each one is either
rejected at apply with a message, or reaches a phase; an invalid one that gets through the CRD
schema ends Failed/InvalidSpec naming a field, exactly when the operator's own validation (run in the
test on the stored object) says it is invalid. The operator never crashes (alive, no traceback)."""

from __future__ import annotations

import copy
import re
import time
from collections import Counter
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render import RenderOptions, render_all
from tests.controlplane.conftest import Cluster, wait_until
from tests.controlplane.operator.conftest import POLICY, Operator, ftj, get

from .conftest import size

pytestmark = pytest.mark.controlplane

PHASES = {"Pending", "WaitingForAdmission", "Running", "Restarting", "Succeeded", "Failed", "Suspended"}
anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 1 << 33),
    st.floats(allow_nan=False, width=32),
    st.text(max_size=12),
    st.lists(st.integers(0, 3), max_size=2),
)
# (path, strategy): mostly plausible values, with the odd wrong type / out-of-range value.
MUTATIONS: list[tuple[tuple[str, ...], st.SearchStrategy[Any]]] = [
    (("distributed", "nodes"), st.one_of(st.integers(-1, 40), anything)),
    (("distributed", "gpusPerNode"), st.one_of(st.integers(-1, 16), anything)),
    (("distributed", "deepspeed", "zeroStage"), st.integers(-1, 4)),
    (("training", "epochs"), st.one_of(st.integers(-1, 5), st.floats(-1, 5), anything)),
    (("training", "maxSteps"), st.integers(-5, 10**6)),
    (("training", "learningRate"), st.one_of(st.floats(-1, 1), anything)),
    (("training", "mixedPrecision"), st.sampled_from(["bf16", "fp16", "no", "fp8", "garbage", ""])),
    (("training", "perDeviceTrainBatchSize"), st.integers(-1, 4096)),
    (("training", "gradientAccumulationSteps"), st.integers(-1, 64)),
    (("adapter", "type"), st.sampled_from(["lora", "qlora", "none", "full", "bogus"])),
    (("adapter", "r"), st.one_of(st.integers(-1, 1024), anything)),
    (("adapter", "alpha"), st.integers(-1, 256)),
    (("dataset", "maxSeqLen"), st.one_of(st.integers(-10, 1 << 20), anything)),
    (("dataset", "textField"), st.one_of(st.text(max_size=8), anything)),
    (("model", "name"), st.one_of(st.text(max_size=30), st.sampled_from(["builtin:tiny-llama", "meta-llama/x"]))),
    (("model", "attnImplementation"), st.sampled_from(["sdpa", "eager", "flash_attention_2", "nope"])),
    (("runPolicy", "backoffLimit"), st.integers(-1, 50)),
    (("runPolicy", "activeDeadlineSeconds"), st.integers(-1, 10**7)),
]


def mutate(body: dict[str, Any], path: tuple[str, ...], value: Any, delete: bool) -> None:
    node = body["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node.get(key), dict) or key not in node else node[key]
        if not isinstance(node, dict):
            return
    if delete:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    body = copy.deepcopy(ftj(draw(st.sampled_from(["tiny-cpu", "llama-70b-lora-2x8"])), run_seconds=1))
    for i in draw(st.lists(st.integers(0, len(MUTATIONS) - 1), max_size=3, unique=True)):
        path, strat = MUTATIONS[i]
        mutate(body, path, draw(strat), delete=draw(st.integers(0, 9)) == 0)
    if draw(st.integers(0, 9)) == 0:  # a top-level section missing
        body["spec"].pop(draw(st.sampled_from(["model", "dataset", "training", "distributed", "output"])), None)
    return body


def test_generated_specs_are_rejected_or_reach_a_phase(cluster: Cluster, namespace: str, operator: Operator) -> None:
    accepted: list[str] = []
    rejected: list[tuple[str, str]] = []
    counter = iter(range(10**6))

    @settings(
        max_examples=size(50, 2000),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(specs())
    def apply_one(body: dict[str, Any]) -> None:
        name = f"gen-{next(counter)}"
        body["metadata"] = {"name": name}
        proc = cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(body), check=False)
        if proc.returncode == 0:
            accepted.append(name)
        else:
            assert proc.stderr.strip(), f"{name} rejected without a message"
            rejected.append((name, proc.stderr.strip()))

    apply_one()
    assert accepted, "no generated spec got through the CRD schema"

    def all_have_phase() -> dict[str, dict[str, Any]] | None:
        found = {o["metadata"]["name"]: o for o in (get(cluster, namespace, "finetunejobs") or {"items": []})["items"]}
        missing = [n for n in accepted if not (found.get(n, {}).get("status") or {}).get("phase")]
        return found if not missing else None

    found = wait_until(
        all_have_phase, timeout=60 + 0.5 * len(accepted), interval=1, what="a phase on every accepted FineTuneJob"
    )
    outcomes: Counter[tuple[str, str | None]] = Counter()
    for name in accepted:
        st_ = found[name]["status"]
        assert st_["phase"] in PHASES, (name, st_)
        invalid_spec = any(
            c["type"] == "Failed" and c.get("reason") == "InvalidSpec" for c in st_.get("conditions", [])
        )
        # The operator's own validation, run here on the object as stored: invalid <=> InvalidSpec.
        expected = local_verdict(found[name])
        assert invalid_spec == (expected is not None), (name, expected, st_)
        if invalid_spec:
            assert re.search(r"\b(spec|metadata)(\.[\w\[\]-]+)+", st_.get("message", "")), (name, st_["message"])
            assert all(path in st_["message"] for path in expected or []), (name, expected, st_["message"])
        outcomes["invalid" if invalid_spec else "valid", st_["phase"]] += 1
    time.sleep(2)
    assert operator.proc is not None and operator.proc.poll() is None, "operator died"
    log = operator.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 2000 :][:6000]
    print(
        f"{len(accepted) + len(rejected)} specs: {len(rejected)} rejected at apply, {len(accepted)} accepted: "
        f"{dict(sorted(outcomes.items()))}"
    )


def local_verdict(obj: dict[str, Any]) -> list[str] | None:
    """What the operator's validation says about a stored FineTuneJob: the field paths it names, or None."""
    body = {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in obj}
    try:
        render_all(FineTuneJob.from_body(body), RenderOptions(policy=POLICY))  # the operator's pod policy
    except InvalidSpecError as exc:
        return sorted({e.path for e in exc.errors})
    return None
