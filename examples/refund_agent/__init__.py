"""The refund example from the chapter, with real processes: a payments vendor over HTTP,
a durable worker SIGKILLed at the worst moment, and a fresh worker that finishes the job."""
