"""The Engine's public surface: what an application calls, at most 42 names, and the
client's calls it offers keep the client's signatures (the rest is `engine.client`)."""

from __future__ import annotations

import inspect

import durable
from durable import Client, Engine

# 40 until start_or_send and start_or_send_async (signal-with-start starts a workflow in
# this engine, which the client's cannot).
MAX_PUBLIC = 42
# Set in Engine.__init__ (the parts an engine is made of), besides its methods and properties.
PARTS = {"client", "config", "registry", "runner", "ownership"}


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_the_engine_shows_at_most_forty_two_names() -> None:
    engine = Engine("postgresql://127.0.0.1:1/unused", registry=durable.Registry())
    names = {name for name in dir(engine) if not name.startswith("_")}
    assert names == _public(Engine) | PARTS
    assert len(names) <= MAX_PUBLIC, sorted(names)


def test_an_engine_is_not_a_client_but_holds_one() -> None:
    assert not issubclass(Engine, Client)
    engine = Engine("postgresql://127.0.0.1:1/unused", registry=durable.Registry())
    assert isinstance(engine.client, Client)
    assert engine.client.config is engine.config


def test_the_calls_an_engine_hands_to_its_client_keep_their_signatures() -> None:
    shared = _public(Engine) & _public(Client)
    assert {"retrieve", "send", "get_event", "cancel", "list_workflows"} <= shared
    for name in sorted(shared):
        if name in {"running"}:  # a property on both
            continue
        ours, theirs = getattr(Engine, name), getattr(Client, name)
        assert inspect.signature(ours) == inspect.signature(theirs), name


# What the engine, the worker loop and the stream readers use of a client: plumbing, not
# what a user calls, so not on its public surface.
CLIENT_PLUMBING = {
    "listener",
    "close_listener",
    "notifications",
    "notify_channel",
    "stream_channel",
    "expire_approvals",
}


def test_the_clients_plumbing_is_not_public() -> None:
    assert not CLIENT_PLUMBING & _public(Client)
    assert all(hasattr(Client, f"_{name}") for name in CLIENT_PLUMBING)
