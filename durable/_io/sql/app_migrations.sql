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
