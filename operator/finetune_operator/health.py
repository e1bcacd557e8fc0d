"""Pod health: what keeps a trainer pod from running, read from the pod alone, in words a user can act on.

A job stuck `Pending` says little by itself: the reason (no node with enough GPUs, a missing
PersistentVolumeClaim or Secret, an image the node cannot pull, a container killed for memory, an
eviction) is written by the scheduler and the kubelet into the pod's status, not the FineTuneJob's.
`pod_problem` maps one pod (the dict the API server returns) to its worst `PodProblem`, or None;
`pods_health` folds the problems of an attempt's pods into the `PodsHealthy` condition of the job.
Every fact comes from the pod's own status and spec, never from its events, so the operator learns it
from the pod watch it already has, with no API call: a Secret or ConfigMap missing from an env
reference shows (the kubelet's `CreateContainerConfigError`), while a volume that fails to mount is
only an event (`FailedMount`) and is not seen here. The trainer pods mount no user Secret or
ConfigMap, so only the checkpoint claim can be missing, and the scheduler reports that.

Pure: no I/O, no clock; the same pod always gives the same answer.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

HEALTHY_REASON: Final = "PodsHealthy"
"""The `PodsHealthy` condition's reason while no pod of the current attempt shows a problem."""
UNSCHEDULABLE: Final = "Unschedulable"
OOM_KILLED: Final = "OOMKilled"
CRASH_LOOP: Final = "CrashLoopBackOff"
EVICTED: Final = "Evicted"
IMAGE_REASONS: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "ImageInspectError",
     "RegistryUnavailable", "SignatureValidationFailed"}
)  # fmt: skip
"""The kubelet's container waiting reasons for an image it cannot get."""
START_REASONS: Final = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "PreStartHookError",
     "PostStartHookError"}
)  # fmt: skip
"""The kubelet's container waiting reasons for a container it cannot create or start: a Secret, ConfigMap or
key an env entry names that does not exist (`CreateContainerConfigError`), a command that is not there."""
DETAIL_LIMIT: Final = 1024
"""Characters of one scheduler or kubelet message kept (a scheduler message grows with the number of taints)."""
MESSAGE_LIMIT: Final = 4096
"""Characters of the condition's message: every distinct problem, then how many more there were."""
_RANK: Final = {EVICTED: 0, OOM_KILLED: 1, CRASH_LOOP: 2, **dict.fromkeys(START_REASONS, 3),
                **dict.fromkeys(IMAGE_REASONS, 4), UNSCHEDULABLE: 5}  # fmt: skip
"""Which problem the condition's reason names when pods show several: what ends the attempt first, then what
stops a container from starting, then a pod waiting for a node. A pod-level failure the kubelet names with
another reason (a rejection at admission, `OutOfnvidia.com/gpu`) ranks with an eviction."""


@dataclass(frozen=True)
class PodProblem:
    """Why one pod is not running as it should: a CamelCase reason and what the scheduler or kubelet said."""

    reason: str
    message: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", _clip(self.message))

    @property
    def text(self) -> str:
        """`Reason: message`, for quoting in another sentence."""
        return f"{self.reason}: {self.message}"


@dataclass(frozen=True)
class PodsHealth:
    """The `PodsHealthy` condition of a job: its status ("True" or "False"), reason and message."""

    healthy: bool
    reason: str
    message: str

    @property
    def status(self) -> str:
        return "True" if self.healthy else "False"


def _clip(text: str, limit: int = DETAIL_LIMIT) -> str:
    text = " ".join(str(text).split())  # one line: the kubelet's messages may end in a space or a newline
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _rank(problem: PodProblem) -> int:
    return _RANK.get(problem.reason, 0)


def _memory_limit(name: str, status: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    """The container's memory limit: as the kubelet reports it (Kubernetes 1.33+), else as the spec asks."""
    reported = ((status.get("resources") or {}).get("limits") or {}).get("memory")
    if reported:
        return str(reported)
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if container.get("name") == name:
            limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            return str(limit) if limit else None
    return None


def _oom(name: str, status: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    limit = _memory_limit(name, status, spec)
    if limit:
        return f"container {name} was killed for using more than its memory limit of {limit}"
    return f"container {name} was killed for running out of memory (it has no memory limit: the node ran out)"


def _container_problem(status: Mapping[str, Any], spec: Mapping[str, Any]) -> PodProblem | None:
    """One container's status: an image it cannot get, a start it cannot make, a memory kill, a crash loop."""
    name = str(status.get("name") or "?")
    state = status.get("state") or {}
    waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
    reason = str(waiting.get("reason") or "")
    detail = " ".join(str(waiting.get("message") or "").split())
    if reason in IMAGE_REASONS:
        image = status.get("image") or next(
            (c.get("image") for c in spec.get("containers") or [] if c.get("name") == name), "?"
        )
        return PodProblem(reason, f'container {name}, image "{image}"' + (f": {detail}" if detail else ""))
    if reason in START_REASONS:
        return PodProblem(reason, f"container {name}" + (f": {detail}" if detail else ""))
    if terminated.get("reason") == OOM_KILLED:
        return PodProblem(OOM_KILLED, _oom(name, status, spec))
    if reason == CRASH_LOOP:
        last = (status.get("lastState") or {}).get("terminated") or {}
        restarts = status.get("restartCount") or 0
        text = f"container {name} keeps failing ({restarts} restart(s))"
        if last.get("reason") == OOM_KILLED:
            text += f"; last time: {_oom(name, status, spec)}"
        elif last:
            text += f"; last exit code {last.get('exitCode')} ({last.get('reason') or 'Error'})"
        return PodProblem(CRASH_LOOP, text)
    return None


def pod_problem(pod: Mapping[str, Any]) -> PodProblem | None:
    """The worst problem one pod shows (a pod dict as the API server returns it), or None.

    In order: a pod the kubelet failed as a whole (`Evicted`, a rejection at admission) with its message,
    then its containers (init containers first): an image it cannot pull, a container it cannot create,
    one killed for memory (with its memory limit), one in a crash loop; then a pod the scheduler cannot
    place (the scheduler's message: which nodes lack what, a claim that does not exist). A running,
    pending-but-fine, succeeded or ordinarily failed pod has none: an exit code is the attempt's failure,
    reported by the job's own conditions.
    """
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    problems: list[PodProblem] = []
    if status.get("phase") == "Failed" and status.get("reason") and status.get("message"):
        problems.append(PodProblem(str(status["reason"]), str(status["message"])))
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        found = _container_problem(container, spec)
        if found is not None:
            problems.append(found)
    for condition in status.get("conditions") or []:
        scheduled = condition.get("type") == "PodScheduled" and condition.get("status") == "False"
        if scheduled and condition.get("reason") == UNSCHEDULABLE:
            problems.append(PodProblem(UNSCHEDULABLE, condition.get("message") or "no node fits"))
    return min(problems, key=_rank, default=None)


def _names(pods: Sequence[str]) -> str:
    shown = ", ".join(pods[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
    return f"pod{'s' if len(pods) > 1 else ''} {shown}"


def pods_health(pods: Iterable[tuple[str, PodProblem | None]]) -> PodsHealth:
    """The `PodsHealthy` condition from the (name, problem) of each pod of an attempt.

    Pods with the same problem are named together; the reason is the worst problem's (`_RANK`), the
    message lists every distinct one, worst first, within `MESSAGE_LIMIT`.
    """
    grouped: dict[PodProblem, list[str]] = {}
    for name, problem in sorted(pods, key=lambda p: p[0]):
        if problem is not None:
            grouped.setdefault(problem, []).append(name)
    if not grouped:
        return PodsHealth(True, HEALTHY_REASON, "no pod of the current attempt shows a problem")
    ordered = sorted(grouped.items(), key=lambda item: (_rank(item[0]), item[1][0]))
    parts = [f"{_names(names)}: {problem.text}" for problem, names in ordered]
    message = parts[0]  # a problem's message is at most DETAIL_LIMIT characters: the first always fits
    for i, part in enumerate(parts[1:], start=1):
        more = f" (and {len(parts) - i} more problem(s))"
        if len(message) + 2 + len(part) + len(more) > MESSAGE_LIMIT:
            message += more
            break
        message += f"; {part}"
    return PodsHealth(False, ordered[0][0].reason, message)
