"""The conformance matrix on the catalogue's chat models, on their real weights, through
``serve``'s app and the real ``openai``, ``anthropic`` and ``ollama`` clients
(``bench/conformance.py``): every cell comes out as the shipped capabilities say
(``models/hub/capabilities.json``, what ``mlotspark list``, ``/v1/models``, Ollama's
``/api/show`` and the chat's picker report), and no cell is an empty reply.

A test per cell, so each stays small; one engine and one server per model (Qwen's are
the run's own, ``conftest.qwen_server``).
"""

from __future__ import annotations

import pytest

from mlotspark.bench.conformance import CELLS, Matrix, run_cell
from mlotspark.models.hub.capabilities import capabilities, from_cells, measured

SHIPPED = measured()["models"]


def _server_for(gguf):
    from live_server import LiveServer
    from mlotspark import Engine

    return LiveServer(Engine.load(str(gguf), progress=False, temperature=0.0))


@pytest.fixture(scope="module")
def smollm2(default_gguf):
    srv = _server_for(default_gguf)
    yield Matrix(srv.state.engine, srv)
    srv.stop()


@pytest.fixture(scope="module")
def gemma3(gemma_server):
    return Matrix(gemma_server.state.engine, gemma_server)


@pytest.fixture(scope="module")
def qwen(qwen_server):
    return Matrix(qwen_server.state.engine, qwen_server)


# The memory_writer cell runs a judge set through the model writer (minutes a model on these
# cores): ``mlotspark bench --suite conformance`` measures it; its result ships, and
# ``test_every_catalogue_chat_model_ships_every_cell`` checks that it does.
SUITE_CELLS = tuple(c for c in CELLS if c != "memory_writer")


def _check(matrix: Matrix, alias: str, cell: str) -> None:
    got = run_cell(matrix, cell)
    assert "empty" not in got.detail, got  # never an empty reply that looks like success
    assert got.status == "ok" or got.detail, got  # a refusal or a failure says why
    assert got.status == SHIPPED[alias][cell], (
        f"{alias} · {cell}: measured {got.status} ({got.detail}); the shipped capabilities say "
        f"{SHIPPED[alias][cell]}: re-measure with `mlotspark bench --suite conformance --write-capabilities`")


@pytest.mark.slow
@pytest.mark.parametrize("cell", SUITE_CELLS)
def test_smollm2_135m_cells_are_as_shipped(smollm2, cell):
    _check(smollm2, "smollm2-135m-instruct", cell)


@pytest.mark.slow
@pytest.mark.parametrize("cell", SUITE_CELLS)
def test_qwen2_5_coder_cells_are_as_shipped(qwen, cell):
    _check(qwen, "qwen2.5-coder-0.5b", cell)


@pytest.mark.slow
@pytest.mark.parametrize("cell", SUITE_CELLS)
def test_gemma3_270m_cells_are_as_shipped(gemma3, cell):
    _check(gemma3, "gemma3-270m", cell)


def test_every_catalogue_chat_model_ships_every_cell():
    from mlotspark.cli.check import CATALOGUE_CHAT

    for alias in CATALOGUE_CHAT:
        assert set(SHIPPED[alias]) == set(CELLS), alias
        assert all(v in ("ok", "refused", "fail") for v in SHIPPED[alias].values())


def test_capabilities_are_measured_for_the_catalogue_and_unverified_elsewhere():
    qwen = capabilities("qwen2.5-coder-0.5b")
    assert qwen.verified and qwen.features == from_cells(SHIPPED["qwen2.5-coder-0.5b"])
    assert "tools" in qwen.features and "tools" not in capabilities("smollm2-135m-instruct").features
    other = capabilities("/some/model.gguf", has_tools=True)
    assert not other.verified and "tools" in other.features and other.describe().endswith("(unverified)")
    assert "tools" not in capabilities("/some/model.gguf").features
