"""`durable worker --metrics-port`: a port the worker cannot listen on is a usage error
that names it, and the port actually bound (`--metrics-port 0` lets the system choose) is
logged, since nothing else says where the metrics are."""

from __future__ import annotations

import logging

import click
import pytest

pytest.importorskip("prometheus_client", reason="pip install 'durable-pg[metrics]'")

from durable.cli._worker import _metrics_server


def test_a_process_past_the_last_port_is_a_usage_error() -> None:
    # --processes 2 --metrics-port 65535: process 1 would listen on 65536.
    with pytest.raises(click.UsageError, match="65536"):
        _metrics_server("127.0.0.1", 65535, "1")


def test_the_port_chosen_for_port_0_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="durable.worker"):
        served = _metrics_server("127.0.0.1", 0, None)
    assert served is not None
    try:
        port = served[1].server_address[1]
        assert any(f":{port}/metrics" in r.getMessage() for r in caplog.records)
    finally:
        served[1].shutdown()
        served[1].server_close()
