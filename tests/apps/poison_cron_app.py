"""Three every-second schedules of one workflow, and a workflow to submit by hand, for the
test that corrupts schedules in the database under a running `durable worker --app`."""

from __future__ import annotations

import datetime as dt

import durable

registry = durable.Registry()

SCHEDULES = ("cron.good", "cron.bad_cron", "cron.bad_timezone")


@durable.workflow(registry=registry, name="cron.tick")
def tick(at: dt.datetime) -> str:
    return at.isoformat()


for _name in SCHEDULES:
    durable.scheduled("* * * * * *", name=_name, registry=registry)(tick)


@durable.workflow(registry=registry, name="cron.hello")
def hello(name: str) -> str:
    return f"hello {name}"
