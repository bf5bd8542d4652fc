"""The suite never writes the user's data directory, even from fixtures wider than a test; and
the tests sharing such a fixture run on one xdist worker, so it is set up once."""

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


def test_tests_sharing_a_module_fixture_go_to_one_worker(request, module_home):
    # conftest groups them (``--dist loadgroup``): the fixture is set up on one xdist worker.
    mark = request.node.get_closest_marker("xdist_group")
    file = request.node.nodeid.split("::")[0]
    assert mark is not None and mark.args[0] == file
    if getattr(request.config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup: xdist read it
        assert request.node.nodeid.endswith(f"@{file}")


def test_a_test_without_a_shared_fixture_goes_to_any_worker(request):
    assert request.node.get_closest_marker("xdist_group") is None
