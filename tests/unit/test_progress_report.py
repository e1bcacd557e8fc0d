"""The report's own limits (finetune_api.v1alpha1.status): finite, bounded numbers and clean output strings.

They hold for what a trainer POSTs (`TrainerReport`, parsed from JSON as the endpoint does), they are in
the generated CRD's status schema too, and a stored status that breaks them (written before they
existed) still reads, without the offending part.
"""

import json
from typing import Any

import pytest
from pydantic import ValidationError

from finetune_api.v1alpha1.status import INT64_MAX, FineTuneJobStatus, OutputStatus, Progress, TrainerReport
from finetune_operator.crd import build_crd

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def parse(body: str) -> TrainerReport:
    return TrainerReport.model_validate_json(body)


@pytest.mark.parametrize(
    "body",
    [
        '{"progress": {"step": 1, "loss": NaN}}',
        '{"progress": {"step": 1, "loss": Infinity}}',
        '{"progress": {"step": 1, "loss": -Infinity}}',
        '{"progress": {"step": 1, "loss": "NaN"}}',
        '{"progress": {"step": 1, "loss": "1.5"}}',
        '{"progress": {"step": 1, "loss": 1e999}}',
        '{"progress": {"step": 1, "loss": 1e308}}',
        '{"progress": {"step": 1, "loss": -1e308}}',
        '{"progress": {"step": 1, "evalLoss": 1000001}}',
        '{"progress": {"step": 1, "learningRate": -0.1}}',
        '{"progress": {"step": 1, "epoch": 1e300}}',
        '{"progress": {"step": 1, "tokensPerSecond": 1e13}}',
        '{"progress": {"step": 1, "percent": 100.5}}',
        '{"progress": {"step": 1, "etaSeconds": 1e11}}',
        '{"progress": {"step": 9223372036854775808}}',
        '{"progress": {"step": 99999999999999999999999999999999}}',
        '{"progress": {"step": 1, "totalSteps": -1}}',
        '{"progress": {"step": "5"}}',
        '{"progress": {"step": 5.5}}',
        '{"progress": {"step": 11, "totalSteps": 10}}',
        '{"progress": {"step": 1, "loss": ' + "1" * 400 + "}}",
    ],
    ids=["nan", "inf", "-inf", "nan-string", "number-string", "overflow-float", "loss-1e308", "loss--1e308",
         "eval-loss-over-1e6", "negative-lr", "epoch-1e300", "throughput-1e13", "percent-over-100", "eta-1e11",
         "step-over-int64", "step-huge", "negative-total", "step-string", "step-fraction", "step-beyond-total",
         "loss-400-digits"],
)
def test_numbers_outside_the_limits_are_refused(body: str) -> None:
    with pytest.raises(ValidationError):
        parse(body)


def test_numbers_at_the_limits_are_kept() -> None:
    report = parse(json.dumps({"progress": {"step": INT64_MAX, "totalSteps": INT64_MAX, "loss": -1e6, "evalLoss": 1e6,
                                            "learningRate": 0, "percent": 100, "epoch": 3, "tokensPerSecond": 1e12}}))
    assert report.progress is not None and report.progress.step == INT64_MAX and report.progress.loss == -1e6
    assert parse('{"progress": {"step": 10, "totalSteps": 10}}').progress is not None


@pytest.mark.parametrize(
    "output",
    [
        {"url": "javascript:alert(1)"},
        {"url": "data:text/html,hi"},
        {"url": "https://huggingface.co/acme/x\u0000"},
        {"url": "https://huggingface.co/acme/x\u001b[2J"},
        {"url": "https://huggingface.co/acme/x\r\nX-Injected: 1"},
        {"url": "https://huggingface.co/acme/x\u0007"},
        {"url": "https://huggingface.co/acme/x\u009b31m"},
        {"url": "https://huggingface.co/a b"},
        {"url": "https://huggingface.co/\"><script>"},
        {"url": "https://huggingface.co/" + "a" * 60_000},
        {"revision": "main\u001b[31m"},
        {"revision": "-rf"},
        {"revision": "a" * 256},
        {"hubRepo": "acme/x\u0000"},
        {"hubRepo": "acme/x\nevil"},
        {"hubRepo": "not-a-repo"},
        {"hubRepo": "acme/" + "x" * 300},
    ],
    ids=["javascript", "data", "nul", "esc", "crlf", "bel", "c1-csi", "space", "markup", "60kb", "revision-esc",
         "revision-dash", "revision-long", "repo-nul", "repo-newline", "repo-no-slash", "repo-long"],
)
def test_output_strings_are_printable_bounded_and_http(output: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse(json.dumps({"output": output}))


def test_a_real_push_validates() -> None:
    output = OutputStatus(hub_repo="acme/demo-adapter", revision=COMMIT,
                          url=f"https://huggingface.co/acme/demo-adapter/commit/{COMMIT}")
    assert parse(json.dumps({"output": output.to_dict(exclude_none=True)})).output == output
    assert OutputStatus(revision="refs/pr/1").revision == "refs/pr/1"
    assert OutputStatus(url=f"http://hub.ml.svc:8080/acme/x/commit/{COMMIT}").url


def test_the_crd_status_schema_carries_the_same_limits() -> None:
    status = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    output, progress = status["output"]["properties"], status["progress"]["properties"]
    assert output["url"]["maxLength"] == 2048 and output["url"]["pattern"].startswith("^https?://")
    assert output["revision"]["maxLength"] == 255 and "pattern" in output["revision"]
    assert output["hubRepo"]["maxLength"] == 200 and "pattern" in output["hubRepo"]
    assert progress["step"]["format"] == progress["totalSteps"]["format"] == "int64"
    assert "maximum" not in progress["step"]  # the API server would read 2**63 - 1 as a float64 and overflow
    assert (progress["loss"]["minimum"], progress["loss"]["maximum"]) == (-1e6, 1e6)


def test_a_stored_status_that_breaks_the_limits_still_reads_without_that_part() -> None:
    stored = {"phase": "Running", "attempt": 2, "progress": {"step": 11, "totalSteps": 10, "loss": 1e308},
              "output": {"url": "javascript:alert(1)"}}
    status = FineTuneJobStatus.model_validate(stored)
    assert (status.phase, status.attempt, status.progress, status.output) == ("Running", 2, None, None)
    assert FineTuneJobStatus.model_validate({"progress": {"step": 3}}).progress == Progress(step=3)


def test_the_trainer_leaves_out_what_the_operator_would_refuse() -> None:
    progress_module = pytest.importorskip("finetune_trainer.progress", reason="trainer extras not installed")

    class State:
        global_step, max_steps, epoch, num_input_tokens_seen = 5, 10, float("inf"), 0
        is_world_process_zero = True

    class Reporter:
        reports: list[TrainerReport] = []

        def submit(self, report: TrainerReport) -> None:
            self.reports.append(report)

    reporter = Reporter()
    callback = progress_module.ProgressCallback(reporter, metrics_file=_devnull(), interval=0.0)
    callback.on_log(None, State(), None, logs={"loss": float("nan"), "learning_rate": 2e-4, "eval_loss": 1e308})
    (report,) = reporter.reports
    assert report.progress is not None and report.progress.step == 5
    assert (report.progress.loss, report.progress.eval_loss, report.progress.epoch) == (None, None, None)
    assert report.progress.learning_rate == 2e-4


def _devnull() -> Any:
    from pathlib import Path

    return Path("/dev/null")
