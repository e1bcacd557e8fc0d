"""admit and AdmissionCache: the rules, then the planner, as a value; one admission per (uid, generation, policy)."""

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.admit import AdmissionCache, Admitted, admit, admit_or_raise
from finetune_operator.cli import EXIT_INVALID, main
from finetune_operator.plan import plan_job
from finetune_operator.policy import PodPolicy
from tests.builders import job_body

POLICY = PodPolicy()


def ftj(
    uid: str | None = "u1", generation: int | None = 1, labels: dict[str, str] | None = None, **body_args: Any
) -> FineTuneJob:
    body = job_body(name="demo", nodes=2, gpus=8, **body_args)
    body["metadata"].update(uid=uid, generation=generation, labels=labels or {})
    return FineTuneJob.from_body(body)


def paths(admission: Admitted | InvalidSpecError) -> list[str]:
    assert isinstance(admission, InvalidSpecError), admission
    return [e.path for e in admission.errors]


def test_a_valid_job_is_admitted_with_the_planners_plan() -> None:
    job = ftj(zero="auto")
    admission = admit(job, POLICY)
    assert admission == Admitted(plan_job(job.spec))


def test_the_planners_refusal_is_an_error_with_its_field() -> None:
    admission = admit(ftj(zero="auto", model="org/unknown-model"), POLICY)
    assert paths(admission) == ["spec.distributed.deepspeed.zeroStage"]


def test_a_rule_error_is_reported_without_asking_the_planner() -> None:
    job = ftj(zero="auto", model="org/unknown-model", overrides={"zero_optimization": {"stage": 2}})
    assert paths(admit(job, POLICY)) == ["spec.distributed.deepspeed.overrides.zero_optimization.stage"]


def test_the_pod_policy_decides_a_template_image() -> None:
    job = ftj(template={"image": "registry.example/trainer:v1"})
    assert paths(admit(job, POLICY)) == ["spec.template.image"]
    assert isinstance(admit(job, PodPolicy(allowed_images=("registry.example/",))), Admitted)


def test_admit_or_raise_raises_the_error_admit_answers() -> None:
    job = ftj(overrides={"zero_optimization": {"stage": 2}})
    answer = admit(job)
    with pytest.raises(InvalidSpecError) as raised:
        admit_or_raise(job)
    assert isinstance(answer, InvalidSpecError) and raised.value.errors == answer.errors
    assert admit_or_raise(ftj()) == admit(ftj())


def test_one_admission_per_uid_and_generation_whatever_the_labels_or_status() -> None:
    cache = AdmissionCache()
    first = cache(ftj(), POLICY)
    assert isinstance(first, Admitted)
    relabelled = ftj(labels={"kueue.x-k8s.io/queue-name": "q"})
    restarted = ftj().model_copy(update={"status": ftj().status.model_copy(update={"attempt": 3})})
    assert cache(relabelled, POLICY) is first
    assert cache(restarted, POLICY) is first
    assert (cache.misses, cache.hits) == (1, 2)


def test_a_new_generation_is_admitted_again_from_its_own_spec() -> None:
    cache = AdmissionCache()
    first = cache(ftj(zero=3), POLICY)
    edited = cache(ftj(generation=2, zero=2), POLICY)
    assert isinstance(first, Admitted) and isinstance(edited, Admitted)
    assert (first.plan.strategy.zero_stage, edited.plan.strategy.zero_stage) == (3, 2)
    assert (cache.misses, cache.hits) == (2, 0)


def test_another_uid_or_policy_is_admitted_again() -> None:
    cache = AdmissionCache()
    image = {"template": {"image": "registry.example/trainer:v1"}}
    refused = cache(ftj(**image), POLICY)
    allowed = cache(ftj(**image), replace(POLICY, allowed_images=("registry.example/",)))
    other = cache(ftj(uid="u2", **image), POLICY)
    assert isinstance(refused, InvalidSpecError) and isinstance(allowed, Admitted)
    assert isinstance(other, InvalidSpecError) and other is not refused
    assert (cache.misses, cache.hits) == (3, 0)


def test_an_invalid_spec_is_kept_as_its_error() -> None:
    cache = AdmissionCache()
    bad = ftj(overrides={"zero_optimization": {"stage": 2}})  # owned by spec.distributed.deepspeed.zeroStage
    error = cache(bad, POLICY)
    assert isinstance(error, InvalidSpecError)
    assert cache(bad, POLICY) is error


def test_jobs_without_identity_are_admitted_every_time_and_never_kept() -> None:
    cache = AdmissionCache()
    for job in (ftj(uid=None), ftj(uid=None), ftj(generation=None)):
        assert isinstance(cache(job, POLICY), Admitted)
    assert (cache.misses, cache.hits, len(cache._entries)) == (0, 0, 0)


def test_the_least_recently_used_entry_goes_first() -> None:
    cache = AdmissionCache(size=2)
    a, b, c = ftj(uid="a"), ftj(uid="b"), ftj(uid="c")
    cache(a, POLICY)
    cache(b, POLICY)
    cache(a, POLICY)  # a is now the most recent
    cache(c, POLICY)  # evicts b
    cache(a, POLICY)
    cache(b, POLICY)
    assert (cache.misses, cache.hits) == (4, 2)


CLI_INVALID = [
    ("a rule error", {"overrides": {"zero_optimization": {"stage": 2}}}),
    ("a planner error", {"zero": "auto", "model": "org/unknown-model"}),
]


@pytest.mark.parametrize("body_args", [c[1] for c in CLI_INVALID], ids=[c[0] for c in CLI_INVALID])
def test_ftjob_render_plan_and_run_refuse_with_admits_errors_and_exit_2(
    body_args: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = job_body(name="demo", nodes=1, gpus=8, **body_args)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(body))
    admission = admit(FineTuneJob.from_body(body))
    assert isinstance(admission, InvalidSpecError)
    want = [f"  {error}" for error in admission.errors]
    commands = {
        "render": ["--out", str(tmp_path / "out")],
        "plan": [],
        "run": ["--workdir", str(tmp_path / "run")],
    }
    for command, flags in commands.items():
        assert main([command, str(job_file), *flags]) == EXIT_INVALID, command
        err = capsys.readouterr().err.splitlines()
        assert err == [f"ftjob {command}: invalid FineTuneJob:", *want], command
    assert not (tmp_path / "out").exists(), "nothing is rendered for an invalid spec"
