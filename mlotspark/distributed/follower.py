"""Every rank but 0: run the steps rank 0 broadcasts, on this rank's share of the model.

A follower keeps, per request rank 0 has in flight, the cache of its own layers and
the counters the batched steps read (``FollowerSequence``), and one ``DecodeBatch``:
the same ``runtime`` code as rank 0 runs, on the same ids in the same order, so the
packed KV buffers, chunk lengths and row order come out the same on every rank. It
never samples, never builds a logits processor (a ``response_format`` grammar is
rank 0's alone) and never decides when a request ends: rank 0 says so.

A follower that lacks its share of a conversation (no snapshot, a damaged one, other
layers) says so when the request joins; when rank 0 has the conversation's token ids,
every rank replays them (``protocol.replay``) and the lacking ones rebuild their share
instead of failing the turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlotspark.errors import DistributedError, MlotsparkError, SnapshotError
from mlotspark.memory.cascade import CascadeConfig
from mlotspark.options import GenerationOptions
from mlotspark.runtime.batching import DecodeBatch, is_plain_kv
from mlotspark.runtime.generation import Generation
from mlotspark.runtime.prefill import prefill_batch, prefill_chunk
from mlotspark.runtime.sequence import Sequence
from mlotspark.distributed.group import RankGroup, is_rank_failure
from mlotspark.distributed.protocol import cascade_from_message, fresh_cache, join_plan, replay
from mlotspark.distributed.rank_memory import RankMemory
from mlotspark.distributed.rank_status import RankStatus

#: ``(prompt ids, options, cascade config or None, cache or None, cached tokens) -> Generation``:
#: a follower's request (the cache, when given, is its share of a conversation).
MakeGeneration = Callable[[list[int], GenerationOptions, "CascadeConfig | None", "list | None", int], Generation]


class FollowerSequence(Sequence):
    """A follower's side of one request: what ``prefill_batch`` and ``DecodeBatch`` read.

    ``Sequence``'s own set-up (sampler, logits processors, detokenizer, stop strings) is
    rank 0's work and is skipped: the rows decode greedily over the zero logits a
    follower's share returns, and their tokens are never used.

    Args:
        gen: the follower's Generation (prompt, this rank's cache, prefill chunk).
    """

    def __init__(self, gen: Generation):  # noqa: D107 - no super().__init__: see the class docstring
        self.request = gen
        self.prompt, self.cache, self.options = gen.prompt, gen.cache, gen.options
        self.tokens: list[int] = []
        self.fed_tokens: list[int] = list(gen.prompt)
        self.eos: set[int] = set()
        self.sampler = None
        self.greedy = True
        self.processors: list = []
        self.max_tokens = gen.options.max_tokens
        self.prefilled = 0
        self.decoded = False
        self.plain = is_plain_kv(gen.cache)
        self.lazy_input = None
        self.finish = None
        self.t_start, self.t_first = time.perf_counter(), None
        self.steps = 0
        self.batch_sizes = 0
        self.meter = None


@dataclass
class _Share:
    """A request in flight on this rank."""

    seq: FollowerSequence
    key: str | None  # the conversation whose share this rank keeps, if any
    context: list[int]  # token ids the cache held before the prompt


class Follower:
    """The loop of every rank but 0 (see the module docstring).

    Args:
        group: the rank group (this process is not rank 0).
        model: this rank's share of the model.
        make_generation: builds a Generation for this rank's share of a request.
        status: this rank's RankStatus.
        local_cascade: this rank's own cascade config, for its spill directory.
        memory: this rank's share of the conversations.
    """

    def __init__(self, group: RankGroup, model: Any, make_generation: MakeGeneration, status: RankStatus,
                 local_cascade: "CascadeConfig | None" = None, memory: RankMemory | None = None):
        self.group, self.model, self.make_generation = group, model, make_generation
        self.status, self.local_cascade, self.memory = status, local_cascade, memory
        self.shares: dict[int, _Share] = {}
        self.batch = DecodeBatch(model)
        self.done = 0

    def run(self) -> int:
        """Run rank 0's steps until it says stop.

        Returns:
            How many requests ended on this rank.

        Raises:
            DistributedError: rank 0 (or a neighbour) is gone, or sent what this rank cannot follow.
        """
        ops = {"join": self._join, "prefill": self._prefill, "decode": self._decode, "leave": self._leave,
               "drop": self._drop, "reset": self._reset, "status": self._status, "idle": self._idle}
        while True:
            msg = self.group.broadcast_json(None)
            op = msg.get("op")
            if op == "stop":
                return self.done
            if op not in ops:
                raise DistributedError(f"rank {self.group.rank} got an unknown message {op!r} from rank 0")
            try:
                ops[op](msg)
            except RuntimeError as e:
                if is_rank_failure(e):
                    raise DistributedError(f"rank {self.group.rank} lost the connection to another rank ({e})") from e
                raise

    # ------------------------------------------------------------------ ops
    def _join(self, msg: dict) -> None:
        mem = msg.get("memory")
        cascade = cascade_from_message(msg.get("cascade"), self.local_cascade)
        answer: dict = {"ok": True}
        gen, context, cache = None, [], None
        try:
            # Only what shapes this rank's work: sampling options are rank 0's.
            opts = GenerationOptions(temperature=0.0, prefill_chunk=int(msg["chunk"]),
                                     max_tokens=int(msg["max_tokens"]))
            if mem is not None and int(mem["cached"]) > 0:  # a continued conversation (else a fresh cache)
                if self.memory is None:
                    raise DistributedError(f"rank {self.group.rank} keeps no conversations (follow without memory)")
                try:
                    context, cache = self.memory.take(mem["key"], int(mem["cached"]), mem["kind"])
                except SnapshotError as e:  # rebuilt from the tokens if rank 0 has them
                    answer = {"ok": False, "lacks": True, "error": str(e)}
            gen = self.make_generation(list(msg["prompt"]), opts, cascade, cache, len(context))
        except MlotsparkError as e:
            answer = {"ok": False, "lacks": False, "error": str(e)}
        plan, lacking, _ = join_plan(self.group.gather_json(answer), bool(msg.get("replayable")))
        if plan == "refuse":  # rank 0 fails the request; a share taken from memory stays for the next turn
            if cache is not None and self.memory is not None:
                self.memory.keep(mem["key"], context, cache, save=False)
            return
        assert gen is not None  # every rank that could not make one refused
        if plan == "replay":
            tokens = self.group.broadcast_json(None)
            mine = self.group.rank in lacking
            replay(self.model, gen.cache if mine else fresh_cache(self.model, cascade), tokens, gen.options.prefill_chunk)
            if mine:
                context = list(tokens)
        self.shares[int(msg["id"])] = _Share(FollowerSequence(gen), mem["key"] if mem else None, context)

    def _prefill(self, msg: dict) -> None:
        seqs = self._seqs(msg["ids"])
        t0 = time.perf_counter()
        if msg["batched"]:
            prefill_batch(self.model, seqs)
        else:
            prefill_chunk(self.model, seqs[0])
        self.status.last_step_ms = round((time.perf_counter() - t0) * 1000, 2)

    def _decode(self, msg: dict) -> None:
        t0 = time.perf_counter()
        self.batch.collect(self.batch.launch(self._seqs(msg["ids"])))
        self.status.last_step_ms = round((time.perf_counter() - t0) * 1000, 2)

    def _leave(self, msg: dict) -> None:
        share = self.shares.pop(int(msg["id"]))
        self.batch.release(share.seq, write_back=True)
        seq = share.seq
        # What this rank's cache holds now: the same tokens as rank 0's (the same steps ran).
        fed = (list(seq.prompt) + list(msg["extra"]))[: int(msg["fed"])]
        saved = None
        if share.key is not None and self.memory is not None:
            saved = self.memory.keep(share.key, share.context + fed, seq.cache, bool(msg["save"]))
        self.group.gather_json({"saved": saved, "status": self.status.read()})
        self.done += 1

    def _drop(self, msg: dict) -> None:
        share = self.shares.pop(int(msg["id"]), None)
        if share is not None:
            self.batch.release(share.seq, write_back=False)

    def _reset(self, msg: dict) -> None:
        self.shares.clear()
        self.batch = DecodeBatch(self.model)

    def _idle(self, msg: dict) -> None:
        """Rank 0 has nothing to do: sleep its beat rather than poll for its next message."""
        time.sleep(min(max(float(msg["sleep_s"]), 0.0), 1.0))

    def _status(self, msg: dict) -> None:
        self.group.gather_json(self.status.read())

    def _seqs(self, ids: list[int]) -> list[FollowerSequence]:
        try:
            return [self.shares[int(i)].seq for i in ids]
        except KeyError as e:
            raise DistributedError(f"rank {self.group.rank} holds no request {e.args[0]} that rank 0 steps") from None
