"""The chart's NetworkPolicy: the progress port only from FineTuneJob trainer pods, metrics and health as before.

Rendered with `helm template` only. The labels it selects trainer pods by are the ones the operator puts on
every trainer pod (checked against the renderer), so the policy never shuts out a real trainer.
"""

from __future__ import annotations

from typing import Any

from finetune_api import constants
from finetune_operator.render import RenderOptions, render_all
from tests.builders import job

from .conftest import Helm, documents, find


def policy(helm: Helm, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return find(documents(helm.template(values=values or {})), "NetworkPolicy")


def ingress_by_port(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["ports"][0]["port"]: rule for rule in doc["spec"]["ingress"]}


def test_on_by_default_and_the_progress_port_admits_only_trainer_pods(helm: Helm) -> None:
    (doc,) = policy(helm)
    assert doc["spec"]["policyTypes"] == ["Ingress"]
    assert doc["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "finetune-operator", "app.kubernetes.io/instance": "ftjob"}
    rules = ingress_by_port(doc)
    assert set(rules) == {"progress", "metrics", "health"}
    (peer,) = rules["progress"]["from"]
    assert peer["namespaceSelector"] == {}  # every namespace: the operator watches all of them
    assert peer["podSelector"]["matchLabels"] == {constants.LABEL_MANAGED_BY: constants.MANAGED_BY}
    assert peer["podSelector"]["matchExpressions"] == [{"key": constants.LABEL_JOB_NAME, "operator": "Exists"}]
    assert "from" not in rules["metrics"] and "from" not in rules["health"]


def test_the_trainer_pods_carry_the_labels_the_policy_selects() -> None:
    rendered = render_all(job(name="demo", namespace="ml"), RenderOptions())
    labels = rendered.job["spec"]["template"]["metadata"]["labels"]
    assert labels[constants.LABEL_MANAGED_BY] == constants.MANAGED_BY
    assert labels[constants.LABEL_JOB_NAME] == "demo"


def test_namespaced_mode_admits_only_the_watched_namespaces_and_metrics_from_given_peers(helm: Helm) -> None:
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    (doc,) = policy(helm, {"watchNamespaces": ["team-a", "team-b"], "networkPolicy": {"metricsFrom": monitoring}})
    rules = ingress_by_port(doc)
    (peer,) = rules["progress"]["from"]
    assert peer["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}
    assert rules["metrics"]["from"] == monitoring
    assert "from" not in rules["health"]


def test_it_can_be_turned_off(helm: Helm) -> None:
    assert policy(helm, {"networkPolicy": {"enabled": False}}) == []
