"""Which pod `ftjob logs` reads, which events the status screen shows, which kubeconfig it uses (no cluster)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from finetune_api import constants
from finetune_operator.view.client import ViewError, kubeconfig_paths
from finetune_operator.view.pods import completion_index, event_is_about, job_selector, rank0_pod, started


def pod(name: str, *, job: str = "demo", attempt: int = 1, index: int | None = 0, phase: str = "Running",
        created: str = "2026-12-01T21:00:00Z", deleting: bool = False, as_annotation: bool = False) -> dict[str, Any]:
    labels = {constants.LABEL_JOB_NAME: job, constants.LABEL_ATTEMPT: str(attempt)}
    annotations: dict[str, str] = {}
    if index is not None:
        (annotations if as_annotation else labels)[constants.LABEL_COMPLETION_INDEX] = str(index)
    meta: dict[str, Any] = {"name": name, "labels": labels, "annotations": annotations, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T21:10:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def names(found: Mapping[str, Any] | None) -> str | None:
    return None if found is None else str(found["metadata"]["name"])


def test_selectors_use_the_operators_label_keys() -> None:
    assert job_selector("demo") == f"{constants.LABEL_JOB_NAME}=demo"
    assert job_selector("demo", 3) == f"{constants.LABEL_JOB_NAME}=demo,{constants.LABEL_ATTEMPT}=3"


def test_rank0_is_index_0_of_the_current_attempt_of_this_job() -> None:
    pods = [
        pod("demo-1-0-aaaaa", attempt=1, phase="Failed"),
        pod("demo-2-1-bbbbb", attempt=2, index=1),
        pod("demo-2-0-ccccc", attempt=2),
        pod("other-2-0-ddddd", job="other", attempt=2),
        pod("stray", attempt=2, index=None),
    ]
    assert names(rank0_pod(pods, "demo", 2)) == "demo-2-0-ccccc"
    assert names(rank0_pod(pods, "demo", 1)) == "demo-1-0-aaaaa"
    assert rank0_pod(pods, "demo", 3) is None
    assert rank0_pod([], "demo", 1) is None


def test_rank0_among_replacements_prefers_live_then_started_then_newest() -> None:
    old = pod("demo-1-0-aaaaa", created="2026-12-01T21:00:00Z", phase="Failed")
    deleting = pod("demo-1-0-bbbbb", created="2026-12-01T21:05:00Z", deleting=True)
    pending = pod("demo-1-0-ccccc", created="2026-12-01T21:06:00Z", phase="Pending")
    assert names(rank0_pod([old, deleting], "demo", 1)) == "demo-1-0-aaaaa"
    assert names(rank0_pod([old, deleting, pending], "demo", 1)) == "demo-1-0-aaaaa"  # started beats newer
    newer = pod("demo-1-0-ddddd", created="2026-12-01T21:07:00Z")
    assert names(rank0_pod([old, deleting, pending, newer], "demo", 1)) == "demo-1-0-ddddd"


def test_completion_index_from_the_label_or_else_the_annotation() -> None:
    assert completion_index(pod("p", index=2)) == 2
    assert completion_index(pod("p", index=0, as_annotation=True)) == 0
    assert completion_index(pod("p", index=None)) is None
    assert names(rank0_pod([pod("p", index=0, as_annotation=True)], "demo", 1)) == "p"


def test_started_means_the_trainer_container_has_a_log() -> None:
    assert started(pod("p", phase="Running")) and started(pod("p", phase="Succeeded"))
    assert started(pod("p", phase="Failed"))
    waiting = pod("p", phase="Pending")
    assert not started(waiting)
    waiting["status"]["containerStatuses"] = [{"name": constants.TRAINER_CONTAINER, "state": {"waiting": {}}}]
    assert not started(waiting)
    waiting["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 1}}
    assert started(waiting)


def about(kind: str, name: str) -> dict[str, Any]:
    return {"involvedObject": {"kind": kind, "name": name}}


def test_events_of_the_job_its_attempt_jobs_and_their_pods() -> None:
    assert event_is_about(about("FineTuneJob", "demo"), "demo", 2)
    assert event_is_about(about("Job", "demo-1"), "demo", 2)
    assert event_is_about(about("Job", "demo-2"), "demo", 2)
    assert not event_is_about(about("Job", "demo-3"), "demo", 2)  # not an attempt yet
    assert event_is_about(about("Pod", "demo-2-0-x7k2p"), "demo", 2)
    assert event_is_about(about("Pod", "demo-1-11-x7k2p"), "demo", 2)
    assert not event_is_about(about("FineTuneJob", "demo-1"), "demo", 2)
    assert not event_is_about(about("Pod", "demo-1-2-0-x7k2p"), "demo", 2)  # a pod of job "demo-1"
    assert not event_is_about(about("Pod", "demo-config"), "demo", 2)
    assert not event_is_about(about("ConfigMap", "demo-config"), "demo", 2)
    assert not event_is_about(about("Pod", "demo-1-0-x7k2p"), "demo", 0)  # no attempt yet: no pods of it


def test_kubeconfig_order_is_kubectls(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    default = home / ".kube" / "config"
    default.write_text("{}")
    flag = tmp_path / "flag.yaml"
    flag.write_text("{}")
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    two.write_text("{}")
    env = {"KUBECONFIG": f"{one}:{two}"}
    assert kubeconfig_paths(str(flag), env, home) == [str(flag)]
    assert kubeconfig_paths(None, env, home) == [str(two)]  # the listed files that exist, merged
    assert kubeconfig_paths(None, {}, home) == [str(default)]
    assert kubeconfig_paths(None, {"KUBECONFIG": ""}, home) == [str(default)]
    default.unlink()
    assert kubeconfig_paths(None, {}, home) == []  # then in-cluster, if there is a pod around us


def test_a_named_kubeconfig_that_is_missing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ViewError, match=r"--kubeconfig .*/nope: no such file"):
        kubeconfig_paths(str(tmp_path / "nope"), {}, tmp_path)
    with pytest.raises(ViewError, match=r"KUBECONFIG=.*/a:.*/b: no such file"):
        kubeconfig_paths(None, {"KUBECONFIG": f"{tmp_path}/a:{tmp_path}/b"}, tmp_path)
