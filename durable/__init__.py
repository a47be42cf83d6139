"""durable: durable execution for long-running Python programs, journaled in PostgreSQL.

Decorate the long process with `@workflow`, each unit of work with `@step` (or
`@transaction` when it writes the application's database), and run it inside
`with Engine(...):`. Each step's output is journaled once; after a crash the workflow is
re-invoked with its saved inputs and completed steps return their journaled outputs.
"""

from durable._budget import Reservation, budget_left, charge, reserve
from durable._child_handle import ChildHandle
from durable._children import on_approval, on_message, on_timer, wait_first
from durable._children_async import wait_first_async
from durable._client import Client
from durable._clock import Clock, FakeClock, SystemClock
from durable._current import step_id, workflow_id
from durable._debounce_async import Debouncer
from durable._decorators import effect, step, tool, transaction, workflow
from durable._driver import compensate
from durable._driver_async import to_thread
from durable._engine import AsyncWorkflowHandle, Engine, WorkflowHandle
from durable._heartbeats import heartbeat, last_heartbeat
from durable._methods import Instance
from durable._models import (
    Budget,
    Decision,
    RetryPolicy,
    StepKind,
    StepRecord,
    Winner,
    WorkflowInfo,
    WorkflowStatus,
)
from durable._patches import deprecate_patch, patched
from durable._patches_async import patched_async
from durable._queues import Queue
from durable._registry import Registry, default_registry
from durable._retention import PruneReport, RetentionPolicy
from durable._schedules import scheduled
from durable._starts import start_child
from durable._starts_async import start_child_async
from durable._state import append_turn
from durable._state_async import append_turn_async, conversation, state
from durable._streams import close_stream, write_stream
from durable._streams_async import close_stream_async, write_stream_async
from durable._timeouts import workflow_timeout
from durable._tracing import instrument_psycopg
from durable._version import __version__ as __version__
from durable._waits import approval, get_event, recv, send, set_event, sleep
from durable._waits_async import (
    approval_async,
    get_event_async,
    recv_async,
    send_async,
    set_event_async,
    sleep_async,
)
from durable.serialization import JSONSerializer, PickleSerializer, Serializer

__all__ = [
    "AsyncWorkflowHandle",
    "Budget",
    "ChildHandle",
    "Client",
    "Clock",
    "Debouncer",
    "Decision",
    "Engine",
    "FakeClock",
    "Instance",
    "JSONSerializer",
    "PickleSerializer",
    "PruneReport",
    "Queue",
    "Registry",
    "Reservation",
    "RetentionPolicy",
    "RetryPolicy",
    "Serializer",
    "StepKind",
    "StepRecord",
    "SystemClock",
    "Winner",
    "WorkflowHandle",
    "WorkflowInfo",
    "WorkflowStatus",
    "append_turn",
    "append_turn_async",
    "approval",
    "approval_async",
    "budget_left",
    "charge",
    "close_stream",
    "close_stream_async",
    "compensate",
    "conversation",
    "default_registry",
    "deprecate_patch",
    "effect",
    "get_event",
    "get_event_async",
    "heartbeat",
    "instrument_psycopg",
    "last_heartbeat",
    "on_approval",
    "on_message",
    "on_timer",
    "patched",
    "patched_async",
    "recv",
    "recv_async",
    "reserve",
    "scheduled",
    "send",
    "send_async",
    "set_event",
    "set_event_async",
    "sleep",
    "sleep_async",
    "start_child",
    "start_child_async",
    "state",
    "step",
    "step_id",
    "to_thread",
    "tool",
    "transaction",
    "wait_first",
    "wait_first_async",
    "workflow",
    "workflow_id",
    "workflow_timeout",
    "write_stream",
    "write_stream_async",
]
