"""The scheduler's side of the thermal governor: configuration, memory, throughput.

- ``SchedulerConfig``: mode, max batch and memory limit (``Engine.load``, CLI flags).
- ``parse_memory_limit`` and ``kv_bytes_per_token``: what the memory guard projects.
- ``ThroughputMeter``: turns decode steps into the ~1 s throughput samples the
  governor's ``ThroughputProbe`` reads as throttle evidence.
- ``governor_snapshot``: a fresh governor's decision, for ``mlotspark info``.
- ``memory_status``: which memory signal and KV budget are in force (``platform.memory``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlotspark.errors import OptionError
from mlotspark.platform.dtypes import activation_dtype
from mlotspark.platform.memory import apply_memory_limit, memory_budget
from mlotspark.thermal.governor import MODES, POLICIES, ThermalGovernor
from mlotspark.units import parse_bytes

__all__ = ["SchedulerConfig", "ThroughputMeter", "activation_dtype", "governor_snapshot", "kv_bytes_per_token",
           "memory_status", "parse_memory_limit"]

WINDOW_S = 1.0  # decode time per throughput sample (ThroughputProbe wants ~1 s)
FAIR_SHARE = 0.8  # a window with less CPU time than this share of the best is contention


def parse_memory_limit(value: int | str | None) -> int | None:
    """Bytes from ``4GB``, ``512MiB``, ``1.5g`` or an integer (``units.parse_bytes``);
    None stays None.

    Raises:
        OptionError: an unparsable or non-positive size.
    """
    return None if value is None else parse_bytes(value, "memory limit")


def kv_bytes_per_token(model: Any) -> int:
    """KV bytes one token costs in a plain cache (keys + values over all layers), at
    the activation dtype (:func:`activation_dtype`)."""
    args = getattr(model, "args", None)
    try:
        layers = len(model.layers)
        heads = args.num_key_value_heads or args.num_attention_heads
        head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
        itemsize = activation_dtype(model).size
    except (AttributeError, TypeError):
        return 0
    return 2 * layers * heads * head_dim * itemsize


@dataclass(frozen=True)
class SchedulerConfig:
    """How the engine schedules requests; ``Engine.load`` and the CLI set it.

    Args:
        mode: governor mode, ``auto`` (default: balanced on AC, efficiency on
            battery), ``performance``, ``balanced`` or ``efficiency``.
        max_batch: most sequences decoded together (default 8).
        memory_limit: projected KV + weights stay under this many bytes, also
            given to ``mx.set_memory_limit`` (default None: no limit). Accepts
            ``"8GB"`` style strings.
        governor: a ready ThermalGovernor (tests, benchmarks); overrides the above.

    The mode wins over ``max_batch``: efficiency decodes at most ``max_batch // 4``
    sequences together (at least 1), as the user's power policy asks; ``mode_cap``
    says how many, and the CLI says so once when it lowers a ``--max-batch`` given.
    """

    mode: str = "auto"
    max_batch: int = 8
    memory_limit: int | str | None = None
    governor: ThermalGovernor | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise OptionError(f"invalid mode {self.mode!r}: choose one of {', '.join(MODES)}")
        mb = self.max_batch
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
            raise OptionError(f"invalid max_batch {mb!r}: must be an integer >= 1")
        object.__setattr__(self, "memory_limit", parse_memory_limit(self.memory_limit))

    def mode_cap(self) -> int:
        """The most sequences the mode lets decode together (``auto``: as on AC power)."""
        mode = "balanced" if self.mode == "auto" else self.mode
        return max(1, self.max_batch // POLICIES[mode].cap_divisor)

    def make_governor(self) -> ThermalGovernor:
        """The governor this config describes (the given one, if any).

        A memory limit also goes to MLX's allocator (``mx.set_memory_limit``); a
        given governor's limit does not, so tests never shrink the process's limit.
        """
        if self.governor is not None:
            return self.governor
        if self.memory_limit is not None:
            apply_memory_limit(self.memory_limit)
        # On Metal with no limit given, weights + KV stay inside the recommended working
        # set (the pool both live in); elsewhere the system's available memory decides.
        limit = memory_budget(limit_bytes=self.memory_limit).admission_limit_bytes
        return ThermalGovernor(mode=self.mode, max_batch=self.max_batch,
                               memory_limit_bytes=limit)

    def kv_ceiling(self, model: Any, context_length: int) -> int:
        """The most KV the engine can hold: ``max_batch`` full contexts (what to wire)."""
        return kv_bytes_per_token(model) * int(context_length) * max(self.max_batch, 1)


class ThroughputMeter:
    """Aggregate decode rate per batch size, handed to the governor about once a second.

    Args:
        governor: receives ``record_throughput(batch, tok/s, context)``.
        cpu_backend: True on MLX's CPU backend, where windows in which other
            processes took the cores are left out (see :meth:`had_the_cpu`).
    """

    def __init__(self, governor: ThermalGovernor, cpu_backend: bool):
        self.governor = governor
        self.cpu_backend = cpu_backend
        self.batch = 0
        self.tokens, self.time_s, self.cpu_s = 0, 0.0, 0.0
        self.context: int | None = None  # the longest context decoded in the window
        self.last_tps = 0.0  # the last window's rate, recorded or not
        self.best_share = 0.0  # most CPU seconds per second of decoding seen

    def add(self, batch: int, step_s: float, cpu_s: float, context: int | None = None) -> None:
        """Count one decode step of ``batch`` sequences (one token each), the longest
        of them ``context`` tokens long (a longer context is slower, not hotter)."""
        if batch != self.batch:
            self.flush(force=True)  # a sample covers one batch size only
            self.batch = batch
        if context is not None:
            self.context = max(self.context or 0, int(context))
        self.tokens += batch
        self.time_s += step_s
        self.cpu_s += cpu_s
        self.flush()

    def flush(self, force: bool = False) -> None:
        """Record the window once it holds a second of decoding (half, when forced)."""
        enough = self.time_s >= WINDOW_S or (force and self.time_s >= WINDOW_S / 2)
        if enough and self.tokens:
            self.last_tps = self.tokens / self.time_s
            if self.had_the_cpu():
                self.governor.record_throughput(self.batch, self.last_tps, self.context)
        if enough or force:
            self.reset()

    def had_the_cpu(self) -> bool:
        """False when other processes took the CPU during the window (CPU backend).

        Time-sharing the cores slows decoding as heat does, but shrinking the batch
        or pausing would not help: such a window is no throttle evidence. A hot chip
        runs slower while the process keeps its share of CPU time.
        """
        if not self.cpu_backend or self.time_s <= 0:
            return True
        share = self.cpu_s / self.time_s
        self.best_share = max(self.best_share, share)
        return share >= FAIR_SHARE * self.best_share

    def reset(self) -> None:
        """Drop the current window (after a pause: it says nothing about speed)."""
        self.tokens, self.time_s, self.cpu_s = 0, 0.0, 0.0
        self.context = None


def governor_snapshot(mode: str = "auto", max_batch: int = 8) -> dict[str, Any]:
    """What a fresh governor decides on this machine now (``mlotspark info``, no model).

    Returns:
        ``state``, ``cap``, ``mode`` (effective), ``reason``.
    """
    d = ThermalGovernor(mode=mode, max_batch=max_batch).update(force=True)
    return {"state": d.state, "cap": d.cap, "mode": d.mode, "reason": d.reason}


def memory_status(model: Any = None, weights_bytes: int = 0, memory_limit: int | None = None,
                  platform: str | None = None) -> dict[str, Any]:
    """Which memory signal and budget are in force, for ``info`` and the engine's status.

    Args:
        model: the loaded model (for the KV dtype and bytes per token), or None.
        weights_bytes: its weights' bytes.
        memory_limit: the user's limit, if any.
        platform: ``sys.platform`` by default.

    Returns:
        ``signal``, ``source``, ``kv_budget_bytes``, ``admission_limit_bytes``, ``line``
        and, with a model, ``kv_dtype`` and ``kv_bytes_per_token``.
    """
    b = memory_budget(weights_bytes, memory_limit, platform=platform)
    out: dict[str, Any] = {"signal": b.signal, "source": b.source, "kv_budget_bytes": b.kv_bytes,
                           "admission_limit_bytes": b.admission_limit_bytes, "line": b.describe()}
    if model is not None:
        out["kv_dtype"] = str(activation_dtype(model)).split(".")[-1]
        out["kv_bytes_per_token"] = kv_bytes_per_token(model)
    return out
