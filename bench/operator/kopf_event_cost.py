"""CPU per watch event in kopf's event path (`process_resource_event`), by what is registered for the resource.

The operator's CPU in a burst is mostly per watch event (bench/operator/README.md): each one is JSON-decoded
and run through kopf's per-event machinery (memory, body and patch wrappers, loggers, the throttler, cause
detection) and through every callback registered for its resource, each with a progress state, an outcome and
its kwargs. This measures that path in-process, without a cluster: a trainer pod's life (created, bound,
running, ready, deleted) for `--pods` pods, through kopf 1.45's `process_resource_event` with

* `none`: nothing registered (kopf's fixed cost per event),
* `index`: a `kopf.index` only, `event`: a `kopf.on.event` handler only,
* `index+event`: both (the operator until 2026-12-02),
* `index+deleted`: an index and an event handler whose `when` filter passes only DELETED (the operator since).

The callbacks compute the same summary the operator's do (`handlers.indexes.owned_pod`); `json` is the stdlib
decoding of the same events as the watch stream carries them. CPU time (`time.process_time`), not wall time.

    $V/bin/python bench/operator/kopf_event_cost.py --pods 400 --repeat 3
"""

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import kopf
from kopf._cogs.structs import references
from kopf._core.actions import lifecycles
from kopf._core.engines import indexing
from kopf._core.reactor import inventory, processing

from finetune_operator.handlers.configure import NoDiffBase
from finetune_operator.handlers.indexes import CHILD_LABELS, key_of, owned_pod, pod_trigger
from finetune_operator.runtime import ChildTriggers

PODS = references.Resource(
    group="", version="v1", plural="pods", kind="Pod", namespaced=True, verbs=frozenset({"list", "watch", "patch"})
)
VARIANTS = ("none", "index", "event", "index+event", "index+deleted")


def _registry(variant: str, seen: ChildTriggers) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    if variant.startswith("index"):

        @kopf.index("", "v1", "pods", labels=CHILD_LABELS, registry=registry, id="ftj_pods")
        async def ftj_pods(body: kopf.Body, **_: Any) -> Any:
            owned = owned_pod(body)
            seen.changed(owned.uid, pod_trigger(owned))
            return {key_of(body.meta): owned}

    if variant in ("event", "index+event"):

        @kopf.on.event("", "v1", "pods", labels=CHILD_LABELS, registry=registry, id="pod_event")
        async def pod_event(type: str | None, body: kopf.Body, **_: Any) -> None:
            owned = owned_pod(body)
            if type == "DELETED":
                seen.forget(owned.uid)
            else:
                seen.changed(owned.uid, pod_trigger(owned))

    if variant == "index+deleted":

        @kopf.on.event(
            "",
            "v1",
            "pods",
            labels=CHILD_LABELS,
            registry=registry,
            id="pod_deleted",
            when=lambda type, **_: type == "DELETED",
        )
        async def pod_deleted(body: kopf.Body, **_: Any) -> None:
            seen.forget(str(body.meta.uid))

    return registry


def _pod(i: int, step: int) -> dict[str, Any]:
    """Trainer pod `i` at step 1 (created) .. 4 (ready): labels, owner, env and managedFields of a real one's size."""
    fields: dict[str, Any] = {
        "f:metadata": {f"f:labels{k}": {} for k in range(12)},
        "f:spec": {f"f:c{k}": {} for k in range(60)},
    }
    meta = {
        "name": f"b{i}-1-0-x",
        "namespace": "ns",
        "uid": f"pod-{i}",
        "resourceVersion": str(10 * i + step),
        "labels": {"finetune.dev/job-name": f"b{i}", "app.kubernetes.io/managed-by": "finetune-operator"},
        "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": f"b{i}-1", "uid": f"job-{i}", "controller": True}
        ],
        "managedFields": [
            {"manager": m, "operation": "Update", "fieldsV1": fields} for m in ("kube-controller-manager", "kwok")
        ],
    }
    env = [{"name": f"FTJOB_VAR_{k}", "value": "x" * 24} for k in range(30)]
    conditions = [
        {"type": t, "status": "True" if step > 2 or (t == "PodScheduled" and step > 1) else "False"}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": "node-1" if step > 1 else None,
            "containers": [{"name": "trainer", "image": "t", "env": env}],
        },
        "status": {
            "phase": "Running" if step > 2 else "Pending",
            "conditions": conditions if step > 3 else conditions[:1],
        },
    }


def _events(pods: int) -> list[dict[str, Any]]:
    life = ((1, "ADDED"), (2, "MODIFIED"), (3, "MODIFIED"), (4, "MODIFIED"), (4, "DELETED"))
    return [{"type": t, "object": _pod(i, step)} for i in range(pods) for step, t in life]


async def _kopf_ms(variant: str, events: list[dict[str, Any]]) -> float:
    """CPU ms per event of `process_resource_event` with `variant`'s callbacks registered."""
    registry = _registry(variant, ChildTriggers())
    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = NoDiffBase()
    indexers = indexing.OperatorIndexers()
    indexers.ensure(registry._indexing.get_all_handlers())
    memories = inventory.ResourceMemories()
    queue: Any = asyncio.Queue()
    start = time.process_time()
    for event in events:
        await processing.process_resource_event(
            lifecycle=lifecycles.all_at_once,
            indexers=indexers,
            registry=registry,
            settings=settings,
            memories=memories,
            memobase=kopf.Memo(),  # type: ignore[arg-type]  # kopf.Memo is an AnyMemo at run time
            resource=PODS,
            raw_event=event,  # type: ignore[arg-type]
            event_queue=queue,
        )
    return (time.process_time() - start) / len(events) * 1e3


def _json_ms(events: list[dict[str, Any]]) -> tuple[float, float]:
    """CPU ms per event to decode the events as the watch stream carries them, and their mean size in KB."""
    lines = [json.dumps(e).encode() for e in events]
    start = time.process_time()
    for line in lines:
        json.loads(line)
    return (time.process_time() - start) / len(lines) * 1e3, statistics.mean(map(len, lines)) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=400, help="pods; 5 events each")
    ap.add_argument("--repeat", type=int, default=3, help="runs of every variant (interleaved); the median is printed")
    args = ap.parse_args()
    events = _events(args.pods)
    runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeat):
        for variant in VARIANTS:
            runs[variant].append(asyncio.run(_kopf_ms(variant, events)))
    decode, size = _json_ms(events)
    print(f"{len(events)} pod events, {args.pods} pods; CPU ms per event, median of {args.repeat}")
    for variant in VARIANTS:
        print(f"  kopf, {variant:14s} {statistics.median(runs[variant]):.3f}")
    print(f"  json.loads, {size:.1f} KB     {decode:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
