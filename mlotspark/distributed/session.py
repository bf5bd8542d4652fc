"""What an Engine holds when it runs across ranks: the setup, rank 0's leader, the follow loop."""

from __future__ import annotations

import time
from typing import Any

from mlotspark.errors import DistributedError, OptionError
from mlotspark.options import GenerationOptions
from mlotspark.thermal.probes import Probe
from mlotspark.distributed.follower import Follower, MakeGeneration
from mlotspark.distributed.leader import STATUS_INTERVAL_S, RankLeader
from mlotspark.distributed.loading import DistributedSetup
from mlotspark.distributed.protocol import DEFAULT_TIMEOUT_S
from mlotspark.distributed.rank_memory import RankMemory
from mlotspark.distributed.rank_status import THERMAL_STATES, RankStatus, RemoteProbe, hottest


class DistributedSession:
    """The engine's side of a multi-rank run.

    Rank 0 runs the engine's ordinary scheduler (continuous batching under the thermal
    governor) with a ``RankLeader`` as its step mirror (``attach``); the other ranks
    call ``follow``.

    Args:
        setup: how the model is spread (``LoadedModel.extra["distributed"]``).
        model: this rank's share of the model.
        weights_bytes: this rank's resident weight bytes.
        timeout: seconds without progress before rank 0 gives up on the others.
        identity: (fingerprint, weight format, model name): what this rank's snapshots must match.
        probes: what this rank reads its heat from (default: the platform's probes).
    """

    def __init__(self, setup: DistributedSetup, model: Any, weights_bytes: int, timeout: float = DEFAULT_TIMEOUT_S,
                 identity: tuple[str, str, str] = ("", "", ""), probes: list[Probe] | None = None):
        self.setup, self.model = setup, model
        self.status = RankStatus(setup.group, setup.layers[setup.rank], weights_bytes, probes)
        fingerprint, weights, name = identity
        self.memory = RankMemory(setup.layers[setup.rank], fingerprint, weights, name)
        self.timeout = timeout
        self.leader: RankLeader | None = None
        self._scheduler: Any = None
        if setup.rank == 0:
            self.leader = RankLeader(setup.group, model, self.status, timeout)

    @property
    def rank(self) -> int:
        return self.setup.rank

    @property
    def size(self) -> int:
        return self.setup.size

    @property
    def failed(self) -> DistributedError | None:
        """The error that stopped the ranks, if any (rank 0)."""
        return None if self.leader is None else self.leader.failed

    def attach(self, scheduler: Any) -> None:
        """Rank 0: run through ``scheduler`` (made with ``mirror=self.leader``): its governor
        also reads the other ranks' probes, and a watchdog failure aborts it."""
        leader = self._leader()
        self._scheduler = scheduler
        leader.on_broken = scheduler.abort
        scheduler.governor.probes.append(RemoteProbe(lambda: leader.last_ranks))

    def check_request(self, options: GenerationOptions, cache: Any, cache_key: str | None = None) -> None:
        """Refuse what a multi-rank run does not do, naming it.

        Raises:
            DistributedError: the ranks failed or rank 0 closed.
            OptionError: beams, several returns, speculative decoding, a KV cache kind,
                or a cache passed in without the conversation it belongs to (the other
                ranks find their share of a cache by that name).
        """
        self._leader().check()
        if cache is not None and cache_key is None:
            raise OptionError("a cache passed in without its cache_key (a prefix cache) does not run across "
                              "ranks: the other ranks keep their share of a cache by conversation")
        for name, value, off in (("num_beams", options.num_beams, 1),
                                 ("num_return_sequences", options.num_return_sequences, 1),
                                 ("speculative", options.speculative, None),
                                 ("cache_kind", options.cache_kind, None)):
            if value != off:
                raise OptionError(f"{name}={value!r} does not run across ranks (distributed runs decode in one batch)")

    def _leader(self) -> RankLeader:
        if self.leader is None:
            raise DistributedError(f"rank {self.rank} takes requests from rank 0: call Engine.follow() there")
        return self.leader

    def follow(self, make_generation: MakeGeneration, local_cascade: Any = None) -> int:
        """Ranks but 0: run rank 0's steps until it closes; returns how many requests ended here.

        Args:
            make_generation: ``(ids, options, cascade config or None, cache, cached) -> Generation``.
            local_cascade: this rank's CascadeConfig, if any (its spill directory is kept).
        """
        if self.leader is not None:
            raise DistributedError("rank 0 leads: submit requests there, follow() is for the other ranks")
        return Follower(self.setup.group, self.model, make_generation, self.status, local_cascade,
                        self.memory).run()

    def ranks_status(self) -> list[dict]:
        """Rank 0: every rank's memory, thermal state and last step time, in rank order.

        The figures every rank sent within the last second (at the end of a request, or
        in the turn-by-turn refresh that feeds the governor), with rank 0's own read now;
        older ones are asked for again, between two steps on the engine thread.
        """
        if self.leader is None:
            return [self.status.read()]
        leader = self.leader
        fresh = time.monotonic() - leader.status_t < STATUS_INTERVAL_S
        if leader.failed is None and not fresh and self._scheduler is not None:
            try:
                return self._scheduler.call(leader.gather_status)
            except DistributedError:
                pass  # the figures heard last, below
        return [self.status.read(), *leader.last_ranks[1:]]

    def scheduler_status(self, base: dict) -> dict:
        """Rank 0's ``Scheduler.status()`` across ranks: ``base`` with every rank's figures
        (``ranks``); the state and reason are the hottest rank's when it is hotter than
        what the governor last decided (it reads every rank's probes, at most once a second)."""
        ranks = self.ranks_status()
        state, reason = hottest(ranks)
        out = dict(base, ranks=ranks, mode=f"distributed {self.setup.mode} · {base.get('mode', '')}".rstrip(" ·"))
        if THERMAL_STATES.index(state) >= THERMAL_STATES.index(base.get("state", "nominal")):
            out["state"] = state
        out["reason"] = f"{reason}; {base['reason']}" if base.get("reason") else reason
        return out

    def close(self) -> None:
        """Rank 0: let the other ranks return from ``follow`` (call once the engine thread is done)."""
        if self.leader is not None:
            self.leader.stop()
