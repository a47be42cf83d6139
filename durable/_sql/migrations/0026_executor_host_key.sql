-- Where an executor's pid means its process: hostname, boot id and pid namespace (see
-- durable/_host.py). An engine starting on the same host takes the claims of an executor
-- whose process is gone at once, instead of after its lease. '': not known (rows from
-- before, or a host where it cannot be read): such rows are only ever waited out.
ALTER TABLE {schema}.executors ADD COLUMN host_key text NOT NULL DEFAULT '';
