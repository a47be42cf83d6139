"""Integrations of durable with agent frameworks (each an optional extra)."""
