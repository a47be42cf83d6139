-- callbacks: the single-use URLs a wait hands out (durable.callback_url), each completing
--   one wait of one workflow when a third party POSTs to it: a message on a topic
--   (kind 'message': recv, a wait_first branch on the topic) or a decision on a gate
--   (kind 'approval'). Keyed by the sha256 of the URL's token, in hex: the token itself is
--   never stored (the journal holds what derives it again with the workers' secret, not
--   the token). used_at and outcome are set by the POST that completed the wait, in the
--   transaction that delivered it; a later POST answers with that outcome. No foreign key
--   to workflows: on Citus the table is sharded by token_hash in a group of its own
--   (_citus.BY_OWN_KEY), as the lookup by token names no workflow.
CREATE TABLE {schema}.callbacks (
    token_hash   text NOT NULL PRIMARY KEY,
    workflow_id  text NOT NULL,
    kind         text NOT NULL CHECK (kind IN (
        'message',   -- the body is sent as a message on `target` (a topic; '' the default)
        'approval'   -- the body decides the gate named `target`
    )),
    target       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT {schema}.current_time(),
    expires_at   timestamptz NOT NULL,
    used_at      timestamptz,
    outcome      text
);
CREATE INDEX callbacks_workflow_idx ON {schema}.callbacks (workflow_id);
