-- The same clock, written so that Citus can evaluate it: the fake time when
-- `durable.fake_now` is set, else the statement's time. Citus refuses a statement on a
-- distributed table that calls a function which is not IMMUTABLE inside a COALESCE or a CASE
-- ("non-IMMUTABLE functions are not allowed in CASE or COALESCE statements"), and the body
-- of 0001's current_time() is a COALESCE that PostgreSQL inlines into every statement
-- calling it. LEAST and GREATEST ignore NULLs: with f the fake time (NULL when unset) and t
-- the statement's, least(f, greatest(f, t)) is f when f is set and t when it is not. Still
-- one STABLE expression that PostgreSQL inlines: no function call per use.
CREATE OR REPLACE FUNCTION {schema}.current_time() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT least(nullif(current_setting('durable.fake_now', true), '')::timestamptz,
                 greatest(nullif(current_setting('durable.fake_now', true), '')::timestamptz,
                          statement_timestamp()))
$$;

-- `t` plus `seconds` seconds, as an IMMUTABLE expression: Citus refuses, in an UPDATE of a
-- distributed table, a function that is not IMMUTABLE given a column (timestamptz +
-- interval is STABLE, as a day can have 23 hours in some time zone) and one inside a
-- COALESCE or a CASE. Seconds are the same in every zone, so the sum is computed in UTC,
-- where it is IMMUTABLE. Inlined by PostgreSQL like current_time().
CREATE FUNCTION {schema}.plus_seconds(t timestamptz, seconds float8) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT ((t AT TIME ZONE 'UTC') + make_interval(secs => seconds)) AT TIME ZONE 'UTC'
$$;
