"""What the operator keeps per job between events: the change checks (`Triggers`, `ChildTriggers`) and the newest
body (`Bodies`)."""

import asyncio
from typing import Any

import kopf
import pytest

from finetune_operator.handlers import jobs
from finetune_operator.handlers.indexes import owned_job, owned_pod, pod_trigger, routine
from finetune_operator.handlers.state import OperatorConfig, OperatorState
from finetune_operator.runtime import Bodies, ChildTriggers, Triggers
from finetune_operator.runtime.burst import BURST_JOBS


def _body(
    generation: int = 1, labels: dict[str, str] | None = None, status: dict[str, Any] | None = None, **meta: object
) -> dict[str, Any]:
    metadata = {"name": "a", "namespace": "ns", "uid": "u1", "generation": generation, "labels": labels or {}, **meta}
    return {"metadata": metadata, "spec": {}, "status": status or {}}


def test_only_spec_label_uid_or_deletion_changes_trigger_a_reconcile() -> None:
    triggers, key = Triggers(), ("ns", "a")
    assert triggers.changed(key, Triggers.signature(_body()))
    # our own status writes and progress pushes: same signature, no reconcile
    assert not triggers.changed(key, Triggers.signature(_body(status={"phase": "Running"}, resourceVersion="9")))
    assert triggers.changed(key, Triggers.signature(_body(generation=2)))
    assert triggers.changed(key, Triggers.signature(_body(generation=2, labels={"kueue.x-k8s.io/queue-name": "q"})))
    assert triggers.changed(
        key, Triggers.signature(_body(generation=2, labels={"kueue.x-k8s.io/queue-name": "q"}, deletionTimestamp="t"))
    )
    assert triggers.changed(key, Triggers.signature(_body(uid="u2")))  # a re-created namesake
    triggers.forget(key)
    assert triggers.changed(key, Triggers.signature(_body(uid="u2")))


def _versioned(rv: str, phase: str) -> dict[str, Any]:
    return _body(status={"phase": phase}, resourceVersion=rv, managedFields=[{"manager": "x"}])


def test_the_newest_body_wins_so_a_late_event_never_hides_our_own_status_write() -> None:
    bodies, key = Bodies(), ("ns", "a")
    bodies.offer(key, _versioned("10", "Pending"))  # watch event
    bodies.offer(key, _versioned("12", "Running"))  # the answer to our status write
    bodies.offer(key, _versioned("11", "Pending"))  # an older event delivered after it
    latest = bodies.get(key)
    assert latest is not None and latest["status"]["phase"] == "Running"
    assert "managedFields" not in latest["metadata"] and latest["metadata"]["resourceVersion"] == "12"
    bodies.offer(key, _versioned("13", "Succeeded"))
    assert bodies.get(key)["status"]["phase"] == "Succeeded"  # type: ignore[index]
    bodies.forget(key)
    assert bodies.get(key) is None


def test_versions_that_are_not_numbers_defer_to_arrival_order() -> None:
    bodies, key = Bodies(), ("ns", "a")
    bodies.offer(key, _versioned("b", "Pending"))
    bodies.offer(key, _versioned("a", "Running"))
    assert bodies.get(key)["status"]["phase"] == "Running"  # type: ignore[index]


def _job(**status: Any) -> dict[str, Any]:
    meta = {"name": "a-1", "namespace": "ns", "uid": "j1", "labels": {"finetune.dev/attempt": "1"}}
    meta["ownerReferences"] = [{"controller": True, "uid": "u1"}]
    return {"metadata": meta, "spec": {}, "status": status}


def _pod(**status: Any) -> dict[str, Any]:
    meta = {"name": "a-1-0-x", "namespace": "ns", "uid": "p1", "ownerReferences": [{"controller": True, "uid": "j1"}]}
    return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": {"phase": "Running", **status}}


def test_a_childs_event_triggers_only_when_what_the_round_reads_of_it_changed() -> None:
    children = ChildTriggers()
    assert children.changed("j1", owned_job(_job()))  # first sighting
    assert not children.changed("j1", owned_job(_job(active=2, ready=1, startTime="t")))  # counts: not read
    failed = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
    assert children.changed("j1", owned_job(_job(conditions=failed)))
    ready = [{"type": "Ready", "status": "True"}]
    assert children.changed("p1", owned_pod(_pod()))
    assert not children.changed("p1", owned_pod(_pod(podIP="10.0.0.7", hostIP="10.1.0.1")))
    assert children.changed("p1", owned_pod(_pod(podIP="10.0.0.7", conditions=ready)))
    children.forget("p1")
    assert children.changed("p1", owned_pod(_pod(podIP="10.0.0.7", conditions=ready)))


def _waiting_pod(node: str | None, conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    meta = {"name": "a-1-0-x", "namespace": "ns", "uid": "p1", "ownerReferences": [{"controller": True, "uid": "j1"}]}
    spec = {"nodeName": node} if node else {}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending", "conditions": conditions or []}}


def test_a_pod_bound_to_a_node_is_no_news_but_leaving_a_scheduler_problem_is() -> None:
    children = ChildTriggers()
    assert children.changed("p1", pod_trigger(owned_pod(_waiting_pod(None))))
    bound = owned_pod(_waiting_pod("n1"))
    assert bound.value.node == "n1"  # the index keeps the node (a lost pod's message names it)
    assert not children.changed("p1", pod_trigger(bound))  # the trigger does not look at it
    running = _waiting_pod("n1") | {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    assert children.changed("p1", pod_trigger(owned_pod(running)))
    unschedulable = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes"}]
    children.forget("p1")
    assert children.changed("p1", pod_trigger(owned_pod(_waiting_pod(None, unschedulable))))
    scheduled = [{"type": "PodScheduled", "status": "True"}]
    assert children.changed("p1", pod_trigger(owned_pod(_waiting_pod("n1", scheduled))))  # its problem is gone


def _rounds(monkeypatch: pytest.MonkeyPatch) -> tuple[OperatorState, list[tuple[str, str]]]:
    """An operator state whose rounds are only recorded (which key, in order)."""
    state = OperatorState(config=OperatorConfig(image="t"), kube=None)  # type: ignore[arg-type]
    rounds: list[tuple[str, str]] = []

    async def reconcile_job(_state: Any, key: tuple[str, str], **_: Any) -> None:
        rounds.append(key)

    monkeypatch.setattr(jobs, "reconcile_job", reconcile_job)
    return state, rounds


INDEXES = {name: {} for name in ("ftj_jobs", "ftj_pods", "ftj_configmaps", "ftj_services")}


def _pod_event(state: OperatorState, body: dict[str, Any], type: str = "MODIFIED") -> Any:
    """One watch event of a trainer pod as kopf delivers it: the index function (not for a deletion), then the
    deletion handler (only for one); the rounds they started have run when this returns. The index entry."""
    body["metadata"]["labels"] = {"finetune.dev/job-name": "a"}

    async def deliver() -> Any:
        if type == "DELETED":
            await jobs.child_deleted(body=kopf.Body(body), memo=kopf.Memo(state=state), **INDEXES)
            return None
        entry = await jobs.ftj_pods(body=kopf.Body(body), memo=kopf.Memo(state=state), **INDEXES)
        await asyncio.gather(*state.triggered)
        return entry

    return asyncio.run(deliver())


def test_a_new_pod_that_only_waits_is_no_round_and_its_next_change_is(monkeypatch: pytest.MonkeyPatch) -> None:
    state, rounds = _rounds(monkeypatch)
    state.indexed = True

    def event(body: dict[str, Any], type: str = "MODIFIED") -> None:
        _pod_event(state, body, type)

    event(_waiting_pod(None), "ADDED")
    assert rounds == []  # created, waiting for a node: the Job's round already expects it
    event(_waiting_pod("n1"))
    assert rounds == []  # bound
    event(_waiting_pod("n1") | {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    assert rounds == [("ns", "a")]  # running: news
    unschedulable = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes"}]
    stuck = _waiting_pod(None, unschedulable)
    stuck["metadata"]["uid"] = "p2"
    event(stuck, "ADDED")
    assert rounds == [("ns", "a")] * 2  # a new pod with a problem is news at once
    gone = _waiting_pod(None)
    gone["metadata"]["uid"] = "p3"
    event(gone, "DELETED")
    assert len(rounds) == 3  # a deleted pod always is
    event(stuck, "DELETED")
    assert len(rounds) == 4 and not state.children.knows("p2")  # and is forgotten


def test_before_kopf_filled_its_indexes_a_child_is_indexed_and_noted_but_starts_no_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The listing at start: kopf calls index functions before any handler, and every FineTuneJob's first
    sighting (a handler, so after all indexes are filled) is a round that reads the child anyway."""
    state, rounds = _rounds(monkeypatch)
    running = _waiting_pod("n1") | {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    entry = _pod_event(state, running, type="ADDED")
    assert rounds == [] and state.triggered == set()
    assert entry == {("ns", "a"): owned_pod(running)}  # what kopf keeps in ftj_pods
    state.indexed = True  # what the first handler call says
    _pod_event(state, running)
    assert rounds == []  # noted at the listing: the same summary is no news
    _pod_event(state, running | {"status": {"phase": "Failed"}})
    assert rounds == [("ns", "a")]


def test_an_attempt_jobs_change_is_a_round_and_its_deletion_too(monkeypatch: pytest.MonkeyPatch) -> None:
    state, rounds = _rounds(monkeypatch)
    state.indexed = True
    job = _job()
    job["metadata"] |= {"namespace": "ns", "labels": {"finetune.dev/job-name": "a"}}

    async def deliver(body: dict[str, Any], deleted: bool = False) -> None:
        if deleted:
            await jobs.child_deleted(body=kopf.Body(body), memo=kopf.Memo(state=state), **INDEXES)
        else:
            await jobs.ftj_jobs(body=kopf.Body(body), memo=kopf.Memo(state=state), **INDEXES)
        await asyncio.gather(*state.triggered)

    asyncio.run(deliver(job))
    assert rounds == [("ns", "a")]
    asyncio.run(deliver(_job(active=2, ready=1) | {"metadata": job["metadata"]}))
    assert rounds == [("ns", "a")]  # counts only: not read by a round
    asyncio.run(deliver(job, deleted=True))
    assert rounds == [("ns", "a")] * 2 and not state.children.knows(str(job["metadata"]["uid"]))


def test_kopf_calls_the_deletion_handler_for_deletions_only() -> None:
    assert jobs._deleted(type="DELETED") and not jobs._deleted(type="MODIFIED") and not jobs._deleted(type=None)


def test_in_a_burst_a_new_jobs_routine_child_change_waits_for_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod running well, of a job that is itself new (nothing written yet), is held for the burst's end (one
    round then); a failed pod is a round at once, and so is any change of a job whose status says more."""
    state, rounds = _rounds(monkeypatch)
    state.indexed = True
    for _ in range(BURST_JOBS):
        state.burst.created()
    running = _waiting_pod("n1") | {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    _pod_event(state, running)
    assert rounds == [] and list(state.burst.held) == [("ns", "a")]
    _pod_event(state, running | {"status": {"phase": "Failed"}})
    assert rounds == [("ns", "a")]
    state.burst.forget(("ns", "a"))
    state.bodies.offer(("ns", "a"), {"metadata": {"resourceVersion": "5"}, "status": {"phase": "Running"}})
    _pod_event(state, running)
    assert rounds == [("ns", "a")] * 2 and state.burst.held == {}  # an older job: news at once


def test_routine_child_changes() -> None:
    assert routine(owned_pod(_pod())) and routine(owned_pod(_waiting_pod("n1")))
    assert not routine(owned_pod(_pod(phase="Failed")))
    unschedulable = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes"}]
    assert not routine(owned_pod(_waiting_pod(None, unschedulable)))
    assert routine(owned_job(_job(active=2)))
    failed = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
    assert not routine(owned_job(_job(conditions=failed)))
    suspended = _job()
    suspended["spec"] = {"suspend": True}
    assert not routine(owned_job(suspended))
