# Past 500 lines on purpose: every macOS signal's parser and budget beside the one scripted platform they share.
"""macOS signals and budgets, driven by what macOS prints and returns, on Linux.

No Mac here: ``sys.platform`` / the device are patched, and the macOS commands and
calls are fixtures in the formats macOS uses (``pmset -g``, ``pmset -g therm``, the
``kern.memorystatus_*`` sysctls, notify(3) thermal-pressure levels). A fake libSystem
runs the ctypes paths (``sysctlbyname``, ``notify_register_check``/``notify_get_state``).
"""

from __future__ import annotations

import ctypes
import os
import sys
from types import SimpleNamespace

import mlx.core as mx
import pytest

from mlotspark.distributed import group
from mlotspark.errors import DistributedError
from mlotspark.platform import device, memory
from mlotspark.platform.memory import KernelPressure, memory_budget, read_sysctl_int
from mlotspark.runtime.scheduler_config import SchedulerConfig, memory_status
from mlotspark.thermal.governor import ThermalGovernor
from mlotspark.thermal.macos import (
    BackgroundProbe,
    LowPowerProbe,
    MemoryPressureProbe,
    PmsetProbe,
    ThermalPressureProbe,
    parse_pmset_lowpower,
)
from mlotspark.thermal.probes import PsutilProbe, Reading, ScriptedProbe, default_probes
from mlotspark.thermal.throughput import ThroughputProbe

GB = 1 << 30

# `pmset -g` on a MacBook (macOS 14/15) with Low Power Mode on; the format of the line
# macOS prints: two-space indent, name padded, value.
PMSET_G_LOW_POWER = """\
System-wide power settings:
Currently in use:
 standby              1
 Sleep On Power Button 1
 hibernatefile        /var/vm/sleepimage
 powernap             1
 networkoversleep     0
 disksleep            10
 sleep                1 (sleep prevented by coreaudiod)
 hibernatemode        3
 ttyskeepawake        1
 displaysleep         2
 tcpkeepalive         1
 lowpowermode         1
 womp                 0
"""
PMSET_G_NORMAL = PMSET_G_LOW_POWER.replace("lowpowermode         1", "lowpowermode         0")
# `pmset -g therm` on Apple Silicon: says nothing whatever the heat.
PMSET_THERM_ARM = """\
Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
Note: No CPU power status has been recorded
"""
# kern.memorystatus_vm_pressure_level: 1 normal, 2 warn, 4 critical; kern.memorystatus_level: % free.
SYSCTL = {
    "normal": {"kern.memorystatus_vm_pressure_level": 1, "kern.memorystatus_level": 62},
    "warn": {"kern.memorystatus_vm_pressure_level": 2, "kern.memorystatus_level": 21},
    "critical": {"kern.memorystatus_vm_pressure_level": 4, "kern.memorystatus_level": 6},
}


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def fixture_reader(name: str):
    table = SYSCTL[name]
    calls: list[str] = []

    def read(key: str) -> int | None:
        calls.append(key)
        return table.get(key)

    read.calls = calls  # type: ignore[attr-defined]
    return read


def busy_mac_psutil():
    """psutil as macOS reports a healthy 16 GB Mac with the model wired: "available"
    (inactive + free) is 5 %, dynamic swap 99 % full."""
    return SimpleNamespace(
        cpu_percent=lambda interval=None: 40.0, cpu_freq=lambda: None, sensors_battery=lambda: None,
        virtual_memory=lambda: SimpleNamespace(total=16 * GB, available=int(0.05 * 16 * GB)),
        swap_memory=lambda: SimpleNamespace(total=4 * GB, used=int(0.99 * 4 * GB)),
    )


# ------------------------------------------------------------- sysctl and memory pressure
class FakeLibSystem:
    """``sysctlbyname`` and the notify calls as ctypes would see them (values through byref)."""

    def __init__(self, sysctl: dict[str, int], notify_levels: list[int] | None = None) -> None:
        self.registered: list[bytes] = []
        levels = list(notify_levels or [0])
        calls = {"get": 0}

        def sysctlbyname(name, valp, sizep, newp, newlen):
            key = name.decode()
            if key not in sysctl:
                return -1
            valp._obj.value = sysctl[key]
            sizep._obj.value = 4  # both are 32-bit ints in the kernel
            return 0

        def notify_register_check(key, tokenp):
            self.registered.append(key)
            tokenp._obj.value = 7
            return 0

        def notify_get_state(token, statep):
            assert token.value == 7
            statep._obj.value = levels[min(calls["get"], len(levels) - 1)]
            calls["get"] += 1
            return 0

        # plain functions, so ctypes-style ``argtypes``/``restype`` may be set on them
        self.sysctlbyname = sysctlbyname
        self.notify_register_check = notify_register_check
        self.notify_get_state = notify_get_state


def test_sysctl_is_read_through_ctypes_then_the_command():
    lib = FakeLibSystem(SYSCTL["warn"])
    assert read_sysctl_int("kern.memorystatus_vm_pressure_level", lib=lib) == 2
    assert read_sysctl_int("kern.memorystatus_level", lib=lib) == 21
    # no such sysctl through ctypes: the `sysctl -n` fallback answers
    assert read_sysctl_int("kern.other", lib=lib, runner=lambda name: 5) == 5

    class NoLib:
        def __getattr__(self, name):
            raise AttributeError(name)

    assert read_sysctl_int("kern.memorystatus_vm_pressure_level", lib=NoLib(),
                           runner=fixture_reader("critical")) == 4
    assert read_sysctl_int("kern.x", lib=NoLib(), runner=lambda n: (_ for _ in ()).throw(OSError())) is None


def test_kernel_pressure_is_cached_and_silent_off_macos():
    reader, clock = fixture_reader("warn"), FakeClock()
    kp = KernelPressure(platform="darwin", reader=reader, ttl_s=1.0, clock=clock)
    assert kp.read() == (2, 21)
    assert kp.read() == (2, 21)
    assert len(reader.calls) == 2  # one read of each sysctl within the second
    clock.t += 1.5
    kp.read()
    assert len(reader.calls) == 4
    assert KernelPressure(platform="linux", reader=reader).read() == (None, None)


@pytest.mark.parametrize("level,expected", [("normal", 0), ("warn", 1), ("critical", 2)])
def test_memory_pressure_probe_maps_the_kernel_levels(level, expected):
    probe = MemoryPressureProbe(KernelPressure(platform="darwin", reader=fixture_reader(level)))
    assert probe.read().memory_pressure_level == expected


def test_on_macos_the_kernel_level_decides_not_psutils_ratio_or_swap():
    """psutil says 95 % used and swap 99 % full; the kernel says normal: nominal, admitted.
    The same psutil figures on Linux make the governor fair and refuse new requests."""
    mac = [PsutilProbe(busy_mac_psutil(), platform="darwin"),
           MemoryPressureProbe(KernelPressure(platform="darwin", reader=fixture_reader("normal")))]
    gov = ThermalGovernor(mac, clock=FakeClock(), min_interval_s=0)
    d = gov.update()
    assert d.state == "nominal" and "kernel memory pressure normal" in d.reason
    assert gov.status()["reading"].get("swap_used_ratio") is None
    assert gov.admit(1 << 20, 8 * GB, active_requests=2)[0]

    linux = ThermalGovernor([PsutilProbe(busy_mac_psutil(), platform="linux")], clock=FakeClock(), min_interval_s=0)
    assert linux.update().state == "fair"
    assert not linux.admit(1 << 20, 8 * GB, active_requests=2)[0]


def test_kernel_warn_is_fair_and_holds_new_requests_critical_is_serious():
    warn = ThermalGovernor([MemoryPressureProbe(KernelPressure(platform="darwin", reader=fixture_reader("warn")))],
                           clock=FakeClock(), min_interval_s=0)
    d = warn.update()
    assert d.state == "fair" and "kernel memory pressure warn" in d.reason
    ok, why = warn.admit(1 << 20, 1 << 30, active_requests=1)
    assert not ok and "kernel memory pressure warn" in why
    assert warn.admit(1 << 20, 1 << 30, active_requests=0)[0]  # nothing to wait for
    crit = ThermalGovernor([MemoryPressureProbe(KernelPressure(platform="darwin", reader=fixture_reader("critical")))],
                           clock=FakeClock(), min_interval_s=0)
    assert crit.update().state == "serious"


# ------------------------------------------------------------------ budgets
def test_budgets_metal_working_set_minus_weights_available_elsewhere_limit_first():
    metal = memory_budget(2 * GB, platform="darwin", metal=True, working_set=int(10.7 * GB))
    assert metal.kv_bytes == int(10.7 * GB) - 2 * GB
    assert metal.admission_limit_bytes == int(10.7 * GB)  # weights + KV inside the working set
    assert metal.signal.startswith("kernel pressure level")
    other = memory_budget(2 * GB, platform="linux", metal=False, available=8 * GB)
    # the weights are resident: already out of "available", not subtracted twice
    assert other.kv_bytes == 4 * GB and other.admission_limit_bytes is None
    assert other.signal.startswith("psutil")
    limited = memory_budget(2 * GB, 6 * GB, platform="darwin", metal=True, working_set=int(10.7 * GB))
    assert limited.kv_bytes == 4 * GB and limited.source == "memory limit"
    assert "Metal recommended working set" in metal.describe()


def test_on_metal_the_governor_limits_weights_plus_kv_to_the_working_set(monkeypatch):
    monkeypatch.setattr(memory, "metal_available", lambda: True)
    monkeypatch.setattr(memory, "metal_working_set", lambda: 10 * GB)
    gov = SchedulerConfig(mode="balanced").make_governor()
    assert gov.memory_limit_bytes == 10 * GB
    gov.probes = [PsutilProbe(busy_mac_psutil(), platform="darwin")]
    gov.update(force=True)
    # 6 GB of weights + 3 GB of running KV + 0.5 GB more fits; 1.5 GB more does not
    assert gov.admit(GB // 2, 9 * GB, active_requests=1)[0]
    ok, why = gov.admit(3 * GB // 2, 9 * GB, active_requests=1)
    assert not ok and "memory limit 10.0 GiB" in why
    status = memory_status(weights_bytes=6 * GB, platform="darwin")
    assert status["kv_budget_bytes"] == 4 * GB and status["source"] == "Metal recommended working set"


def test_the_auto_cache_kind_budget_follows_the_same_rule(monkeypatch):
    from mlotspark.caches.policy import kv_budget

    monkeypatch.setattr(memory, "metal_available", lambda: True)
    monkeypatch.setattr(memory, "metal_working_set", lambda: 10 * GB)
    assert kv_budget(None, 2 * GB) == 8 * GB
    assert kv_budget(5 * GB, 2 * GB) == 3 * GB


def test_elsewhere_no_limit_is_invented(monkeypatch):
    monkeypatch.setattr(memory, "metal_available", lambda: False)
    assert SchedulerConfig(mode="balanced").make_governor().memory_limit_bytes is None


def test_info_says_which_memory_signal_and_budget_are_in_force(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(device, "kernel_pressure",
                        lambda: KernelPressure(platform="darwin", reader=fixture_reader("warn")))
    info = device.device_info()
    assert info["memory_signal"] == "kernel pressure level (kern.memorystatus_vm_pressure_level)"
    assert info["memory_pressure"] == "warn, 21% free (kernel)"
    assert info["kv_budget"].startswith("KV budget ")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(device, "kernel_pressure", lambda: KernelPressure(platform="linux"))
    info = device.device_info()
    assert info["memory_signal"].startswith("psutil") and "memory_pressure" not in info


# ---------------------------------------------------------- wired and cache limits
def test_wired_limit_covers_weights_and_kv_and_comes_back_on_restore(monkeypatch):
    calls = []
    limits = {"wired": 0, "cache": 7 * GB}

    def set_wired(n):
        calls.append(("wired", n))
        old, limits["wired"] = limits["wired"], n
        return old

    def set_cache(n):
        calls.append(("cache", n))
        old, limits["cache"] = limits["cache"], n
        return old

    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": 10 * GB})
    monkeypatch.setattr(mx, "set_wired_limit", set_wired)
    monkeypatch.setattr(mx, "set_cache_limit", set_cache)
    got = device.configure_metal_limits(weights_bytes=GB, kv_bytes=GB)
    assert got.wired_bytes == 2 * GB  # not the whole 10 GB working set
    assert got.cache_bytes == 256 << 20  # an eighth of 2 GB
    big = device.configure_metal_limits(weights_bytes=9 * GB, kv_bytes=8 * GB)
    assert big.wired_bytes == 10 * GB  # MLX refuses more than the working set
    big.restore()
    got.restore()
    assert limits == {"wired": 0, "cache": 7 * GB}  # what was there before the engine


def test_the_engine_wires_at_load_gives_the_cache_back_when_idle_and_restores_at_close(monkeypatch, tmp_path):
    """Engine.load wires weights + the KV of max_batch full contexts, the engine thread
    clears MLX's cache once it has nothing to run, and close() restores the old limits."""
    import time

    from mlotspark import Engine
    from mlotspark import engine as engine_module
    from mlotspark.runtime import scheduler as scheduler_module
    from mlotspark.runtime.scheduler_config import kv_bytes_per_token
    from tiny import tiny_model, write_tiny_gguf

    calls: list = []

    class Limits:
        def restore(self):
            calls.append("restore")

    def configure(weights_bytes, kv_bytes):
        calls.append(("wire", weights_bytes, kv_bytes))
        return Limits()

    monkeypatch.setattr(engine_module, "configure_metal_limits", configure)
    monkeypatch.setattr(scheduler_module, "release_idle_memory", lambda: calls.append("idle"))
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_model(seed=2))
    engine = Engine.load(str(path), progress=False, cascade=None, max_batch=2)
    try:
        model = engine.loaded.model
        assert calls == [("wire", engine.loaded.nbytes(), kv_bytes_per_token(model) * engine.loaded.context_length * 2)]
        engine.generate("hello", raw=True, max_tokens=3, temperature=0)
        deadline = time.monotonic() + 10
        while "idle" not in calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "idle" in calls and "restore" not in calls
    finally:
        engine.close()
    assert calls[-1] == "restore" and calls.count("restore") == 1


def test_no_limits_are_touched_off_metal(monkeypatch):
    monkeypatch.setattr(mx.metal, "is_available", lambda: False)
    assert device.configure_metal_limits(GB, GB) is None


# --------------------------------------------------------------- thermal signals
def test_notify_thermal_pressure_through_a_fake_libsystem_drives_the_governor():
    lib = FakeLibSystem({}, notify_levels=[0, 1, 2, 3, 4])
    probe = ThermalPressureProbe(platform="darwin", lib=lib)
    assert lib.registered == [b"com.apple.system.thermalpressurelevel"]
    assert lib.notify_get_state.restype is ctypes.c_uint32  # the ctypes signature was declared
    gov = ThermalGovernor([probe], clock=FakeClock(), min_interval_s=0, max_batch=8)
    states = [gov.update().state for _ in range(5)]
    assert states == ["nominal", "fair", "serious", "critical", "critical"]
    assert "thermal pressure sleeping" in gov.last_decision.reason


def test_low_power_mode_moves_auto_to_efficiency():
    assert parse_pmset_lowpower(PMSET_G_LOW_POWER).low_power_mode is True
    assert parse_pmset_lowpower(PMSET_G_NORMAL).low_power_mode is False
    assert parse_pmset_lowpower("nothing here").low_power_mode is None
    low = ThermalGovernor([LowPowerProbe(runner=lambda: PMSET_G_LOW_POWER, platform="darwin")], mode="auto",
                          clock=FakeClock(), min_interval_s=0, max_batch=8)
    d = low.update()
    assert d.mode == "efficiency" and d.cap == 2 and "Low Power Mode" in d.reason
    normal = ThermalGovernor([LowPowerProbe(runner=lambda: PMSET_G_NORMAL, platform="darwin")], mode="auto",
                             clock=FakeClock(), min_interval_s=0, max_batch=8)
    assert normal.update().mode == "balanced"
    assert LowPowerProbe(runner=lambda: PMSET_G_LOW_POWER, platform="linux").read() == Reading()


def test_pmset_therm_is_skipped_on_apple_silicon():
    runs = []

    def runner():
        runs.append(1)
        return PMSET_THERM_ARM

    assert PmsetProbe(runner=runner, platform="darwin", machine="arm64").read() == Reading()
    assert runs == []
    assert PmsetProbe(runner=runner, platform="darwin", machine="x86_64").read().thermal_warning == 0
    assert runs == [1]


def test_macos_default_probes_run_commands_off_the_engine_thread():
    probes = default_probes(platform="darwin", machine="arm64")
    try:
        kinds = [type(p) for p in probes]
        inner = [type(p.inner) for p in probes if isinstance(p, BackgroundProbe)]
        assert ThermalPressureProbe in kinds and PsutilProbe in kinds and ThroughputProbe in kinds
        assert set(inner) == {MemoryPressureProbe, LowPowerProbe}  # no pmset -g therm on arm64
        intel = default_probes(platform="darwin", machine="x86_64")
        assert PmsetProbe in [type(p.inner) for p in intel if isinstance(p, BackgroundProbe)]
    finally:
        for p in probes + intel:
            if isinstance(p, BackgroundProbe):
                p.stop()


def test_a_background_probe_reads_on_its_own_thread_and_the_engine_copies_the_last_reading():
    runs = []

    def runner():
        runs.append(1)
        return PMSET_G_LOW_POWER

    bg = BackgroundProbe(LowPowerProbe(runner=runner, platform="darwin"), interval_s=60.0)
    try:
        for _ in range(2000):  # until its thread has read once (no timing asserted)
            if bg.read().low_power_mode:
                break
            bg._stop.wait(0.005)
        gov = ThermalGovernor([bg], mode="auto", clock=FakeClock(), min_interval_s=0)
        for _ in range(5):
            gov.update()
        assert gov.last_decision.mode == "efficiency"
        assert len(runs) == 1  # five updates, one pmset run: the engine never ran it
        assert bg.reader_threads == {"mlotspark-probe-LowPowerProbe"}
    finally:
        bg.stop()


def _steady_long_generation(probe: ThroughputProbe, clock: FakeClock, with_context: bool,
                            throttle_at: int | None = None) -> list[float | None]:
    """One request decoding from 200 to 6000 tokens of context at a steady clock: each
    token costs 20 ms + 5 µs per token of context (attention), 1 s per sample; past
    ``throttle_at`` tokens, the chip runs 40 % slower."""
    evidence, ctx = [], 200
    while ctx < 6000:
        cost = 0.020 + 5e-6 * ctx
        if throttle_at is not None and ctx >= throttle_at:
            cost /= 0.6
        tps = 1.0 / cost
        probe.record(1, tps, ctx if with_context else None)
        clock.t += 1.0
        ctx += int(tps)
        evidence.append(probe.evidence())
    return evidence


def test_a_long_generation_at_a_steady_clock_stays_nominal():
    clock = FakeClock()
    probe = ThroughputProbe(clock=clock)
    gov = ThermalGovernor([probe], clock=clock, min_interval_s=0)
    evidence = _steady_long_generation(probe, clock, with_context=True)
    assert max(e or 0.0 for e in evidence) == 0.0
    assert gov.update().state == "nominal"
    # Without the context the same run looks like heat: what this guards against.
    blind = ThroughputProbe(clock=clock)
    assert max(e or 0.0 for e in _steady_long_generation(blind, clock, with_context=False)) > 0.5


def test_a_real_slowdown_at_equal_context_is_still_throttling():
    clock = FakeClock()
    probe = ThroughputProbe(clock=clock)
    gov = ThermalGovernor([probe], clock=clock, min_interval_s=0)
    # settle at ~1000 tokens of context, then 40 % slower at the same context
    for _ in range(6):
        probe.record(1, 40.0, 1000)
    for _ in range(6):
        probe.record(1, 24.0, 1010)
    assert probe.evidence() >= 0.5
    assert gov.update().state in ("serious", "critical")
    # a shorter context slower than a longer one's best is evidence too
    fresh = ThroughputProbe(clock=clock)
    for _ in range(6):
        fresh.record(1, 30.0, 4000)
    for _ in range(4):
        fresh.record(1, 15.0, 300)
    assert fresh.evidence() > 0.5


# -------------------------------------------------------------------- JACCL
JACCL_ENV = {"MLX_RANK": "0", "MLX_IBV_DEVICES": "/tmp/ibv-devices.json", "MLX_JACCL_COORDINATOR": "10.0.0.1:32323"}


@pytest.fixture
def jaccl_env(monkeypatch):
    for k in ("MLX_HOSTFILE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JACCL_RANK"):
        monkeypatch.delenv(k, raising=False)
    for k, v in JACCL_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(group, "_JOINED", None)


def test_jaccl_launch_is_recognised(jaccl_env):
    assert "jaccl" in group.BACKENDS
    assert group.launched() and group.launched_backend() == "jaccl"


def test_the_backend_is_named_in_mlx_s_own_order(monkeypatch):
    """MLX 0.32's ``any`` tries the ring, then MPI, then JACCL: with a hostfile too, the ring forms."""
    for k in ("MLX_HOSTFILE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JACCL_RANK", *JACCL_ENV):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MLX_RANK", "1")
    monkeypatch.setenv("MLX_HOSTFILE", "/tmp/hosts.json")
    assert group.launched_backend() == "ring"
    for k, v in JACCL_ENV.items():
        monkeypatch.setenv(k, v)
    assert group.launched_backend() == "ring"
    monkeypatch.delenv("MLX_HOSTFILE")
    assert group.launched_backend() == "jaccl"
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    assert group.launched_backend() == "mpi"


def test_jaccl_errors_are_rank_failures():
    err = RuntimeError("[jaccl] Recv failed with errno=60")
    assert group.is_rank_failure(err)
    with pytest.raises(DistributedError, match="a rank is gone"):
        with group._collective("gather a message"):
            raise err


def test_a_misconfigured_jaccl_link_is_an_error_not_a_group_of_one(jaccl_env):
    """With JACCL's launcher environment and no RDMA device, join() must fail loudly."""
    with pytest.raises(DistributedError, match="cannot join the rank group"):
        group.join()
    assert group._JOINED is None


def test_without_a_launcher_nothing_is_recognised(monkeypatch):
    for k in (*JACCL_ENV, "MLX_HOSTFILE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JACCL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert not group.launched() and group.launched_backend() is None
    assert os.environ.get("MLX_IBV_DEVICES") is None
    monkeypatch.setattr(group, "_JOINED", None)
    alone = group.join()
    assert alone.size == 1 and alone.backend is None  # `info --distributed` names no backend
