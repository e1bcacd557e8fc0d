"""What `ftjob status` and `ftjob watch` print, drawn from a FineTuneJob body and its events. Pure: no I/O.

The body is the API server's JSON (what `kubectl get ftj NAME -o json` shows). Its status is read through the
API's own model (`FineTuneJobStatus`), so a field is named in one place; a status this model cannot read (written
by a newer operator) still shows its phase and a line that says what did not parse, rather than nothing.

`status.progress` holds only the latest report (loss, eval loss, step): the curve of earlier values exists
nowhere in the cluster. `History` keeps the values seen while `watch` runs, one point per reported step, and the
screen draws them as a sparkline; `status`, a single look, shows the latest values alone.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from finetune_api.v1alpha1.status import TERMINAL_PHASES, Condition, FineTuneJobStatus, Progress

BAR_WIDTH = 30
"""Cells of the progress bar; each cell shows eighths, so 30 cells resolve 1/240 of the run."""
SPARK_POINTS = 40
"""Points of a sparkline (the most recent ones), and the most `History` keeps per series."""
EVENTS_SHOWN = 8
"""Events on the status screen: the most recent of the job, its attempt Jobs and their pods."""
SCREEN_WIDTH = 120
"""Default line width when the terminal's is unknown (piped output)."""

_EIGHTHS = " ▏▎▍▌▋▊▉"
_SPARKS = "▁▂▃▄▅▆▇█"
_PHASE_COLORS = {
    "Succeeded": "32",  # green
    "Failed": "31",  # red
    "Running": "36",  # cyan
    "Restarting": "33",  # yellow
    "Pending": "33",
    "Suspended": "35",  # magenta
}
EXIT_FOR_PHASE = {"Succeeded": 0, "Failed": 1}
"""How `ftjob watch` exits once the job reaches a terminal phase."""
assert set(EXIT_FOR_PHASE) == TERMINAL_PHASES


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """`[█████▌    ]`: `fraction` (clamped to 0..1) of `width` cells, in eighths of a cell."""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    cells = "█" * full + (_EIGHTHS[part] if part else "")
    return "[" + cells.ljust(width) + "]"


def sparkline(values: Sequence[float], width: int = SPARK_POINTS) -> str:
    """The last `width` values as block heights, lowest to highest of those shown; flat values sit mid-height."""
    shown = list(values)[-width:]
    if not shown:
        return ""
    low, high = min(shown), max(shown)
    if high == low:
        return _SPARKS[len(_SPARKS) // 2 - 1] * len(shown)
    top = len(_SPARKS) - 1
    return "".join(_SPARKS[round((v - low) / (high - low) * top)] for v in shown)


def duration(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`, `2d03h`: two units at most, like `kubectl get`'s AGE."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def throughput(tokens_per_second: float) -> str:
    """`850 tok/s`, `12.3k tok/s`, `1.20M tok/s`."""
    if tokens_per_second >= 1e6:
        return f"{tokens_per_second / 1e6:.2f}M tok/s"
    if tokens_per_second >= 1e3:
        return f"{tokens_per_second / 1e3:.1f}k tok/s"
    return f"{tokens_per_second:.0f} tok/s"


def clock(moment: datetime | None) -> str:
    """`21:40:03Z` (UTC); `-` when unknown."""
    if moment is None:
        return "-"
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%H:%M:%SZ")


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@dataclass(frozen=True)
class Event:
    """One core/v1 Event about the job, an attempt Job or a pod, as much as the screen shows."""

    time: datetime | None
    type: str
    reason: str
    kind: str
    name: str
    message: str
    count: int = 1

    @classmethod
    def from_body(cls, raw: Mapping[str, Any]) -> "Event":
        """From the API's JSON: the newest of lastTimestamp, series.lastObservedTime, eventTime, creation."""
        series = raw.get("series") or {}
        meta = raw.get("metadata") or {}
        stamps = (raw.get("lastTimestamp"), series.get("lastObservedTime"), raw.get("eventTime"),
                  raw.get("firstTimestamp"), meta.get("creationTimestamp"))
        times = [t for t in (_parse_time(s) for s in stamps) if t is not None]
        involved = raw.get("involvedObject") or {}
        return cls(
            time=max(times) if times else None,
            type=str(raw.get("type") or "Normal"),
            reason=str(raw.get("reason") or ""),
            kind=str(involved.get("kind") or ""),
            name=str(involved.get("name") or ""),
            message=" ".join(str(raw.get("message") or "").split()),
            count=int(series.get("count") or raw.get("count") or 1),
        )


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def recent(events: Iterable[Event], limit: int = EVENTS_SHOWN) -> list[Event]:
    """The `limit` newest events, oldest first (undated ones count as oldest)."""
    epoch = datetime.min.replace(tzinfo=UTC)
    return sorted(events, key=lambda e: e.time or epoch)[-limit:] if limit > 0 else []


@dataclass
class History:
    """Loss and eval loss seen so far (status holds only the latest). The training loss gets a point per
    reported step; the eval loss a point per new value, since a report repeats the last evaluation's loss at
    every step until the next evaluation (and does not say at which step that was)."""

    limit: int = SPARK_POINTS
    loss: list[float] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    _loss_at: tuple[int, float] | None = None

    def observe(self, progress: Progress | None) -> None:
        """Record the report's values unless they repeat the last point of their series."""
        if progress is None:
            return
        if progress.loss is not None and self._loss_at != (progress.step, progress.loss):
            self._loss_at = (progress.step, progress.loss)
            self._add(self.loss, progress.loss)
        if progress.eval_loss is not None and (not self.eval_loss or self.eval_loss[-1] != progress.eval_loss):
            self._add(self.eval_loss, progress.eval_loss)

    def _add(self, series: list[float], value: float) -> None:
        series.append(value)
        del series[: -self.limit]


@dataclass(frozen=True)
class JobView:
    """The parts of a FineTuneJob body the screen reads, parsed once."""

    namespace: str
    name: str
    status: FineTuneJobStatus
    max_steps: int | None
    created: datetime | None
    problem: str | None = None
    """Why the status did not parse as this version's model (then `status` holds the phase alone)."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "JobView":
        meta = body.get("metadata") or {}
        raw = body.get("status") or {}
        problem = None
        try:
            status = FineTuneJobStatus.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            problem = f"status.{where}: {first['msg']}"
            phase = raw.get("phase")
            status = FineTuneJobStatus(phase=phase) if phase in _PHASE_COLORS else FineTuneJobStatus()
        training = ((body.get("spec") or {}).get("training")) or {}
        max_steps = training.get("maxSteps")
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            status=status,
            max_steps=max_steps if isinstance(max_steps, int) and not isinstance(max_steps, bool) else None,
            created=_parse_time(meta.get("creationTimestamp")),
            problem=problem,
        )

    @property
    def phase(self) -> str:
        return self.status.phase

    @property
    def total_steps(self) -> int | None:
        """Planned optimizer steps: what the trainer reported, else the spec's maxSteps."""
        progress = self.status.progress
        if progress is not None and progress.total_steps:
            return progress.total_steps
        return self.max_steps

    def condition(self, ctype: str) -> Condition | None:
        return next((c for c in self.status.conditions if c.type == ctype), None)


def terminal_exit(body: Mapping[str, Any]) -> int | None:
    """0 once the job Succeeded, 1 once it Failed, None while it can still change."""
    return EXIT_FOR_PHASE.get(JobView.from_body(body).phase)


def _paint(text: str, code: str | None, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color and code else text


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def _progress_lines(view: JobView, history: History | None) -> list[str]:
    progress = view.status.progress
    if progress is None:
        return ["Progress   no report from the trainer yet"]
    total = view.total_steps
    epoch = f"  epoch {progress.epoch:.2f}" if progress.epoch is not None else ""
    if total:
        ratio = progress.step / total
        percent = progress.percent if progress.percent is not None else 100 * ratio
        head = f"Progress   {bar(ratio)} {percent:5.1f}%  step {progress.step}/{total}{epoch}"
    else:
        head = f"Progress   step {progress.step} (total unknown){epoch}"
    losses = history.loss if history else []
    evals = history.eval_loss if history else []
    loss = f"Loss       {_number(progress.loss, '.4f')}"
    if len(losses) > 1:
        loss += f"  {sparkline(losses)}"
    loss += f"   eval {_number(progress.eval_loss, '.4f')}"
    if len(evals) > 1:
        loss += f"  {sparkline(evals)}"
    speed = [
        throughput(progress.tokens_per_second) if progress.tokens_per_second is not None else "- tok/s",
        f"lr {_number(progress.learning_rate, '.2e')}",
        f"ETA {duration(progress.eta_seconds) if progress.eta_seconds is not None else '-'}",
        f"reported {clock(progress.updated_at)}",
    ]
    return [head, loss, "Speed      " + "   ".join(speed)]


def _plan_line(view: JobView) -> str:
    plan = view.status.plan
    if plan is None:
        return "Plan       -"
    line = f"Plan       ZeRO-{plan.zero_stage}, offload {plan.offload}, ~{plan.estimated_gpu_memory} per GPU estimated"
    if plan.gradient_checkpointing:
        line += f", gradient checkpointing {plan.gradient_checkpointing}"
    return line + (f"  ({plan.reason})" if plan.reason else "")


def _output_line(view: JobView) -> str:
    out = view.status.output
    if out is None:
        return "Output     -"
    where = out.url or (f"{out.hub_repo}@{out.revision}" if out.hub_repo and out.revision else out.hub_repo)
    return f"Output     {where or '-'}"


def render_screen(body: Mapping[str, Any], events: Sequence[Event] = (), history: History | None = None, *,
                  now: datetime | None = None, width: int = SCREEN_WIDTH, color: bool = False) -> str:
    """The status screen: header, progress, loss, speed, plan, output, conditions, recent events, message."""
    view = JobView.from_body(body)
    st = view.status
    header = f"FineTuneJob {view.namespace}/{view.name}   {st.phase}   attempt {st.attempt}"
    if st.restarts:
        header += f" ({st.restarts} restart{'s' if st.restarts != 1 else ''})"
    if st.nodes is not None:
        header += f"   nodes {st.ready_nodes}/{st.nodes} ready"
    if view.created is not None and now is not None:
        header += f"   age {duration((now - view.created).total_seconds())}"
    lines = [*_progress_lines(view, history), _plan_line(view), _output_line(view)]
    if view.problem:
        lines.append(f"Status     not readable by this ftjob: {view.problem}")
    if st.conditions:
        lines.append("Conditions")
        type_w = max(len(c.type) for c in st.conditions)
        reason_w = max(len(c.reason) for c in st.conditions)
        for c in st.conditions:
            since = f"  since {clock(c.last_transition_time)}" if c.last_transition_time else ""
            lines.append(f"  {c.type:<{type_w}}  {c.status:<7}  {c.reason:<{reason_w}}  {c.message}{since}".rstrip())
    shown = recent(events)
    if shown:
        lines.append(f"Events (last {len(shown)})")
        reason_w = max(len(e.reason) for e in shown)
        object_w = max(len(e.kind) + 1 + len(e.name) for e in shown)
        for e in shown:
            what = f"{e.kind}/{e.name}"
            message = e.message + (f" (x{e.count})" if e.count > 1 else "")
            lines.append(f"  {clock(e.time)}  {e.type:<7}  {e.reason:<{reason_w}}  {what:<{object_w}}  {message}")
    if st.message:
        lines.append(f"Message    {st.message}")
    header = _fit(header, width)
    lead = f"FineTuneJob {view.namespace}/{view.name}   {st.phase}"
    if header.startswith(lead):  # the phase in color, when the width leaves it whole
        header = lead[: -len(st.phase)] + _paint(st.phase, _PHASE_COLORS.get(st.phase), color) + header[len(lead):]
    return "\n".join([header, *(_fit(line, width) for line in lines)])


def summary_line(body: Mapping[str, Any]) -> str:
    """One line that changes when something a person follows changes: `watch` prints it per change when piped.

    No clock in it, so that two events with the same content give the same line (the caller stamps it)."""
    view = JobView.from_body(body)
    st = view.status
    parts = [st.phase, f"attempt={st.attempt}"]
    progress = st.progress
    if progress is not None:
        total = view.total_steps
        step = f"step={progress.step}/{total}" if total else f"step={progress.step}"
        if total:
            step += f" ({100 * progress.step / total:.0f}%)"
        parts += [step, f"loss={_number(progress.loss, '.4f')}", f"eval_loss={_number(progress.eval_loss, '.4f')}"]
        if progress.tokens_per_second is not None:
            parts.append(f"tok/s={progress.tokens_per_second:.0f}")
        if progress.eta_seconds is not None:
            parts.append(f"eta={duration(progress.eta_seconds)}")
    if st.plan is not None:
        parts.append(f"zero={st.plan.zero_stage}")
    health = view.condition("PodsHealthy")
    if health is not None:
        parts.append(f"pods={health.status}/{health.reason}")
    if st.phase in TERMINAL_PHASES:
        final = view.condition(st.phase)
        if final is not None:
            parts.append(f"reason={final.reason}")
        if st.output is not None and st.output.url:
            parts.append(f"output={st.output.url}")
    return " ".join(parts)
