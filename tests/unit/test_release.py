"""What a release needs besides code: one version number, read by the build from
durable/_base/version.py, and an entry for it in CHANGELOG.md (docs/versioning.md,
"Releases of durable-pg")."""

from __future__ import annotations

import re
import tomllib

from durable._base.version import __version__
from tests.conftest import ROOT


def test_the_build_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "durable/_base/version.py"
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_the_changelog_has_unreleased_and_the_current_version() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text("utf-8"), re.M)
    assert headings[0] == "Unreleased"
    assert __version__ in headings


def test_the_dev_extra_can_build_and_check_the_distributions() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    dev = {
        re.split(r"[<>=\[ ]", spec, maxsplit=1)[0]
        for spec in project["project"]["optional-dependencies"]["dev"]
    }
    assert {"build", "twine"} <= dev
