-- A @transaction step's journal row goes to the server with the application's COMMIT, in
-- one round trip (a pipeline). There the fenced insert must fail, not merely insert
-- nothing, when the run no longer owns its workflow: a statement that wrote no row would
-- let the COMMIT queued behind it keep the writes of a run that lost its claim (a zombie).
-- The record statement calls this only when it inserted nothing. SQLSTATE UD001 (a class
-- free for implementations) is how the driver tells it from the application's errors.
CREATE FUNCTION {schema}.fence_lost(workflow_id text, epoch bigint) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'run % of workflow % no longer owns it: its transaction rolls back',
        epoch, workflow_id
        USING ERRCODE = 'UD001',
              HINT = 'another worker claimed the workflow after this run''s lease expired';
END
$$;
