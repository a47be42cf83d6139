-- A time budget: wall-clock seconds a workflow tree may run, counted from the budget's
-- creation (its root's first start), across crashes, restarts and waits.
ALTER TABLE {schema}.budgets ADD COLUMN limit_seconds numeric CHECK (limit_seconds >= 0);
