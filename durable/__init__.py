"""durable: durable execution for long-running Python programs, journaled in PostgreSQL.

Decorate the long process with `@workflow`, each unit of work with `@step` (or
`@transaction` when it writes the application's database), and run it inside
`with Engine(...):`. Each step's output is journaled once; after a crash the workflow is
re-invoked with its saved inputs and completed steps return their journaled outputs.
"""

from durable._base.clock import Clock, FakeClock, SystemClock
from durable._base.models import (
    Budget,
    Decision,
    RetryPolicy,
    StepKind,
    StepRecord,
    Winner,
    WorkflowInfo,
    WorkflowStatus,
)
from durable._base.registry import Registry, default_registry
from durable._base.version import __version__ as __version__
from durable._client.bulk import BulkResult
from durable._client.client import Client
from durable._client.debounce_async import Debouncer
from durable._client.queues import Queue
from durable._client.schedules import scheduled
from durable._client.starts import start_child
from durable._client.starts_async import start_child_async
from durable._host.engine import AsyncWorkflowHandle, Engine, WorkflowHandle
from durable._io.retention import PruneReport, RetentionPolicy
from durable._run.attributes import workflow_attributes
from durable._run.budget import Reservation, budget_left, charge, reserve
from durable._run.child_handle import ChildHandle
from durable._run.children import on_approval, on_message, on_timer, wait_first
from durable._run.children_async import wait_first_async
from durable._run.current import step_id, workflow_id
from durable._run.decorators import effect, step, tool, transaction, workflow
from durable._run.driver import compensate
from durable._run.driver_async import to_thread
from durable._run.filter import AttributeRange, RunFilter
from durable._run.heartbeats import heartbeat, last_heartbeat
from durable._run.methods import Instance
from durable._run.patches import deprecate_patch, patched
from durable._run.patches_async import patched_async
from durable._run.start_options import with_options
from durable._run.state import append_turn
from durable._run.state_async import append_turn_async, conversation, state
from durable._run.streams import close_stream, write_stream
from durable._run.streams_async import close_stream_async, write_stream_async
from durable._run.timeouts import workflow_timeout
from durable._run.tracing import instrument_psycopg
from durable._run.waits import (
    approval,
    callback_url,
    get_event,
    recv,
    send,
    set_attributes,
    set_event,
    sleep,
)
from durable._run.waits_async import (
    approval_async,
    callback_url_async,
    get_event_async,
    recv_async,
    send_async,
    set_attributes_async,
    set_event_async,
    sleep_async,
)
from durable.serialization import JSONSerializer, PickleSerializer, Serializer

__all__ = [
    "AsyncWorkflowHandle",
    "AttributeRange",
    "Budget",
    "BulkResult",
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
    "RunFilter",
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
    "callback_url",
    "callback_url_async",
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
    "set_attributes",
    "set_attributes_async",
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
    "with_options",
    "workflow",
    "workflow_attributes",
    "workflow_id",
    "workflow_timeout",
    "write_stream",
    "write_stream_async",
]
