"""The kube-apiserver process dies mid-run and comes back (same command line), which breaks every watch
connection and in-flight request: the operator recovers within 30 s (a job created after each restart
gets its children and a phase) and every job still finishes with one set of children. Dropped watch
connections with the apiserver staying up are `test_dropped_watches.py`.

Restarting the apiserver disturbs everyone on the cluster, so this runs only on a cluster this
pytest session started itself and shares with no other session (or with FTJOB_CHAOS_APISERVER=1).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.controlplane.conftest import Cluster, wait_until
from tests.controlplane.operator.conftest import Operator, apply, ftj, items, status, wait_phase

from .checks import assert_succeeded_once_with_one_set_of_children
from .conftest import size

pytestmark = pytest.mark.controlplane


def restart_apiserver(cluster: Cluster) -> None:
    d = cluster.kubeconfig.parent
    pid_file = d / "pids" / "kube-apiserver.pid"
    pid = int(pid_file.read_text().strip())
    cmdline = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2],
        timeout=15,
        interval=0.1,
        what="old kube-apiserver gone",
    )
    time.sleep(2)  # the operator sees its watches break and requests fail
    with open(d / "logs" / "kube-apiserver.log", "ab") as log:
        proc = subprocess.Popen(
            cmdline, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    pid_file.write_text(f"{proc.pid}\n")  # so hack/cluster/down.sh stops the new one
    wait_until(cluster.readyz, timeout=60, interval=0.5, what="kube-apiserver /readyz after restart")


def test_operator_recovers_from_an_apiserver_restart(cluster: Cluster, namespace: str, operator: Operator) -> None:
    users = list((cluster.kubeconfig.parent / "fixture-users").glob("*"))
    if os.environ.get("FTJOB_CHAOS_APISERVER") != "1" and not (cluster.started_here and len(users) <= 1):
        pytest.skip("would restart a kube-apiserver other sessions use (set FTJOB_CHAOS_APISERVER=1 to force)")
    for i in range(3):
        apply(cluster, namespace, ftj("tiny-cpu", name=f"before-{i}", run_seconds=8))
    for i in range(3):
        wait_phase(cluster, namespace, "Running", name=f"before-{i}", timeout=60)
    recovered = []
    for k in range(size(1, 3)):  # each restart breaks every watch and in-flight request of the operator
        restart_apiserver(cluster)
        t0 = time.monotonic()
        apply(cluster, namespace, ftj("tiny-cpu", name=f"after-{k}", run_seconds=2))
        wait_until(
            lambda k=k: (
                status(cluster, namespace, f"after-{k}").get("phase")
                and items(cluster, namespace, "jobs", f"finetune.dev/job-name=after-{k}")
            ),
            timeout=30,
            interval=0.2,
            what="the operator handling a job created after the restart",
        )
        recovered.append(round(time.monotonic() - t0, 1))
    for name in ["before-0", "before-1", "before-2"] + [f"after-{k}" for k in range(len(recovered))]:
        assert_succeeded_once_with_one_set_of_children(cluster, namespace, name)
    assert operator.proc is not None and operator.proc.poll() is None
    print(f"{len(recovered)} apiserver restart(s); the operator handled a new job {recovered} s after each")
