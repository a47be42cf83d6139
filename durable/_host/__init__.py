"""The host: claims, the runner, event-loop hosts, the worker loop and the Engine."""
