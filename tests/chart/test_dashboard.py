"""The chart's Grafana dashboard ConfigMap: off by default, labelled for the sidecar, every panel queries.

Whether each query names a metric the operator really serves is checked against a running operator in
tests/controlplane/operator/test_operator_dashboard.py; here, only the helm binary.
"""

from __future__ import annotations

import json

import pytest
import yaml

from .conftest import CHART, Helm, documents, find
from .dashboard import DASHBOARD_LABEL, dashboard_of, exported_names, metric_names, queries

ENABLED = {"metrics": {"dashboard": {"enabled": True}}}


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('max by (namespace, job) (finetune_job_loss{namespace=~"$namespace", job=~"$job"})', {"finetune_job_loss"}),
        ("histogram_quantile(0.95, sum by (le) (rate(a_seconds_bucket[$__rate_interval])))", {"a_seconds_bucket"}),
        ('sum without (pod) (x{l="by (y)"}) / on (job) group_left (team) y_info', {"x", "y_info"}),
        ("rate(c_total[5m] offset 1h) > bool 1e3 and d unless e or Inf", {"c_total", "d", "e"}),
        ("label_values(finetune_job_progress_ratio, namespace)", {"finetune_job_progress_ratio"}),
        ('label_values(m{namespace=~"$namespace"}, job)', {"m"}),
        ("sum(rate(x:recorded:rate5m[1m:10s]))", {"x:recorded:rate5m"}),
    ],
)
def test_metric_names_reads_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_exported_names_reads_the_text_format() -> None:
    page = (
        "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 2.0\n"
        "# HELP h H.\n# TYPE h histogram\n"
        "# HELP g G.\n# TYPE g gauge\ng{job=\"demo\"} 1.0\n"
    )
    declared, sampled = exported_names(page)
    assert sampled == {"a_total", "g"}
    assert declared == {"a_total", "a_created", "h_bucket", "h_sum", "h_count", "h_created", "g"}


def test_the_dashboard_is_off_by_default(helm: Helm) -> None:
    docs = documents(helm.template())
    assert [d for d in find(docs, "ConfigMap") if DASHBOARD_LABEL in (d["metadata"].get("labels") or {})] == []


def test_the_dashboard_configmap_is_labelled_for_the_grafana_sidecar(helm: Helm) -> None:
    values = {"metrics": {"dashboard": {"enabled": True, "namespace": "monitoring", "labels": {"team": "ml"},
                                        "annotations": {"grafana_folder": "Fine-tuning"}}}}
    (config_map,) = find(documents(helm.template(values=values)), "ConfigMap", "ftjob-finetune-operator-dashboard")
    meta = config_map["metadata"]
    assert meta["namespace"] == "monitoring"
    assert meta["labels"][DASHBOARD_LABEL] == "1" and meta["labels"]["team"] == "ml"
    assert meta["annotations"] == {"grafana_folder": "Fine-tuning"}
    assert config_map["data"] == {"finetune-operator.json": (CHART / "dashboards" / "finetune-operator.json")
                                  .read_text().rstrip("\n")}


def test_every_panel_queries_the_operators_metrics(helm: Helm) -> None:
    dashboard = dashboard_of(helm.template(values=ENABLED))
    assert dashboard["uid"] and dashboard["title"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 6 and all(p.get("targets") for p in panels), [p["title"] for p in panels]
    found = queries(dashboard)
    assert all(metric_names(query) for _, query in found), [q for q in found if not metric_names(q[1])]
    names = set().union(*(metric_names(query) for _, query in found))
    assert {n for n in names if not n.startswith("finetune_")} == set()
    for gauge in ("loss", "eval_loss", "tokens_per_second", "progress_ratio", "eta_seconds", "attempt"):
        assert f"finetune_job_{gauge}" in names


def test_a_namespace_that_is_not_a_dns_label_is_refused(helm: Helm) -> None:
    proc = helm.run("template", "x", str(CHART), "--set", "metrics.dashboard.namespace=Not_A_Namespace", check=False)
    assert proc.returncode != 0 and "namespace" in proc.stderr


def test_the_dashboard_file_is_json_with_a_fixed_uid() -> None:
    dashboard = json.loads((CHART / "dashboards" / "finetune-operator.json").read_text())
    assert dashboard["uid"] == "finetune-operator"
    assert yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]["dashboard"]["enabled"] is False
