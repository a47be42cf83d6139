-- durable.patched(): the marker a run journals where it first reaches a patch point on
-- code that has the patch (a replay that finds it takes the patch's new branch).
ALTER TABLE {schema}.steps DROP CONSTRAINT steps_kind_check;
ALTER TABLE {schema}.steps ADD CONSTRAINT steps_kind_check CHECK (kind IN (
    'step', 'transaction', 'child', 'effect', 'sleep', 'recv', 'send', 'event', 'approval',
    'tool', 'state', 'turn', 'stream', 'patch'));
