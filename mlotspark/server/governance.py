"""One memory budget and one thermal governor for every model a server holds.

Each resident model has its own engine and scheduler, but they share one machine: a
:class:`SharedGovernor` holds the machine's memory budget and the one
:class:`~mlotspark.thermal.governor.ThermalGovernor`, and hands each engine a
:class:`GovernorShare` in place of a governor of its own (``Engine.load(governor=...)``).

- Memory: the weights of every resident model are counted once each; what is left of the
  budget is split evenly into the engines' KV budgets, so an engine's share is
  ``(budget - all resident weights) / resident models`` and shrinks when another model
  loads (running requests are never cut: the share gates admissions only). A model fits
  when all weights plus ``min_kv_bytes`` of KV per resident model stay within the budget.
- Heat: one governor reads the probes, one thermal state, one cool-down pause for all; its
  batch cap is the machine's, split among the engines that have requests in flight. Decode
  rates reach its throughput probe only from the first engine while it runs alone: another
  model's rate, or one slowed by a neighbour, would read as throttling.

This module never imports mlx.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

from mlotspark.units import fmt_bytes

MIN_KV_BYTES = 64 << 20  # the least KV a resident model is left (a few thousand tokens of a small model)


@dataclass(frozen=True)
class Fit:
    """Whether a model of ``need_bytes`` fits beside the resident ones, and the one-line why."""

    ok: bool
    line: str


class GovernorShare:
    """One engine's governor: the shared thermal governor, and its own share of the budget.

    Passed as ``Engine.load(governor=...)``; the scheduler calls ``update``, ``admit``,
    ``status`` and ``record_throughput`` as on a ThermalGovernor; anything else is the
    shared governor's.
    """

    def __init__(self, shared: "SharedGovernor", name: str):
        self.shared, self.name = shared, name
        self.weights_bytes = 0
        self.resident = False
        self.active = 0  # requests in flight on this engine (the pool counts them)

    def __getattr__(self, attr: str) -> Any:  # probes, throughput, mode_max ... of the one governor
        if attr == "shared":  # not set yet (copies): no recursion
            raise AttributeError(attr)
        return getattr(self.shared.governor, attr)

    def kv_budget(self) -> int:
        return self.shared.kv_share()

    def update(self, force: bool = False) -> Any:
        d = self.shared.governor.update(force)
        return replace(d, cap=self.shared.cap_of(d.cap))

    def admit(self, projected_bytes: int, in_use_bytes: int, active_requests: int | None = None) -> tuple[bool, str]:
        """This engine's KV share first, then the shared governor (system memory pressure)."""
        kv = max(0, in_use_bytes - self.weights_bytes)
        share = self.kv_budget()
        if kv + projected_bytes > share:
            alone = " even with nothing else running" if active_requests == 0 else ""
            return False, (f"model {self.name}: needs {fmt_bytes(projected_bytes)} + {fmt_bytes(kv)} KV in use > "
                           f"its KV share {fmt_bytes(share)} ({self.shared.describe()}){alone}: waits")
        return self.shared.governor.admit(projected_bytes, in_use_bytes, active_requests)

    def record_throughput(self, batch_size: int, tokens_per_s: float, context: int | None = None) -> None:
        if self.shared.feeds_throughput(self):
            self.shared.governor.record_throughput(batch_size, tokens_per_s, context)

    def status(self, last: int = 20) -> dict[str, Any]:
        out = dict(self.shared.governor.status(last))
        out["cap"] = self.shared.cap_of(out["cap"])
        out["kv_budget_bytes"] = self.kv_budget()
        out["memory_budget_bytes"] = self.shared.budget_bytes
        return out


class SharedGovernor:
    """The machine's memory budget and thermal governor, shared by every resident model.

    Args:
        governor: the one ThermalGovernor (built with no memory limit: the shares enforce it).
        budget_bytes: what weights + KV of every resident model may take together.
        min_kv_bytes: the least KV a resident model must be left for it to fit.
    """

    def __init__(self, governor: Any, budget_bytes: int, *, min_kv_bytes: int = MIN_KV_BYTES):
        self.governor = governor
        self.budget_bytes = int(budget_bytes)
        self.min_kv_bytes = int(min_kv_bytes)
        self.shares: list[GovernorShare] = []
        self._lock = threading.Lock()

    def share(self, name: str) -> GovernorShare:
        """A new engine's governor (not resident until :meth:`settle`)."""
        s = GovernorShare(self, name)
        with self._lock:
            self.shares.append(s)
        return s

    def resident(self) -> list[GovernorShare]:
        return [s for s in self.shares if s.resident]

    def settle(self, share: GovernorShare, weights_bytes: int) -> None:
        """``share``'s model is loaded, its weights ``weights_bytes``."""
        share.weights_bytes, share.resident = int(weights_bytes), True

    def leave(self, share: GovernorShare) -> None:
        """``share``'s model was unloaded: its weights and KV share go back to the others."""
        share.resident, share.weights_bytes = False, 0

    def weights(self) -> int:
        return sum(s.weights_bytes for s in self.resident())

    def kv_share(self) -> int:
        """Each resident engine's KV budget: (budget - all resident weights) / resident models."""
        n = max(1, len(self.resident()))
        return max(0, self.budget_bytes - self.weights()) // n

    def describe(self) -> str:
        n = len(self.resident())
        return (f"memory budget {fmt_bytes(self.budget_bytes)} - weights {fmt_bytes(self.weights())} "
                f"of {n} resident model{'s' * (n != 1)}, split {max(n, 1)} way{'s' * (n > 1)}")

    def fits(self, name: str, need_bytes: int, without: tuple[GovernorShare, ...] = ()) -> Fit:
        """Whether ``name`` (weights ``need_bytes``) fits beside the resident models, ``without``
        those (candidates to unload), each left at least ``min_kv_bytes`` of KV."""
        others = [s for s in self.resident() if s not in without and s.name != name]
        weights = sum(s.weights_bytes for s in others)
        reserve = self.min_kv_bytes * (len(others) + 1)
        total = need_bytes + weights + reserve
        line = (f"model '{name}' needs {fmt_bytes(need_bytes)} of weights; with {len(others)} resident "
                f"model{'s' * (len(others) != 1)} ({fmt_bytes(weights)}) and {fmt_bytes(reserve)} of KV "
                f"({fmt_bytes(self.min_kv_bytes)} each) that is {fmt_bytes(total)} > the memory budget "
                f"{fmt_bytes(self.budget_bytes)}")
        return Fit(total <= self.budget_bytes, line)

    def busy(self) -> int:
        """Engines with requests in flight."""
        return sum(1 for s in self.resident() if s.active > 0)

    def cap_of(self, cap: int) -> int:
        """One engine's batch cap: the machine's, split among the busy engines."""
        floor = getattr(self.governor, "min_batch", 1)
        return max(floor, cap // max(1, self.busy()))

    def feeds_throughput(self, share: GovernorShare) -> bool:
        """Only the first engine's rates, taken while no other engine has work, reach the probe."""
        resident = self.resident()
        return bool(resident) and resident[0] is share and all(s.active == 0 for s in resident[1:])

    def status(self) -> dict[str, Any]:
        """For ``/health``: the budget, each resident model's weights and the KV share."""
        return {"budget_bytes": self.budget_bytes, "weights_bytes": self.weights(), "kv_share_bytes": self.kv_share(),
                "min_kv_bytes": self.min_kv_bytes, "busy_engines": self.busy(),
                "models": {s.name: s.weights_bytes for s in self.resident()}}


def machine_budget(memory_limit: int | None = None, *, read: Callable[..., Any] | None = None) -> int:
    """The server's memory budget: the user's limit, else Metal's recommended working set,
    else the memory available now (read before any model loads, so their weights count in it)."""
    if read is None:
        from mlotspark.platform.memory import memory_budget as read
    return int(read(0, memory_limit).pool_bytes)


__all__ = ["Fit", "GovernorShare", "MIN_KV_BYTES", "SharedGovernor", "machine_budget"]
