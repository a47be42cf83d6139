"""durable.callback_url() in the core: a new URL stores its token's hash and journals
what derives the token again (never the token); a replay derives the same URL and writes
nothing; another secret, or none, stops the run. No database: the answers are scripted."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib

import pytest

from durable import _core as protocol
from durable._base.models import StepKind, StepRecord
from durable._core import Execute, Run
from durable.errors import ConfigurationError
from tests.unit.scripted import T0, Script, make_run

SECRET = b"a-secret-of-the-workers-0123456789abcdef"
BASE = "https://hooks.example.com/durable/"


def with_secret(run: Run, secret: bytes | None = SECRET, base: str | None = None) -> Run:
    run.settings = dataclasses.replace(run.settings, callback_secret=secret, callback_base_url=base)
    return run


def mint(run: Run, script: Script, nonce: str = "nonce-1", base: str | None = BASE) -> str:
    return script.run(protocol.callback_url(run, "message", "payment", base, 3600.0, nonce))


def test_a_new_url_stores_the_hash_of_its_token_and_journals_no_token() -> None:
    run, script = with_secret(make_run()), Script()
    url = mint(run, script)
    assert [op.name for op in script.ops if isinstance(op, Execute)] == [
        "insert_callback",
        "record_step",
    ]
    prefix = "https://hooks.example.com/durable/callbacks/"
    assert url.startswith(prefix)
    token = url[len(prefix) :]
    assert len(token) == 43
    stored = script.executed("insert_callback")[0]
    assert stored["token_hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert (stored["workflow_id"], stored["kind"], stored["target"]) == (
        "wf-1",
        "message",
        "payment",
    )
    assert stored["expires_at"] == T0 + dt.timedelta(hours=1)
    recorded = script.executed("record_step")[0]
    assert recorded["step_name"] == "callback-url:message:payment"
    assert recorded["kind"] == StepKind.STEP
    assert token not in str(script.ops)  # the token is written nowhere
    # Another nonce, another token.
    assert mint(with_secret(make_run()), Script(), nonce="nonce-2") != url


def _journaled(script: Script) -> StepRecord:
    recorded = script.executed("record_step")[0]
    return StepRecord(0, recorded["step_name"], StepKind.STEP, recorded["output"], None, 1)


def test_a_replay_hands_out_the_same_url_and_mints_nothing() -> None:
    first = Script()
    url = mint(with_secret(make_run()), first)
    replayed = Script()
    run = with_secret(make_run(records=[_journaled(first)]))
    # Another nonce and base on the replay change nothing: the journal decides.
    assert mint(run, replayed, nonce="another", base="https://elsewhere.example.com") == url
    assert replayed.ops == []


def test_a_replay_under_another_secret_stops_rather_than_hand_out_a_dead_url() -> None:
    first = Script()
    mint(with_secret(make_run()), first)
    run = with_secret(make_run(records=[_journaled(first)]), secret=b"another-secret" * 3)
    with pytest.raises(ConfigurationError, match="DURABLE_CALLBACK_SECRET"):
        mint(run, Script())


def test_no_secret_or_no_address_mints_nothing() -> None:
    script = Script()
    with pytest.raises(ConfigurationError, match="DURABLE_CALLBACK_SECRET"):
        mint(with_secret(make_run(), secret=None), script)
    with pytest.raises(ConfigurationError, match="base_url"):
        mint(with_secret(make_run()), script, base=None)
    with pytest.raises(ConfigurationError, match="base_url"):
        mint(with_secret(make_run()), script, base="ftp://example.com")
    assert script.ops == []
    # The engine's default address serves when the call names none.
    url = mint(with_secret(make_run(), base="http://127.0.0.1:8322"), Script(), base=None)
    assert url.startswith("http://127.0.0.1:8322/callbacks/")
