"""The operator's controller runtime: what runs reconcile rounds, when, and how many at once.

**What kopf does for us.** Watching: one list+watch stream per resource (FineTuneJobs and our labelled
children: Jobs, pods, ConfigMaps, Services), reconnects, server-side label selectors, and a worker per
object that delivers its events in order. Indexes: in-memory views of each job's children
(`handlers/indexes.py`; the index functions of Jobs and pods, in `handlers/jobs.py`, also trigger the
rounds), filled before any handler runs, so the first round after a restart already sees every child.
Peering: keep-alives in the (Cluster)KopfPeering object and pausing its handlers in a standby replica.
Also startup/cleanup hooks, the memo and the liveness endpoint.

**What we own here, and why.** kopf's own reconcile model is a handler per cause (create, update,
resume), each retried on `kopf.TemporaryError`, with a diff-base kept per object and timers per object.
In a burst of N FineTuneJobs created at once (bench/operator: N two-node jobs against "the floor", a
client that creates the same children directly) that model cost 1.66x / 1.86x / 1.78x the floor at
N = 100 / 300 / 1,000 on a 2-core machine: a deep copy of every event's body for the diff-base (16% of
the operator's CPU) and an annotation patch per job, one full round per child event (a dozen per job
in a burst), a GET of the job before each round (6.3 per job at N = 1,000), and kopf timers would put a
finalizer on every job. The machinery below replaced it; with it the same bench gave 1.33x / 1.54x /
1.32x on a loaded machine, and 1.45-1.71x / 1.48-1.60x / 1.47x on a quiet one, where both sides saturate the
CPU and the ratio is one of total CPU (bench/operator/README.md has the runs and what is left).

* `queueing.WorkQueue`: one round of a job at a time, triggers that arrive meanwhile coalesced into one
  more round, at most `--max-concurrent-reconciles` rounds in flight (controller-runtime's workqueue
  and MaxConcurrentReconciles), a new job's round first (`Slots`); a failed round becomes a wake-up.
* `wakeups.Wakeups`: deadlines, TTLs, retries and the slow resync for every job in one heap and one
  task (controller-runtime's RequeueAfter), not a kopf timer (and finalizer) per job.
* `bodies.Bodies`: the newest body of each job from its watch events and our own status writes, so an
  event-driven round does not GET the job.
* `burst.Burst`: during a burst of new jobs, status writes that can wait (a new job's start, ready counts) wait
  for its end, so they do not compete with the burst's creates at the API server.
* `triggers.Triggers`, `triggers.ChildTriggers`: which events call for a round (our own status writes do
  not, nor a child's event that changes nothing the round reads of it).
* `peering.PeeringGate`: kopf's peering rule applied to our own tasks (kopf pauses only its handlers).
* `tasks.detach`: a round in a task of its own (wake-ups, a child's index function), held until it ends.
* `errors.RetryLaterError`: a round's "try again in N seconds", caught by the work queue.

The runtime knows nothing of FineTuneJobs beyond their (namespace, name) key and metadata: it neither
imports the handlers nor kopf (import-linter contracts in pyproject.toml); `handlers/` is the
kopf-facing side and the logic of one round.
"""

from finetune_operator.runtime.bodies import Bodies
from finetune_operator.runtime.burst import Burst
from finetune_operator.runtime.errors import RetryLaterError
from finetune_operator.runtime.keys import Key
from finetune_operator.runtime.peering import PeeringGate, outranked
from finetune_operator.runtime.queueing import WorkQueue
from finetune_operator.runtime.tasks import detach
from finetune_operator.runtime.triggers import ChildTriggers, Signature, Triggers
from finetune_operator.runtime.wakeups import Wakeups

__all__ = [
    "Bodies",
    "Burst",
    "ChildTriggers",
    "Key",
    "PeeringGate",
    "RetryLaterError",
    "Signature",
    "Triggers",
    "Wakeups",
    "WorkQueue",
    "detach",
    "outranked",
]
