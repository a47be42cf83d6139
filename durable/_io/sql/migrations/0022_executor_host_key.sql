-- Where an executor's pid means its process, and which process it is: the host key
-- (hostname, boot id and pid namespace, see durable/_host.py) and the process's start in
-- clock ticks since boot (NULL where unknown). An engine of the same host key takes the
-- claims of an executor whose process is gone (no such pid, or the pid now names a process
-- that started at another tick) at once, instead of after its lease. No clock is compared:
-- neither the database's nor a skewed or fake one. '': not known (rows from before, or a
-- host where it cannot be read): such rows are only ever waited out.
-- In a DO block: Citus takes no two commands in one query string.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {schema}.executors ADD COLUMN host_key text NOT NULL DEFAULT ''''';
    EXECUTE 'ALTER TABLE {schema}.executors ADD COLUMN pid_start bigint';
END
$$;
