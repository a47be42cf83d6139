"""Every name the library itself writes into a user's database, in one place.

A workflow's journal (`steps.step_name`), its gates (`approvals.name`) and the ids the
library derives (child workflow ids, effect idempotency keys, schedule tick ids) hold
names that the library chooses, not the user: `recv:<topic>`, `budget@<seq>`,
`<parent>:child:<seq>`, ... A replay compares the name journaled at a position with the
name the code asks for there, a resumed run looks its gates up by name, and a fork or a
budget raise finds rows by prefix. So these strings are stored in users' databases and
form a storage contract: changing one by a single byte makes every journal written
before the change unreadable (a replay sees another name and raises
NondeterminismError, a denied gate is no longer found, a child is started twice).

They must never change for existing journals. A new kind of label may be added; an
existing one changes only with `LABELS_VERSION` bumped and a migration that rewrites the
stored labels. `tests/unit/test_labels.py` pins the exact text of each, and checks that
no other module spells out their fragments, so the contract stays in this module.

Two SQL statements in `_io/sql/queries.sql` read these names too, and SQL cannot call
this module: `waiting_budget_gates` matches `BUDGET_GATE_PREFIX` (`budget@%`) and
`denied_budget_gate` matches a budget gate and its cap gates (`<gate>` or `<gate>:...`).
The fork's `fork_events` receives `EVENT_PREFIX` as a parameter.

Nothing here imports from the rest of the package: the names depend on nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib

LABELS_VERSION = 1
"""The version of the label contract below. Bump it only together with a migration that
rewrites every stored label of the old version: journals outlive the code that wrote
them, and the code reading them must find the same names."""

JOURNAL_VERSION = 3
"""The version of the journal format as a whole: the labels of LABELS_VERSION, the kinds
of journal rows and what each holds. Written on every workflow when it is created
(`workflows.journal_version`, migration 0020). Code refuses a journal of a higher version
than this (JournalVersionError: it would misread it), and its workers do not claim one.
Bump it with LABELS_VERSION, and whenever a journal that new code writes could be misread
by the code before it (a new kind of row an older replay would not know, say).

Versions: 1, the first; 2, a workflow's sent message ids name its incarnation (migration
0025, `sent_message_id`): code of version 1 would send a message cut off before its
journal row again under another id, so it must not run a journal of version 2; 3, a datetime
in an IANA zone is stored with its zone (`...+01:00[Europe/Berlin]`), which code of version 2
cannot decode."""

# -- journal step names -----------------------------------------------------------------------

SLEEP = "sleep"
"""durable.sleep(): the journaled wake-up time."""

STATE = "durable.state"
"""durable.state.set()/update(): each journaled value of the workflow's working state."""

TURN = "durable.turn"
"""durable.append_turn(): each journaled turn of the conversation."""

ATTRIBUTES = "durable.attributes"
"""durable.set_attributes(): each journaled call (a row of kind 'step' holding the pairs)."""

APPROVAL_PREFIX = "approval:"
RECV_PREFIX = "recv:"
RECV_DEADLINE_PREFIX = "recv-deadline:"
EVENT_PREFIX = "event:"
STREAM_PREFIX = "stream:"
STREAM_CLOSE_PREFIX = "stream-close:"
PATCH_PREFIX = "patch:"
SEND_PREFIX = "send:"
READ_EVENT_PREFIX = "get-event:"
CHILD_RESULT_PREFIX = "child-result:"
WAIT_FIRST = "wait-first"
WAIT_FIRST_TIMER = "wait-first-timer"
CALLBACK_PREFIX = "callback-url:"
CALLBACK_MESSAGE_PREFIX = "callback-url#"


def approval(name: str) -> str:
    """The journaled call of durable.approval(name): the decision is its output (the gate
    itself, in the approvals table, is stored under `name` alone)."""
    return f"{APPROVAL_PREFIX}{name}"


def recv(topic_key: str) -> str:
    """The journaled call of durable.recv() on a topic ("" for the default topic): the
    consumed message is its output."""
    return f"{RECV_PREFIX}{topic_key}"


def recv_deadline(topic_key: str) -> str:
    """The journaled deadline of a durable.recv() with a timeout: the wake-up time, so a
    resumed wait does not wait again for the part already waited."""
    return f"{RECV_DEADLINE_PREFIX}{topic_key}"


def send(topic_key: str) -> str:
    """The journaled call of durable.send() inside a workflow, on a topic ("" for the
    default topic): the id of the message sent is its output."""
    return f"{SEND_PREFIX}{topic_key}"


def sent_message_id(sender_id: str, seq: int, incarnation: str = "") -> str:
    """The id of the message a workflow sends at position `seq` (when the caller gives no
    idempotency key): the same on every run, so a send that is run again after a crash is
    the same message, delivered once. `incarnation`: which life of its id the sender is
    (journal version 2, `workflows.incarnation`), so that a workflow started again under
    the id of a pruned one sends new messages, not the old ones' ids; '' for a journal of
    version 1, whose ids stay as they were."""
    if not incarnation:
        return f"{sender_id}:send:{seq}"
    return f"{sender_id}:send:{seq}@{incarnation}"


def callback(kind: str, target: str) -> str:
    """The journaled call of durable.callback_url() for a wait of `kind` ("message": a
    topic, "" the default; "approval": a gate) on `target`: what derives the URL's token
    again (never the token) is its output, so a replay hands out the same URL."""
    return f"{CALLBACK_PREFIX}{kind}:{target}"


def callback_message_id(token_hash: str) -> str:
    """The id of the message a callback URL's POST delivers (`token_hash`: the sha256 of its
    token, in hex): one message per URL, whatever retries it."""
    return f"{CALLBACK_MESSAGE_PREFIX}{token_hash}"


def read_event(key: str) -> str:
    """The journaled call of durable.get_event() inside a workflow: the value read (or
    None, when it did not appear in time) is its output."""
    return f"{READ_EVENT_PREFIX}{key}"


def child_result(name: str, workflow_id: str) -> str:
    """The journaled wait for a child's outcome (a ChildHandle's result()), `name` being
    the child's workflow name and `workflow_id` its id: the child's value (or failure) is
    its output. A replay waiting for another child there is a NondeterminismError, never
    the other child's outcome."""
    return f"{CHILD_RESULT_PREFIX}{name}@{workflow_id}"


def wait_first(index: int, what: str) -> str:
    """The journaled outcome of durable.wait_first(), won by the condition at `index`,
    which is `what` (`message:<topic>`, `approval:<gate>`, `timer`, `child:<id>`): the
    name says which one won, so a replay picks the same one, and a replay whose condition
    at that index is another is a NondeterminismError (never a message handed back as a
    timer's or a child's value). The winner's value (the message, the decision, the
    child's outcome) is its output."""
    return f"{WAIT_FIRST}#{index} {what}"


def patch(patch_id: str) -> str:
    """The marker durable.patched(patch_id) journals where a run first reaches that point
    on code that has the patch: a replay that finds it takes the new branch, one that
    finds another call there (a journal from before the patch) takes the old one."""
    return f"{PATCH_PREFIX}{patch_id}"


def event(key: str) -> str:
    """The journaled call of durable.set_event(key, ...)."""
    return f"{EVENT_PREFIX}{key}"


def event_key(label: str) -> str | None:
    """The key of an event call's journaled name, or None for any other name. A fork
    reads event keys back this way (in SQL, with EVENT_PREFIX as a parameter)."""
    return label[len(EVENT_PREFIX) :] if label.startswith(EVENT_PREFIX) else None


def stream(key: str, closing: bool = False) -> str:
    """The journaled call of a write to stream `key`, or of its close."""
    return f"{STREAM_CLOSE_PREFIX}{key}" if closing else f"{STREAM_PREFIX}{key}"


def parse_stream(label: str) -> tuple[str, bool] | None:
    """(key, closing) of a stream call's journaled name, or None for any other name."""
    if label.startswith(STREAM_CLOSE_PREFIX):
        return label[len(STREAM_CLOSE_PREFIX) :], True
    if label.startswith(STREAM_PREFIX):
        return label[len(STREAM_PREFIX) :], False
    return None


# Step names of the calls durable.llm.wrap() journals, one per wrapped client method.
LLM_OPENAI_CHAT = "openai.chat.completions.create"
LLM_OPENAI_RESPONSES = "openai.responses.create"
LLM_ANTHROPIC_MESSAGES = "anthropic.messages.create"

PYDANTIC_AI_PREFIX = "pydantic_ai."


def pydantic_ai_step(operation: str) -> str:
    """The step name of a Pydantic AI operation run durably (model request, tool call)."""
    return f"{PYDANTIC_AI_PREFIX}{operation}"


OPENAI_AGENTS_PREFIX = "openai_agents."


def openai_agents_step(operation: str) -> str:
    """The step name of an OpenAI Agents SDK operation run durably: `model` (a model's
    response) or `tool.<name>` (a function tool's call)."""
    return f"{OPENAI_AGENTS_PREFIX}{operation}"


# -- gate names (approvals.name) ------------------------------------------------------------------

BUDGET_GATE_PREFIX = "budget@"
_CAP = ":cap"


def budget_gate(seq: int) -> str:
    """The gate a new step at position `seq` waits at when the budget is used up. Keyed by
    position, not journaled as a call, so a replay after the decision reaches the same
    step at the same gate."""
    return f"{BUDGET_GATE_PREFIX}{seq}"


def budget_cap_gate(seq: int, nth: int) -> str:
    """The gate of the `nth` refusal, by the cap, of the step at position `seq` (a second
    refusal after a raise asks again). Starts with its position's budget_gate and a
    colon, which the SQL finding a denied gate at a position relies on."""
    return f"{budget_gate(seq)}{_CAP}{nth}"


def parse_budget_gate(name: str) -> tuple[int, int | None] | None:
    """(seq, nth) of a budget gate's name (nth None for budget_gate, the refusal number
    for budget_cap_gate), or None for any other gate."""
    if not name.startswith(BUDGET_GATE_PREFIX):
        return None
    position, cap, nth = name[len(BUDGET_GATE_PREFIX) :].partition(_CAP)
    if not _is_number(position) or (cap and not _is_number(nth)):
        return None
    return int(position), int(nth) if cap else None


def effect_approval(effect_name: str, nth: int) -> str:
    """The gate of the `nth` call of an effect that requires approval, in the workflow's
    order of calls (the same on every replay)."""
    return f"{effect_name}#{nth}"


# -- derived ids ----------------------------------------------------------------------------------

MAX_ID_BYTES = 512
"""The longest id, key or name (UTF-8 bytes) the library takes (`_names.check_name`):
every id it derives is kept within it, or the workflow it names would run but be refused
by id afterwards (get, cancel, send, export)."""

_DIGEST = "~h"
_DIGEST_HEX = 32


def _within_limit(stem: str, tail: str) -> str:
    """`stem + tail`, as it always was when it fits in MAX_ID_BYTES. When it does not, the
    stem is replaced by its longest prefix that leaves room for `~h` and 32 hex digits of
    the stem's SHA-256, and the tail is kept: the same on every run and in every process
    (so a replay derives the same id), distinct for distinct stems, readable by its start,
    and never more than the limit. Only an id that did not fit (and so could not be read
    back) is derived differently from before."""
    whole = stem + tail
    if len(whole.encode("utf-8")) <= MAX_ID_BYTES:
        return whole
    digest = hashlib.sha256(stem.encode("utf-8")).hexdigest()[:_DIGEST_HEX]
    room = MAX_ID_BYTES - len(tail.encode("utf-8")) - len(_DIGEST) - _DIGEST_HEX
    head = stem.encode("utf-8")[: max(room, 0)].decode("utf-8", errors="ignore")
    return f"{head}{_DIGEST}{digest}{tail}"


_CHILD = ":child:"


def child_id(parent_id: str, seq: int) -> str:
    """The id of the child workflow started at a parent's position: deterministic, so a
    replay of the parent finds the child it started instead of starting another. A parent
    whose id leaves no room for the `:child:<seq>` tail has its part shortened and hashed
    (`_within_limit`): a child's id fits the id limit like any other."""
    return _within_limit(parent_id, f"{_CHILD}{seq}")


def parse_child_id(workflow_id: str) -> tuple[str, int] | None:
    """(parent id, position) of a derived child id, or None for an id not of that form
    (an id the user gave). Nested children have the innermost position last. For a parent
    id too long to be kept whole (see child_id), the parent part is its shortened, hashed
    form: the parent itself is in the child's row (`parent_id`)."""
    parent, sep, seq = workflow_id.rpartition(_CHILD)
    if not sep or not parent or not _is_number(seq):
        return None
    return parent, int(seq)


def effect_key(workflow_id: str, seq: int, user_part: str | None = None) -> str:
    """An effect's idempotency key: derived from the work, never random, so it is the same
    on every replay and in every process (the effects table, and the systems the effect
    calls, dedupe by it). With a user key, that key replaces the position. It may pass the
    id limit (up to twice it, with a user key): no call takes an effect key back, the
    effects table's key holds it, and it is never shortened, since a pending effect must
    be found under the key it was sent with, or its vendor would be called again."""
    return f"{workflow_id}:{seq}" if user_part is None else f"{workflow_id}:{user_part}"


SCHEDULE_PREFIX = "schedule:"


def schedule_tick_id(schedule_name: str, tick: dt.datetime) -> str:
    """The id of the workflow a schedule starts for one tick: the primary key makes a tick
    start once, whichever process fires it first."""
    tail = f":{tick.astimezone(dt.UTC).isoformat()}"
    return _within_limit(f"{SCHEDULE_PREFIX}{schedule_name}", tail)


def schedule_trigger_id(schedule_name: str, unique: str) -> str:
    """The id of a run of a schedule triggered by hand (`trigger_schedule`): never a tick's
    id, so a triggered run never takes the place of the tick it falls on."""
    return _within_limit(f"{SCHEDULE_PREFIX}{schedule_name}", f":trigger:{unique}")


def retry_id(workflow_id: str) -> str:
    """The id of a bulk retry's run of a workflow (a fork from the start): derived, so that
    a second retry of the same run finds it and starts nothing."""
    return _within_limit(workflow_id, ":retry")


TRIGGER_PREFIX = "trigger:"


def trigger_message_id(trigger_name: str, key: str) -> str:
    """The id of the workflow a trigger starts for one message (`durable.triggers`): its
    key (the message's id, or the key the trigger names) under the trigger's name, so a
    redelivered message finds the workflow its first delivery recorded and starts none."""
    return _within_limit(f"{TRIGGER_PREFIX}{trigger_name}:{key}", "")


DEBOUNCE_PREFIX = "debounce:"
# The journaled name of a debounce made from workflow code (a step).
DEBOUNCE_STEP = "durable.debounce"


def debounce_key(workflow_name: str, key: str) -> str:
    """Where a Debouncer holds a key in its queue's dedup table: per workflow, so that
    debouncers of two workflows never share a key."""
    return f"{DEBOUNCE_PREFIX}{workflow_name}:{key}"


def _is_number(text: str) -> bool:
    """A position as written by these labels: decimal digits of a non-negative int."""
    return text.isascii() and text.isdigit()
