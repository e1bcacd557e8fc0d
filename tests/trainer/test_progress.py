"""The progress channel: token re-read on every POST, camelCase TrainerReport, and a dead endpoint is harmless."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_api.v1alpha1.status import Progress, TrainerReport
from tests.fixtures.progress_server import ProgressServer
from tests.trainer.launching import free_port

pytestmark = pytest.mark.trainer


def test_reports_carry_the_current_projected_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from finetune_trainer.progress import Reporter

    token = tmp_path / "token"
    with ProgressServer() as server:
        monkeypatch.setenv("FTJOB_PROGRESS_URL", server.url)
        monkeypatch.setenv("FTJOB_PROGRESS_TOKEN_FILE", str(token))
        reporter = Reporter()
        token.write_text("first\n")
        reporter.submit(TrainerReport(progress=Progress(step=1, total_steps=10, loss=2.5)))
        reporter.flush()
        token.write_text("rotated\n")  # kubelet rotates projected tokens in place
        reporter.submit(TrainerReport(progress=Progress(step=2, total_steps=10)))
        reporter.flush()
    assert server.tokens == ["Bearer first", "Bearer rotated"]
    assert server.reports[0] == {"progress": {"step": 1, "totalSteps": 10, "loss": 2.5}}


def test_an_unreachable_endpoint_never_raises_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from finetune_trainer.progress import Reporter

    monkeypatch.setenv("FTJOB_PROGRESS_URL", f"http://127.0.0.1:{free_port()}/progress")
    monkeypatch.delenv("FTJOB_PROGRESS_TOKEN_FILE", raising=False)
    reporter = Reporter(timeout=0.5)
    for step in range(3):
        reporter.submit(TrainerReport(progress=Progress(step=step)))
        reporter.flush()
    assert caplog.text.count("unreachable") == 1
