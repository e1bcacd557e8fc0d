"""Failures on the real control plane: a failed pod or lost node restarts the gang as the next
attempt, the backoff limit ends it, a permanent exit code fails it at once, and nothing restarts
after a terminal phase."""

from __future__ import annotations

import time

from ..conftest import Cluster, wait_until
from .conftest import KWOK, Operator, apply, condition, events, ftj, get, items, status, wait_phase

CHILD = "finetune.dev/job-name=demo"


def pods_of(cluster: Cluster, namespace: str, attempt: int) -> list[dict]:
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
