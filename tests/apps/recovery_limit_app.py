"""Two workflows for crash tests of the recovery limit: one with a limit of its own
(`@durable.workflow(max_recovery_attempts=2)`), one under the engine's. Each step call is
recorded in counter_app's `world` table (counter_app.setup creates it)."""

from __future__ import annotations

import durable
from tests.apps.counter_app import World

registry = durable.Registry()
LIMIT = 2


@durable.step(registry=registry, name="limit.step")
def limit_step(workflow_id: str, label: str) -> str:
    World.record(workflow_id, label)
    return label.upper()


@durable.workflow(registry=registry, name="limit.own", max_recovery_attempts=LIMIT)
def own_limit(workflow_id: str, /) -> list[str]:
    return [limit_step(workflow_id, f"s{i}") for i in (1, 2, 3)]


@durable.workflow(registry=registry, name="limit.engine")
def engine_limit(workflow_id: str, /) -> list[str]:
    return [limit_step(workflow_id, f"s{i}") for i in (1, 2, 3)]
