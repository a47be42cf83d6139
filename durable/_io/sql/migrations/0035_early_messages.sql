-- early_messages: messages sent to a workflow id that no workflow has yet
--   (send(..., before_start=True)), kept for the run that starts under that id. Not a
--   workflow's rows (there is none to refer to yet), hence no foreign key; sharded by
--   workflow id like `messages`, so a send and the move below stay on one shard.
--   The run moves them into `messages` at its first receive, created_at kept (they come
--   first, in the order they were sent); a sender that finds the workflow created
--   meanwhile moves them itself (adopt_early_messages: whichever looks last sees the
--   other's commit). Retention deletes those older than
--   RetentionPolicy.early_messages_after (7 days by default) that no run took.
-- In a DO block: Citus takes no two commands in one query string.
DO $$
BEGIN
    EXECUTE 'CREATE TABLE {schema}.early_messages ('
        '    workflow_id  text NOT NULL,'
        '    message_id   text NOT NULL,'
        '    topic        text NOT NULL DEFAULT '''','
        '    payload      text NOT NULL,'
        '    created_at   timestamptz NOT NULL DEFAULT {schema}.current_time(),'
        '    PRIMARY KEY (workflow_id, message_id))';
    EXECUTE 'CREATE INDEX early_messages_created_idx ON {schema}.early_messages (created_at)';
END
$$;
