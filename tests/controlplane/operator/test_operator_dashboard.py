"""The chart's dashboard against a running operator: every metric its queries name is one `/metrics` serves.

The operator runs as in the other operator tests; a job's trainer pod (KWOK, held Running) pushes a
progress report with every number set, so the per-job gauges have samples; then the dashboard is read
out of `helm template` with the dashboard on, and each metric name in its PromQL is looked up among
the names `/metrics` declares, the per-job ones among those with samples for that job. Deleting the
job removes its per-job series from `/metrics`.
"""

from __future__ import annotations

from tests.chart.conftest import Helm, helm
from tests.chart.dashboard import dashboard_of, exported_names, metric_names, queries

from ..conftest import Cluster, wait_until
from .conftest import Operator, apply, ftj, items, wait_phase
from .test_operator_progress import pod_token, post

__all__ = ["helm"]  # the chart tests' fixture, used here

REPORT = {"progress": {"step": 3, "totalSteps": 12, "epoch": 0.25, "loss": 2.5, "evalLoss": 2.75,
                       "learningRate": 0.0002, "tokensPerSecond": 1234.5, "percent": 25.0, "etaSeconds": 90.0}}
JOB_PREFIX = "finetune_job_"


def job_samples(page: str, namespace: str, name: str) -> dict[str, float]:
    """The finetune_job_* samples of one job on a /metrics page."""
    found: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith(JOB_PREFIX) and f'namespace="{namespace}"' in line and f'job="{name}"' in line:
            found[line.split("{", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return found


def test_every_dashboard_query_names_a_metric_the_operator_serves(
    cluster: Cluster, namespace: str, operator: Operator, helm: Helm
) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", hold=True))
    wait_phase(cluster, namespace, "Running", timeout=30)
    pod = items(cluster, namespace, "pods", "finetune.dev/job-name=demo")[0]["metadata"]["name"]
    token = pod_token(cluster, namespace, pod, f"finetune.dev/progress/{namespace}/demo")
    assert post(operator, namespace, "demo", token, REPORT) == 200

    page = operator.metrics()
    assert job_samples(page, namespace, "demo") == {
        "finetune_job_loss": 2.5, "finetune_job_eval_loss": 2.75, "finetune_job_tokens_per_second": 1234.5,
        "finetune_job_progress_ratio": 0.25, "finetune_job_eta_seconds": 90.0, "finetune_job_attempt": 1.0,
    }
    served, sampled = exported_names(page)

    dashboard = dashboard_of(helm.template(values={"metrics": {"dashboard": {"enabled": True}}}))
    used = {name: where for where, query in queries(dashboard) for name in metric_names(query)}
    assert len(used) >= 10, used
    assert {name: where for name, where in used.items() if name not in served} == {}
    assert {name for name in used if name.startswith(JOB_PREFIX) and name not in sampled} == set()

    cluster.kubectl("-n", namespace, "delete", "finetunejob", "demo", "--wait=false")
    wait_until(lambda: not job_samples(operator.metrics(), namespace, "demo"), timeout=30,
               what="the deleted job's finetune_job_* series gone from /metrics")
