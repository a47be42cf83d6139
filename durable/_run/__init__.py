"""A run: the drivers that perform the core's operations, the host of a workflow's life,
and the API workflow code calls."""
