"""A worker app that builds its own engine with an executor id given in code (`--app
tests.apps.coded_engine_app:engine`): under `durable worker --processes N` each process still
gets an id of its own."""

from __future__ import annotations

import durable
from tests.apps import counter_app

engine = durable.Engine(registry=counter_app.registry, executor_id="coded")
