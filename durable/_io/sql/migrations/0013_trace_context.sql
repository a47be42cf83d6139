-- The trace a workflow belongs to (W3C trace context, as a JSON object of its headers), set
-- when it is started or enqueued, so that every run of it (a recovery on another worker
-- included) and its children join the same trace. NULL when no tracing was on.
ALTER TABLE {schema}.workflows ADD COLUMN trace_context text;
