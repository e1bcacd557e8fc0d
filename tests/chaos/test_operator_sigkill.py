"""SIGKILL the operator at random moments while jobs are created, run, fail, restart and finish.

After the storm (and a last restart) every job must end in its right terminal state with exactly
the children it should have: one ConfigMap and one Service per job, at most one Job (the one of its
final attempt, named `<job>-<attempt>`), every child owned by an object that exists, and the attempt
count not inflated by the kills.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pytest

from tests.controlplane.conftest import Cluster, wait_until
from tests.controlplane.operator.conftest import Operator, apply, ftj, get

from .conftest import FULL, size

pytestmark = pytest.mark.controlplane

LABEL = "finetune.dev/job-name"
TERMINAL = {"Succeeded", "Failed"}


def plan(n: int) -> list[tuple[dict[str, Any], str, int]]:
    """(body, expected phase, expected final attempt) for n jobs: mostly successes, some that fail
    on every attempt (restart, then BackoffLimitExceeded), some with a permanent exit code."""
    out = []
    for i in range(n):
        kind = i % 5
        if kind in (0, 1, 2):
            body = ftj("tiny-cpu", name=f"ok-{i}", run_seconds=2 + (i % 3))
            out.append((body, "Succeeded", 1))
        elif kind == 3:
            body = ftj("tiny-cpu", name=f"flaky-{i}", fail=True, run_seconds=1, backoffLimit=1)
            out.append((body, "Failed", 2))
        else:
            body = ftj("tiny-cpu", name=f"perm-{i}", fail=True, exit_code=65, run_seconds=1, backoffLimit=3)
            out.append((body, "Failed", 1))
    if n >= 10:  # two gang jobs on the fake 8-GPU nodes as well
        out[0] = (ftj("llama-70b-lora-2x8", name="gang-0", run_seconds=3), "Succeeded", 1)
        out[5] = (ftj("llama-70b-lora-2x8", name="gang-5", run_seconds=3), "Succeeded", 1)
    return out


def phases(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    found = get(cluster, namespace, "finetunejobs") or {"items": []}
    return {o["metadata"]["name"]: o for o in found["items"]}


def test_sigkill_storm_leaves_no_duplicates_no_orphans_right_terminal_states(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    rng = random.Random(8)
    jobs = plan(size(10, 100))
    expected = {b["metadata"]["name"]: (phase, attempt) for b, phase, attempt in jobs}
    pending = list(jobs)
    kills = 0
    deadline = time.monotonic() + (600 if FULL else 90)
    # The storm: create jobs in small waves and SIGKILL the operator at random moments in between.
    while time.monotonic() < deadline:
        for _ in range(rng.randint(1, 4)):
            if pending:
                apply(cluster, namespace, pending.pop(0)[0])
        time.sleep(rng.uniform(0.0, 2.5))
        operator.kill()
        kills += 1
        time.sleep(rng.uniform(0.0, 1.0))
        operator.start()
        done = {n for n, o in phases(cluster, namespace).items() if (o.get("status") or {}).get("phase") in TERMINAL}
        if not pending and (kills >= size(6, 30) or len(done) == len(expected)):
            break
    assert not pending, "storm deadline passed before every job was created"

    def all_terminal() -> dict[str, dict[str, Any]] | None:
        now = phases(cluster, namespace)
        ok = len(now) == len(expected) and all((o.get("status") or {}).get("phase") in TERMINAL for o in now.values())
        return now if ok else None

    final = wait_until(all_terminal, timeout=600 if FULL else 120, interval=1, what="every job terminal")
    got = {n: ((o["status"]).get("phase"), o["status"].get("attempt")) for n, o in final.items()}
    assert got == expected, f"after {kills} SIGKILLs"

    uids = {o["metadata"]["uid"]: n for n, o in final.items()}
    children = {
        kind: (get(cluster, namespace, kind, "-l", LABEL) or {"items": []})["items"]
        for kind in ("configmaps", "services", "jobs")
    }
    for kind, objs in children.items():
        per_job: dict[str, list[str]] = {}
        for c in objs:
            owner = c["metadata"]["labels"][LABEL]
            per_job.setdefault(owner, []).append(c["metadata"]["name"])
            refs = [r["uid"] for r in c["metadata"].get("ownerReferences") or []]
            assert refs and all(r in uids for r in refs), f"orphan {kind[:-1]} {c['metadata']['name']}: {refs}"
            assert uids[refs[0]] == owner
        for name, names in per_job.items():
            assert len(names) == 1, f"duplicate {kind} for {name}: {names}"
            if kind == "jobs":
                assert names == [f"{name}-{final[name]['status']['attempt']}"], (name, names)
    for name, (phase, _) in expected.items():
        if phase == "Succeeded":
            cm = [c for c in children["configmaps"] if c["metadata"]["labels"][LABEL] == name]
            svc = [c for c in children["services"] if c["metadata"]["labels"][LABEL] == name]
            assert len(cm) == 1 and len(svc) == 1, f"{name}: configmaps {len(cm)} services {len(svc)}"
    # Pods: each owned by a Job that still exists.
    job_uids = {j["metadata"]["uid"] for j in children["jobs"]}
    for pod in (get(cluster, namespace, "pods", "-l", LABEL) or {"items": []})["items"]:
        refs = [r["uid"] for r in pod["metadata"].get("ownerReferences") or []]
        if pod["metadata"].get("deletionTimestamp"):
            continue
        assert refs and all(r in job_uids for r in refs), f"orphan pod {pod['metadata']['name']}"
    assert operator.proc is not None and operator.proc.poll() is None
    assert "Traceback" not in operator.log_path.read_text(errors="replace")
    print(f"{len(expected)} jobs, {kills} SIGKILL/restart cycles: final phases {dict(Counter(got.values()))}")
