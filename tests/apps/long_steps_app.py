"""An app for long-step tests: a crawl of many pages, one heartbeat a page.

Every attempt writes where it started and each page it did to the `crawl` table, and the
step after it writes the crawl's result to `results`: both through their own autocommit
connections, outside durable, so they show what really ran. A first attempt takes
`page_seconds` a page; an attempt that resumes from a heartbeat goes fast, so that a test
need not wait out the whole crawl. A heartbeat refused (this process lost the workflow)
is written down, and the attempt then returns anyway: its result must not be recorded.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

import durable
from durable.errors import StaleOwnerError

registry = durable.Registry()
DDL = """
CREATE TABLE IF NOT EXISTS crawl (id bigserial PRIMARY KEY, workflow_id text, what text,
    page int, pid int);
CREATE TABLE IF NOT EXISTS results (id bigserial PRIMARY KEY, workflow_id text, pid int,
    first_page int);
"""
HEARTBEAT_TIMEOUT = 5.0


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)


def _write(statement: str, params: list[Any]) -> None:
    with psycopg.connect(os.environ["DURABLE_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(statement, params)


def _note(workflow_id: str, what: str, page: int) -> None:
    _write(
        "INSERT INTO crawl (workflow_id, what, page, pid) VALUES (%s, %s, %s, %s)",
        [workflow_id, what, page, os.getpid()],
    )


@durable.step(
    registry=registry,
    name="long.crawl",
    heartbeat_timeout=HEARTBEAT_TIMEOUT,
    retries=2,
    initial_delay=0,
)
def crawl(workflow_id: str, pages: int, page_seconds: float) -> dict[str, int]:
    last = durable.last_heartbeat()
    first = 0 if last is None else int(last) + 1
    _note(workflow_id, "start", first)
    for page in range(first, pages):
        time.sleep(page_seconds if last is None else 0.01)
        try:
            durable.heartbeat(page)
        except StaleOwnerError:
            _note(workflow_id, "refused", page)
            break  # and return as if done: the record is refused all the same
        _note(workflow_id, "page", page)
    return {"first": first, "pid": os.getpid()}


@durable.step(registry=registry, name="long.keep")
def keep(workflow_id: str, result: dict[str, int]) -> None:
    _write(
        "INSERT INTO results (workflow_id, pid, first_page) VALUES (%s, %s, %s)",
        [workflow_id, result["pid"], result["first"]],
    )


@durable.workflow(registry=registry, name="long.crawl_job")
def crawl_job(workflow_id: str, /, pages: int, page_seconds: float) -> dict[str, int]:
    result = crawl(workflow_id, pages, page_seconds)
    keep(workflow_id, result)
    return result
