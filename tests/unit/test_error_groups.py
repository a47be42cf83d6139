"""Every public error is in exactly one of the four groups under DurableError, which tell
a caller what to do about it: fix the program (UsageError), handle the outcome
(OutcomeError), act on the stored record (StateError), or retry once the environment is
back (InfrastructureError)."""

from __future__ import annotations

import inspect
import re

import pytest

from durable import errors

GROUPS: tuple[type[errors.DurableError], ...] = (
    errors.UsageError,
    errors.OutcomeError,
    errors.StateError,
    errors.InfrastructureError,
)
# Control flow that unwinds a workflow: BaseExceptions, outside every group on purpose.
CONTROL_FLOW = {
    errors.WorkflowSuspended,
    errors.WorkflowInterrupted,
    errors.WorkflowHandedOver,
    errors.WorkflowPaused,
    errors.WorkflowAbandoned,
}
# What `except ConfigurationError` catches: what it caught before the groups, less the
# infrastructure failures that a caller giving up on bad configuration must not give up on.
CONFIGURATION = {
    "ConfigurationError",
    "NoEngineError",
    "EngineNotRunningError",
    "DuplicateNameError",
    "DefinitionError",
    "DBOSNameError",
    "UnknownWorkflowError",
    "UnknownInstanceError",
    "InvalidNameError",
    "ExecutorIdInUseError",
    "InvalidScheduleError",
    "InvalidBudgetError",
    "UnknownModelPriceError",
    "UnboundedModelCallError",
    "OutboxRequiredError",
    "NoOpenTransactionError",
    "MissingExtraError",
}


def public_classes() -> list[type[BaseException]]:
    found = [
        cls
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if cls.__module__ == errors.__name__ and not name.startswith("_")
    ]
    assert all(issubclass(cls, BaseException) for cls in found)
    return found


def grouped() -> list[type[errors.DurableError]]:
    """The public errors that must be in a group: all but DurableError and the groups."""
    return [
        cls
        for cls in public_classes()
        if issubclass(cls, errors.DurableError) and cls is not errors.DurableError
        if cls not in GROUPS
    ]


def test_every_public_class_is_a_durable_error_or_control_flow() -> None:
    strays = [
        cls.__name__
        for cls in public_classes()
        if not issubclass(cls, errors.DurableError) and cls not in CONTROL_FLOW
    ]
    assert strays == []
    for cls in CONTROL_FLOW:
        assert not issubclass(cls, Exception), cls


def test_the_groups_sit_directly_under_durable_error() -> None:
    for group in GROUPS:
        assert group.__bases__ == (errors.DurableError,), group
    for a in GROUPS:
        for b in GROUPS:
            assert a is b or not issubclass(a, b), (a, b)


@pytest.mark.parametrize("cls", grouped(), ids=lambda cls: cls.__name__)
def test_each_error_is_in_exactly_one_group(cls: type[errors.DurableError]) -> None:
    groups = [group.__name__ for group in GROUPS if issubclass(cls, group)]
    assert len(groups) == 1, (cls.__name__, groups)


def test_the_groups_hold_a_fair_share_each() -> None:
    """No group is a catch-all, and none is empty (an error added later joins one)."""
    counts = {g.__name__: sum(issubclass(c, g) for c in grouped()) for g in GROUPS}
    assert all(n >= 5 for n in counts.values()), counts


def test_an_unreachable_database_is_infrastructure_not_configuration() -> None:
    """The reason for the groups: code that gives up on a configuration mistake must not
    give up on an outage, which durable (and its callers) retry."""
    err = errors.DatabaseUnavailableError("lost the system database")
    assert isinstance(err, errors.InfrastructureError)
    assert not isinstance(err, errors.ConfigurationError)
    assert not isinstance(err, errors.UsageError)
    try:
        raise err
    except errors.UsageError:
        pytest.fail("an outage was taken for a usage error")
    except errors.InfrastructureError:
        pass


def test_configuration_error_catches_the_configuration_mistakes_only() -> None:
    assert issubclass(errors.ConfigurationError, errors.UsageError)
    caught = {cls.__name__ for cls in grouped() if issubclass(cls, errors.ConfigurationError)}
    assert caught == CONFIGURATION


@pytest.mark.parametrize(
    ("cls", "group"),
    [
        (errors.EmbeddedServerError, errors.InfrastructureError),
        (errors.ExecutorIdTakenError, errors.InfrastructureError),
        (errors.StaleOwnerError, errors.InfrastructureError),
        (errors.StatementError, errors.InfrastructureError),
        (errors.MigrationError, errors.InfrastructureError),
        (errors.WorkflowFailedError, errors.OutcomeError),
        (errors.WorkflowTimeoutError, errors.OutcomeError),
        (errors.StepError, errors.OutcomeError),
        (errors.BudgetExceededError, errors.OutcomeError),
        (errors.ApprovalDeniedError, errors.OutcomeError),
        (errors.WorkflowNotFoundError, errors.StateError),
        (errors.ForkAfterUndoError, errors.StateError),
        (errors.QueueDedupError, errors.StateError),
        (errors.ApprovalConflictError, errors.StateError),
        (errors.SerializationError, errors.UsageError),
        (errors.PayloadTooLargeError, errors.UsageError),
        (errors.NotInWorkflowError, errors.UsageError),
        (errors.NotInStepError, errors.NotInWorkflowError),
        (errors.NondeterminismError, errors.UsageError),
        (errors.BranchOrderError, errors.NondeterminismError),
        (errors.TransactionStepError, errors.UsageError),
    ],
    ids=lambda v: v.__name__,
)
def test_placements_that_matter(
    cls: type[errors.DurableError], group: type[errors.DurableError]
) -> None:
    assert issubclass(cls, group)


def test_the_builtin_bases_are_kept() -> None:
    """`except TimeoutError` and `except TypeError` keep catching what they caught."""
    assert issubclass(errors.StepTimeoutError, TimeoutError)
    assert issubclass(errors.ResultTimeoutError, TimeoutError)
    assert issubclass(errors.WorkflowArgumentsError, TypeError)
    assert issubclass(errors.AsyncInSyncError, TypeError)
    assert issubclass(errors.BlockingCallError, TypeError)
    assert issubclass(errors.WorkflowTimeoutError, errors.WorkflowCancelledError)
    assert issubclass(errors.ForkAfterUndoError, errors.WorkflowNotResumableError)
    assert issubclass(errors.PayloadTooLargeError, errors.SerializationError)


def test_the_default_message_is_the_first_paragraph() -> None:
    """Later paragraphs of a docstring say where the class belongs, not what went wrong."""
    assert str(errors.EngineNotRunningError()).startswith("The engine (or client) is not")
    message = str(errors.DatabaseUnavailableError())
    assert message.endswith("that PostgreSQL is running.")
    assert str(errors.UsageError()).endswith("as the\n    message says.")


def test_the_module_docstring_draws_the_tree_as_it_is() -> None:
    """Each name in the docstring's tree sits under its class's first base."""
    doc = errors.__doc__ or ""
    tree = doc.split("The tree::", 1)[1].split("\n\n", 2)[1]
    parents: list[str] = []
    drawn: dict[str, str] = {}
    for line in tree.splitlines():
        assert line.startswith("    "), line  # the block's indent, then the drawing
        match = re.match(r"((?:[│ ] {3})*)(?:[├└]── )?(\w+)", line[4:])
        assert match, line
        depth = len(match.group(1)) // 4 + (1 if "──" in line else 0)
        name = match.group(2)
        del parents[depth:]
        if parents:
            drawn[name] = parents[-1]
        parents.append(name)
    expected = {cls.__name__: cls.__bases__[0].__name__ for cls in grouped()}
    expected.update({g.__name__: "DurableError" for g in GROUPS})
    assert drawn == expected
