-- durable schema, version 6: cron schedules.
--
-- Each tick of a schedule starts one workflow whose id names the schedule and the tick, so
-- the workflows primary key makes a tick run exactly once however many workers fire it.
-- Workers fire a schedule while holding its row lock, so they agree on which ticks ran.

CREATE TABLE {schema}.schedules (
    schedule_name     text PRIMARY KEY,
    workflow_name     text NOT NULL,
    workflow_version  text,
    cron              text NOT NULL,
    timezone          text NOT NULL DEFAULT 'UTC',
    -- Missed-tick policy after downtime: run at most this many missed ticks before the
    -- latest one (0: skip them all).
    catch_up          integer NOT NULL DEFAULT 0 CHECK (catch_up >= 0),
    paused            boolean NOT NULL DEFAULT false,
    -- The latest tick fired or skipped; ticks after it are due.
    last_tick         timestamptz,
    created_at        timestamptz NOT NULL DEFAULT {schema}.current_time(),
    updated_at        timestamptz NOT NULL DEFAULT {schema}.current_time()
);
