"""The status screen and the watch line, from FineTuneJob bodies as the API server returns them (no cluster)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from finetune_api.v1alpha1.status import Progress
from finetune_operator.view.screen import (
    Event,
    History,
    bar,
    duration,
    recent,
    render_screen,
    sparkline,
    summary_line,
    terminal_exit,
    throughput,
)

NOW = datetime(2026, 12, 1, 21, 41, tzinfo=UTC)


def body(**status: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "demo", "namespace": "ml", "creationTimestamp": "2026-12-01T21:00:00Z"},
        "spec": {"training": {"maxSteps": 200}},
        "status": {
            "phase": "Running",
            "attempt": 2,
            "restarts": 1,
            "nodes": 2,
            "readyNodes": 2,
            "progress": {"step": 57, "totalSteps": 100, "loss": 1.2345, "evalLoss": 1.31, "learningRate": 1e-4,
                         "tokensPerSecond": 12345.6, "etaSeconds": 310, "epoch": 0.57,
                         "updatedAt": "2026-12-01T21:40:03Z"},
            "plan": {"zeroStage": 3, "offload": "optimizer:cpu", "estimatedGPUMemory": "61.2Gi",
                     "gradientCheckpointing": "8 of 32 layers (every 4)", "reason": "ZeRO-2 does not fit"},
            "output": {"hubRepo": "org/demo", "revision": "a" * 40,
                       "url": "https://huggingface.co/org/demo/commit/" + "a" * 40},
            "conditions": [
                {"type": "Running", "status": "True", "reason": "Running", "message": "attempt 2 is running",
                 "lastTransitionTime": "2026-12-01T21:30:00Z"},
                {"type": "PodsHealthy", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes are available"},
            ],
        },
    }
    base["status"].update(status)
    return base


def event(reason: str, stamp: str, kind: str = "Pod", name: str = "demo-2-0-x7k2p", **extra: Any) -> Event:
    return Event.from_body({"type": "Normal", "reason": reason, "message": f"{reason}  happened",
                            "involvedObject": {"kind": kind, "name": name}, "lastTimestamp": stamp, **extra})


@pytest.mark.parametrize(("fraction", "expected"), [
    (0.0, "[" + " " * 10 + "]"),
    (1.0, "[" + "█" * 10 + "]"),
    (0.5, "[" + "█" * 5 + " " * 5 + "]"),
    (1 / 80, "[▏" + " " * 9 + "]"),  # one eighth of one cell
    (0.55, "[█████▌    ]"),
    (7.0, "[" + "█" * 10 + "]"),  # clamped
    (-1.0, "[" + " " * 10 + "]"),
])
def test_bar_fills_eighths_of_cells(fraction: float, expected: str) -> None:
    assert bar(fraction, 10) == expected


def test_sparkline_maps_lowest_to_highest_and_keeps_the_latest_points() -> None:
    assert sparkline([3.0, 2.0, 1.0]) == "█▅▁"  # 3.5 of 7 steps rounds to the even 4
    assert sparkline([1.0, 8.0]) == "▁█"
    assert sparkline([5.0, 5.0, 5.0]) == "▄▄▄"  # flat: mid-height, not the floor
    assert sparkline([]) == ""
    assert sparkline([100.0, 1.0, 2.0], width=2) == "▁█"  # only the last two, scaled among themselves


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (42.9, "42s"), (185, "3m05s"), (3720, "1h02m"), (2 * 86400 + 3 * 3600 + 59, "2d03h"), (-5, "0s"),
])
def test_duration_has_two_units_at_most(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_throughput_units() -> None:
    assert throughput(850.2) == "850 tok/s"
    assert throughput(12345.6) == "12.3k tok/s"
    assert throughput(1_204_000) == "1.20M tok/s"


def test_history_keeps_a_loss_point_per_reported_step() -> None:
    history = History(limit=3)
    for step, loss in [(1, 2.0), (1, 2.0), (2, 1.5), (3, 1.2), (4, 1.1), (5, 1.1)]:
        history.observe(Progress(step=step, loss=loss, total_steps=10))
    history.observe(None)
    history.observe(Progress(step=6, total_steps=10))  # no loss in this report
    assert history.loss == [1.2, 1.1, 1.1]  # the last three; a flat step is a point
    assert history.eval_loss == []


def test_history_keeps_an_eval_point_per_new_value() -> None:
    """Reports repeat the last evaluation's loss at every step until the next evaluation."""
    history = History()
    for step, ev in [(1, 1.9), (2, 1.9), (3, 1.9), (4, 1.7), (5, 1.7), (6, 1.6)]:
        history.observe(Progress(step=step, eval_loss=ev))
    assert history.eval_loss == [1.9, 1.7, 1.6]


def test_screen_shows_phase_attempt_progress_plan_conditions_events_and_output() -> None:
    events = [event("Scheduled", "2026-12-01T21:30:05Z"),
              event("Restarting", "2026-12-01T21:29:00Z", kind="FineTuneJob", name="demo", count=2)]
    text = render_screen(body(), events, now=NOW, width=200)
    lines = text.splitlines()
    assert lines[0] == "FineTuneJob ml/demo   Running   attempt 2 (1 restart)   nodes 2/2 ready   age 41m00s"
    assert lines[1] == "Progress   [" + "█" * 17 + "▏" + " " * 12 + "]  57.0%  step 57/100  epoch 0.57"
    assert lines[2] == "Loss       1.2345   eval 1.3100"  # one look: the latest values, no curve
    assert lines[3] == "Speed      12.3k tok/s   lr 1.00e-04   ETA 5m10s   reported 21:40:03Z"
    assert lines[4] == ("Plan       ZeRO-3, offload optimizer:cpu, ~61.2Gi per GPU estimated, gradient checkpointing "
                        "8 of 32 layers (every 4)  (ZeRO-2 does not fit)")
    assert lines[5] == "Output     https://huggingface.co/org/demo/commit/" + "a" * 40
    assert "  PodsHealthy  False    Unschedulable  0/3 nodes are available" in lines
    assert "  Running      True     Running        attempt 2 is running  since 21:30:00Z" in lines
    at = lines.index("Events (last 2)")
    assert lines[at + 1] == "  21:29:00Z  Normal   Restarting  FineTuneJob/demo    Restarting happened (x2)"
    assert lines[at + 2] == "  21:30:05Z  Normal   Scheduled   Pod/demo-2-0-x7k2p  Scheduled happened"


def test_screen_draws_the_loss_curve_seen_during_a_watch() -> None:
    history = History()
    for step, (loss, ev) in enumerate([(2.0, 2.1), (1.5, 1.9), (1.0, 1.8)]):
        history.observe(Progress(step=step, loss=loss, eval_loss=ev, total_steps=100))
    text = render_screen(body(), history=history, now=NOW)
    assert "Loss       1.2345  █▅▁   eval 1.3100  █▃▁" in text.splitlines()


def test_screen_before_the_first_report_and_without_plan_or_output() -> None:
    b = body(progress=None, plan=None, output=None, conditions=[], restarts=0, attempt=0, phase="Pending")
    b["status"] = {k: v for k, v in b["status"].items() if v is not None}
    lines = render_screen(b, now=NOW).splitlines()
    assert lines[0].startswith("FineTuneJob ml/demo   Pending   attempt 0   nodes")
    assert "Progress   no report from the trainer yet" in lines
    assert "Plan       -" in lines and "Output     -" in lines
    assert not any(line.startswith(("Conditions", "Events")) for line in lines)


def test_total_steps_fall_back_to_the_specs_max_steps() -> None:
    b = body()
    del b["status"]["progress"]["totalSteps"]
    assert "step 57/200" in render_screen(b, now=NOW)


def test_screen_of_a_status_this_version_cannot_read_still_shows_the_phase_and_why() -> None:
    b = body(phase="Failed", conditions=[{"type": "Exploded", "status": "True", "reason": "X"}])
    text = render_screen(b, now=NOW)
    assert "   Failed   " in text.splitlines()[0]
    assert "Status     not readable by this ftjob: status.conditions.0.type:" in text


def test_long_lines_are_cut_to_the_width_and_color_marks_only_the_phase() -> None:
    b = body(message="x" * 300)
    text = render_screen(b, now=NOW, width=60)
    assert all(len(line) <= 60 for line in text.splitlines())
    assert text.splitlines()[0] == "FineTuneJob ml/demo   Running   attempt 2 (1 restart)   nod…"
    assert text.splitlines()[-1].endswith("…")
    colored = render_screen(b, now=NOW, width=60, color=True).splitlines()[0]
    assert colored == "FineTuneJob ml/demo   \x1b[36mRunning\x1b[0m   attempt 2 (1 restart)   nod…"
    cut_in_the_phase = render_screen(b, now=NOW, width=26, color=True).splitlines()[0]
    assert cut_in_the_phase == "FineTuneJob ml/demo   Run…"  # no color code cut in half


def test_recent_events_are_the_newest_oldest_first() -> None:
    events = [event(f"E{i}", f"2026-12-01T21:{i:02d}:00Z") for i in range(12)]
    undated = Event.from_body({"reason": "Old", "involvedObject": {"kind": "Pod", "name": "p"}})
    assert [e.reason for e in recent([*reversed(events), undated], limit=3)] == ["E9", "E10", "E11"]
    assert recent(events, limit=0) == []


def test_event_time_is_the_newest_stamp_it_carries() -> None:
    e = Event.from_body({
        "reason": "BackOff", "type": "Warning", "involvedObject": {"kind": "Pod", "name": "p"},
        "eventTime": "2026-12-01T21:00:00.123456Z", "series": {"count": 7, "lastObservedTime": "2026-12-01T21:05:00Z"},
    })
    assert e.time == datetime(2026, 12, 1, 21, 5, tzinfo=UTC)
    assert e.count == 7 and e.type == "Warning"


def test_summary_line_changes_with_what_it_shows_and_only_then() -> None:
    first = summary_line(body())
    assert first == ("Running attempt=2 step=57/100 (57%) loss=1.2345 eval_loss=1.3100 tok/s=12346 eta=5m10s "
                     "zero=3 pods=False/Unschedulable")
    touched = body()
    touched["metadata"]["resourceVersion"] = "999"  # a change the line does not show
    touched["status"]["conditions"][0]["lastTransitionTime"] = "2026-12-01T21:31:00Z"
    assert summary_line(touched) == first
    later = copy.deepcopy(body())
    later["status"]["progress"]["step"] = 58
    assert summary_line(later) != first


def test_summary_line_of_a_finished_job_names_the_reason_and_output() -> None:
    b = body(phase="Succeeded", conditions=[{"type": "Succeeded", "status": "True", "reason": "Completed"}])
    line = summary_line(b)
    assert line.startswith("Succeeded attempt=2 ")
    assert line.endswith("reason=Completed output=https://huggingface.co/org/demo/commit/" + "a" * 40)


@pytest.mark.parametrize(("phase", "code"), [
    ("Succeeded", 0), ("Failed", 1), ("Running", None), ("Restarting", None), ("Pending", None), ("Suspended", None),
])
def test_terminal_exit(phase: str, code: int | None) -> None:
    assert terminal_exit(body(phase=phase)) == code
    assert terminal_exit({"metadata": {"name": "x"}}) is None  # no status yet: Pending
