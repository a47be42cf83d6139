"""The client: reading and changing stored workflows, starts, queues, schedules."""
