"""The progress channel on the real control plane: TokenReview with the job's audience, pod label."""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from finetune_api.v1alpha1.status import Progress, TrainerReport
from tests.unit.test_field_names import describe_label

from ..conftest import Cluster, wait_until
from .conftest import Operator, apply, ftj, get, items, status, wait_phase

REPORT = {"progress": {"step": 7, "totalSteps": 10, "loss": 1.25, "percent": 70.0, "epoch": 0.7}}


def field_names(value: object) -> Iterator[str]:
    """Every key of a JSON value, nested objects and lists included."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield str(key)
            yield from field_names(child)
    elif isinstance(value, list):
        for child in value:
            yield from field_names(child)


def post(operator: Operator, namespace: str, name: str, token: str | None, body: object = REPORT) -> int:
    url = f"https://127.0.0.1:{operator.progress_port}/v1/namespaces/{namespace}/finetunejobs/{name}/progress"
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # self-signed operator cert
    try:
        with urllib.request.urlopen(request, context=insecure, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def pod_token(cluster: Cluster, namespace: str, pod: str, audience: str) -> str:
    """What the projected volume gives the trainer: a pod-bound token with the job's audience."""
    return cluster.kubectl("-n", namespace, "create", "token", "default", "--audience", audience,
                           "--bound-object-kind", "Pod", "--bound-object-name", pod).stdout.strip()


def test_progress_push_is_authenticated_per_job(cluster: Cluster, namespace: str, operator: Operator) -> None:
    for name in ("demo", "other"):
        body = ftj("tiny-cpu", name=name, hold=True)
        apply(cluster, namespace, body)
    wait_phase(cluster, namespace, "Running", timeout=30)
    wait_phase(cluster, namespace, "Running", name="other", timeout=30)
    pod = items(cluster, namespace, "pods", "finetune.dev/job-name=demo")[0]["metadata"]["name"]
    other_pod = items(cluster, namespace, "pods", "finetune.dev/job-name=other")[0]["metadata"]["name"]
    audience = f"finetune.dev/progress/{namespace}/demo"
    good = pod_token(cluster, namespace, pod, audience)
    another_jobs = pod_token(cluster, namespace, other_pod, f"finetune.dev/progress/{namespace}/other")
    wrong_pod = pod_token(cluster, namespace, other_pod, audience)

    assert post(operator, namespace, "demo", None) == 401
    assert post(operator, namespace, "demo", "not-a-token") == 401
    assert post(operator, namespace, "demo", another_jobs) == 401
    assert post(operator, namespace, "demo", wrong_pod) == 403
    codes = [post(operator, namespace, "demo", good) for _ in range(3)]  # 1/s with a burst of 2
    assert codes[0] == 200 and codes[-1] == 429

    def table() -> list[str] | None:
        lines = cluster.kubectl("-n", namespace, "get", "ftj", "demo").stdout.splitlines()
        return lines if "70%" in lines[-1] else None

    header, row = wait_until(table, timeout=10, what="progress in kubectl get ftj")
    assert header.split()[:4] == ["NAME", "PHASE", "PROGRESS", "LOSS"]
    assert row.split()[:5] == ["demo", "Running", "70%", "(7/10)", "1.25"]  # the PROGRESS column: 70% (7/10)
    st = status(cluster, namespace, "demo")
    assert st["progress"]["summary"] == "70% (7/10)"
    assert re.fullmatch(r"\d+(\.\d)?(Gi|Mi)", st["plan"]["estimatedGPUMemory"])
    described = cluster.kubectl("-n", namespace, "describe", "ftj", "demo").stdout
    assert re.search(r"\n    Summary: +70% \(7/10\)\n", described), described
    assert re.search(r"\n    Estimated Gpu Memory: +\d+(\.\d)?(Gi|Mi)\n", described), described
    labels = {describe_label(key) for key in field_names(st)}
    assert {label for label in labels if f" {label}:" not in described} == set()  # the splitter is kubectl's
    metrics = operator.metrics()
    assert 'finetune_progress_pushes_total{result="accepted"}' in metrics
    assert 'finetune_progress_pushes_total{result="rate_limited"}' in metrics
    assert 'finetune_progress_pushes_total{result="forbidden"} 1.0' in metrics


def test_the_trainers_reporter_reaches_status_with_the_pods_env(cluster: Cluster, namespace: str,
                                                                operator: Operator, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract end to end: the URL and CA the operator renders into the pod, the trainer's own client."""
    reporter_module = pytest.importorskip("finetune_trainer.progress", reason="trainer extras not installed")
    apply(cluster, namespace, ftj("tiny-cpu", hold=True))
    wait_phase(cluster, namespace, "Running", timeout=30)
    pod = items(cluster, namespace, "pods", "finetune.dev/job-name=demo")[0]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    config_map = get(cluster, namespace, "configmap", "demo-config")
    ca = tmp_path / "ca.crt"
    ca.write_text(config_map["data"][Path(env["FTJOB_PROGRESS_CA_FILE"]).name])
    token = tmp_path / "token"
    token.write_text(pod_token(cluster, namespace, pod["metadata"]["name"], f"finetune.dev/progress/{namespace}/demo"))
    monkeypatch.setenv("FTJOB_PROGRESS_URL", env["FTJOB_PROGRESS_URL"])
    monkeypatch.setenv("FTJOB_PROGRESS_TOKEN_FILE", str(token))
    monkeypatch.setenv("FTJOB_PROGRESS_CA_FILE", str(ca))
    reporter = reporter_module.Reporter()
    reporter.submit(TrainerReport(progress=Progress(step=3, total_steps=4, percent=75.0, loss=0.5)))
    reporter.flush(10)
    assert not reporter._warned
    st = wait_until(lambda: (status(cluster, namespace).get("progress") or {}).get("step") == 3
                    and status(cluster, namespace), timeout=10, what="progress in status")
    assert st["progress"]["percent"] == 75.0 and "updatedAt" in st["progress"]
