-- The console's workflow list: newest first, paged by (created_at, workflow_id) keyset,
-- optionally filtered by name or by an id prefix. Each filter walks an index in the list's
-- order, so a page reads about as many rows as it shows, also among millions of workflows
-- (a filter by status uses workflows_status_created_idx of 0001).
CREATE INDEX workflows_created_idx ON {schema}.workflows (created_at, workflow_id);
CREATE INDEX workflows_name_created_idx ON {schema}.workflows (name, created_at, workflow_id);
-- Byte order ("C"), so that an id prefix is one index range whatever the database's collation.
CREATE INDEX workflows_id_c_idx ON {schema}.workflows ((workflow_id COLLATE "C"));
