"""kopf handlers of the operator; importing this package registers them with kopf.

Layout: `configure` (startup/cleanup, settings), `indexes` (children by job), `jobs` (thin
handlers: every trigger calls `reconciling.reconcile_job`), `reconciling` (read, decide with the
pure `reconcile`, apply, write status), `kube` (the only API-talking module), `requeue`
(deadline/TTL wake-ups), `state` (what memo holds), `main` (`ftjob operator`).
"""

from finetune_operator.handlers import configure, indexes, jobs

__all__ = ["configure", "indexes", "jobs"]
