-- The audit log: each operator action (cancel, resume, move, fork, import, a decision, a
-- budget raised, a schedule paused, resumed or deleted), written in the action's own
-- transaction (durable/_audit.py). Keyed by the workflow the action was on ('' for a
-- schedule's), each row by a uuid the client makes: no sequence. Not one of a workflow's
-- tables: an export does not carry it and retention does not prune it.
CREATE TABLE {schema}.audit_log (
    workflow_id text NOT NULL,
    audit_id uuid NOT NULL,
    at timestamptz NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    subject text,
    detail text,
    PRIMARY KEY (workflow_id, audit_id)
);
CREATE INDEX audit_log_workflow_at_idx ON {schema}.audit_log (workflow_id, at);
CREATE INDEX audit_log_at_idx ON {schema}.audit_log (at);
