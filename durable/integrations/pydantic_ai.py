"""pydantic-ai agents that run durably inside a durable workflow.

`DurableAgent` is a pydantic-ai durability capability (`pip install 'durable-pg[pydantic-ai]'`),
built on pydantic-ai's own durable-execution surface (`pydantic_ai.durable_exec`), as its
DBOS, Temporal and Prefect backends are:

    agent = Agent(model, tools=[...], capabilities=[DurableAgent(name="researcher")])

    @durable.workflow(budget=durable.Budget(dollars=2.0))
    async def research(question: str) -> str:
        return (await agent.run(question)).output

Inside a workflow every model request and every tool call of the agent is a journaled
step: a resumed workflow gets the recorded model responses and tool results back in
order, with no second request and no tool run twice. A model request charges its tokens
(and, with `prices=`, its dollars) to the workflow's budget, so the hard cap stops an agent
that would spend past it. Outside a workflow the agent runs as usual.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from durable._base import labels
from durable._base.extras import extra
from durable._base.models import StepKind
from durable._base.registry import StepDef
from durable._run import driver_async as _driver_async
from durable._run.budget import charge
from durable._run.budget import reserve as durable_reserve
from durable._run.context import current_run, current_step, workflow_code_run
from durable.llm import Price, Usage

with extra("pydantic-ai"):
    from pydantic_ai.durable_exec import (
        JSON_CODEC,
        BaseDurabilityCapability,
        DurabilityEngineSpec,
        DurableOperationBackend,
        DurableOperationId,
        JournalCallableOperationBackend,
        ModelRequestId,
        RoleBasedOperationConfig,
    )


__all__ = ["DurableAgent"]


@dataclass(init=False, kw_only=True)
class DurableAgent(BaseDurabilityCapability[Any]):
    """Makes a pydantic-ai agent's model requests and tool calls durable steps.

    name: a stable name for the agent: its steps are journaled as `<name>.<operation>`.
    prices: dollars per million tokens by model name (durable.llm.Price; longest prefix
        wins); a model with no price is charged in tokens only.
    reserve: dollars set aside (durable.reserve) before each model request: when what the
        budget has left cannot cover it, the request is not sent and the agent waits at
        the budget gate. Without it, a request is refused only once its cost is known
        (after it was made).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="durable",
        durable_unit_noun="step",
        durable_container_noun="workflow",
        codec=JSON_CODEC,  # steps journal JSON
        # A response's tool calls run one after another in a workflow: run concurrently,
        # their steps could take their journal positions in another order on replay.
        sequential_tools_in_durable_context=True,
    )

    def __init__(
        self,
        *,
        name: str | None = None,
        prices: Mapping[str, Price | None] | None = None,
        reserve: float | None = None,
        models: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(models=models, name=name)
        self._prices = dict(prices or {})
        self._reserve = reserve

    @property
    def in_durable_context(self) -> bool:
        return workflow_code_run() is not None

    @property
    def in_durable_unit(self) -> bool:
        step = current_step.get()
        return (step is not None and current_run.get() is not None) or super().in_durable_unit

    def get_durable_operation_backend(self) -> DurableOperationBackend[None]:
        return _StepBackend(
            agent_name=self.name or "agent",
            config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None),
            price=self._price,
            reserve=self._reserve,
        )

    def _price(self, model: str) -> Price | None:
        for name in sorted(self._prices, key=len, reverse=True):
            if model == name or model.startswith(name):
                return self._prices[name]
        return None


class _StepBackend(JournalCallableOperationBackend[None]):
    """Runs each durable operation of the agent as one journaled async step."""

    def __init__(
        self,
        *,
        agent_name: str,
        config: Any,
        price: Callable[[str], Price | None],
        reserve: float | None,
    ) -> None:
        super().__init__(agent_name=agent_name, config=config)
        self._price = price
        self._reserve = reserve

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        if workflow_code_run() is None:
            return await body()  # outside a workflow (or inside a step): a plain call
        is_model = isinstance(operation_id, ModelRequestId)

        async def unit() -> object:
            if is_model and self._reserve:
                with durable_reserve(dollars=self._reserve):  # refused: nothing is sent
                    payload = await body()
            else:
                payload = await body()
            if is_model and isinstance(payload, dict):
                self._charge(payload)
            return payload

        defn = StepDef(labels.pydantic_ai_step(name), unit, StepKind.STEP)
        return await _driver_async.call_step(defn, (), {})

    def _charge(self, response: dict[str, Any]) -> None:
        usage = response.get("usage") or {}
        used = Usage(
            int(usage.get("input_tokens") or 0),
            int(usage.get("output_tokens") or 0),
            int(usage.get("cache_read_tokens") or 0),
        )
        price = self._price(str(response.get("model_name") or ""))
        dollars = 0.0 if price is None else float(price.dollars(used))
        if used.total or dollars:
            charge(dollars=dollars, tokens=used.total)
