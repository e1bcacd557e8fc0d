"""Failures on the real control plane: a failed pod or lost node restarts the gang as the next
attempt, the backoff limit ends it, a permanent exit code fails it at once (through the attempt Job's own
podFailurePolicy, quoting the trainer's termination record), nothing restarts after a terminal phase, and an
operator killed with SIGKILL leaves no private key behind."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from finetune_api import constants
from finetune_api.termination import TerminationRecord
from finetune_operator.render.command import LAUNCHER

from ..conftest import Cluster, wait_until
from .conftest import KWOK, Operator, apply, condition, events, ftj, get, items, status, wait_phase

CHILD = "finetune.dev/job-name=demo"


def pods_of(cluster: Cluster, namespace: str, attempt: int) -> list[dict[str, Any]]:
    return items(cluster, namespace, "pods", f"{CHILD},finetune.dev/attempt={attempt}")


def test_a_failed_pod_on_attempt_1_restarts_as_attempt_2(cluster: Cluster, namespace: str,
                                                          operator: Operator) -> None:
    apply(cluster, namespace, ftj("llama-70b-lora-2x8", hold=True, run_seconds=0.2))
    wait_phase(cluster, namespace, "Running", timeout=30)
    pod = pods_of(cluster, namespace, 1)[0]["metadata"]["name"]
    cluster.kubectl("-n", namespace, "annotate", "pod", pod, f"{KWOK}/fail=true", f"{KWOK}/hold-")
    # Restarting lasts only until attempt 2's pods are up (well under a second on KWOK): read it
    # from the condition and the events rather than racing to see the phase.
    st = wait_until(lambda: (s := status(cluster, namespace)).get("attempt") == 2 and s.get("phase") == "Running"
                    and s, timeout=30, what="attempt 2 running")
    assert st["restarts"] == 1 and condition(st, "Restarting")["status"] == "False"
    warnings = [e for e in events(cluster, namespace) if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["PodFailed"]
    assert pod in warnings[0]["message"] and "starting attempt 2" in warnings[0]["message"]
    wait_until(lambda: [j["metadata"]["name"] for j in items(cluster, namespace, "jobs", CHILD)] == ["demo-2"],
               timeout=30, what="attempt 1's Job deleted, attempt 2's present")


def test_a_lost_node_restarts_the_gang(cluster: Cluster, namespace: str, operator: Operator) -> None:
    body = ftj("llama-70b-lora-2x8", hold=True)
    body["spec"]["distributed"]["nodes"] = 1
    apply(cluster, namespace, body)
    wait_phase(cluster, namespace, "Running", timeout=30)
    node = pods_of(cluster, namespace, 1)[0]["spec"]["nodeName"]
    cluster.kubectl("label", "node", node, "kwok.finetune.dev/lost=true")
    try:
        st = wait_until(lambda: (s := status(cluster, namespace)).get("attempt") == 2 and s.get("phase") == "Running"
                        and s, timeout=60, what="attempt 2 running")
    finally:
        cluster.kubectl("label", "node", node, "kwok.finetune.dev/lost-")
    assert st["restarts"] == 1 and pods_of(cluster, namespace, 2)
    assert pods_of(cluster, namespace, 2)[0]["spec"]["nodeName"] != node
    (warning,) = [e for e in events(cluster, namespace) if e["type"] == "Warning"]
    assert "attempt 1 failed" in warning["message"] and "starting attempt 2" in warning["message"]


def test_past_the_backoff_limit_the_job_fails(cluster: Cluster, namespace: str, operator: Operator) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", fail=True, run_seconds=0.2, backoffLimit=1))
    st = wait_phase(cluster, namespace, "Failed", timeout=60)
    assert condition(st, "Failed")["reason"] == "BackoffLimitExceeded"
    assert (st["attempt"], st["restarts"]) == (2, 1)
    time.sleep(3)  # sticky: nothing new appears
    assert [j["metadata"]["name"] for j in items(cluster, namespace, "jobs", CHILD)] == ["demo-2"]
    assert get(cluster, namespace, "finetunejob", "demo")["status"]["phase"] == "Failed"


def test_a_permanent_exit_code_fails_in_one_attempt(cluster: Cluster, namespace: str, operator: Operator) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", fail=True, exit_code=65, run_seconds=0.2, backoffLimit=3))
    st = wait_phase(cluster, namespace, "Failed", timeout=60)
    failed = condition(st, "Failed")
    assert failed["reason"] == "PermanentError" and "65" in failed["message"]
    assert st["attempt"] == 1
    time.sleep(3)
    assert [j["metadata"]["name"] for j in items(cluster, namespace, "jobs", CHILD)] == ["demo-1"]


def terminate_like_the_kubelet(
    cluster: Cluster, namespace: str, pod: dict[str, Any], exit_code: int, message: str
) -> None:
    """What the kubelet reports when the trainer container exits: KWOK runs no container, so a held pod's
    status is written here instead (the Job controller and the operator see a real pod status either way)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    terminated = {"exitCode": exit_code, "reason": "Error", "message": message, "startedAt": now, "finishedAt": now}
    containers = [
        {"name": c["name"], "image": c["image"], "ready": False, "restartCount": 0, "started": False,
         "state": {"terminated": terminated}}
        for c in pod["spec"]["containers"]
    ]  # fmt: skip
    body = {"status": {"phase": "Failed", "containerStatuses": containers}}
    cluster.kubectl("-n", namespace, "patch", "pod", pod["metadata"]["name"], "--subresource=status", "--type=merge",
                    "-p", json.dumps(body))  # fmt: skip


def test_exit_65_with_the_trainers_record_fails_the_job_through_its_pod_failure_policy(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    apply(cluster, namespace, ftj("tiny-cpu", hold=True, backoffLimit=3))
    wait_phase(cluster, namespace, "Running", timeout=30)
    (attempt_job,) = items(cluster, namespace, "jobs", CHILD)
    assert attempt_job["spec"]["podFailurePolicy"] == {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": constants.TRAINER_CONTAINER, "operator": "In", "values": [64, 65, 66]},
            }
        ]
    }
    (pod,) = pods_of(cluster, namespace, 1)
    command = pod["spec"]["containers"][0]["command"]
    assert command[: len(LAUNCHER) + 2] == [*LAUNCHER, "accelerate", "launch"]

    record = TerminationRecord(
        exit_code=65,
        reason="BadDatasetError",
        message="dataset.textField 'nosuchfield' is not a column of the train split; columns are ['content']",
    )
    terminate_like_the_kubelet(cluster, namespace, pod, 65, record.to_message())

    st = wait_phase(cluster, namespace, "Failed", timeout=60)
    failed = condition(st, "Failed")
    assert failed["reason"] == "PermanentError"
    assert f"pod {pod['metadata']['name']} exited with permanent error code 65" in failed["message"]
    assert f"(BadDatasetError: {record.message})" in failed["message"]
    assert (st["attempt"], st["restarts"]) == (1, 0)
    job_failed = condition(get(cluster, namespace, "job", "demo-1")["status"], "Failed")
    assert job_failed["reason"] == "PodFailurePolicy", "the Job controller's FailJob rule did not fire"
    time.sleep(3)  # sticky: no attempt 2
    assert [j["metadata"]["name"] for j in items(cluster, namespace, "jobs", CHILD)] == ["demo-1"]


def _private_keys_in(root: Path, entries: set[str]) -> list[str]:
    """Files holding a PEM private key among `entries` of `root` (two levels deep)."""
    found = []
    for name in entries:
        path = root / name
        for candidate in [path, *(path.rglob("*") if path.is_dir() else [])]:
            try:
                if candidate.is_file() and b"PRIVATE KEY" in candidate.read_bytes()[:100_000]:
                    found.append(str(candidate))
            except OSError:
                continue
    return found


def _open_files(pid: int) -> list[str]:
    """What a process's descriptors point to; one closed between listing and reading (a socket of the operator's
    watches, say) is skipped."""
    links = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            links.append(os.readlink(fd))
    return links


def test_an_operator_killed_with_sigkill_leaves_no_private_key_behind(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> None:
    temp = Path(tempfile.gettempdir())
    before = {p.name for p in temp.iterdir()}
    second = Operator(cluster, namespace, tmp_path / "second-operator.log")
    second.start()
    try:
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
        url = f"https://127.0.0.1:{second.progress_port}/healthz"
        with contextlib.suppress(urllib.error.HTTPError):  # it serves TLS with its self-signed key: any answer
            urllib.request.urlopen(url, context=insecure, timeout=5).close()
        assert second.proc is not None and second.tmpdir is not None
        fds = _open_files(second.proc.pid)
        assert any(link.startswith("/memfd:progress-key") for link in fds), "the self-signed key is not in memory"
        assert not list(second.tmpdir.glob("ftjob-progress-tls-*")), "the self-signed key went to a temp directory"
    finally:
        second.kill()
    new = {p.name for p in temp.iterdir()} - before
    assert not [n for n in new if n.startswith("ftjob-progress-tls-")]
    assert _private_keys_in(temp, new) == []
