-- Which workflow sent a message, and from which position of its journal (NULL: sent from
-- outside any workflow). durable.patched() asks it: a send cut off after delivering and
-- before its journal row left this row as its only mark, and a patch at that position must
-- then take its old branch (the send replays as the old code's, it is not made again under
-- the next position). The message id cannot answer that: a caller's idempotency key names
-- nothing of the sender. Read only by a run recovering at a patch point.
-- In a DO block: Citus takes no two commands in one query string.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {schema}.messages ADD COLUMN sender_id text';
    EXECUTE 'ALTER TABLE {schema}.messages ADD COLUMN sender_seq integer';
    EXECUTE 'CREATE INDEX messages_sender_idx ON {schema}.messages (sender_id, sender_seq) '
        'WHERE sender_id IS NOT NULL';
END
$$;
