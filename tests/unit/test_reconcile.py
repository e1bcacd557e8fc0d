"""reconcile: desired children versus observed ones → the actions the handlers apply."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_api.v1alpha1.status import FineTuneJobStatus
from finetune_operator.admit import Admission, AdmissionCache, admit
from finetune_operator.policy import PodPolicy
from finetune_operator.reconcile import Actions, reconcile
from finetune_operator.render import RenderContext, Rendered, RenderOptions, render, render_all
from finetune_operator.status import AttemptObserved, Observed, PodObserved
from tests.builders import job_body

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
OPTIONS = RenderOptions(image="trainer:test", progress_url="https://op:8443")


def ftj(
    *, status: dict[str, Any] | None = None, labels: dict[str, str] | None = None, **run_policy: Any
) -> FineTuneJob:
    body = job_body(name="demo", nodes=2, gpus=8, runPolicy={"backoffLimit": 2, **run_policy})
    body["metadata"].update(uid="u1", generation=1, labels=labels or {})
    job = FineTuneJob.from_body(body)
    return job.model_copy(update={"status": FineTuneJobStatus.model_validate(status or {})})


FILES = render_all(ftj()).files
RUNNING = tuple(PodObserved(f"demo-1-{i}", "Running", ready=True) for i in range(2))
LOST = (PodObserved("demo-1-0", "Failed", exit_code=143, reason="DeletionByTaintManager"),)


def seen(*attempts: AttemptObserved, children: bool = True) -> Observed:
    return Observed(attempts={a.attempt: a for a in attempts}, config_map=FILES if children else None, service=children)


def summary(actions: Actions) -> dict[str, Any]:
    """The parts of Actions a reader cares about, as names."""
    return {
        "apply": [o["kind"] for o in actions.apply],
        "create": [o["metadata"]["name"] for o in actions.create],
        "delete": actions.delete_jobs,
        "suspend": actions.suspend_jobs,
        "delete_self": actions.delete_self,
    }


def want(apply: list[str] | None = None, create: list[str] | None = None, delete: list[str] | None = None,
         suspend: dict[str, bool] | None = None, delete_self: bool = False) -> dict[str, Any]:
    return {"apply": apply or [], "create": create or [], "delete": delete or [], "suspend": suspend or {},
            "delete_self": delete_self}


CASES = [
    ("a new job gets its ConfigMap, Service and attempt 1", ftj(), seen(children=False),
     want(apply=["ConfigMap", "Service"], create=["demo-1"])),
    ("a job whose children all exist needs nothing", ftj(), seen(AttemptObserved(1, "demo-1", pods=RUNNING)), want()),
    ("a changed ConfigMap is applied again", ftj(),
     Observed(attempts={1: AttemptObserved(1, "demo-1")}, config_map={"x": "y"}, service=True),
     want(apply=["ConfigMap"])),
    ("a lost node creates attempt 2 and deletes attempt 1", ftj(),
     seen(AttemptObserved(1, "demo-1", failed=True, pods=LOST)),
     want(create=["demo-2"], delete=["demo-1"])),
    ("an older attempt left behind is deleted", ftj(status={"attempt": 2}),
     seen(AttemptObserved(1, "demo-1", failed=True), AttemptObserved(2, "demo-2")), want(delete=["demo-1"])),
    ("an attempt already being deleted is not deleted again", ftj(status={"attempt": 2}),
     seen(AttemptObserved(1, "demo-1", failed=True, deleting=True), AttemptObserved(2, "demo-2")), want()),
    ("past the backoff limit nothing is created", ftj(status={"attempt": 3}),
     seen(AttemptObserved(3, "demo-3", failed=True, pods=LOST)), want()),
    ("suspend sets the running Job's suspend", ftj(suspend=True), seen(AttemptObserved(1, "demo-1", pods=RUNNING)),
     want(suspend={"demo-1": True})),
    ("resume clears the Job's suspend", ftj(), seen(AttemptObserved(1, "demo-1", suspended=True)),
     want(suspend={"demo-1": False})),
    ("a Kueue-queued Job's suspend is left to Kueue", ftj(labels={"kueue.x-k8s.io/queue-name": "q"}),
     seen(AttemptObserved(1, "demo-1", suspended=True)), want()),
    ("a job past its deadline deletes its running attempt", ftj(activeDeadlineSeconds=10,
     status={"startTime": "2026-01-01T11:00:00Z", "phase": "Running", "attempt": 1}),
     seen(AttemptObserved(1, "demo-1", pods=RUNNING)), want(delete=["demo-1"])),
    ("a succeeded job past its TTL deletes itself", ftj(ttlSecondsAfterFinished=60,
     status={"phase": "Succeeded", "attempt": 1, "completionTime": "2026-01-01T11:00:00Z"}),
     seen(AttemptObserved(1, "demo-1", complete=True)), want(delete_self=True)),
    ("a permanently failed attempt is kept for its logs while its pods terminate", ftj(),
     seen(AttemptObserved(1, "demo-1", failing_since=NOW, pods=(PodObserved("demo-1-0", "Failed", exit_code=65),))),
     want()),
    ("a job that finished while an older attempt was left behind (crash) deletes the older one",
     ftj(status={"phase": "Failed", "attempt": 2}),
     seen(AttemptObserved(1, "demo-1", failed=True), AttemptObserved(2, "demo-2", failed=True)),
     want(delete=["demo-1"])),
    ("a failed job is never recreated even with no children left", ftj(status={"phase": "Failed", "attempt": 1}),
     seen(children=False), want()),
]


@pytest.mark.parametrize(("job", "observed", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_actions(job: FineTuneJob, observed: Observed, expected: dict[str, Any]) -> None:
    assert summary(reconcile(job, observed, NOW, OPTIONS)) == expected


def test_children_are_the_rendered_ones_owned_by_the_job() -> None:
    actions = reconcile(ftj(), seen(children=False), NOW, OPTIONS)
    rendered = render_all(ftj(), OPTIONS)
    config_map, service = actions.apply
    assert config_map["data"] == rendered.files
    assert {k: v for k, v in actions.create[0].items() if k != "metadata"} == {
        k: v for k, v in rendered.job.items() if k != "metadata"
    }
    for child in (config_map, service, actions.create[0]):
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "finetune.dev/v1alpha1", "kind": "FineTuneJob", "name": "demo", "uid": "u1",
                       "controller": True, "blockOwnerDeletion": True}
        assert child["metadata"]["labels"]["finetune.dev/job-name"] == "demo"


def test_the_same_state_always_gives_the_same_actions() -> None:
    observed = seen(AttemptObserved(1, "demo-1", failed=True, pods=LOST))
    assert reconcile(ftj(), observed, NOW, OPTIONS) == reconcile(ftj(), observed, NOW, OPTIONS)


class Counting:
    """The real admission and renderer, recording each call: the admitted job's generation, the rendered attempt."""

    def __init__(self, admitter: Any = admit) -> None:
        self.admitter = admitter
        self.admitted: list[int | None] = []
        self.rendered: list[int] = []

    def admit(self, job: FineTuneJob, policy: PodPolicy) -> Admission:
        self.admitted.append(job.metadata.generation)
        return self.admitter(job, policy)  # type: ignore[no-any-return]

    def render(self, ctx: RenderContext) -> Rendered:
        self.rendered.append(ctx.attempt)
        return render(ctx)

    def round(self, job: FineTuneJob, observed: Observed) -> Actions:
        return reconcile(job, observed, NOW, OPTIONS, admitter=self.admit, renderer=self.render)


ROUNDS = [
    # (what happens, job, observed, attempts rendered)
    ("a new job renders attempt 1", ftj(), seen(children=False), [1]),
    ("a steady job renders its current attempt", ftj(status={"phase": "Running", "attempt": 1}),
     seen(AttemptObserved(1, "demo-1", pods=RUNNING)), [1]),
    ("a restart renders only the next attempt", ftj(status={"phase": "Running", "attempt": 1}),
     seen(AttemptObserved(1, "demo-1", failed=True, pods=LOST)), [2]),
    ("an attempt left behind is not rendered", ftj(status={"attempt": 2}),
     seen(AttemptObserved(1, "demo-1", failed=True), AttemptObserved(2, "demo-2")), [2]),
    ("a job that fails now renders nothing", ftj(status={"attempt": 3}),
     seen(AttemptObserved(3, "demo-3", failed=True, pods=LOST)), []),
    ("a finished job renders nothing", ftj(status={"phase": "Succeeded", "attempt": 1}),
     seen(AttemptObserved(1, "demo-1", complete=True)), []),
    ("an invalid job renders nothing", FineTuneJob.from_body(job_body(name="demo", overrides={"train_batch_size": 7})),
     Observed(), []),
]


@pytest.mark.parametrize(("job", "observed", "attempts"), [r[1:] for r in ROUNDS], ids=[r[0] for r in ROUNDS])
def test_a_round_admits_once_and_renders_at_most_once_for_the_attempt_the_status_chose(
    job: FineTuneJob, observed: Observed, attempts: list[int]
) -> None:
    counting = Counting()
    actions = counting.round(job, observed)
    assert counting.admitted == [job.metadata.generation]
    assert counting.rendered == attempts
    if attempts:
        assert actions.status.attempt == attempts[0]


def test_a_restart_creates_the_next_attempts_job_as_rendered_for_it() -> None:
    running = ftj(status={"phase": "Running", "attempt": 1})
    restart = reconcile(running, seen(AttemptObserved(1, "demo-1", failed=True, pods=LOST)), NOW, OPTIONS)
    expected = render_all(running, OPTIONS, attempt=2).job
    assert {k: v for k, v in restart.create[0].items() if k != "metadata"} == {
        k: v for k, v in expected.items() if k != "metadata"
    }
    assert expected["metadata"]["name"] == restart.create[0]["metadata"]["name"] == "demo-2"


def test_a_new_jobs_first_status_already_counts_the_job_it_creates() -> None:
    first = reconcile(ftj(), seen(children=False), NOW, OPTIONS)
    assert [o["metadata"]["name"] for o in first.create] == ["demo-1"]
    status = first.status
    assert (status.phase, status.attempt, status.start_time) == ("Pending", 1, NOW)
    assert [(c.type, c.status, c.reason) for c in status.conditions] == [("Created", "True", "ChildrenCreated")]
    assert [(t.type, t.reason) for t in first.transitions] == [("Normal", "PodsStarting")]
    # the next round (the Job observed) has nothing new to say
    second = reconcile(ftj(status=status.to_dict(exclude_none=True)), seen(AttemptObserved(1, "demo-1")), NOW, OPTIONS)
    assert second.status == status and second.transitions == [] and second.create == []


def test_a_restart_still_reports_restarting_with_the_cause() -> None:
    running = ftj(status={"phase": "Running", "attempt": 1, "message": "attempt 1: 2/2 node(s) running"})
    restart = reconcile(running, seen(AttemptObserved(1, "demo-1", failed=True, pods=LOST)), NOW, OPTIONS)
    assert (restart.status.phase, restart.status.attempt) == ("Restarting", 2)
    assert [(t.type, t.reason) for t in restart.transitions] == [("Warning", "NodeLost")]


def test_with_an_admission_cache_a_job_is_admitted_once_per_generation() -> None:
    cache = AdmissionCache()
    counting = Counting(cache)
    pending = ftj(status={"phase": "Pending", "attempt": 1})
    rounds = [seen(AttemptObserved(1, "demo-1")), seen(AttemptObserved(1, "demo-1", pods=RUNNING))]
    cached = [counting.round(pending, observed) for observed in rounds * 2]
    assert (cache.misses, cache.hits) == (1, 3)
    assert counting.rendered == [1, 1, 1, 1]  # rendering is per round: the attempt comes from the status
    assert cached == [reconcile(pending, observed, NOW, OPTIONS) for observed in rounds * 2]
    edited = pending.model_copy(update={"metadata": pending.metadata.model_copy(update={"generation": 2})})
    counting.round(edited, rounds[0])
    assert (cache.misses, cache.hits) == (2, 3)
    assert counting.admitted == [1, 1, 1, 1, 2]


def test_deadline_and_ttl_ask_for_a_wake_up() -> None:
    running = reconcile(ftj(activeDeadlineSeconds=600, status={"startTime": "2026-01-01T11:55:00Z"}),
                        seen(AttemptObserved(1, "demo-1", pods=RUNNING)), NOW, OPTIONS)
    assert running.requeue_after == timedelta(minutes=5).total_seconds()
    done = reconcile(ftj(ttlSecondsAfterFinished=3600, status={"phase": "Succeeded",
                                                                 "completionTime": "2026-01-01T11:30:00Z"}),
                     seen(AttemptObserved(1, "demo-1", complete=True)), NOW, OPTIONS)
    assert (done.requeue_after, done.delete_self) == (1800.0, False)


def test_an_invalid_spec_creates_no_child() -> None:
    body = job_body(name="demo", overrides={"train_batch_size": 7})
    actions = reconcile(FineTuneJob.from_body(body), Observed(), NOW, OPTIONS)
    assert (actions.invalid, actions.apply, actions.create, actions.status.phase) == (True, [], [], "Failed")


def _hash_of(job: FineTuneJob) -> str:
    actions = reconcile(job, seen(children=False), NOW, OPTIONS)
    return str(actions.create[0]["metadata"]["annotations"]["finetune.dev/template-hash"])


def _edited(job: FineTuneJob, section: str, **changes: Any) -> FineTuneJob:
    part = getattr(job.spec, section).model_copy(update=changes)
    return job.model_copy(update={"spec": job.spec.model_copy(update={section: part})})


def test_a_pod_template_edited_while_suspended_replaces_the_suspended_job() -> None:
    suspended = seen(AttemptObserved(1, "demo-1", suspended=True, template_hash=_hash_of(ftj())))
    edited = _edited(ftj(), "template", image="trainer:v2")
    assert summary(reconcile(edited, suspended, NOW, OPTIONS)) == want(delete=["demo-1"])
    assert summary(reconcile(ftj(), suspended, NOW, OPTIONS)) == want(suspend={"demo-1": False})


def test_a_hyperparameter_edited_while_suspended_only_rewrites_the_config_map() -> None:
    suspended = seen(AttemptObserved(1, "demo-1", suspended=True, template_hash=_hash_of(ftj())))
    edited = _edited(ftj(), "training", learning_rate=5e-5)
    assert summary(reconcile(edited, suspended, NOW, OPTIONS)) == want(apply=["ConfigMap"], suspend={"demo-1": False})


def test_suspending_is_not_an_edit() -> None:
    running_hash = _hash_of(ftj())
    assert _hash_of(ftj(suspend=True)) == running_hash
    suspended = seen(AttemptObserved(1, "demo-1", suspended=True, template_hash=running_hash))
    assert summary(reconcile(ftj(suspend=True), suspended, NOW, OPTIONS)) == want()


def test_the_progress_url_and_ca_reach_the_pod() -> None:
    options = RenderOptions(image="trainer:test", progress_url="https://op:8443/v1/namespaces/default/finetunejobs/demo/progress",
                            progress_ca="-----BEGIN CERTIFICATE-----\n")
    actions = reconcile(ftj(), seen(children=False), NOW, options)
    config_map = next(o for o in actions.apply if o["kind"] == "ConfigMap")
    assert config_map["data"]["progress-ca.crt"].startswith("-----BEGIN")
    env = {e["name"]: e.get("value") for e in actions.create[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FTJOB_PROGRESS_CA_FILE"] == "/etc/ftjob/progress-ca.crt"
    assert env["FTJOB_PROGRESS_URL"].endswith("/finetunejobs/demo/progress")


def test_the_attempt_jobs_template_hash_is_computed_once_per_rendering(monkeypatch: pytest.MonkeyPatch) -> None:
    import finetune_operator.render as rendering
    from finetune_operator.render.memo import RenderMemo

    calls = 0
    real = rendering.spec_digest

    def counting(attempt_job: dict[str, Any]) -> str:
        nonlocal calls
        calls += 1
        return real(attempt_job)

    monkeypatch.setattr(rendering, "spec_digest", counting)
    memo = RenderMemo()
    hashes = [
        reconcile(ftj(), seen(children=False), NOW, OPTIONS, renderer=memo).create[0]["metadata"]["annotations"]
        for _ in range(3)
    ]
    assert calls == 1 and memo.hits == 2  # three rounds of one spec: one rendering, one hash
    job = render_all(ftj(), OPTIONS).job
    flipped = {**job, "spec": {**job["spec"], "suspend": not job["spec"].get("suspend")}}
    assert hashes[0]["finetune.dev/template-hash"] == real(job) == real(flipped)  # suspend is ours, not an edit
