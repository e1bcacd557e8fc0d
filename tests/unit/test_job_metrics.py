"""Per-job gauges (`finetune_job_*`): set from accepted reports, removed when the job ends or is deleted.

`JobSeries` is driven directly (with a fake clock for the expiry), then through the progress app with
the fakes of test_progress_server: an accepted report sets the gauges, a refused one or one for a job
that is gone or already finished sets none.
"""

from collections.abc import Iterator
from typing import Any

import pytest

from finetune_api.v1alpha1.status import Progress, TrainerReport
from finetune_operator import metrics
from finetune_operator.metrics import JOB_GAUGES, JOB_SERIES_TTL_SECONDS, REGISTRY, JobSeries
from tests.unit.test_progress_server import REPORT, Writer, answer_of

NAMES = [gauge._name for gauge in JOB_GAUGES]


def value(name: str, namespace: str, job: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"namespace": namespace, "job": job})


def series_of(namespace: str, job: str) -> dict[str, float]:
    """Every finetune_job_* sample of the job, as /metrics would show it."""
    found = {name: value(name, namespace, job) for name in NAMES}
    return {name: v for name, v in found.items() if v is not None}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def series() -> Iterator[tuple[JobSeries, Clock]]:
    clock = Clock()
    table = JobSeries(clock=clock)
    yield table, clock
    for namespace, job in table.jobs():
        table.forget(namespace, job)


def test_the_six_gauges_have_the_documented_names() -> None:
    assert sorted(NAMES) == sorted([
        "finetune_job_loss", "finetune_job_eval_loss", "finetune_job_tokens_per_second",
        "finetune_job_progress_ratio", "finetune_job_eta_seconds", "finetune_job_attempt",
    ])


def test_record_sets_each_gauge_and_forget_removes_them_all(series: tuple[JobSeries, Clock]) -> None:
    table, _ = series
    table.record("team-a", "llama", attempt=2, loss=1.5, eval_loss=1.75, tokens_per_second=4096.0,
                 progress_ratio=0.25, eta_seconds=600.0)
    table.record("team-b", "llama", attempt=1, loss=3.0)
    assert series_of("team-a", "llama") == {
        "finetune_job_loss": 1.5, "finetune_job_eval_loss": 1.75, "finetune_job_tokens_per_second": 4096.0,
        "finetune_job_progress_ratio": 0.25, "finetune_job_eta_seconds": 600.0, "finetune_job_attempt": 2.0,
    }
    assert table.jobs() == [("team-a", "llama"), ("team-b", "llama")]
    table.forget("team-a", "llama")
    assert series_of("team-a", "llama") == {}
    assert series_of("team-b", "llama") == {"finetune_job_loss": 3.0, "finetune_job_attempt": 1.0}
    assert table.jobs() == [("team-b", "llama")]
    table.forget("team-a", "llama")  # twice, or a job that never reported: nothing happens
    table.forget("team-c", "never")


def test_a_report_without_a_value_keeps_the_previous_one(series: tuple[JobSeries, Clock]) -> None:
    table, _ = series
    table.record("ns", "job", attempt=1, loss=2.0, eval_loss=2.5)
    table.record("ns", "job", attempt=2, loss=1.0)
    assert series_of("ns", "job") == {"finetune_job_loss": 1.0, "finetune_job_eval_loss": 2.5,
                                      "finetune_job_attempt": 2.0}


@pytest.mark.parametrize(
    ("deleted", "phase", "removed"),
    [(True, "Running", True), (False, "Succeeded", True), (False, "Failed", True), (False, "Suspended", True),
     (False, "Running", False), (False, "Restarting", False), (False, "Pending", False), (False, None, False)],
)
def test_watch_events_remove_a_job_that_is_deleted_or_done(
    series: tuple[JobSeries, Clock], deleted: bool, phase: str | None, removed: bool
) -> None:
    table, _ = series
    table.record("ns", "job", attempt=1, loss=2.0)
    table.job_event("ns", "job", deleted=deleted, phase=phase)
    assert (series_of("ns", "job") == {}) is removed
    assert (table.jobs() == []) is removed


def test_series_no_report_refreshed_for_the_ttl_expire(series: tuple[JobSeries, Clock]) -> None:
    table, clock = series
    table.record("ns", "quiet", attempt=1, loss=2.0)
    clock.now += JOB_SERIES_TTL_SECONDS / 2
    table.record("ns", "busy", attempt=1, loss=1.0)
    clock.now += JOB_SERIES_TTL_SECONDS / 2 + 1
    assert table.expire() == 1
    assert series_of("ns", "quiet") == {} and series_of("ns", "busy") == {"finetune_job_loss": 1.0,
                                                                          "finetune_job_attempt": 1.0}
    table.record("ns", "busy", attempt=1, loss=0.5)  # a report refreshes it
    clock.now += JOB_SERIES_TTL_SECONDS - 1
    assert table.expire() == 0 and table.jobs() == [("ns", "busy")]


@pytest.fixture
def demo() -> Iterator[None]:
    """The progress app's fake job ml/demo (attempt 2) without series before and after."""
    metrics.JOB_SERIES.forget("ml", "demo")
    yield
    metrics.JOB_SERIES.forget("ml", "demo")


def test_an_accepted_report_sets_the_jobs_gauges(demo: None) -> None:
    report = TrainerReport(progress=Progress(step=5, total_steps=10, loss=1.5, eval_loss=1.625, percent=50.0,
                                             tokens_per_second=2048.0, eta_seconds=30.0))
    status, reason, writer = answer_of(report.to_dict(exclude_none=True))
    assert (status, reason) == (200, "ok")
    assert writer.written[0][2]["progress"]["summary"] == "50% (5/10)"
    assert series_of("ml", "demo") == {
        "finetune_job_loss": 1.5, "finetune_job_eval_loss": 1.625, "finetune_job_tokens_per_second": 2048.0,
        "finetune_job_progress_ratio": 0.5, "finetune_job_eta_seconds": 30.0, "finetune_job_attempt": 2.0,
    }


def test_a_trainers_own_summary_is_replaced(demo: None) -> None:
    body = {"progress": {"step": 1, "totalSteps": 4, "summary": "done"}}
    status, _, writer = answer_of(body)
    assert status == 200 and writer.written[0][2]["progress"]["summary"] == "25% (1/4)"
    assert series_of("ml", "demo") == {"finetune_job_progress_ratio": 0.25, "finetune_job_attempt": 2.0}


class FinishedWriter(Writer):
    """The status write succeeds, and its answer says the job has already finished."""

    async def __call__(self, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        await super().__call__(ns, name, status)
        return {"status": {**status, "phase": "Succeeded"}}


@pytest.mark.parametrize(
    ("kwargs", "body", "code"),
    [
        ({"writer": Writer(gone=True)}, REPORT, 404),
        ({"writer": FinishedWriter()}, REPORT, 200),
        ({}, {"progress": {"step": -1}}, 400),
        ({"token": None}, REPORT, 401),
    ],
    ids=["job-gone", "written-after-the-end", "invalid", "no-token"],
)
def test_no_gauges_for_a_refused_report_or_a_job_that_ended(demo: None, kwargs: dict[str, Any], body: Any,
                                                            code: int) -> None:
    metrics.JOB_SERIES.record("ml", "demo", attempt=1, loss=9.0)  # from an earlier report
    ended = code in (404, 200)
    status, _, _ = answer_of(body, **kwargs)
    assert status == code
    assert series_of("ml", "demo") == ({} if ended else {"finetune_job_loss": 9.0, "finetune_job_attempt": 1.0})
