"""The operator's kopf handlers: the premise `configure.NoDiffBase` rests on, and one callback per child event."""

import kopf

import finetune_operator.handlers  # noqa: F401  (registers the handlers)


def test_no_changing_handlers_so_kopf_needs_no_diff_base() -> None:
    registry = kopf.get_default_registry()
    assert registry._changing.get_all_handlers() == []
    watching = {h.id for h in registry._watching.get_all_handlers()}
    assert {"finetunejob_event", "attempt_job_deleted", "trainer_pod_deleted"} <= watching


def test_a_childs_change_is_one_kopf_callback_its_index_function() -> None:
    """Pods and Jobs have an index each and an event handler only for their deletion (kopf skips index functions
    for deletions): kopf runs two callbacks for no event of theirs (`handlers/jobs.py`)."""
    registry = kopf.get_default_registry()
    indexing = {h.id for h in registry._indexing.get_all_handlers()}
    assert {"ftj_jobs", "ftj_pods", "ftj_configmaps", "ftj_services"} == indexing
    for handler in registry._watching.get_all_handlers():
        if handler.id != "finetunejob_event":
            assert handler.when is not None and not handler.when(type="MODIFIED") and handler.when(type="DELETED")
