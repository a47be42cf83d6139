"""What must hold after every schedule, judged from the world (the vendor's record of
every call) and from the stored journal, never from logs.

Each check returns the violations it found as sentences; an empty list is a pass. The
names are the ones docs/guarantees.md links to.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row

from durable._base.models import WorkflowStatus
from tests.sim.world import Vendor

TERMINAL = frozenset(s.value for s in WorkflowStatus if s.is_terminal)
COMPENSATING = {"COMPENSATED", "ERROR", "CANCELLED"}
MAX_MODEL_CALL = Decimal("0.5")


def _wid(key: str) -> str:
    return key.rsplit(":", 1)[0]


class Facts:
    """The stored rows the checks read, in one snapshot."""

    def __init__(self, url: str, app_url: str | None = None) -> None:
        with psycopg.connect(url, row_factory=dict_row, application_name="sim_admin") as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            self.workflows = {
                r["workflow_id"]: r for r in conn.execute("SELECT * FROM durable.workflows")
            }
            self.steps = list(conn.execute("SELECT * FROM durable.steps ORDER BY 1, 2"))
            self.effects = list(conn.execute("SELECT * FROM durable.effects"))
            self.budgets = {
                r["budget_id"]: r for r in conn.execute("SELECT * FROM durable.budgets")
            }
            self.messages = list(conn.execute("SELECT * FROM durable.messages"))
            self.approvals = list(conn.execute("SELECT * FROM durable.approvals"))
        with psycopg.connect(
            app_url or url, row_factory=dict_row, application_name="sim_admin"
        ) as conn:
            self.app_rows = list(conn.execute("SELECT workflow_id, tag FROM sim_app"))
            # A separate application database keeps a @transaction step's record beside its
            # rows (durable.transaction_outputs, committed with them); the system journal
            # adopts it when the run replays that step, which a run cancelled first never
            # does.
            self.app_records = (
                list(conn.execute("SELECT * FROM durable.transaction_outputs"))
                if app_url is not None and app_url != url
                else []
            )


def effects_once(vendor: Vendor, facts: Facts) -> list[str]:
    """Each payment key is charged at most once, and each applied payment of the ledger
    reached the vendor; no refund without its payment."""
    out = [f"payment key {k} charged {n} times" for k, n in vendor.payments.items() if n > 1]
    for e in facts.effects:
        if e["effect_name"] in ("pay", "apay"):
            if e["status"] == "applied" and not vendor.payments[e["idempotency_key"]]:
                out.append(f"effect {e['idempotency_key']} applied in the ledger, never paid")
    return out


def undone_once(vendor: Vendor, facts: Facts) -> list[str]:
    """Per instruction (tag), never more refunds than payments, across a workflow, its
    resumes and its forks; each refund key refunds once."""
    out = [f"refund key {k} refunded {n} times" for k, n in vendor.refunds.items() if n > 1]
    paid, refunded = Counter[str](), Counter[str]()
    for key, tag in vendor.paid_tags.items():
        if vendor.payments[key]:
            paid[tag] += 1
    for key, tag in vendor.refund_tags.items():
        if vendor.refunds[key]:
            refunded[tag] += 1
    for tag, n in refunded.items():
        if n > paid[tag]:
            out.append(f"{tag}: refunded {n} times, paid {paid[tag]} times")
    return out


def compensated_net_zero(vendor: Vendor, facts: Facts) -> list[str]:
    """An instruction's payments are all refunded when every workflow that holds one of
    them in its journal ended compensated (failed or cancelled after paying): the payer,
    and the forks that copied it. A fork and its original share a copied payment and undo
    it once between them (whichever compensates first), so the net is judged per
    instruction across them, not per workflow. (A failed refund would end
    COMPENSATION_FAILED; the vendor here never refuses one.)"""
    out = []
    paid: Counter[str] = Counter()
    holders: dict[str, set[str]] = defaultdict(set)
    for key, tag in vendor.paid_tags.items():
        if vendor.payments[key]:
            paid[tag] += 1
            payer = _wid(key)
            holders[tag] |= {w for w in facts.workflows if w == payer or w.startswith(payer + "f")}
    refunded: Counter[str] = Counter()
    for key, tag in vendor.refund_tags.items():
        if vendor.refunds[key]:
            refunded[tag] += 1
    for tag, n in paid.items():
        statuses = {facts.workflows[w]["status"] for w in holders[tag]}
        if statuses and statuses <= COMPENSATING and refunded[tag] != n:
            out.append(
                f"{tag}: paid {n}, refunded {refunded[tag]}, by workflows that all "
                f"ended compensated ({sorted(holders[tag])})"
            )
    return out


def transactions_exactly_once(vendor: Vendor, facts: Facts) -> list[str]:
    """Each journaled @transaction output names one application row, and each application
    row is named by a journaled output (it never committed without its journal row): in
    the system journal, or, with a separate application database, in the record committed
    beside it there (a run cancelled before it replayed the step never adopted it)."""
    out = []
    rows = Counter(f"{r['workflow_id']}/{r['tag']}" for r in facts.app_rows)
    out += [f"application row {k} written {n} times" for k, n in rows.items() if n > 1]
    journaled = {
        s["output"].strip('"')
        for s in [*facts.steps, *facts.app_records]
        if s["step_name"] == "book" and s["output"] is not None
    }
    out += [f"application row {k} has no journal row" for k in rows if k not in journaled]
    out += [
        f"journal names application row {k}, which is missing" for k in journaled if k not in rows
    ]
    return out


def children_adopted(vendor: Vendor, facts: Facts) -> list[str]:
    """One position starts one child, and a parent that went on past the position where
    it started a child names that child there. (A child created in the window before its
    parent's journal row, whose parent never ran that far again, cancelled say, is not
    adopted; it ended with its parent's cancel, which nothing_stranded checks.)"""
    out = []
    named: dict[str, list[str]] = defaultdict(list)
    reached: dict[str, int] = {}
    for s in facts.steps:
        reached[s["workflow_id"]] = max(reached.get(s["workflow_id"], -1), s["step_seq"])
        if s["child_workflow_id"]:
            named[s["child_workflow_id"]].append(f"{s['workflow_id']}@{s['step_seq']}")
    per_position: Counter[tuple[str, int]] = Counter()
    for wid, w in facts.workflows.items():
        parent = w["parent_id"]
        if parent is None:
            continue
        per_position[(parent, w["parent_step_seq"])] += 1
        went_on = reached.get(parent, -1) >= w["parent_step_seq"]
        if went_on and not any(p.startswith(parent + "@") for p in named[wid]):
            out.append(f"child {wid} ({w['status']}) is not in the journal of its parent {parent}")
    out += [f"{p}@{s} started {n} children" for (p, s), n in per_position.items() if n > 1]
    return out


def spending_capped(vendor: Vendor, facts: Facts, faults_fired: int) -> list[str]:
    """The ledger never passes its limits (dollars, steps) by more than
    docs/discussions.md allows (children running concurrently: one step each), and the
    vendor was paid no more than the ledger plus the attempts a crash cut off before their
    record (each re-run once)."""
    out = []
    members: dict[str, list[str]] = defaultdict(list)
    for wid, w in facts.workflows.items():
        if w["budget_id"]:
            members[w["budget_id"]].append(wid)
    spent_at_vendor: Counter[str] = Counter()
    for wid, dollars in vendor.models:
        spent_at_vendor[wid] += dollars  # type: ignore[assignment]
    for budget_id, b in facts.budgets.items():
        tree = members.get(budget_id, [])
        # The steps limit is exact within a run (gathered steps count each other); children
        # running at once may each pass the gate before the others' records land, and an
        # operator who approves a budget gate lets one more step through.
        steps = b.get("limit_steps")
        overrides = sum(
            1
            for a in facts.approvals
            if a["workflow_id"] in tree
            and a["name"].startswith("budget@")
            and str(a["status"]).lower() == "approved"
        )
        steps_slack = max(0, len(tree) - 1) + overrides
        if steps is not None and b["spent_steps"] > steps + steps_slack:
            out.append(
                f"budget {budget_id}: {b['spent_steps']} steps > limit {steps} + {steps_slack}"
            )
        limit = b["limit_dollars"]
        if limit is None:
            continue
        slack = MAX_MODEL_CALL * max(0, len(tree) - 1)
        if b["spent_dollars"] > limit + slack:
            out.append(f"budget {budget_id}: spent {b['spent_dollars']} > limit {limit} + {slack}")
        at_vendor = sum((spent_at_vendor[w] for w in tree), Decimal(0))
        allowed = Decimal(str(b["spent_dollars"])) + MAX_MODEL_CALL * (faults_fired + len(tree))
        if at_vendor > max(allowed, Decimal(str(limit)) + slack + MAX_MODEL_CALL * faults_fired):
            out.append(
                f"budget {budget_id}: vendor paid {at_vendor}, ledger {b['spent_dollars']}, "
                f"limit {limit}"
            )
    return out


def nothing_stranded(vendor: Vendor, facts: Facts) -> list[str]:
    """After the drain, every workflow has ended; one that has not is claimable, or waits
    on a condition its row names (a wake-up time, a gate, a message)."""
    out = []
    waiting_gates = {a["workflow_id"] for a in facts.approvals if a["status"] == "PENDING"}
    for wid, w in facts.workflows.items():
        if w["status"] in TERMINAL:
            continue
        why = (w["wake_at"] is not None) or wid in waiting_gates
        out.append(
            f"{wid} left {w['status']} (owner {w['owner']}, lease "
            f"{w['lease_expires_at']}, wake_at {w['wake_at']}, gate {why})"
        )
    return out


def messages_once(vendor: Vendor, facts: Facts) -> list[str]:
    """A send from workflow code delivers one message, however often its run is replayed or
    recovered; a message is consumed at most once, by a journaled receive of its workflow."""
    out = []
    sends = Counter(
        (m["sender_id"], m["sender_seq"]) for m in facts.messages if m["sender_id"] is not None
    )
    out += [f"the send at {w}@{s} delivered {n} messages" for (w, s), n in sends.items() if n > 1]
    seqs = {(s["workflow_id"], s["step_seq"]) for s in facts.steps}
    for m in facts.messages:
        if m["consumed_at"] is not None and (m["workflow_id"], m["consumed_seq"]) not in seqs:
            out.append(
                f"message {m['message_id']} consumed at {m['workflow_id']}@"
                f"{m['consumed_seq']}, which the journal lacks"
            )
    return out


def once_unless_cut(vendor: Vendor, facts: Facts, cut: set[str]) -> list[str]:
    """A plain step, a model call or an llm request of one workflow runs again only when
    the process that ran it first was cut off (killed, or its lease lost while it was
    paused) before its record: never twice from processes that lived on."""
    runs: Counter[tuple[str, str]] = Counter()
    for kind, tag, proc in vendor.calls:
        if proc not in cut:
            runs[(kind, tag)] += 1
    return [
        f"{kind} {tag} ran {n} times by processes that were not cut off"
        for (kind, tag), n in runs.items()
        if n > 1
    ]


def handed_over_at_a_boundary(
    vendor: Vendor, stopped: list[tuple[str, int]], width: int
) -> list[str]:
    """A worker told to stop hands each run over at its next step boundary: after the
    stop, a run of it finishes the step under way (or the `width` steps gathered at once)
    and starts no other; another process does the rest. An undo under way is the
    exception, by design (`_core.run.check_interrupt`: compensations are not cut
    short): a run that failed or was cancelled as the stop came may still refund."""
    out = []
    for proc, mark in stopped:
        after = Counter(
            wid for kind, wid, p in vendor.events[mark:] if p == proc and kind != "refund"
        )
        out += [
            f"{wid}: {n} calls by {proc} after it was told to stop"
            for wid, n in after.items()
            if n > width
        ]
    return out


def patch_one_branch(vendor: Vendor, facts: Facts) -> list[str]:
    """At a patch point a run takes one branch: never the new one after the old code
    started its call there (a payment, a child under its own id, a transaction)."""
    out = []
    old_done: set[tuple[str, str]] = set()
    for key, tag in vendor.paid_tags.items():
        wid = _wid(key)
        if tag.endswith(".old"):
            old_done.add((wid, tag[: -len(".old")]))
        elif tag.endswith(".old.0"):  # the pay of a child "<parent>-<tag>.old"
            base = tag[: -len(".old.0")]
            old_done.add((wid.removesuffix(f"-{base}.old"), base))
    for row in facts.app_rows:
        if row["tag"].endswith(".old"):
            old_done.add((row["workflow_id"], row["tag"][: -len(".old")]))
    for key, tag in vendor.paid_tags.items():
        if tag.endswith(".new") and (_wid(key), tag[: -len(".new")]) in old_done:
            out.append(f"{_wid(key)} took both branches of the patch at {tag[:-4]}")
    return out


EXPECTED_ERRORS = (
    "tests.sim.app.Boom",
    "durable.errors.WorkflowFailedError",  # a child's failure, raised in its parent
    "durable.errors.WorkflowCancelledError",
    "durable.errors.ApprovalDeniedError",
)


def expected_outcomes(vendor: Vendor, facts: Facts) -> list[str]:
    """The programs are deterministic and well-formed: a run that ends in error ends with
    its own failure (or a child's, a cancel, a denial: of an approval, or of its budget
    gate), never with an error durable raised about itself (a NondeterminismError, a lost
    record, a refused key)."""
    out = []
    denied = {a["workflow_id"] for a in facts.approvals if a["status"] == "denied"}
    for wid, w in facts.workflows.items():
        if w["error"] is None:
            continue
        kind = json.loads(w["error"]).get("type", "")
        # Its budget used up and the gate that asked for more denied (a "deny" decides
        # every gate a run waits at, the budget's too).
        gate_denied = kind == "durable.errors.BudgetExceededError" and wid in denied
        if not kind.startswith(EXPECTED_ERRORS) and not gate_denied:
            message = json.loads(w["error"]).get("message", "")[:200]
            out.append(f"{wid} ended {w['status']} with {kind}: {message}")
    return out


def check(sim: Any, facts: Facts) -> list[str]:
    vendor = sim.vendor
    out: list[str] = []
    for fn in (
        effects_once,
        undone_once,
        compensated_net_zero,
        transactions_exactly_once,
        children_adopted,
        nothing_stranded,
        messages_once,
        patch_one_branch,
        expected_outcomes,
    ):
        out += [f"{fn.__name__}: {v}" for v in fn(vendor, facts)]
    out += [f"spending_capped: {v}" for v in spending_capped(vendor, facts, sim.faults_fired)]
    out += [f"once_unless_cut: {v}" for v in once_unless_cut(vendor, facts, sim.cut)]
    width = 3 if '"par"' in json.dumps(sim.scenario["workflows"]) else 1
    out += [
        f"handed_over_at_a_boundary: {v}"
        for v in handed_over_at_a_boundary(vendor, sim.stopped, width)
    ]
    return out
