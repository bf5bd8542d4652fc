"""Thermal governor and probes: scripted heat, battery, memory and throughput.

Time is a fake clock everywhere: no test sleeps or measures wall-clock time.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlotspark.errors import OptionError
from mlotspark.platform.memory import apply_memory_limit
from mlotspark.thermal.governor import STATES, Decision, ThermalGovernor
from mlotspark.thermal.probes import (
    PmsetProbe,
    PsutilProbe,
    Reading,
    ScriptedProbe,
    ThermalPressureProbe,
    ThroughputProbe,
    default_probes,
    parse_pmset_therm,
)


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def temps(*values: float, **extra) -> list[Reading]:
    return [Reading(temperature_c=v, **extra) for v in values]


def run(gov: ThermalGovernor, clock: FakeClock, steps: int, dt: float = 2.0) -> list[Decision]:
    out = []
    for _ in range(steps):
        out.append(gov.update())
        clock.advance(dt)
    return out


PMSET_THROTTLED = """\
Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
2020-11-24 13:10:40 +0100 CPU Power notify
\tCPU_Scheduler_Limit \t= 100
\tCPU_Available_CPUs \t= 8
\tCPU_Speed_Limit \t= 35
"""
PMSET_APPLE_SILICON = """\
Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
Note: No CPU power status has been recorded
"""
PMSET_TWO_BLOCKS = """\
2020-11-24 13:10:40 +0100 CPU Power notify
\tCPU_Speed_Limit \t= 60
2020-11-24 13:12:02 +0100 CPU Power notify
\tCPU_Speed_Limit \t= 100
Thermal Warning Level = 5
"""


# --- heat-up and cool-down ---------------------------------------------------------


def test_heat_up_lowers_cap_step_by_step_to_floor_and_pauses_in_critical():
    clock = FakeClock()
    gov = ThermalGovernor([ScriptedProbe(temps(50, 72, 82, 92))], max_batch=8, clock=clock)
    d = run(gov, clock, 4)
    assert [x.state for x in d] == ["nominal", "fair", "serious", "critical"]
    assert [x.cap for x in d] == [8, 4, 2, 1]
    assert [x.pause_s for x in d[:3]] == [0.0, 0.0, 0.0]
    assert d[3].pause_s == pytest.approx(2.0)
    assert d[3].reason == "temperature 92°C ≥ 90 → critical: cap 2→1, pause 2.0s"


def test_critical_pauses_on_a_duty_cycle_not_forever():
    clock = FakeClock()
    gov = ThermalGovernor([ScriptedProbe(temps(95))], clock=clock)
    first = gov.update()
    assert first.cap == 1 and first.pause_s == pytest.approx(2.0)
    clock.advance(2.0)  # the engine slept through the pause
    after = gov.update()
    assert after.state == "critical" and after.pause_s == 0.0  # now some work at the floor
    clock.advance(3.0)
    assert gov.update().pause_s == pytest.approx(2.0)  # then the next cool-down


def test_cooling_raises_cap_additively_and_rate_limited():
    clock = FakeClock()
    probe = ScriptedProbe(temps(92) + temps(*[55] * 60))
    gov = ThermalGovernor([probe], max_batch=8, clock=clock)
    assert gov.update().cap == 1
    caps, times = [], []
    for _ in range(60):
        clock.advance(1.0)
        d = gov.update()
        caps.append(d.cap)
        times.append(d.t)
        assert d.pause_s == 0.0
    assert caps[-1] == 8
    steps = [b - a for a, b in zip([1] + caps, caps)]
    assert set(steps) <= {0, 1}  # never jumps
    rises = [t for t, s in zip(times, steps) if s == 1]
    assert all(b - a >= 5.0 for a, b in zip(rises, rises[1:]))  # balanced: +1 per 5 s at most


def test_hysteresis_keeps_state_until_clearly_cooler():
    clock = FakeClock()
    gov = ThermalGovernor([ScriptedProbe(temps(92, 88, 86))], clock=clock)
    d = run(gov, clock, 3)
    assert d[1].state == "critical" and "cooling" in d[1].reason  # 88 ≥ 90 - 3
    assert d[2].state == "serious"


def test_updates_are_rate_limited_and_pause_counts_down():
    clock = FakeClock()
    probe = ScriptedProbe(temps(95, 40))
    gov = ThermalGovernor([probe], clock=clock, min_interval_s=1.0)
    first = gov.update()
    clock.advance(0.5)
    again = gov.update()
    assert probe.calls == 1  # probes not read again within min_interval_s
    assert again.cap == first.cap and again.reason == first.reason
    assert again.pause_s == pytest.approx(first.pause_s - 0.5)
    assert len(gov.history) == 1
    assert gov.update(force=True).state == "nominal" and probe.calls == 2


def test_serious_halves_again_while_it_lasts():
    clock = FakeClock()
    gov = ThermalGovernor([ScriptedProbe(temps(50, 83))], max_batch=8, clock=clock)
    caps = [d.cap for d in run(gov, clock, 12, dt=2.0)]
    assert caps[1] == 4  # arriving in serious
    assert caps[-1] == 2  # halved once more after 15 s of serious, not every update
    assert caps.count(2) >= 3


# --- modes and battery ---------------------------------------------------------------


def test_battery_switches_auto_to_efficiency():
    clock = FakeClock()
    probe = ScriptedProbe(temps(50, 50, on_battery=False) + temps(*[50] * 30, on_battery=True))
    gov = ThermalGovernor([probe], mode="auto", max_batch=8, clock=clock)
    d = run(gov, clock, 3)
    assert d[0].mode == "balanced" and d[0].cap == 8
    assert d[2].mode == "efficiency" and d[2].cap == 2  # max(1, 8 // 4)
    assert "on battery" in d[2].reason
    assert gov.status()["mode"] == "auto" and gov.status()["effective_mode"] == "efficiency"


def test_explicit_performance_is_kept_on_battery():
    clock = FakeClock()
    probe = ScriptedProbe(temps(50, on_battery=True))
    gov = ThermalGovernor([probe], mode="performance", clock=clock)
    d = run(gov, clock, 3)
    assert all(x.mode == "performance" and x.cap == 8 for x in d)


def test_back_on_ac_grows_additively_from_efficiency_cap():
    clock = FakeClock()
    probe = ScriptedProbe(temps(50, on_battery=True) + temps(*[50] * 40, on_battery=False))
    gov = ThermalGovernor([probe], mode="auto", max_batch=8, clock=clock)
    caps = [d.cap for d in run(gov, clock, 40, dt=1.0)]
    assert caps[0] == 2 and caps[-1] == 8
    assert all(b - a in (0, 1) for a, b in zip(caps, caps[1:]))


def test_performance_holds_on_fair_efficiency_pauses_on_serious():
    clock = FakeClock()
    perf = ThermalGovernor([ScriptedProbe(temps(50, 74))], mode="performance", clock=clock)
    assert [d.cap for d in run(perf, clock, 2)] == [8, 8]
    eff = ThermalGovernor([ScriptedProbe(temps(50, 84))], mode="efficiency", clock=clock)
    d = run(eff, clock, 2)
    assert d[1].state == "serious" and d[1].cap == 1 and d[1].pause_s > 0
    bal = ThermalGovernor([ScriptedProbe(temps(50, 84))], mode="balanced", clock=clock)
    assert run(bal, clock, 2)[1].pause_s == 0.0


# --- other signals -------------------------------------------------------------------


def test_pmset_speed_limit_below_100_counts_as_throttling():
    clock = FakeClock()
    probe = ScriptedProbe([Reading(speed_limit=100), Reading(speed_limit=95)])
    gov = ThermalGovernor([probe], clock=clock)
    d = run(gov, clock, 2)
    assert d[0].state == "nominal" and d[1].state != "nominal"
    assert d[1].cap < d[0].cap and "speed limit" in d[1].reason
    # Through the real probe and parser, as on a Mac.
    pm = PmsetProbe(runner=lambda: PMSET_THROTTLED, platform="darwin", clock=clock)
    gov2 = ThermalGovernor([pm], clock=clock)
    assert gov2.update().state == "critical"  # 35 % ≤ 50


def test_macos_thermal_pressure_maps_to_states():
    clock = FakeClock()
    probe = ScriptedProbe([Reading(thermal_pressure=p) for p in (0, 1, 2, 3)])
    gov = ThermalGovernor([probe], clock=clock)
    assert [d.state for d in run(gov, clock, 4)] == list(STATES)
    assert ThermalPressureProbe(platform="linux").read() == Reading()


def test_memory_pressure_refuses_new_requests_but_leaves_cap_alone():
    clock = FakeClock()
    calm = ThermalGovernor([ScriptedProbe(temps(50, memory_pressure=0.30))], clock=clock)
    tight = ThermalGovernor([ScriptedProbe(temps(50, memory_pressure=0.90))], clock=clock)
    a, b = calm.update(), tight.update()
    assert (a.state, a.cap) == (b.state, b.cap) == ("nominal", 8)
    ok, why = tight.admit(100 << 20, 1 << 30, active_requests=2)
    assert not ok and "memory 90%" in why
    assert calm.admit(100 << 20, 1 << 30, active_requests=2)[0]
    # With nothing running there is nothing to wait for: pressure alone does not block.
    assert tight.admit(100 << 20, 1 << 30, active_requests=0)[0]


def test_memory_limit_queues_requests_that_would_exceed_it():
    gov = ThermalGovernor([ScriptedProbe([Reading()])], memory_limit_bytes=1 << 30,
                          clock=FakeClock())
    gov.update()
    ok, why = gov.admit(600 << 20, 500 << 20)
    assert not ok and "memory limit 1.0 GiB" in why
    ok, why = gov.admit(600 << 20, 500 << 20, active_requests=0)
    assert not ok and "even with nothing else running" in why
    assert gov.admit(400 << 20, 500 << 20) == (True, "fits: 900.0 MiB of limit 1.0 GiB")
    with pytest.raises(OptionError, match="-5"):
        gov.admit(-5, 0)


def test_admit_refuses_more_than_available_memory():
    probe = ScriptedProbe([Reading(memory_pressure=0.5, memory_available_bytes=200 << 20)])
    gov = ThermalGovernor([probe], clock=FakeClock())
    gov.update()
    ok, why = gov.admit(300 << 20, 0, active_requests=1)
    assert not ok and "available" in why


def test_sustained_throughput_drop_at_equal_batch_size_raises_evidence_and_state():
    clock = FakeClock()
    tp = ThroughputProbe(clock=clock)
    gov = ThermalGovernor([tp], clock=clock)
    for _ in range(8):
        tp.record(4, 100.0)
    assert tp.evidence() == 0.0
    assert gov.update().state == "nominal"
    tp.record(4, 55.0)  # one dip is noise
    assert tp.evidence() == 0.0
    for _ in range(5):
        tp.record(4, 55.0)
    assert tp.evidence() >= 0.5
    clock.advance(2.0)
    d = gov.update()
    assert d.state in ("serious", "critical") and d.cap < 8 and "throughput" in d.reason


def test_throughput_at_another_batch_size_is_not_compared():
    clock = FakeClock()
    tp = ThroughputProbe(clock=clock)
    for _ in range(8):
        tp.record(4, 100.0)
    for _ in range(8):
        tp.record(8, 60.0)  # a different batch size is a different baseline
    assert tp.evidence() == 0.0 and tp.evidence(4) == 0.0
    tp.record(2, 10.0)
    assert tp.read().throttle_evidence is None  # batch 2 has no settled history yet
    clock.advance(120.0)
    assert tp.evidence(8) is None  # stale history says nothing about now
    tp.record(4, float("nan"))  # ignored, not an error


def test_every_decision_has_a_reason():
    clock = FakeClock()
    script = (temps(40, 75, 85, 95, 95, 70, 60, 60) + [Reading(), Reading(speed_limit=70),
              Reading(memory_pressure=0.98), Reading(swap_used_ratio=0.9, memory_pressure=0.9)])
    for mode in ("performance", "balanced", "efficiency", "auto"):
        gov = ThermalGovernor([ScriptedProbe(script)], mode=mode, clock=clock)
        run(gov, clock, len(script) + 3, dt=1.5)
        assert len(gov.history) == len(script) + 3
        for t, state, cap, reason in gov.history:
            assert state in STATES and cap >= 1
            assert reason.strip() and "→" in reason and "\n" not in reason


# --- status, validation, robustness --------------------------------------------------


def test_status_reports_state_cap_reason_and_history():
    clock = FakeClock()
    gov = ThermalGovernor([ScriptedProbe(temps(50, 85)), ThroughputProbe(clock=clock)], clock=clock)
    assert gov.status()["reason"] == "no update yet"
    run(gov, clock, 2)
    s = gov.status()
    assert (s["state"], s["cap"], s["mode"]) == ("serious", 4, "balanced")
    assert s["reason"].startswith("temperature 85°C ≥ 80 → serious")
    assert s["reading"]["temperature_c"] == 85
    assert [h["state"] for h in s["history"]] == ["nominal", "serious"]
    t, state, cap, reason = gov.history[-1]
    assert (state, cap) == ("serious", 4) and t == gov.last_decision.t
    gov.record_throughput(4, 50.0)
    assert gov.status()["throughput"][4]["n"] == 1


@pytest.mark.parametrize(
    "kwargs, bad",
    [
        ({"mode": "turbo"}, "turbo"),
        ({"max_batch": 0}, "0"),
        ({"max_batch": 4, "min_batch": 5}, "5"),
        ({"min_batch": 0}, "0"),
        ({"memory_limit_bytes": -1}, "-1"),
    ],
)
def test_bad_arguments_raise_option_error_naming_the_value(kwargs, bad):
    with pytest.raises(OptionError, match=bad):
        ThermalGovernor([], **kwargs)


def test_set_mode_validates_and_applies_at_next_update():
    clock = FakeClock()
    gov = ThermalGovernor([ScriptedProbe(temps(50))], max_batch=8, clock=clock)
    assert gov.update().cap == 8
    with pytest.raises(OptionError, match="fast"):
        gov.set_mode("fast")
    gov.set_mode("efficiency")
    d = gov.update()  # no clock advance needed: a mode change is not rate-limited
    assert d.mode == "efficiency" and d.cap == 2


def test_a_failing_probe_does_not_stop_the_governor():
    class Broken:
        def read(self):
            raise RuntimeError("sensor gone")

    gov = ThermalGovernor([Broken(), ScriptedProbe(temps(85))], clock=FakeClock())
    assert gov.update().state == "serious"
    assert gov.status()["probe_errors"] == ["Broken: sensor gone"]


def test_reading_merge_keeps_the_worse_known_value():
    a = Reading(temperature_c=60, speed_limit=100, on_battery=False, memory_pressure=0.4)
    b = Reading(temperature_c=75, speed_limit=80, on_battery=True, cpu_load=0.5)
    m = a.merge(b)
    got = (m.temperature_c, m.speed_limit, m.on_battery, m.memory_pressure, m.cpu_load)
    assert got == (75, 80, True, 0.4, 0.5)
    assert Reading.combine([]) == Reading()


# --- probes on this machine and parsers ------------------------------------------------


def test_psutil_probe_reads_this_machine_without_exceptions():
    r = PsutilProbe().read()
    assert isinstance(r, Reading)
    for name in ("cpu_load", "cpu_freq_ratio", "memory_pressure", "swap_used_ratio"):
        v = getattr(r, name)
        assert v is None or 0.0 <= v <= 1.0
    assert r.memory_pressure is not None  # psutil always knows RAM on Linux and macOS
    assert r.on_battery in (None, True, False)


def test_psutil_probe_survives_missing_and_failing_sensors():
    def boom(*a, **k):
        raise OSError("no such sensor")

    fake = SimpleNamespace(
        cpu_percent=boom, cpu_freq=lambda: SimpleNamespace(current=2000.0, max=0.0),
        sensors_battery=lambda: None, virtual_memory=boom, swap_memory=boom,
    )  # no sensors_temperatures at all, as on macOS
    assert PsutilProbe(psutil_module=fake).read() == Reading()
    hot = SimpleNamespace(
        sensors_temperatures=lambda: {
            "nvme": [SimpleNamespace(current=99.0)],
            "coretemp": [SimpleNamespace(current=71.0), SimpleNamespace(current=0.0)],
        },
        sensors_battery=lambda: SimpleNamespace(percent=40, power_plugged=False),
    )
    r = PsutilProbe(psutil_module=hot).read()
    assert (r.temperature_c, r.on_battery, r.battery_percent) == (71.0, True, 40.0)


@pytest.mark.parametrize(
    "text, speed, warning",
    [
        (PMSET_THROTTLED, 35.0, 0),
        (PMSET_APPLE_SILICON, None, 0),
        (PMSET_TWO_BLOCKS, 100.0, 5),
        ("", None, None),
    ],
)
def test_pmset_parser(text, speed, warning):
    r = parse_pmset_therm(text)
    assert (r.speed_limit, r.thermal_warning) == (speed, warning)


def test_pmset_probe_is_silent_off_macos_and_on_failure():
    calls = []

    def counting() -> str:
        calls.append(1)
        return PMSET_THROTTLED

    assert PmsetProbe(runner=counting, platform="linux").read() == Reading()
    assert calls == []

    def missing():
        raise FileNotFoundError("pmset")

    assert PmsetProbe(runner=missing, platform="darwin").read() == Reading()
    clock = FakeClock()
    pm = PmsetProbe(runner=counting, platform="darwin", clock=clock)
    pm.read(), pm.read()
    assert calls == [1]  # cached for interval_s
    clock.advance(10.0)
    assert pm.read().speed_limit == 35.0 and calls == [1, 1]


def test_default_probes_on_this_platform():
    kinds = {type(p) for p in default_probes()}
    assert {PsutilProbe, ThroughputProbe} <= kinds
    gov = ThermalGovernor(max_batch=4)
    assert gov.throughput is not None
    assert gov.update().state in STATES


def test_governor_modules_do_not_import_mlx_at_module_level():
    root = Path(__file__).resolve().parents[1] / "mlotspark" / "thermal"
    for name in ("probes.py", "governor.py"):
        tree = ast.parse((root / name).read_text())
        for node in tree.body:  # module level only
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "mlx" for a in node.names), name
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "mlx", name


def test_apply_memory_limit():
    with pytest.raises(OptionError, match="0"):
        apply_memory_limit(0)
    prev = apply_memory_limit(1 << 40)
    assert prev is None or prev >= 0
    if prev:
        apply_memory_limit(prev)
