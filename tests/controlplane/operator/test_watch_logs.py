"""`ftjob logs` reading real logs: rank 0 of each attempt, on the real worker node of the local cluster.

KWOK pods print nothing, so this needs a node with a kubelet (`make node-up`, `tests/e2e/node`). It runs only
when one is already Ready: starting a node is the e2e suite's business, and skipped here with the reason.

The attempts are Indexed Jobs labelled as the operator labels them (`render.names.attempt_labels`), each pod
printing its attempt and rank; the FineTuneJob's status is patched from the test, as the operator would move
it from attempt 1 to attempt 2, so the test decides when the job restarts.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from finetune_api import constants
from finetune_api.v1alpha1.resource import FineTuneJob
from finetune_operator.render.names import attempt_job_name, attempt_labels
from tests.e2e.node.conftest import RealNode, node_ready

from ..conftest import Cluster
from .conftest import FTJOB, apply, ftj


@pytest.fixture
def node(cluster: Cluster) -> RealNode:
    state = cluster.kubeconfig.parent / "node"
    if not (node_ready(cluster) and (state / "node.env").exists()):
        pytest.skip("no real node is up (make node-up): KWOK pods have no logs to read")
    return RealNode.from_env(state)


def attempt_job(job: FineTuneJob, attempt: int, node: RealNode, lines: int) -> dict[str, Any]:
    """An Indexed Job of 2 pods named and labelled like the operator's attempt `attempt`; each pod prints
    `attempt A rank R line I` once a second."""
    script = (f'for i in $(seq 1 {lines}); do echo "attempt {attempt} rank $JOB_COMPLETION_INDEX line $i"; '
              "sleep 1; done")
    labels = attempt_labels(job, attempt)
    pod_spec = node.place({
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": constants.TRAINER_CONTAINER, "image": node.busybox_image,
                        "imagePullPolicy": "Never", "command": ["sh", "-c", script]}],
    })
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": attempt_job_name(job, attempt), "labels": labels},
        "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimit": 0,
                 "template": {"metadata": {"labels": labels}, "spec": pod_spec}},
    }


def patch_status(cluster: Cluster, namespace: str, status: dict[str, Any]) -> None:
    cluster.kubectl("-n", namespace, "patch", "finetunejob", "demo", "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": status}))


class Following:
    """`ftjob logs -f` with its stdout and stderr lines on one queue, in the order they arrive."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        self.proc = subprocess.Popen([str(FTJOB), "logs", "-f", "demo", "-n", namespace], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def until(self, wanted: str, timeout: float = 60) -> list[str]:
        """Lines up to and including `wanted`."""
        got: list[str] = []
        while True:
            try:
                got.append(self.lines.get(timeout=timeout))
            except queue.Empty:
                raise AssertionError(f"no {wanted!r} from ftjob logs -f in {timeout}s; got {got}") from None
            if got[-1] == wanted:
                return got


@pytest.fixture
def following() -> Iterator[list[Following]]:
    started: list[Following] = []
    yield started
    for f in started:
        if f.proc.poll() is None:
            f.proc.kill()
        f.proc.wait(10)


def test_logs_follow_rank_0_across_a_restart(cluster: Cluster, namespace: str, crd: None, node: RealNode,
                                             following: list[Following]) -> None:
    body = ftj("tiny-cpu")
    apply(cluster, namespace, body)
    job = FineTuneJob.from_body({**body, "metadata": {"name": "demo", "namespace": namespace}})
    patch_status(cluster, namespace, {"phase": "Running", "attempt": 1})
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(attempt_job(job, 1, node, lines=600)))
    follow = Following(cluster, namespace)
    following.append(follow)
    first = follow.until("attempt 1 rank 0 line 3")
    assert first[0].startswith("==> pod demo-1-0-") and first[0].endswith(" (attempt 1, rank 0) <==")
    assert [x for x in first[1:]] == [f"attempt 1 rank 0 line {i}" for i in (1, 2, 3)]  # rank 1 never shows

    # The operator's restart: attempt 1's Job goes, attempt 2's comes; the log moves to its rank 0.
    cluster.kubectl("-n", namespace, "delete", "job", "demo-1", "--cascade=foreground", "--wait=false")
    patch_status(cluster, namespace, {"phase": "Restarting", "attempt": 2, "restarts": 1})
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(attempt_job(job, 2, node, lines=3)))
    second = follow.until("attempt 2 rank 0 line 3")
    header = next(i for i, x in enumerate(second) if x.startswith("==> pod demo-2-0-"))
    assert all(x.startswith("attempt 1 rank 0 line ") for x in second[:header])  # the old pod's last lines
    assert second[header + 1:] == [f"attempt 2 rank 0 line {i}" for i in (1, 2, 3)]
    patch_status(cluster, namespace, {"phase": "Succeeded"})
    assert follow.proc.wait(60) == 0

    once = subprocess.run([str(FTJOB), "logs", "demo", "-n", namespace], capture_output=True, text=True,
                          env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}, timeout=60)
    assert once.returncode == 0, once.stderr
    assert once.stdout.splitlines() == [f"attempt 2 rank 0 line {i}" for i in (1, 2, 3)]
