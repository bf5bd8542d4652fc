"""The suite never writes the user's data directory, even from fixtures wider than a test."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlotspark import storage


@pytest.fixture(scope="module")
def module_home() -> Path:
    return storage.home_path()  # what a module-scoped fixture (an engine loaded once) writes to


def test_module_fixtures_write_a_home_of_the_run(module_home):
    assert module_home.resolve() != (Path.home() / ".mlotspark").resolve()
    assert "mlotspark-test-home-" in str(module_home)


def test_a_test_gets_its_own_home(tmp_path):
    assert storage.home_path() == tmp_path / "home"
