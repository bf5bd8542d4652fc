"""What a generation returns: ``GenerationStats`` and ``GenerationResult``.

Plain records at the bottom of the import graph, so the runtime, the decoding
strategies, the memory tiers and the API all share them without importing each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["FINISH_REASONS", "GenerationResult", "GenerationStats"]

FINISH_REASONS = ("stop", "length", "cancelled")


@dataclass
class GenerationStats:
    """What one request did; the ``--json`` fields of ``mlotspark generate``."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finish_reason: str = "stop"
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


@dataclass
class GenerationResult:
    """A finished generation: ``text``, generated ``tokens`` and ``stats``; with beams or
    ``num_return_sequences`` > 1, every sequence in ``sequences`` (best first, as
    ``mlotspark.decoding.beam.Hypothesis``: ``text``, ``tokens``, ``score``, ``logprob``)."""

    text: str
    tokens: list[int]
    stats: GenerationStats
    sequences: list = field(default_factory=list)

    def __str__(self) -> str:
        return self.text
