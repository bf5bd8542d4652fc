"""Shared fixtures. Every test gets its own ``$MLOTSPARK_HOME`` under tmp_path,
except the real default model, which is fetched once per machine into a cache
directory shared by test runs (``$MLOTSPARK_TEST_MODELS`` or
``~/.cache/mlotspark-test``) so the suite does not download it for every test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Each xdist worker gets its share of the cores for BLAS, set before OpenBLAS loads (MLX's
# and NumPy's read it once). Two workers each running two spinning OpenBLAS threads on two
# cores made single tests 3-10x slower than alone (a 1.6 s load took 22 s). It is the count
# ``platform.blas.fit_threads`` gives the engine when another process holds a core, only
# in force from the start, also for loads and the mlx-lm reference runs that no scheduler
# governs; test_blas_threads.py unsets it to test the fitting itself.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import mlotspark  # noqa: E402,F401  (resolves OpenBLAS before any test imports mlx)

from model_cache import R1_TINY_ANSWER, R1_TINY_THOUGHT, catalogue_path, float32_cache_across_runs  # noqa: E402  (a module of its own: see there)


def pytest_configure(config):
    # Module- and session-scoped fixtures load models before a test's own home is set
    # (``_isolated_home``): without a home of the run's, they wrote the user's ~/.mlotspark
    # (its models_used.json listed pytest's temporary models in ``mlotspark list``).
    import shutil
    import tempfile

    config.pluginmanager.register(_SharedFixtureTimer(), "mlotspark-shared-fixture-timer")
    config._mlotspark_home = tempfile.mkdtemp(prefix="mlotspark-test-home-")
    config._mlotspark_home_before = os.environ.get("MLOTSPARK_HOME")
    os.environ["MLOTSPARK_HOME"] = config._mlotspark_home
    config.add_cleanup(lambda: shutil.rmtree(config._mlotspark_home, ignore_errors=True))
    # No float32 cache (models/formats/float32_cache.py) unless asked: each test has a home of its
    # own, so every real-model load would write 4 bytes a weight (538 MB for SmolLM2) that
    # no later load reads, kept in pytest's last three runs. test_float32_cache.py turns it on.
    os.environ.setdefault("MLOTSPARK_FLOAT32_CACHE", "0")


# ------------------------------------------------------------------ markers and groups
#: Fixtures that bring a real catalogue model: a test using one (directly or through
#: another fixture) is ``slow``, so ``-m "not slow"`` is the inner loop.
REAL_MODEL_FIXTURES = {"default_gguf", "qwen_gguf", "qwen_engine", "qwen_server", "gemma_gguf", "gemma_engine",
                       "gemma_server"}
#: Tests sharing one run-wide engine go to one xdist worker (``--dist loadgroup``): it loads once.
_GROUPS = {"qwen": {"qwen_gguf", "qwen_engine", "qwen_server"}, "gemma": {"gemma_engine", "gemma_server"}}


def _shares_a_module_fixture(item) -> bool:
    """Whether ``item`` uses a fixture set up once per module (or class): a model, two launched ranks."""
    info = getattr(item, "_fixtureinfo", None)
    return bool(info) and any(defs and defs[-1].scope in ("module", "class", "package")
                              for defs in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & REAL_MODEL_FIXTURES or item.path.name.endswith("_real.py"):
            item.add_marker(pytest.mark.slow)
        group = next((g for g, fixtures in _GROUPS.items() if names & fixtures), None)
        if group is None and _shares_a_module_fixture(item):
            # Otherwise each test is a work unit of its own, and a module fixture was set up on
            # both workers when its tests landed on both (two 2-rank launches, two model loads).
            group = item.nodeid.split("::")[0]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


# ------------------------------------------------------------------ the suite's time budget
#: A test (its setup, call and teardown together) that takes longer than the budget is
#: named in red at the end of the run, so the next slow test is noticed when it lands.
#: Past the limit (2.5x the budget) it fails the run: the limit is for a test that hangs or
#: grew tenfold, not a wall-clock assertion a slower machine trips on (CI ran this suite
#: 1.66x slower than the dev VM, and a 37 s test crossed a 60 s failing budget there).
#: ``MLOTSPARK_TEST_BUDGET_S=0`` turns both off. A fixture shared by several tests (module
#: or session scope: a model loaded once) is timed on its own, under its own name, not as
#: part of the first test that asks for it.
TEST_BUDGET_S = float(os.environ.get("MLOTSPARK_TEST_BUDGET_S", "60"))
TEST_LIMIT_FACTOR = 2.5
_durations: dict[str, float] = {}
_shared_setup_s = 0.0  # on the process running the test: shared fixtures set up in its setup
_shared_names: list[tuple[str, float]] = []


class _SharedFixtureTimer:
    """Times the set-up of fixtures shared by several tests and hands it to the report of
    the test whose set-up ran them. A plugin of its own (registered in ``pytest_configure``):
    a conftest's hooks see only the nodes under its folder, and a session fixture is set up
    for the session node above it."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        global _shared_setup_s
        import time

        t0 = time.perf_counter()
        yield
        if fixturedef.scope != "function":
            took = time.perf_counter() - t0
            _shared_setup_s += took
            _shared_names.append((f"{fixturedef.baseid or 'tests/conftest.py'}::{fixturedef.argname}{SHARED}", took))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        global _shared_setup_s
        outcome = yield
        if call.when == "setup" and _shared_names:  # travels to xdist's controller with the report
            outcome.get_result().user_properties.append(("shared_fixtures", list(_shared_names)))
            _shared_setup_s = 0.0
            _shared_names.clear()


def pytest_runtest_logreport(report):
    shared = dict(report.user_properties).get("shared_fixtures") if report.when == "setup" else None
    took = report.duration
    for name, s in shared or ():
        _durations[name] = _durations.get(name, 0.0) + s
        took -= s
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + max(took, 0.0)


SHARED = " (shared fixture)"
#: A shared fixture loads for several tests, and its subprocesses (two ranks) feel the
#: other worker most: three times a test's budget.
FIXTURE_BUDGET_FACTOR = 3


def _over_budget(factor: float = 1.0) -> list[tuple[str, float, float]]:
    """The tests (and shared fixtures) that took longer than ``factor`` times their budget."""
    if TEST_BUDGET_S <= 0:
        return []
    limits = ((n, d, factor * TEST_BUDGET_S * (FIXTURE_BUDGET_FACTOR if n.endswith(SHARED) else 1))
              for n, d in _durations.items())
    return [(n, d, limit) for n, d, limit in limits if d > limit]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _durations:
        return
    tr = terminalreporter
    tr.section("the ten slowest tests (setup + call + teardown)")
    for nodeid, d in sorted(_durations.items(), key=lambda kv: -kv[1])[:10]:
        tr.write_line(f"{d:7.2f}s  {nodeid[:160]}")
    out = os.environ.get("MLOTSPARK_TEST_DURATIONS")
    if out:  # every test's time, for docs/benchmarking.md's table of the suite
        import json

        Path(out).write_text(json.dumps(dict(sorted(_durations.items(), key=lambda kv: -kv[1])), indent=0))
    for nodeid, d, limit in _over_budget():
        tr.write_line(f"over the {limit:.0f} s budget: {nodeid[:160]} took {d:.1f} s", red=True)
    for nodeid, d, limit in _over_budget(TEST_LIMIT_FACTOR):
        tr.write_line(f"over the {limit:.0f} s limit (fails the run): {nodeid[:160]} took {d:.1f} s", red=True)


def pytest_sessionfinish(session, exitstatus):
    if _over_budget(TEST_LIMIT_FACTOR) and exitstatus == 0:
        session.exitstatus = 1


def pytest_unconfigure(config):
    before = getattr(config, "_mlotspark_home_before", None)
    if before is None:
        os.environ.pop("MLOTSPARK_HOME", None)
    else:
        os.environ["MLOTSPARK_HOME"] = before


@pytest.fixture(autouse=True)
def _seeded_random():
    # Tests draw random inputs; a fixed seed per test makes a failure repeat instead of
    # landing in one CI run of many (a damaged-part test once "damaged" nothing, 1 run in 256).
    import random

    import mlx.core as mx
    import numpy as np

    random.seed(0)
    np.random.seed(0)
    mx.random.seed(0)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MLOTSPARK_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """Path to the real default model's GGUF (SmolLM2-135M-Instruct Q4_1)."""
    from mlotspark.models.hub import catalogue

    return catalogue_path(catalogue.DEFAULT_MODEL)


@pytest.fixture(scope="session")
def qwen_gguf() -> Path:
    """Path to the real Qwen2.5-Coder-0.5B-Instruct GGUF (Q4_K_M mix, 491 MB)."""
    return catalogue_path("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen_engine(qwen_gguf):
    """One real Qwen2.5-Coder-0.5B engine for the whole run, greedy, otherwise as
    ``Engine.load`` sets it up (full attention within the context: the cascade is ``auto``),
    for tests that only read it: requests, never a change of its settings."""
    from mlotspark import Engine

    with float32_cache_across_runs(qwen_gguf):
        engine = Engine.load(str(qwen_gguf), progress=False, temperature=0.0)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """Path to the real Gemma 3 270M (base) GGUF (Q4_K_M, 253 MB)."""
    return catalogue_path("gemma3-270m")


@pytest.fixture(scope="session")
def gemma_engine(gemma_gguf):
    """One real Gemma 3 270M engine for the whole run (float32, as the CPU runs it), for
    tests that only read it."""
    from mlotspark import Engine

    with float32_cache_across_runs(gemma_gguf):
        engine = Engine.load(str(gemma_gguf), weights="float32", progress=False, temperature=0.0)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def gemma_server(gemma_engine):
    """``mlotspark serve``'s app over ``gemma_engine`` on a loopback port."""
    from live_server import LiveServer

    srv = LiveServer(gemma_engine)  # its lifespan closes the engine at the end of the run
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def qwen_server(qwen_engine):
    """``mlotspark serve``'s app over ``qwen_engine`` on a loopback port, for the real SDKs."""
    from live_server import LiveServer

    srv = LiveServer(qwen_engine)  # its lifespan closes the engine at the end of the run
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def qwen_tokenizer_real(qwen_gguf, tmp_path_factory):
    """Qwen2.5-Coder-0.5B's tokenizer and chat template, read from its GGUF's metadata (no
    weights: about a second)."""
    from mlotspark.models.formats.gguf_convert import metadata_of, open_reader
    from mlotspark.models.gguf_tokenizer import load_gguf_tokenizer

    return load_gguf_tokenizer(metadata_of(open_reader(qwen_gguf)), tmp_path_factory.mktemp("qwen-tok") / "t.json")


@pytest.fixture(scope="session")
def r1_tokenizer_real():
    """DeepSeek-R1-Distill-Qwen-7B's tokenizer and chat template, from its GGUF header."""
    import json

    from model_cache import r1_distill_tokenizer_json

    from mlotspark.models.gguf_tokenizer import load_gguf_tokenizer

    folder = r1_distill_tokenizer_json()
    return load_gguf_tokenizer(json.loads((folder / "metadata.json").read_text()), folder / "tokenizer.json")


@pytest.fixture(scope="session")
def r1_tiny_engine(r1_tokenizer_real):
    """An engine on a tiny model with the R1 distill's real tokenizer and template, whose
    greedy reply to any chat prompt is ``<think>\\n{R1_TINY_THOUGHT}</think>\\n\\n{R1_TINY_ANSWER}``
    (``tiny.chain_model``), then EOS: the reasoning path of every API, in a blink."""
    from types import SimpleNamespace

    from tiny import chain_model

    from mlotspark import Engine, GenerationOptions
    from mlotspark.models.loader import LoadedModel

    tok = r1_tokenizer_real
    opener = tok.encode("<｜Assistant｜>", add_special_tokens=False)
    reply = tok.encode(f"<think>\n{R1_TINY_THOUGHT}</think>\n\n{R1_TINY_ANSWER}", add_special_tokens=False)
    model = chain_model(opener + reply + [tok.eos_token_id], vocab_size=152064)
    loaded = LoadedModel(model=model, tokenizer=tok, config={}, source=SimpleNamespace(name="r1-tiny", path="r1-tiny"),
                         weights="float32", fingerprint="r1-tiny", context_length=512, supports_cascade=False)
    engine = Engine(loaded, GenerationOptions(temperature=0.0, max_tokens=32))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def r1_tiny_server(r1_tiny_engine):
    """``mlotspark serve``'s app over ``r1_tiny_engine`` on a loopback port, for the real SDKs."""
    from live_server import LiveServer

    srv = LiveServer(r1_tiny_engine)
    yield srv
    srv.stop()
