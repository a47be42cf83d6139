-- A workflow's own limit on the crashes of its worker it survives
-- (`@durable.workflow(max_recovery_attempts=N)`), stored when it is created so that every
-- claim, by any worker, honours the limit its start was given. NULL: the claiming
-- engine's `max_recovery_attempts`.
ALTER TABLE {schema}.workflows ADD COLUMN max_recovery_attempts integer;
