#!/usr/bin/env python
"""API-server CPU per request kind, with the FineTuneJob CRD as generated and without its CEL rules.

    $HOME/.cache/finetune-operator/venv/bin/python bench/operator/request_cost.py --n 200 \
        --variants real,stripped,real,stripped

Why: on the 2-core box the operator run of `bench_operator.py` costs the API server 25-35 ms of CPU per job
more than the floor, and the candidates were the CRD's validation (OpenAPI schema and the CEL rules of
`finetune_api.v1alpha1.rules`, evaluated on every create and status update) and the operator's own writes. This
starts its own small control plane (`hack/cluster/up.sh`, 4 KWOK nodes, no operator) and, per variant of the
CRD, measures kube-apiserver utime+stime (`/proc/<pid>/stat`) around N calls of each kind, one kind at a time:
FineTuneJob create (the bench's job), two rounds of FineTuneJob status merge patches (the operator's first
status: phase, attempt, a `Created` condition), Event create, ConfigMap create (2 KB of data). Variants:
`real` (crds/finetunejob.yaml), `stripped` (every `x-kubernetes-validations` removed), `file:<path>`.
Alternate variants (`real,stripped,real,stripped`): the machine's load drifts, and one pair says little.
Writes results/<stamp>-request-cost.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import bench_operator as bo  # the benchmark's cluster and client helpers


def strip_validations(node: Any) -> Any:
    """The CRD without any `x-kubernetes-validations` (in place)."""
    if isinstance(node, dict):
        node.pop("x-kubernetes-validations", None)
        for value in node.values():
            strip_validations(value)
    elif isinstance(node, list):
        for value in node:
            strip_validations(value)
    return node


def first_status(i: int, k: int) -> dict[str, Any]:
    """The operator's first status write of a new job (what `_write_status` sends), made unique per call."""
    condition = {
        "type": "Created",
        "status": "True",
        "reason": "ChildrenCreated",
        "message": "attempt 1 created",
        "lastTransitionTime": "2026-12-02T00:00:00Z",
    }
    return {"status": {"phase": "Pending", "attempt": 1, "message": f"job {i} round {k}", "conditions": [condition]}}


def measure(b: bo.Bench, api_pid: int, ns: str, n: int) -> dict[str, float]:
    """API-server CPU ms per call, per kind, for n calls of each in a fresh namespace."""
    b.namespace(ns)
    time.sleep(2)  # the namespace's own setup (service account, tokens) out of the first window
    out: dict[str, float] = {}

    def window(kind: str, call: Any) -> None:
        before = b.cpu_seconds(api_pid)
        for i in range(n):
            call(i)
        out[kind] = round((b.cpu_seconds(api_pid) - before) / n * 1000, 2)

    window("finetunejob_create_ms", lambda i: b.create_ftj(ns, f"j{i}"))
    for k in range(2):
        window(
            f"status_patch_{k + 1}_ms",
            lambda i, k=k: b.custom.patch_namespaced_custom_object_status(
                bo.GROUP, bo.VERSION, ns, bo.PLURAL, f"j{i}", first_status(i, k)
            ),
        )
    involved = {"kind": "FineTuneJob", "apiVersion": f"{bo.GROUP}/{bo.VERSION}", "namespace": ns}
    window(
        "event_create_ms",
        lambda i: b.core.create_namespaced_event(
            ns,
            {
                "metadata": {"generateName": f"j{i}."},
                "involvedObject": {**involved, "name": f"j{i}"},
                "reason": "PodsStarting",
                "message": "attempt 1: 0/2 node(s) ready",
                "type": "Normal",
            },
        ),
    )
    window(
        "configmap_create_ms",
        lambda i: b.core.create_namespaced_config_map(ns, {"metadata": {"name": f"c{i}"}, "data": {"a": "b" * 2000}}),
    )
    b.delete_namespace(ns)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="calls of each kind per variant")
    ap.add_argument("--variants", default="real,stripped,real,stripped")
    ap.add_argument("--cluster-dir", type=Path, default=Path("/tmp/ftjob-request-cost"))
    args = ap.parse_args()
    b = bo.Bench(args.cluster_dir, nodes=4, gpus_per_pod=1)
    crd = yaml.safe_load((bo.REPO / "crds" / "finetunejob.yaml").read_text())
    rows: list[dict[str, Any]] = []
    b.up()
    try:
        api_pid = int((b.dir / "pids" / "kube-apiserver.pid").read_text())
        for k, variant in enumerate(args.variants.split(",")):
            if variant.startswith("file:"):
                doc = yaml.safe_load(Path(variant[5:]).read_text())
            else:
                doc = strip_validations(copy.deepcopy(crd)) if variant == "stripped" else crd
            b.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(doc))
            time.sleep(3)  # the API server rebuilds the CRD's handler
            row = {"variant": variant, "load_before": list(os.getloadavg()), **measure(b, api_pid, f"cost-{k}", args.n)}
            bo.log(json.dumps(row))
            rows.append(row)
    finally:
        b.down()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = bo.RESULTS / f"{stamp}-request-cost.json"
    out.write_text(json.dumps({"n": args.n, "rows": rows}, indent=1) + "\n")
    bo.log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
