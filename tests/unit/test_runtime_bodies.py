"""What the operator keeps per job between events: the change check (`Triggers`) and the newest body (`Bodies`)."""

from typing import Any

from finetune_operator.runtime import Bodies, Triggers


def _body(
    generation: int = 1, labels: dict[str, str] | None = None, status: dict[str, Any] | None = None, **meta: object
) -> dict[str, Any]:
    metadata = {"name": "a", "namespace": "ns", "uid": "u1", "generation": generation, "labels": labels or {}, **meta}
    return {"metadata": metadata, "spec": {}, "status": status or {}}


def test_only_spec_label_uid_or_deletion_changes_trigger_a_reconcile() -> None:
    triggers, key = Triggers(), ("ns", "a")
    assert triggers.changed(key, Triggers.signature(_body()))
    # our own status writes and progress pushes: same signature, no reconcile
    assert not triggers.changed(key, Triggers.signature(_body(status={"phase": "Running"}, resourceVersion="9")))
    assert triggers.changed(key, Triggers.signature(_body(generation=2)))
    assert triggers.changed(key, Triggers.signature(_body(generation=2, labels={"kueue.x-k8s.io/queue-name": "q"})))
    assert triggers.changed(
        key, Triggers.signature(_body(generation=2, labels={"kueue.x-k8s.io/queue-name": "q"}, deletionTimestamp="t"))
    )
    assert triggers.changed(key, Triggers.signature(_body(uid="u2")))  # a re-created namesake
    triggers.forget(key)
    assert triggers.changed(key, Triggers.signature(_body(uid="u2")))


def _versioned(rv: str, phase: str) -> dict[str, Any]:
    return _body(status={"phase": phase}, resourceVersion=rv, managedFields=[{"manager": "x"}])


def test_the_newest_body_wins_so_a_late_event_never_hides_our_own_status_write() -> None:
    bodies, key = Bodies(), ("ns", "a")
    bodies.offer(key, _versioned("10", "Pending"))  # watch event
    bodies.offer(key, _versioned("12", "Running"))  # the answer to our status write
    bodies.offer(key, _versioned("11", "Pending"))  # an older event delivered after it
    latest = bodies.get(key)
    assert latest is not None and latest["status"]["phase"] == "Running"
    assert "managedFields" not in latest["metadata"] and latest["metadata"]["resourceVersion"] == "12"
    bodies.offer(key, _versioned("13", "Succeeded"))
    assert bodies.get(key)["status"]["phase"] == "Succeeded"  # type: ignore[index]
    bodies.forget(key)
    assert bodies.get(key) is None


def test_versions_that_are_not_numbers_defer_to_arrival_order() -> None:
    bodies, key = Bodies(), ("ns", "a")
    bodies.offer(key, _versioned("b", "Pending"))
    bodies.offer(key, _versioned("a", "Running"))
    assert bodies.get(key)["status"]["phase"] == "Running"  # type: ignore[index]
