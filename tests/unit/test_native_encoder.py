"""The native record path's encoder (benchmarks/native, an experiment) against durable's:
for a value that reads back exactly it writes the same bytes as JSONSerializer.dumps, and
for any other value it gives None (durable's own path then encodes it, or says what is
wrong). The test builds it first (benchmarks/native/build.sh); skipped when it cannot."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable.serialization import JSONSerializer, _exact_json


def _built() -> Any:
    """The extension, built in place first when a C compiler and libpq's headers are
    there (a second or two); skipped, saying how, when they are not."""
    here = Path(__file__).resolve().parents[2] / "benchmarks" / "native"
    env = {**os.environ, "PYTHON": sys.executable}
    built = subprocess.run(["sh", str(here / "build.sh")], env=env, capture_output=True)
    if built.returncode != 0:
        pytest.skip(
            "benchmarks/native/build.sh failed (needs a C compiler, the Python headers and "
            f"libpq's headers): {built.stderr.decode(errors='replace')[-300:]}",
            allow_module_level=True,
        )
    return importlib.import_module("benchmarks.native._durable_record")


native = _built()

_dumps = JSONSerializer().dumps

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)

SAMPLES: list[Any] = [
    {"i": 1, "ok": True, "pad": "x" * 64},
    [1, 2.5, None, False, True, -0.0, 1e16, 5e-324, 1.7976931348623157e308],
    'é\u2028😀\x00\x1f\x7f"\\\n\r\t\b\f/',
    {"__durable": 1, "x__durable__": "__durable__", "": [{}, []]},
    10**30,
    -(2**63),
    2**63,
    "\udc80",  # a lone surrogate: escaped, as json does
]

NOT_EXACT: list[Any] = [
    (1, 2),
    {1: "a"},
    {"__durable__": 1},
    {"__durable__x": 1},
    [float("nan")],
    {"a": float("inf")},
    type("Sub", (str,), {})("sub"),  # a str subclass
    [b"bytes"],
    {"a": {1, 2}},
    10**5000,  # past int's digit limit for text
]


@pytest.mark.parametrize("value", SAMPLES, ids=range(len(SAMPLES)))
def test_exact_values_encode_to_durables_bytes(value: Any) -> None:
    assert native.encode(value) == _dumps(value)


@pytest.mark.parametrize("value", NOT_EXACT, ids=range(len(NOT_EXACT)))
def test_other_values_are_left_to_durable(value: Any) -> None:
    assert native.encode(value) is None


def test_a_limit_or_a_depth_past_the_walks_leaves_it_to_durable() -> None:
    assert native.encode("x" * 100, 102) == _dumps("x" * 100)
    assert native.encode("x" * 100, 101) is None
    deep: Any = []
    for _ in range(600):
        deep = [deep]
    assert native.encode(deep) is None
    loop: list[Any] = []
    loop.append(loop)
    assert native.encode(loop) is None


@settings(max_examples=100, deadline=None)
@given(_values)
def test_generated_values_agree_with_durable(value: Any) -> None:
    text = native.encode(value)
    if _exact_json(value):
        assert text == _dumps(value)
    else:
        assert text is None
