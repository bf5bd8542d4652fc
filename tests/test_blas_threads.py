"""The engine's BLAS threads follow the cores other processes leave free (thermal/cores.py).

Two OpenBLAS threads beside other busy work stall at every product's end (measured 4x
slower GEMMs, a 25x slower decode step); on an idle machine two are faster. The governor
reads how many cores others keep busy and the scheduler applies the count between steps.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from mlotspark.platform import blas
from mlotspark.thermal.cores import HYSTERESIS, blas_threads
from mlotspark.thermal.governor import ThermalGovernor
from mlotspark.thermal.probes import PsutilProbe, ScriptedProbe


def test_threads_are_the_free_cores_with_a_margin_against_flapping():
    assert blas_threads(0.05, 2, None) == 2
    assert blas_threads(1.0, 2, None) == 1
    assert blas_threads(3.5, 2, 2) == 1  # never below one
    assert blas_threads(None, 2, 2) == 2 and blas_threads(None, 2, None) is None
    assert blas_threads(0.0, 8, None) == 8 and blas_threads(2.2, 8, 8) == 6
    # at the half-core edge the count in force holds; past the margin it moves
    assert blas_threads(0.5 + HYSTERESIS / 2, 2, 2) == 2
    assert blas_threads(0.5 + HYSTERESIS * 2, 2, 2) == 1
    assert blas_threads(0.5 - HYSTERESIS / 2, 2, 1) == 1
    assert blas_threads(0.5 - HYSTERESIS * 2, 2, 1) == 2


class _Times(SimpleNamespace):
    pass


class _FakePsutil:
    """System-wide and own CPU seconds, advanced by the test."""

    def __init__(self):
        self.system, self.own = 100.0, 10.0

    def cpu_percent(self, interval=None):
        return 50.0

    def cpu_times(self):
        return _Times(user=self.system, nice=0.0, system=0.0, irq=0.0, softirq=0.0, steal=0.0, idle=500.0)

    def Process(self):  # noqa: N802  (psutil's name)
        own = self.own
        return SimpleNamespace(cpu_times=lambda: _Times(user=own, system=0.0))


def test_psutil_probe_reads_the_cores_other_processes_keep_busy(monkeypatch):
    ps = _FakePsutil()
    now = [1000.0]
    monkeypatch.setattr("mlotspark.thermal.probes.time.monotonic", lambda: now[0])
    probe = PsutilProbe(psutil_module=ps, platform="linux")
    now[0] += 2.0
    ps.system += 3.0  # 3 CPU seconds busy in 2 s, 1 of them ours: others kept 1 core busy
    ps.own += 1.0
    assert probe.read().cpu_others == pytest.approx(1.0)
    now[0] += 0.05  # too short a window to tell: no figure, and the window keeps growing
    assert probe.read().cpu_others is None
    now[0] += 0.95
    ps.own += 1.0  # 1 s all ours
    ps.system += 1.0
    assert probe.read().cpu_others == pytest.approx(0.0)


def test_the_first_reading_waits_out_its_window_once(monkeypatch):
    # The engine reads the probe as its first request starts, right after making it: the
    # first figure waits the window out (this process idle) instead of leaving the first
    # prefill chunk at OpenBLAS's default threads beside a busy core.
    ps, now, slept = _FakePsutil(), [1000.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s
        ps.system += s  # another process keeps one core busy meanwhile

    monkeypatch.setattr("mlotspark.thermal.probes.time.monotonic", lambda: now[0])
    monkeypatch.setattr("mlotspark.thermal.probes.time.sleep", sleep)
    probe = PsutilProbe(psutil_module=ps, platform="linux")
    now[0] += 0.05
    ps.system += 0.05
    assert probe.read().cpu_others == pytest.approx(1.0)
    assert slept == [pytest.approx(0.15)]
    now[0] += 0.05  # later readings never wait: a short window gives no figure
    assert probe.read().cpu_others is None and len(slept) == 1
    mac = PsutilProbe(psutil_module=_FakePsutil(), platform="darwin")  # Accelerate: no threads to fit
    assert mac.read().cpu_others is None and len(slept) == 1


def test_governor_decides_threads_and_says_why(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    probe = ScriptedProbe([{"cpu_others": 0.0}, {"cpu_others": 1.1}, {"cpu_others": 1.1}])
    gov = ThermalGovernor([probe], min_interval_s=0)
    assert gov.update().threads == 2
    d = gov.update()
    assert d.threads == 1 and "BLAS threads 2→1" in d.reason
    assert gov.status()["blas_threads"] == 1


@pytest.fixture
def fresh_blas(monkeypatch):
    monkeypatch.setattr(blas, "_FITTED", None)
    monkeypatch.setattr(blas, "_PINNED", False)
    before = int(os.environ.get("OPENBLAS_NUM_THREADS") or os.cpu_count() or 1)  # conftest pins it per worker
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    yield
    blas.set_numpy_blas_threads(before)
    fn = getattr(blas._LIB, "openblas_set_num_threads", None) if blas._LIB is not None else None
    if fn is not None:
        fn(before)


def test_fit_leaves_the_users_or_the_ranks_choice(fresh_blas, monkeypatch):
    assert blas.fit_threads(1) and blas.fitted_threads() == 1
    assert not blas.fit_threads(1)  # already in force
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert not blas.fit_threads(2) and blas.fitted_threads() == 1
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    monkeypatch.setattr(blas, "_PINNED", True)  # what set_blas_threads does for ranks
    assert not blas.fit_threads(2)


def test_the_engine_follows_other_work_between_steps(fresh_blas, monkeypatch, tmp_path):
    """Through Engine: another process takes a core, the engine drops to one BLAS thread and
    decodes the same greedy tokens; the core comes back, so does the thread."""
    from tiny import tiny_model, write_tiny_gguf

    from mlotspark import Engine

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_model(seed=3))
    busy = {"cpu_others": 0.0}

    class Machine:
        def read(self):
            from mlotspark.thermal.reading import Reading

            return Reading(**busy)

    gov = ThermalGovernor([Machine()], min_interval_s=0)
    engine = Engine.load(str(path), progress=False, governor=gov, cascade=None)
    try:
        quiet = engine.generate("abc", max_tokens=12, temperature=0)
        assert blas.fitted_threads() == 2
        busy["cpu_others"] = 1.0
        loaded = engine.generate("abc", max_tokens=12, temperature=0)
        assert blas.fitted_threads() == 1
        assert loaded.text == quiet.text
        busy["cpu_others"] = 0.0
        engine.generate("abc", max_tokens=4, temperature=0)
        assert blas.fitted_threads() == 2
        assert any("BLAS threads 1→2" in h["reason"] for h in gov.status(last=50)["history"])
    finally:
        engine.close()
