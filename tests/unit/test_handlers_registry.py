"""The operator's kopf handlers: the premise `configure.NoDiffBase` rests on."""

import kopf

import finetune_operator.handlers  # noqa: F401  (registers the handlers)


def test_no_changing_handlers_so_kopf_needs_no_diff_base() -> None:
    registry = kopf.get_default_registry()
    assert registry._changing.get_all_handlers() == []
    watching = {h.id for h in registry._watching.get_all_handlers()}
    assert {"finetunejob_event", "attempt_job_event", "trainer_pod_event"} <= watching
