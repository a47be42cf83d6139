-- Which life of a workflow id a row is: a token drawn when the row is created (journal
-- version 2). A workflow id may be used again once its workflow was pruned; the ids a run
-- derives for what it sends (message ids, `<id>:send:<seq>@<incarnation>`) then differ
-- from the ids its earlier life sent, which a long-lived receiver still holds as consumed
-- messages (it would drop the new ones as duplicates). NULL: a row from before (journal
-- version 1), whose derived ids stay as they were, so a send cut off before its journal
-- row is still the same message when it is sent again.
-- The default is set after the column is added, so existing rows keep NULL.
-- In a DO block: Citus takes no two commands in one query string.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE {schema}.workflows ADD COLUMN incarnation text';
    EXECUTE 'ALTER TABLE {schema}.workflows ALTER COLUMN incarnation '
        'SET DEFAULT left(md5(random()::text || clock_timestamp()::text), 12)';
END
$$;
