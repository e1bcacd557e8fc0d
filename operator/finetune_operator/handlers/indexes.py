"""kopf indexes of a job's children (Jobs, Pods, ConfigMap, Service), keyed by (namespace, job name).

Each index keeps a small frozen summary rather than the body, so memory stays flat, and records the
owner uid so the children of a deleted namesake are never taken for this job's. `observe()` folds
the index entries of one job into the pure `Observed` that `reconcile` reads. kopf fills indexes
before any other handler runs, so the first reconcile after a restart already sees every child.
The ConfigMap and Service indexes are registered here; those of Jobs and pods are in `handlers/jobs.py`,
since their index functions are also what triggers a round on a child's change (one kopf callback per
event, not an index plus an event handler).
The index functions are `async` only so that kopf calls them inline: a sync one goes through a thread
pool for each of the thousands of child events of a burst.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import kopf

from finetune_api import constants
from finetune_api.termination import TerminationRecord
from finetune_operator.health import pod_problem
from finetune_operator.reconcile import TEMPLATE_HASH
from finetune_operator.runtime import Key
from finetune_operator.status import AttemptObserved, Observed, PodObserved

CHILD_LABELS: dict[str, Any] = {
    constants.LABEL_JOB_NAME: kopf.PRESENT,
    constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
}


@dataclass(frozen=True)
class Owned:
    """A summary of one child plus the uid of the job that owns it."""

    owner_uid: str | None
    uid: str
    value: Any


def owner_uid(meta: Mapping[str, Any]) -> str | None:
    """The uid of the controlling owner (the FineTuneJob for our children, the Job for pods)."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def key_of(meta: Mapping[str, Any]) -> Key:
    return str(meta.get("namespace")), str((meta.get("labels") or {}).get(constants.LABEL_JOB_NAME))


def summarize_pod(body: Mapping[str, Any]) -> PodObserved:
    """A trainer pod: phase, readiness, the container's exit code, why it ended, the trainer's record and what
    keeps it from running (`health.pod_problem`: scheduler and kubelet messages; kept here, not the pod)."""
    status = body.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    exit_code, reason, termination = None, status.get("reason"), None
    for cs in status.get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if cs.get("name") == constants.TRAINER_CONTAINER and terminated:
            exit_code, reason = terminated.get("exitCode"), reason or terminated.get("reason")
            termination = TerminationRecord.from_message(terminated.get("message"))
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            reason = cond.get("reason") or reason
    return PodObserved(
        name=str(body["metadata"]["name"]),
        phase=str(status.get("phase") or "Pending"),
        ready=ready,
        exit_code=exit_code,
        reason=reason,
        node=(body.get("spec") or {}).get("nodeName"),
        deleting=bool(body["metadata"].get("deletionTimestamp")),
        termination=termination,
        problem=pod_problem(body),
    )


def summarize_job(body: Mapping[str, Any]) -> AttemptObserved:
    """An attempt's Job: suspended, finished, and the Failed condition's reason."""
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    failed = conds.get("Failed")
    target = conds.get("FailureTarget")  # decided, but pods are still terminating
    why = failed or target
    since = target.get("lastTransitionTime") if target and not failed else None
    return AttemptObserved(
        attempt=int((meta.get("labels") or {}).get(constants.LABEL_ATTEMPT, "0")),
        name=str(meta["name"]),
        suspended=bool(spec.get("suspend")),
        deleting=bool(meta.get("deletionTimestamp")),
        complete="Complete" in conds,
        failed=failed is not None,
        failed_reason=why.get("reason") if why else None,
        failed_message=why.get("message") if why else None,
        failing_since=datetime.fromisoformat(since.replace("Z", "+00:00")) if since else None,
        template_hash=(meta.get("annotations") or {}).get(TEMPLATE_HASH),
    )


def observe(
    uid: str | None,
    jobs: Iterable[Owned],
    pods: Iterable[Owned],
    config_maps: Iterable[Owned],
    services: Iterable[Owned],
) -> Observed:
    """Fold one job's index entries into `Observed`, keeping only children this job owns."""
    mine = [j for j in jobs if j.owner_uid == uid]
    by_job: dict[str, list[PodObserved]] = {}
    for pod in pods:
        by_job.setdefault(str(pod.owner_uid), []).append(pod.value)
    attempts = {}
    for job in mine:
        value: AttemptObserved = job.value
        pods_of = tuple(sorted(by_job.get(job.uid, []), key=lambda p: p.name))
        attempts[value.attempt] = AttemptObserved(**{**value.__dict__, "pods": pods_of, "uid": job.uid})
    config_map = next((c for c in config_maps if c.owner_uid == uid), None)
    return Observed(
        attempts=attempts,
        config_map=config_map.value if config_map else None,
        config_map_uid=config_map.uid if config_map else None,
        service=any(s.owner_uid == uid for s in services),
    )


def owned_job(body: Mapping[str, Any]) -> Owned:
    """An attempt Job as its index keeps it (and as the change check compares it)."""
    return Owned(owner_uid(body["metadata"]), str(body["metadata"].get("uid")), summarize_job(body))


def owned_pod(body: Mapping[str, Any]) -> Owned:
    """A trainer pod as its index keeps it (and as the change check compares it)."""
    return Owned(owner_uid(body["metadata"]), str(body["metadata"].get("uid")), summarize_pod(body))


def pod_trigger(owned: Owned) -> Owned:
    """What of a trainer pod calls for a round (`runtime.ChildTriggers`): its summary without the node it is
    bound to. The node is read only in the message of a lost pod, which comes with a change of phase or
    reason that calls for a round anyway; binding alone changes nothing a round would write (a pod that
    waited for a node loses its scheduler problem with it, which is part of the summary). In a burst that
    is one round fewer per pod."""
    value: PodObserved = owned.value
    return replace(owned, value=replace(value, node=None))


def waiting_arrival(owned: Owned) -> bool:
    """A trainer pod as it is first seen in the normal course: Pending, on no node yet, no problem, not
    going. Such a pod is no news for a round either: the Job that made it was (its round wrote, or left to
    a wake-up, the status that expects pods), and a round now would only note that the pod exists (a
    `PodsHealthy` that says all is well, a detail that waits anyway). Its next change (bound with a
    problem gone, running, failed) is news as usual. In a burst that is one round fewer per pod."""
    value: PodObserved = owned.value
    return value.phase == "Pending" and value.node is None and value.problem is None and not value.deleting


def routine(owned: Owned) -> bool:
    """A child's change that a new job's round would only turn into a status that may wait (a start, a ready
    count): a pod on its way or running with no problem, not ended and not going; an attempt Job that runs (not
    suspended, finished, failing or going). In a burst of new jobs such a round waits for the burst's end
    (`handlers/jobs.py`, `runtime.Burst`); any other change is a round at once."""
    value = owned.value
    if isinstance(value, PodObserved):
        healthy = value.problem is None and value.exit_code is None and value.reason is None
        return value.phase in ("Pending", "Running") and healthy and not value.deleting
    if isinstance(value, AttemptObserved):
        ended = value.complete or value.failed or value.failed_reason is not None or value.failing_since is not None
        return not (value.suspended or value.deleting or ended)
    return False


@kopf.index("", "v1", "configmaps", labels=CHILD_LABELS)
async def ftj_configmaps(body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    """Rendered config files by FineTuneJob."""
    return {key_of(body.meta): Owned(owner_uid(body.meta), str(body.meta.uid), dict(body.get("data") or {}))}


@kopf.index("", "v1", "services", labels=CHILD_LABELS)
async def ftj_services(body: kopf.Body, **_: Any) -> dict[Key, Owned]:
    """Headless Services by FineTuneJob."""
    return {key_of(body.meta): Owned(owner_uid(body.meta), str(body.meta.uid), True)}
