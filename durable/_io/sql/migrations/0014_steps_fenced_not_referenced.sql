-- A journal row's workflow is proven by the statement that writes it: every insert into
-- steps selects the workflow's row, fenced by epoch and status, FOR SHARE. The foreign key
-- checked the same row again, and taking a second lock on the row a step already holds
-- FOR SHARE cost more than the rest of the step's server time (in one measurement, a
-- step's INSERT went from 0.85x a bare INSERT to 1.36x with the key). Retention deletes a
-- workflow's journal rows itself (prune_finished), as the cascade did.
ALTER TABLE {schema}.steps DROP CONSTRAINT steps_workflow_id_fkey;
