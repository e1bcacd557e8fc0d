"""Which pods and events belong to a job, by the labels and names the operator gives its children. Pure.

The operator labels every child with the job's name and the attempt Job and its pods with the attempt
(`render.names`); the Job controller labels each pod of an Indexed Job with its completion index, which the
launch command passes as the machine rank, so rank 0 of attempt n is the pod of attempt n with index 0. When
the Job controller replaced that pod within the attempt, several carry the index: the one not being deleted
that started last is the one whose log is live.

Events name their object but carry no labels. The attempt Jobs are named `render.names.attempt_job_name_of`;
their pods `<attempt Job>-<index>-<suffix>` (the Job controller's generateName for Indexed Jobs). So an
event is the job's when it is about the FineTuneJob, one of its attempt Jobs, or a pod whose name is one of
those Jobs' names followed by an index and a suffix - which a job whose own name merely starts the same
(`demo` and `demo-1`) does not match.
"""

import re
from collections.abc import Iterable, Mapping
from typing import Any

from finetune_api import constants
from finetune_operator.render.names import attempt_job_name_of

STARTED_PHASES = frozenset({"Running", "Succeeded", "Failed"})
"""Pod phases in which the trainer container has a log to read."""


def job_selector(job_name: str, attempt: int | None = None) -> str:
    """The label selector of a job's children; of one attempt's Job and pods when `attempt` is given."""
    selector = f"{constants.LABEL_JOB_NAME}={job_name}"
    return selector if attempt is None else f"{selector},{constants.LABEL_ATTEMPT}={attempt}"


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def completion_index(pod: Mapping[str, Any]) -> int | None:
    """The pod's index in its Indexed Job (label, else annotation); None for a pod outside one."""
    meta = _meta(pod)
    for source in (meta.get("labels") or {}, meta.get("annotations") or {}):
        value = source.get(constants.LABEL_COMPLETION_INDEX)
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def attempt_of(pod: Mapping[str, Any]) -> int | None:
    value = (_meta(pod).get("labels") or {}).get(constants.LABEL_ATTEMPT)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def started(pod: Mapping[str, Any]) -> bool:
    """The trainer container has run (a log exists): the pod left Pending, or its container left waiting."""
    status = pod.get("status") or {}
    if status.get("phase") in STARTED_PHASES:
        return True
    for container in status.get("containerStatuses") or []:
        if container.get("name") == constants.TRAINER_CONTAINER:
            state = container.get("state") or {}
            return "running" in state or "terminated" in state
    return False


def rank0_pod(pods: Iterable[Mapping[str, Any]], job_name: str, attempt: int) -> Mapping[str, Any] | None:
    """Rank 0 of `attempt` of job `job_name`: its pod with completion index 0; among replacements, the one
    not being deleted, then started, then created last."""
    mine = [
        p for p in pods
        if (_meta(p).get("labels") or {}).get(constants.LABEL_JOB_NAME) == job_name
        and attempt_of(p) == attempt and completion_index(p) == 0
    ]
    if not mine:
        return None

    def rank(pod: Mapping[str, Any]) -> tuple[bool, bool, str]:
        meta = _meta(pod)
        return (not meta.get("deletionTimestamp"), started(pod), str(meta.get("creationTimestamp") or ""))

    return max(mine, key=rank)


def _pod_name_pattern(job_name: str, attempts: int) -> re.Pattern[str]:
    jobs = "|".join(re.escape(attempt_job_name_of(job_name, a)) for a in range(1, attempts + 1))
    return re.compile(rf"^(?:{jobs})-\d+-[a-z0-9]+$")


def event_is_about(event: Mapping[str, Any], job_name: str, attempt: int) -> bool:
    """The event concerns the FineTuneJob `job_name`, one of its attempt Jobs 1..attempt, or one of their pods."""
    involved = event.get("involvedObject") or {}
    kind, name = involved.get("kind"), str(involved.get("name") or "")
    if kind == constants.KIND:
        return name == job_name
    if kind == "Job":
        return name in {attempt_job_name_of(job_name, a) for a in range(1, attempt + 1)}
    if kind == "Pod":
        return attempt >= 1 and _pod_name_pattern(job_name, attempt).match(name) is not None
    return False
