"""What an Engine holds when it runs across ranks: the setup, the runner, the follow loop."""

from __future__ import annotations

from typing import Any, Callable

from mlotspark.errors import DistributedError, OptionError
from mlotspark.options import GenerationOptions
from mlotspark.runtime.generation import Generation
from mlotspark.runtime.request_handle import RequestHandle
from mlotspark.distributed.loading import DistributedSetup
from mlotspark.distributed.rank_memory import RankMemory
from mlotspark.distributed.runner import (DEFAULT_TIMEOUT_S, THERMAL_STATES, LeaderRunner, MakeGeneration,
                                          RankRequest, RankStatus, follow)


class DistributedSession:
    """The engine's side of a multi-rank run.

    Args:
        setup: how the model is spread (``LoadedModel.extra["distributed"]``).
        weights_bytes: this rank's resident weight bytes.
        timeout: seconds without progress before rank 0 gives up on the others.
        identity: (fingerprint, weight format, model name): what this rank's snapshots must match.
    """

    def __init__(self, setup: DistributedSetup, weights_bytes: int, timeout: float = DEFAULT_TIMEOUT_S,
                 identity: tuple[str, str, str] = ("", "", "")):
        self.setup = setup
        self.status = RankStatus(setup.group, setup.layers[setup.rank], weights_bytes)
        fingerprint, weights, model = identity
        self.memory = RankMemory(setup.layers[setup.rank], fingerprint, weights, model)
        self.timeout = timeout
        self._runner: LeaderRunner | None = None
        if setup.rank == 0:
            self._runner = LeaderRunner(setup.group, self.status, timeout)

    @property
    def rank(self) -> int:
        return self.setup.rank

    @property
    def size(self) -> int:
        return self.setup.size

    @staticmethod
    def check_request(options: GenerationOptions, cache: Any, cache_key: str | None = None) -> None:
        """Refuse what a multi-rank run does not do yet, naming it.

        Raises:
            OptionError: beams, several returns, speculative decoding, a KV cache kind,
                or a cache passed in without the conversation it belongs to (the other
                ranks find their share of a cache by that name).
        """
        if cache is not None and cache_key is None:
            raise OptionError("a cache passed in without its cache_key (a prefix cache) does not run across "
                              "ranks: the other ranks keep their share of a cache by conversation")
        for name, value, off in (("num_beams", options.num_beams, 1),
                                 ("num_return_sequences", options.num_return_sequences, 1),
                                 ("speculative", options.speculative, None),
                                 ("cache_kind", options.cache_kind, None)):
            if value != off:
                raise OptionError(f"{name}={value!r} does not run across ranks yet (distributed runs decode plainly)")

    def submit(self, gen: Generation, request: RankRequest | None = None) -> RequestHandle:
        """Rank 0: queue a request for every rank (``request``: its conversation, ``on_finish``)."""
        return self._leader().submit(gen, request)

    def run(self, fn: Callable[[], Any]) -> Any:
        """Rank 0: run ``fn()`` on the thread that runs MLX (snapshot restores, trims)."""
        return self._leader().run(fn)

    def _leader(self) -> LeaderRunner:
        if self._runner is None:
            raise DistributedError(f"rank {self.rank} takes requests from rank 0: call Engine.follow() there")
        return self._runner

    def follow(self, make_generation: MakeGeneration, local_cascade: Any = None) -> int:
        """Ranks but 0: run rank 0's requests until it closes; returns how many ran.

        Args:
            make_generation: ``(ids, options, cascade config or None) -> Generation``.
            local_cascade: this rank's CascadeConfig, if any (its spill directory is kept).
        """
        if self._runner is not None:
            raise DistributedError("rank 0 leads: submit requests there, follow() is for the other ranks")
        return follow(self.setup.group, make_generation, self.status, local_cascade, self.memory)

    def ranks_status(self) -> list[dict]:
        """Rank 0: every rank's memory, thermal state and last step time, in rank order.

        Asked of every rank when they are idle; while a request runs (the ranks are busy
        in its collectives) the figures every rank sent at the end of the last request,
        with rank 0's own read now.
        """
        if self._runner is None:
            return [self.status.read()]
        if self._runner.busy and self._runner.last_ranks:
            return [self.status.read(), *self._runner.last_ranks[1:]]
        if self._runner.busy:
            return [self.status.read()]  # nothing heard from the others yet
        return self._runner.call("status")

    def scheduler_status(self) -> dict:
        """Rank 0's stand-in for ``Scheduler.status()`` across ranks.

        The state is the hottest rank's (every rank reads its own probes), since the
        slowest machine paces every token; requests run one at a time (cap 1).

        Returns:
            ``state``, ``mode``, ``cap``, ``batch_size``, ``queued``, ``reason``, ``ranks``.
        """
        ranks = self.ranks_status()
        hottest = max(ranks, key=lambda r: THERMAL_STATES.index(r.get("thermal", "nominal")))
        busy = self._runner is not None and self._runner.busy
        reason = f"hottest: rank {hottest['rank']} ({hottest['host']}) {hottest['thermal']}"
        if hottest.get("thermal_reason"):
            reason += f": {hottest['thermal_reason']}"
        return {"state": hottest["thermal"], "mode": f"distributed {self.setup.mode}", "cap": 1,
                "batch_size": 1 if busy else 0, "queued": 0, "reason": reason, "ranks": ranks}

    def close(self) -> None:
        """Rank 0: let the other ranks return from ``follow``."""
        if self._runner is not None:
            self._runner.close()
