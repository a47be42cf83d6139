from __future__ import annotations

import durable

PUBLIC = {
    "AttributeRange",
    "BulkResult",
    "RunFilter",
    "set_attributes",
    "set_attributes_async",
    "workflow_attributes",
    "heartbeat",
    "last_heartbeat",
    "Debouncer",
    "ChildHandle",
    "Winner",
    "on_approval",
    "on_message",
    "on_timer",
    "start_child",
    "start_child_async",
    "wait_first",
    "wait_first_async",
    "workflow_timeout",
    "step_id",
    "workflow_id",
    "with_options",
    "get_event",
    "get_event_async",
    "send",
    "send_async",
    "deprecate_patch",
    "patched",
    "patched_async",
    "close_stream",
    "close_stream_async",
    "write_stream",
    "write_stream_async",
    "Reservation",
    "reserve",
    "AsyncWorkflowHandle",
    "append_turn_async",
    "approval_async",
    "recv_async",
    "set_event_async",
    "sleep_async",
    "to_thread",
    "Budget",
    "Client",
    "budget_left",
    "charge",
    "tool",
    "PruneReport",
    "RetentionPolicy",
    "append_turn",
    "conversation",
    "state",
    "Clock",
    "Decision",
    "Engine",
    "FakeClock",
    "Instance",
    "JSONSerializer",
    "PickleSerializer",
    "Queue",
    "Registry",
    "RetryPolicy",
    "Serializer",
    "StepKind",
    "StepRecord",
    "SystemClock",
    "WorkflowHandle",
    "WorkflowInfo",
    "WorkflowStatus",
    "approval",
    "compensate",
    "default_registry",
    "effect",
    "instrument_psycopg",
    "recv",
    "scheduled",
    "set_event",
    "sleep",
    "step",
    "transaction",
    "workflow",
    "callback_url",
    "callback_url_async",
}
# Names that must not come back without a decision.
REMOVED: set[str] = set()


def test_public_surface_is_pinned() -> None:
    assert set(durable.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(durable, name), name
    assert not (REMOVED & set(dir(durable)))


def test_every_public_error_lives_in_errors() -> None:
    from durable import errors

    assert all(
        issubclass(getattr(errors, n), errors.DurableError)
        for n in dir(errors)
        if n.endswith("Error") and isinstance(getattr(errors, n), type)
    )


def test_dir_shows_the_public_names_and_submodules_only() -> None:
    shown = {name for name in dir(durable) if not name.startswith("_")}
    submodules = {
        "errors",
        "serialization",
        "testing",
        "llm",
        "integrations",
        "ui",
        "cli",
        "triggers",
    }
    assert shown - set(durable.__all__) <= submodules, shown - set(durable.__all__)
    assert "annotations" not in shown
