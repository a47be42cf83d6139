-- The version of the journal format a workflow is written in: the names the library stores
-- (durable/_labels.py, LABELS_VERSION) and what a journal row means, as one number
-- (_labels.JOURNAL_VERSION), set when the workflow is created. A journal outlives the code
-- that wrote it and travels (a rollback, an export imported elsewhere): code that knows
-- an older version does not claim a workflow of a newer one, and refuses to start, resume,
-- fork or import it (JournalVersionError), leaving its rows as they are. Workflows created
-- before this column were written in version 1.
-- One statement with no CHECK: Citus refuses an ADD COLUMN with a constraint on a
-- distributed table, and sends a migration's text to its workers as one command.
ALTER TABLE {schema}.workflows ADD COLUMN journal_version integer NOT NULL DEFAULT 1;
