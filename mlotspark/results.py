"""What a generation returns: ``GenerationStats`` and ``GenerationResult``.

Plain records at the bottom of the import graph, so the runtime, the decoding
strategies, the memory tiers and the API all share them without importing each other.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

__all__ = ["FINISH_REASONS", "GenerationResult", "GenerationStats", "ReasoningPiece", "ToolCall"]

FINISH_REASONS = ("stop", "length", "cancelled")


@dataclass
class GenerationStats:
    """What one request did; the ``--json`` fields of ``mlotspark generate``."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finish_reason: str = "stop"
    stop_sequence: str | None = None  # the stop string that ended the text (finish_reason "stop")
    ttft_s: float = 0.0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    peak_memory_mb: float = 0.0
    model: str = ""
    device: str = ""
    weights: str = ""
    prefilled_tokens: int = 0  # prompt tokens actually run through the model
    cached_tokens: int = 0  # prompt tokens whose KV came from a cache or snapshot
    extra: dict = field(default_factory=dict)  # cascade / memory / scheduler figures

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> list[str]:
        """The story of the run in two lines (``generate -v``, the TUI): how it ran
        (weights, BLAS, KV cache and why, cascade, speculation, beams), then what it
        did (cached vs prefilled prompt tokens, TTFT, prefill and decode speed).
        The one place a run is told; every figure is also in ``to_dict()``."""
        x = self.extra
        how = [f"weights {self.weights or '?'}"]
        if x.get("blas"):
            how.append(f"BLAS {_short_blas(x['blas'])}")
        cache = x.get("cache") or {}
        if cache:
            how.append(f"KV cache {cache.get('kind')} ({cache.get('why')})")
        how.append(_cascade_phrase(x.get("cascade")))
        spec = x.get("speculative")
        if spec:
            if spec.get("fallback"):
                how.append(f"speculative {spec.get('drafter')} off: {spec['fallback']}")
            else:
                how.append(f"speculative {spec.get('drafter')}: {spec.get('accepted', 0)}/{spec.get('drafted', 0)} "
                           f"drafts accepted ({spec.get('acceptance_rate', 0.0):.0%}), "
                           f"{spec.get('tokens_per_call', 0.0):.2f} tokens per model call")
        seqs = x.get("sequences")
        if seqs:
            what = f"beams {seqs.get('num_beams')}" if seqs.get("mode") == "beam" else "independent samples"
            how.append(f"{what}, {seqs.get('returned')} returned")
        if (x.get("mean_batch") or 0) > 1:
            how.append(f"mean batch {x['mean_batch']}")
        prompt = f"prompt {self.prompt_tokens:,} tokens"
        if self.cached_tokens:
            prompt += f" ({self.cached_tokens:,} cached, {self.prefilled_tokens:,} prefilled)"
        did = [
            prompt,
            f"TTFT {self.ttft_s * 1000:,.0f} ms",
            f"prefill {self.prefill_tps:,.1f} tok/s",
            f"decode {self.decode_tps:,.1f} tok/s",
            f"{self.generation_tokens:,} generated ({self.finish_reason})",
            f"peak {self.peak_memory_mb:,.0f} MB",
        ]
        return [" · ".join(how), " · ".join(did)]


def _short_blas(blas: str) -> str:
    # "OpenBLAS (/long/path/libopenblas.so.0)" -> "OpenBLAS"; reasons stay whole.
    return blas.split(" (/", 1)[0]


def _cascade_phrase(c: dict | None) -> str:
    if not c:
        return "no cascade for this request (full attention)"
    cfg, tokens, blocks = c.get("config") or {}, c.get("tokens") or {}, c.get("blocks") or {}
    retrieval = c.get("retrieval") or {}
    return (f"cascade on (window {cfg.get('window')}, {cfg.get('sinks')} sinks, {tokens.get('total', 0):,} tokens, "
            f"{blocks.get('total', 0)} blocks, {retrieval.get('blocks_per_call', 0)} retrieved per step)")


@dataclass
class ToolCall:
    """One tool call the model made (``tools=``): the function's ``name`` and its
    ``arguments`` (parsed JSON, valid for the tool's schema)."""

    id: str
    name: str
    arguments: dict

    def arguments_json(self) -> str:
        """The arguments as OpenAI sends them: a JSON string."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ReasoningPiece:
    """A streamed piece of a reasoning model's thinking (``Engine.stream``, iterating a
    ``RequestHandle``): the answer's pieces are ``str``, the thinking's are these, so a
    caller that joins the ``str`` pieces gets the answer alone. The tags are never in it."""

    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class GenerationResult:
    """A finished generation: ``text``, generated ``tokens`` and ``stats``; with beams or
    ``num_return_sequences`` > 1, every sequence in ``sequences`` (best first, as
    ``mlotspark.decoding.beam.Hypothesis``: ``text``, ``tokens``, ``score``, ``logprob``).
    With ``tools``, the calls the reply made are in ``tool_calls`` and ``text`` keeps
    only the words outside them. A reasoning model's thinking (``<think>…</think>``) is in
    ``reasoning``, never in ``text``; empty when the model did not think."""

    text: str
    tokens: list[int]
    stats: GenerationStats
    sequences: list = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str = ""

    def __str__(self) -> str:
        return self.text
