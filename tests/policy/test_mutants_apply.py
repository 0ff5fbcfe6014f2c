"""Every mutant of mutants.py still applies: its text is found exactly once in its file.

``make mutants`` (not part of ``make test``) runs each one; a mutant whose text the policy no
longer holds would be reported as an error there, long after the change that moved the text.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mutants import MUTANTS, Mutant

POLICY = Path(__file__).resolve().parents[2] / "extproc" / "policy"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_the_mutants_text_is_in_its_file_once(mutant: Mutant) -> None:
    text = (POLICY / mutant.file).read_text(encoding="utf-8")
    assert text.count(mutant.old) == 1, f"{mutant.name}: {mutant.file} holds its text " \
                                        f"{text.count(mutant.old)} times"
