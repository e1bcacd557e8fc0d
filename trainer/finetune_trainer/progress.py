"""Progress: one readable log line per logging step, a `metrics.jsonl`, and POSTs to the operator.

The main process POSTs `TrainerReport` JSON to `$FTJOB_PROGRESS_URL` with `Authorization: Bearer <token>`,
the token re-read from `$FTJOB_PROGRESS_TOKEN_FILE` on every POST because projected tokens rotate, and TLS
verified against `$FTJOB_PROGRESS_CA_FILE` when set. POSTs happen on a background thread (latest report
wins), at most every `interval` seconds except the last step, with short timeouts: a slow or absent operator
never slows or fails training, and its failures are logged once. Only the standard library is used.

The operator refuses numbers outside `Progress`'s limits (a NaN or 1e308 loss, from a diverged run), so a
value outside them is left out of the report (it still goes to the log line and metrics.jsonl), and a
report that would not validate is skipped rather than failing the training loop.
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError
from transformers import TrainerCallback

from finetune_api.constants import ENV_PROGRESS_CA_FILE, ENV_PROGRESS_TOKEN_FILE, ENV_PROGRESS_URL
from finetune_api.v1alpha1.status import (
    ETA_LIMIT,
    METRIC_LIMIT,
    THROUGHPUT_LIMIT,
    OutputStatus,
    Progress,
    TrainerReport,
)
from finetune_trainer import output

log = logging.getLogger(__name__)


class Reporter:
    """Sends reports to the operator from a daemon thread; a no-op without FTJOB_PROGRESS_URL."""

    def __init__(self, *, timeout: float = 3.0) -> None:
        self.url = os.environ.get(ENV_PROGRESS_URL) or None
        self.timeout = timeout
        self._pending: TrainerReport | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._warned = False
        if self.url:
            threading.Thread(target=self._loop, name="ftjob-progress", daemon=True).start()

    def submit(self, report: TrainerReport) -> None:
        """Queue a report; an unsent older one is replaced (only the latest matters)."""
        if not self.url:
            return
        with self._lock:
            self._pending = report
            self._idle.clear()
        self._wake.set()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait briefly for the queue to drain (end of training, after a push)."""
        self._idle.wait(timeout)

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                report, self._pending = self._pending, None
            if report is not None:
                self._post(report)
            with self._lock:
                if self._pending is None:
                    self._idle.set()

    def _post(self, report: TrainerReport) -> None:
        assert self.url is not None
        headers = {"Content-Type": "application/json"}
        token_file = os.environ.get(ENV_PROGRESS_TOKEN_FILE)
        try:
            if token_file:
                headers["Authorization"] = "Bearer " + Path(token_file).read_text().strip()
            body = json.dumps(report.to_dict(exclude_none=True)).encode()
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            ca = os.environ.get(ENV_PROGRESS_CA_FILE)
            context = ssl.create_default_context(cafile=ca) if ca else None
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as response:
                response.read()
            log.debug("progress posted: %s", report.progress)
        except Exception as e:  # never fail training over progress
            if not self._warned:
                log.warning(
                    "progress endpoint %s unreachable (%s); training continues, further errors at debug",
                    self.url,
                    e,
                )
                self._warned = True
            else:
                log.debug("progress post failed: %s", e)


def report_output(reporter: Reporter, output: OutputStatus) -> None:
    """Tell the operator where the adapter went."""
    reporter.submit(TrainerReport(output=output))
    reporter.flush()


def _eta(seconds: float | None) -> str:
    return str(timedelta(seconds=int(seconds))) if seconds is not None else "?"


class ProgressCallback(TrainerCallback):
    """Turns Trainer logs into Progress reports, log lines and metrics.jsonl rows (main process only)."""

    def __init__(self, reporter: Reporter, metrics_file: Path, *, interval: float = 5.0) -> None:
        self.reporter = reporter
        self.metrics_file = metrics_file
        self.interval = interval
        self._last_post = 0.0
        self._start = time.monotonic()
        self._start_step = 0
        self._start_tokens = 0
        self._loss: float | None = None
        self._eval_loss: float | None = None
        self._lr: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self._start = time.monotonic()
        self._start_step = state.global_step
        self._start_tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        self._loss = logs.get("loss", self._loss)
        self._eval_loss = logs.get("eval_loss", self._eval_loss)
        self._lr = logs.get("learning_rate", self._lr)
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps({"step": state.global_step, **logs}) + "\n")
        try:
            progress: Progress | None = self._progress(state, logs)
        except ValidationError as e:  # never fail training over a report
            log.debug("progress report skipped: %s", e)
            progress = None
        self._log_line(state, logs, progress)
        last = state.max_steps > 0 and state.global_step >= state.max_steps
        now = time.monotonic()
        if progress is not None and (last or "eval_loss" in logs or now - self._last_post >= self.interval):
            self._last_post = now
            self.reporter.submit(TrainerReport(progress=progress))

    def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if state.is_world_process_zero:
            self.reporter.flush()

    def _log_line(self, state: Any, logs: dict[str, Any], progress: Progress | None) -> None:
        """One line per Trainer log call, by kind: a training step (loss), an evaluation, or the end of training
        (Trainer's summary: runtime and mean loss). The numbers also go to JSON output as fields."""
        total = state.max_steps if state.max_steps > 0 else None
        fields: dict[str, Any] = {
            "step": state.global_step,
            "max_steps": total,
            "loss": self._loss,
            "eval_loss": self._eval_loss,
            "learning_rate": self._lr,
            "tokens_per_second": progress.tokens_per_second if progress else None,
            "eta_seconds": progress.eta_seconds if progress else None,
        }
        extra = {output.FIELDS: {k: v for k, v in fields.items() if v is not None}}
        if "loss" in logs:
            eval_part = f" eval_loss {_fmt(self._eval_loss)}" if self._eval_loss is not None else ""
            log.info(
                "step %d/%s (%.0f%%) loss %s%s lr %s tok/s %s eta %s",
                state.global_step,
                total,
                (progress.percent if progress else None) or 0.0,
                _fmt(self._loss),
                eval_part,
                _fmt(self._lr),
                _fmt(progress.tokens_per_second if progress else None),
                _eta(progress.eta_seconds if progress else None),
                extra=extra,
            )
        elif "eval_loss" in logs:
            log.info("eval at step %d/%s: eval_loss %s", state.global_step, total, _fmt(self._eval_loss), extra=extra)
        elif "train_runtime" in logs:
            log.info(
                "training done: step %d/%s in %.1f s, mean loss %s",
                state.global_step,
                total,
                float(logs["train_runtime"]),
                _fmt(logs.get("train_loss")),
                extra=extra,
            )


    def _progress(self, state: Any, logs: dict[str, Any]) -> Progress:
        """Step, rates and ETA from the Trainer state; rates count this process's run, not a resumed past."""
        elapsed = max(time.monotonic() - self._start, 1e-6)
        done = state.global_step - self._start_step
        total = state.max_steps if state.max_steps > 0 else None
        tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0) - self._start_tokens
        eta = elapsed / done * (total - state.global_step) if total and done > 0 else None
        return Progress(
            step=state.global_step,
            total_steps=total,
            epoch=_within(state.epoch, 0.0, METRIC_LIMIT),
            loss=_within(self._loss, -METRIC_LIMIT, METRIC_LIMIT),
            eval_loss=_within(self._eval_loss, -METRIC_LIMIT, METRIC_LIMIT),
            learning_rate=_within(self._lr, 0.0, METRIC_LIMIT),
            tokens_per_second=_within(tokens / elapsed, 0.0, THROUGHPUT_LIMIT) if tokens > 0 else None,
            percent=min(100.0, 100.0 * state.global_step / total) if total else None,
            eta_seconds=_within(max(0.0, eta), 0.0, ETA_LIMIT) if eta is not None else None,
            updated_at=datetime.now(UTC),
        )


def _within(value: Any, low: float, high: float) -> float | None:
    """`value` as a float when it is a finite number in [low, high] (what the operator accepts), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and low <= number <= high else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


class ProgressBar(TrainerCallback):
    """A tqdm bar over the optimizer steps, in place of transformers' (rank 0, text output, stderr a terminal:
    `output.show_bar`); log lines are written above it by `output.ConsoleHandler`."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream  # None: stderr
        self._bar: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if state.is_world_process_zero and state.max_steps > 0:
            from tqdm.auto import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(
                total=state.max_steps, initial=state.global_step, unit="step", dynamic_ncols=True, file=self.stream
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if self._bar is not None:
            self._bar.update(state.global_step - self._bar.n)

    def on_train_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def console_callbacks(trainer: Any) -> None:
    """Trainer output as `finetune_trainer.output` wants it: transformers' PrinterCallback (a dict `print` on every
    log, added when `disable_tqdm` is set) removed; our bar added where `output.show_bar` allows one."""
    from transformers.trainer_callback import PrinterCallback
    from transformers.trainer_callback import ProgressCallback as HFProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(HFProgressCallback)
    if output.show_bar(output.installed_settings()):
        trainer.add_callback(ProgressBar())
