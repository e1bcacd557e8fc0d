"""The operator's kopf handlers: the premises `configure.NoDiffBase` and `jobs` rest on."""

import kopf

import finetune_operator.handlers  # noqa: F401  (registers the handlers)
from finetune_operator.handlers.state import Triggers


def test_no_changing_handlers_so_kopf_needs_no_diff_base() -> None:
    registry = kopf.get_default_registry()
    assert registry._changing.get_all_handlers() == []
    watching = {h.id for h in registry._watching.get_all_handlers()}
    assert {"finetunejob_event", "attempt_job_event", "trainer_pod_event"} <= watching


def _body(
    generation: int = 1, labels: dict[str, str] | None = None, status: dict | None = None, **meta: object
) -> dict:
    metadata = {"name": "a", "namespace": "ns", "uid": "u1", "generation": generation, "labels": labels or {}, **meta}
    return {"metadata": metadata, "spec": {}, "status": status or {}}


def test_only_spec_label_uid_or_deletion_changes_trigger_a_reconcile() -> None:
    triggers, key = Triggers(), ("ns", "a")
    assert triggers.first(key)
    assert triggers.changed(key, Triggers.signature(_body()))
    assert not triggers.first(key)
    # our own status writes and progress pushes: same signature, no reconcile
    assert not triggers.changed(key, Triggers.signature(_body(status={"phase": "Running"}, resourceVersion="9")))
    assert triggers.changed(key, Triggers.signature(_body(generation=2)))
    assert triggers.changed(key, Triggers.signature(_body(generation=2, labels={"kueue.x-k8s.io/queue-name": "q"})))
    assert triggers.changed(
        key, Triggers.signature(_body(generation=2, labels={"kueue.x-k8s.io/queue-name": "q"}, deletionTimestamp="t"))
    )
    assert triggers.changed(key, Triggers.signature(_body(uid="u2")))  # a re-created namesake
    triggers.forget(key)
    assert triggers.first(key)
