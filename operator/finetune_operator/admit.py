"""Admission: whether a job may run, and the memory plan it runs with, decided once per spec.

"Admission" here is the operator's own acceptance of a job's spec, before any child exists; it is neither the API
server's admission control (CEL rules, ValidatingAdmissionPolicy) nor Kueue's admission of a queued Job.

`admit(job, policy)` answers `Admitted` (the plan) or the `InvalidSpecError` that lists every problem, in this
order: the operator's rules (`validation.check_job`: the API's rule tables, the free-form fields, the trainer's
limits, the pod policy), then the memory planner (`plan.plan_job`: `zeroStage: auto` must find a strategy that
fits). The planner runs only on a job that passed the rules, so its own error never hides theirs.

Why a step of its own, before rendering: the status needs the answer (the plan summary, or `InvalidSpec`) but not
the children, and the children need the attempt, which only the status decides. So one reconcile round is admit ->
status -> render, each once, and the status module never depends on the renderers. `ftjob render`, `ftjob plan`
and `ftjob run` admit through this same function, so they accept and reject the same jobs with the same words.

The answer depends on the job's spec (its `metadata.generation`), its name (fixed for a given uid) and the pod
policy (the operator's flags), never on its labels or status: `AdmissionCache` keeps it per (uid, generation,
policy), so the rounds of a job between two spec edits plan it once. Pure: no I/O.
"""

from collections.abc import Callable
from dataclasses import dataclass

from finetune_api.v1alpha1.errors import InvalidSpecError
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.memo import Memo
from finetune_operator.plan import Plan, plan_job
from finetune_operator.policy import PodPolicy
from finetune_operator.validation import check_job


@dataclass(frozen=True)
class Admitted:
    """A job that breaks no rule, with what the memory planner chose for it (what every renderer builds on)."""

    plan: Plan


Admission = Admitted | InvalidSpecError
Admitter = Callable[[FineTuneJob, PodPolicy], Admission]
"""`admit`, or a memo of it (`AdmissionCache`): what `reconcile` calls once per round."""


def admit(job: FineTuneJob, policy: PodPolicy | None = None) -> Admission:
    """The job's plan, or every rule it breaks under `policy` (default: `PodPolicy()`), as a value."""
    errors = check_job(job, policy)
    if errors:
        return InvalidSpecError(errors)
    try:
        return Admitted(plan_job(job.spec))
    except InvalidSpecError as exc:
        return exc


def admit_or_raise(job: FineTuneJob, policy: PodPolicy | None = None) -> Admitted:
    """`admit` for the command line and tests: the InvalidSpecError raised (`ftjob` exits 2 on it)."""
    admission = admit(job, policy)
    if isinstance(admission, InvalidSpecError):
        raise admission
    return admission


AdmissionKey = tuple[str, int, PodPolicy]
DEFAULT_SIZE = 1024
"""Admissions kept: a plan is a few hundred bytes, so 1,024 (a few hundred KB) cover every active job of a large
cluster; past that the least recently used goes and is planned again on its next round."""


@dataclass
class AdmissionCache(Memo[AdmissionKey, Admission]):
    """Least-recently-used admissions (the plan or the InvalidSpecError) by (uid, generation, pod policy).

    A job not read from an API server (no uid or generation) has nothing that identifies its spec: admitted every
    time, never kept.
    """

    size: int = DEFAULT_SIZE

    def __call__(self, job: FineTuneJob, policy: PodPolicy) -> Admission:
        meta = job.metadata
        if not meta.uid or meta.generation is None:
            return admit(job, policy)
        return self.get_or_compute((meta.uid, meta.generation, policy), lambda: admit(job, policy))
