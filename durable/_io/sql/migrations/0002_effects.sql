-- durable schema, version 2: the effect ledger.
--
-- One row per call of an @effect: a step that changes the outside world. The row is
-- written ahead of the call (write-ahead): 'intent' is committed before anything happens,
-- 'pending' right before the call, and 'applied' with the result in the same transaction
-- as the step's journal row. A row found 'pending' after a crash means "an attempt was
-- made and its outcome is unknown": it is reconciled by asking the outside world about
-- its idempotency key, never guessed. The ledger is an audit trail and outlives journals.

CREATE TABLE {schema}.effects (
    workflow_id          text NOT NULL REFERENCES {schema}.workflows (workflow_id),
    step_seq             integer NOT NULL CHECK (step_seq >= 0),
    effect_name          text NOT NULL,
    -- Derived from the work, never random: <workflow_id>:<step_seq>, or
    -- <workflow_id>:<user part> when the effect declares a key function.
    idempotency_key      text NOT NULL,
    status               text NOT NULL CHECK (status IN (
        'intent',    -- decided and recorded; the call has not started
        'pending',   -- the call started; its outcome is unknown until recorded
        'applied',   -- the call succeeded; result holds what it returned
        'failed'     -- the call failed for good; error holds why
    )),
    -- sha256 of the serialized parameters: the same key with other parameters is refused.
    params_fingerprint   text NOT NULL,
    result               text,
    error                text,
    attempts             integer NOT NULL DEFAULT 0,
    reconciled           boolean NOT NULL DEFAULT false,
    created_at           timestamptz NOT NULL DEFAULT {schema}.current_time(),
    updated_at           timestamptz NOT NULL DEFAULT {schema}.current_time(),
    PRIMARY KEY (workflow_id, step_seq),
    UNIQUE (workflow_id, idempotency_key)
);
