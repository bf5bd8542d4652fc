"""``CascadeConfig``: the sizes and policies of the working + episodic memory tiers.

One validated, frozen record. ``CascadeConfig.for_model(context_length)`` gives the
defaults for a model; every field can be overridden (``dataclasses.replace``, or the
CLI flags ``--window --sinks --block-size --top-k-blocks --routing --block-kind``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import mlx.core as mx

from mlotspark.errors import OptionError

ROUTINGS = ("sequence", "rolling", "token", "hybrid", "question")
BLOCK_KINDS = ("auto", "float16", "q8", "q4")
REPRESENTATIONS = ("minmax", "mean", "keys")

#: Pieces a prefill chunk is attended in on the CPU, chosen by measurement
#: (measured: 4k tokens in forward passes of 2048,
#: pieces of 256 / 512 / 1024 / 2048 = 119 / 115 / 101 / 76 tok/s). Attention is most
#: of a piece's cost on the CPU and grows with the keys each query sees (sinks +
#: blocks + window + the piece), so shorter pieces win while each piece's fixed
#: work (routing, context rebuild) stays small next to it.
CPU_CHUNK = 256


@dataclass(frozen=True)
class CascadeConfig:
    """Working memory (sinks + window) and episodic memory (retrieved blocks).

    The attended context of every token is at most
    ``sinks + top_k * block_size + window + chunk`` keys, at contiguous positions
    starting at 0, so it must stay below the model's trained context
    (``for_model`` checks it).

    Args:
        window: recent tokens always attended (default 1024).
        sinks: first tokens always attended, the StreamingLLM attention sinks (64:
            DESIGN §4 calibration found 64 better than 16).
        block_size: tokens per episodic block (default 32; smaller blocks retrieve
            more precisely, DESIGN §4).
        top_k: blocks retrieved into attention per KV head (default 32: 1024 tokens);
            0 = sinks + window only (the StreamingLLM baseline). On RULER needles in
            natural text (measured), 8 blocks put the
            needle's block in the selection of 6-21% of (layer, KV head) pairs at 4k
            tokens, 32 blocks in ~60%.
        routing: ``sequence | rolling | token | hybrid | question`` (default
            ``question``: sequence-level for prefill, then the prompt's last queries
            choose the blocks for the whole answer; see ``routing.py``).
        rolling_window: decode queries remembered by ``rolling``.
        block_kind: storage of episodic blocks: ``auto | float16 | q8 | q4``. ``auto``
            (the default) stores float16 and, past ``episodic_budget_mb``, re-stores
            the least recently retrieved blocks 8-bit in memory before spilling any:
            a 1M-token prompt's float16 blocks (~12.6 GB on Qwen2.5-0.5B) spill ~3 GB
            on a 16 GB Mac, its 8-bit ones (~6.7 GB) stay in memory.
        episodic_budget_mb: bytes the episodic tier keeps in memory, summed over
            layers: block payloads and every block's routing summary (those stay
            when a block spills); past it the least-recently-retrieved blocks go
            8-bit (``auto``), then spill to disk. None
            (the default): the machine's KV budget when the cache is made
            (``platform.memory.memory_budget``: on Metal the recommended working set
            less the weights, elsewhere half the memory available now, or a memory
            limit less the weights; from a fixed pool less a tenth of it, left to what
            runs beside the store: ``blocks.EPISODIC_HEADROOM``), so a 64 GB Mac keeps
            long contexts in memory and an 8 GB one spills early instead of swapping.
        spill_dir: where spilled blocks go; None = a private directory under
            ``$MLOTSPARK_HOME/spill`` created on first spill.
        representation: how a block is summarised for routing: ``minmax`` (per-dim
            key bounds: an upper bound of the best key's score), ``mean`` (one mean
            key), ``keys`` (every key: exact, but routing cost grows with length).
        chunk: longest run of new tokens attended in one piece; longer prefill
            chunks are split so positions stay bounded (0 = ``window``).
            ``for_model`` picks ``CPU_CHUNK`` on the CPU (see there).
        follow: blocks after each retrieved block retrieved with it, within
            ``top_k`` (default 1: a needle's value often crosses into the next
            block, and matches the question less than its key does).
        lead: blocks before each retrieved block retrieved with it, within ``top_k``
            (default 0). For a needle split over two blocks whose second (the value)
            scored best and whose first (its key) did not: SmolLM2's niah_single misses
            at 16k/32k, captured (measured). Off: there it made both
            needles whole and the 135M model still misread them; a model that reads
            (Qwen2.5-Coder-0.5B, past 32k) is where it is still to be measured.
        question_pass: prompt tokens re-read once per prompt, after the blocks are
            chosen by the consensus of every layer's question queries; the choice then
            holds for the whole answer (default 64; 0 = off; ``question`` routing
            only; see ``question.py``). At 8k tokens it turned a needle found in 29%
            of the (layer, KV head) selections into one found in all of them.
        question_sharpen: exponent on each (layer, KV head)'s attention mass before
            the question pass sums them (1 = plain sum; larger lets the few heads
            that look hard at one block outvote many that look a little at all;
            see ``question.consensus``).
        question_focus: when > 0 the question pass pins only the blocks scoring at
            least this share of the best one (with ``follow``, at most ``top_k``)
            instead of the ``top_k`` best, so near-miss blocks (other needles worded
            like the asked one) are left out (0 = off, the default: at 4k tokens
            sharpen 3 + focus 0.2 took niah_multikey from 1/4 to 2/4 cases but
            dropped values niah_multivalue needs).
        question_queries: the prompt's last queries the question pass scores
            (default 16; ``question`` routing remembers this many, prefill routing
            still uses the last ``rolling_window``). With the chat template the last
            16 tokens are mostly " mentioned in the provided text? Answer
            briefly." and the template's own tokens, not the question's key words.
        answer_route: blocks per KV head that each decode step's own query routes to
            (the block summaries, as ``token`` routing scores them), attended beside
            the blocks the question pass pinned (0 = off, the default: the answer
            attends only the pinned blocks). For chains the question does not name
            (RULER vt: the answer's "VAR X" asks where X is assigned); the span grows
            by ``answer_route * block_size``.
    """

    window: int = 1024
    sinks: int = 64
    block_size: int = 32
    top_k: int = 32
    routing: str = "question"
    rolling_window: int = 16
    block_kind: str = "auto"
    episodic_budget_mb: float | None = None
    spill_dir: str | None = None
    representation: str = "minmax"
    chunk: int = 0
    follow: int = 1
    lead: int = 0
    question_pass: int = 64
    question_sharpen: int = 1
    question_focus: float = 0.0
    question_queries: int = 16
    answer_route: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> OptionError:
            return OptionError(f"invalid cascade {name} {getattr(self, name)!r}: {why}")

        for name in ("window", "block_size", "rolling_window", "question_sharpen", "question_queries"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(name, "must be an integer >= 1")
        for name in ("sinks", "top_k", "chunk", "follow", "lead", "question_pass", "answer_route"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(name, "must be an integer >= 0")
        if self.block_size > self.window:
            raise bad("block_size", f"must not exceed the window ({self.window})")
        if self.routing not in ROUTINGS:
            raise bad("routing", f"choose one of {', '.join(ROUTINGS)}")
        if self.block_kind not in BLOCK_KINDS:
            raise bad("block_kind", f"choose one of {', '.join(BLOCK_KINDS)}")
        if self.representation not in REPRESENTATIONS:
            raise bad("representation", f"choose one of {', '.join(REPRESENTATIONS)}")
        f = self.question_focus
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
            raise bad("question_focus", "must be a number in [0, 1]")
        b = self.episodic_budget_mb
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or not b >= 0):
            raise bad("episodic_budget_mb", "must be a number >= 0, or None for the machine's KV budget")
        if self.spill_dir is not None and not isinstance(self.spill_dir, str):
            raise bad("spill_dir", "must be a path string or None")

    @property
    def max_chunk(self) -> int:
        """New tokens attended in one piece (``chunk``, or ``window`` when 0)."""
        return self.chunk or self.window

    @property
    def span(self) -> int:
        """Largest position any attended key gets, plus one."""
        return self.sinks + (self.top_k + self.answer_route) * self.block_size + self.window + self.max_chunk

    @classmethod
    def for_model(cls, context_length: int, **overrides: Any) -> "CascadeConfig":
        """Defaults for a model trained on ``context_length`` tokens.

        The window is an eighth of the trained context (1024 for 8k), clamped to
        [64, 4096]: small enough that decode stays cheap, large enough for the
        local syntax; the whole attended span stays below the trained context.
        On the CPU, prefill is attended in pieces of ``CPU_CHUNK`` tokens (when the
        window is longer); on a GPU in pieces of the window, as before: there the
        arithmetic is cheap and each piece's fixed cost (a routing host sync per
        layer, a context rebuild) dominates, so fewer pieces (not measured yet).

        Args:
            context_length: the model's trained context (``max_position_embeddings``).
            **overrides: fields to set instead of the defaults.

        Returns:
            A validated config.

        Raises:
            OptionError: a bad value, or a span that exceeds ``context_length``.
        """
        if not isinstance(context_length, int) or context_length < 256:
            raise OptionError(f"invalid context_length {context_length!r}: need an integer >= 256")
        window = max(64, min(4096, context_length // 8))
        sinks = min(64, window // 4)
        block = 32 if window >= 256 else 16
        top_k = min(32, context_length // (4 * block))  # retrieved blocks: at most a quarter
        chunk = CPU_CHUNK if window > CPU_CHUNK and mx.default_device() == mx.cpu else 0
        base: dict[str, Any] = dict(window=window, sinks=sinks, block_size=block, top_k=top_k, chunk=chunk)
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise OptionError(f"unknown cascade option(s): {', '.join(sorted(unknown))}")
        base.update(overrides)
        w = base["window"]
        if "block_size" not in overrides and type(w) is int and w > 0:  # a bad window is named below
            base["block_size"] = min(base["block_size"], w)  # a window below the default block: blocks of it
        config = cls(**base)
        if config.span > context_length:
            raise OptionError(
                f"cascade span {config.span} (sinks {config.sinks} + top_k {config.top_k} x "
                f"block_size {config.block_size} + window {config.window} + chunk {config.max_chunk}) "
                f"exceeds the model's trained context of {context_length} tokens: lower window or top_k "
                "(--window, --top-k-blocks)"
            )
        return config

    @classmethod
    def from_flags(cls, context_length: int, **flags: Any) -> "CascadeConfig":
        """``for_model`` with the flags that were given (None = the default).

        For the CLI: ``--window --sinks --block-size --top-k-blocks --routing
        --block-kind`` map to ``window, sinks, block_size, top_k, routing, block_kind``.

        Raises:
            OptionError: a bad value or an unknown flag name.
        """
        return cls.for_model(context_length, **{k: v for k, v in flags.items() if v is not None})

    def to_dict(self) -> dict:
        """Plain JSON-able fields (for snapshots and stats)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CascadeConfig":
        """Inverse of ``to_dict``; unknown keys are refused.

        Raises:
            OptionError: unknown key or bad value.
        """
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise OptionError(f"unknown cascade option(s): {', '.join(sorted(unknown))}")
        return cls(**d)
