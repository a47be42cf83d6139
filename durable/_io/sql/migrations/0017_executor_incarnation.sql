-- Each process that runs under an executor id is one incarnation of it. Two processes can
-- hold one id at once: one paused (or cut off) past its lease, so that its heartbeat is
-- stale and another process may take its id, then resumed. The executor row names the
-- incarnation that holds the id now (a token each process draws when it starts, written
-- when it registers); a process renews leases, beats, claims, releases and deletes the row
-- only while the row names its own incarnation, in the same statement, so a resumed twin
-- touches nothing of the new holder's. '': a row registered before incarnations existed.
ALTER TABLE {schema}.executors ADD COLUMN incarnation text NOT NULL DEFAULT '';
