-- Created in the application's database when it is not the system database: the journal of
-- @transaction steps lives next to the app's rows so both commit in one transaction.
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.transaction_outputs (
    workflow_id  text NOT NULL,
    step_seq     integer NOT NULL,
    step_name    text NOT NULL,
    output       text,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (workflow_id, step_seq)
);
-- The outbox (`durable outbox install`, Engine.install_outbox): starts, enqueues and
-- messages written in the application's transaction when its database is not the system
-- database. A worker drains them into the system database: each row's id names its
-- workflow (or message), so a drain run again after a crash starts nothing twice.
CREATE TABLE IF NOT EXISTS {schema}.outbox (
    outbox_id   text PRIMARY KEY,
    -- The named statement the drain runs in the system database.
    statement   text NOT NULL CHECK (statement IN ('insert_workflow_pending',
                                                   'enqueue_workflow', 'send_message')),
    params      text NOT NULL,  -- its parameters, as JSON
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
