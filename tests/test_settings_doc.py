"""docs/configuration.md is generated from Settings: it must match what the generator writes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from extproc import settings_doc
from extproc.settings import Settings


def test_the_configuration_page_is_current() -> None:
    # stale: run `python -m extproc.settings_doc` and commit docs/configuration.md
    assert settings_doc.PAGE.read_text() == settings_doc.render()


def test_every_setting_is_on_the_page() -> None:
    page = settings_doc.render()
    for f in dataclasses.fields(Settings):
        assert f"`MODELPOOL_{f.name.upper()}`" in page


def test_check_says_stale_and_write_makes_it_current(tmp_path: Path) -> None:
    page = tmp_path / "configuration.md"
    page.write_text("# an old page\n")
    assert settings_doc.main(["--check", "--output", str(page)]) == 1
    assert settings_doc.main(["--output", str(page)]) == 0
    assert settings_doc.main(["--check", "--output", str(page)]) == 0
    assert page.read_text() == settings_doc.render()
