"""What a missing optional extra says: the exact `pip install` line, as a typed error (an
ImportError too), never a bare ModuleNotFoundError."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

# (the extra, a module of it to hide, what imports it)
CASES = [
    ("pydantic-ai", "pydantic_ai", "import durable.integrations.pydantic_ai"),
    ("openai-agents", "agents", "import durable.integrations.openai_agents"),
    ("ui", "starlette", "import durable.ui"),
    ("otel", "opentelemetry", "import durable; durable.instrument_psycopg()"),
]


def _without(module: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter where `module` cannot be imported."""
    hide = f"import sys; sys.modules[{module!r}] = None\n"
    return subprocess.run(
        [sys.executable, "-c", hide + code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.parametrize(("extra", "module", "code"), CASES, ids=[c[0] for c in CASES])
def test_a_missing_extra_names_its_pip_install_line(extra: str, module: str, code: str) -> None:
    done = _without(module, code)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("durable.errors.MissingExtraError"), done.stderr
    assert f"pip install 'durable-pg[{extra}]'" in last


def test_a_missing_extra_is_an_import_error() -> None:
    code = (
        "try:\n    import durable.integrations.pydantic_ai\n"
        "except ImportError as exc:\n    print(type(exc).__name__, exc.extra, exc.name)\n"
    )
    done = _without("pydantic_ai", code)
    assert done.stdout.split() == ["MissingExtraError", "pydantic-ai", "pydantic_ai"], done.stderr


def test_the_pydantic_ai_example_says_how_to_install_what_it_needs() -> None:
    code = (
        "import runpy, sys\nsys.argv = ['example']\n"
        "runpy.run_module('examples.agent_pydantic_ai', run_name='__main__')\n"
    )
    done = _without("pydantic_ai", code)
    assert done.returncode == 1
    assert "pip install 'durable-pg[pydantic-ai]'" in done.stderr
    assert "Traceback" not in done.stderr
