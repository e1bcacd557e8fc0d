"""kopf handlers of the operator; importing this package registers them with kopf.

Layout: `configure` (startup/cleanup, settings), `indexes` (children by job), `jobs` (thin
handlers: every trigger calls `reconciling.reconcile_job`), `reconciling` (one round: read, decide
with the pure `reconcile`, apply, write status), `kube` (the only API-talking module), `state` (what
memo holds), `main` (`ftjob operator`). When rounds run, how many at once, wake-ups, the body cache
and the peering gate are the runtime's (`finetune_operator.runtime`).
"""

from finetune_operator.handlers import configure, indexes, jobs

__all__ = ["configure", "indexes", "jobs"]
