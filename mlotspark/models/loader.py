"""Load a resolved model: weights, config and tokenizer, in the chosen weight format.

Our llama-family model (``models.llama``) runs llama, mistral, qwen2, qwen3 and GGUF
``llama``/``qwen2``/``qwen3``, since the memory cascade needs its attention; every other
architecture of an mlx-lm directory runs on mlx-lm's own classes (full attention only).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import psutil
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes, dequantize_model
from mlx_lm.utils import load_model as mlx_lm_load_model

from mlotspark.models import gguf
from mlotspark.platform.device import is_metal
from mlotspark.errors import MlotsparkError, ModelFormatError, OptionError
from mlotspark.models import llama
from mlotspark.models.catalogue import ModelSource, model_fingerprint

log = logging.getLogger(__name__)

WEIGHT_FORMATS = ("auto", "quantized", "float16", "bfloat16", "float32")
_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
# float32 copies of the weights may use at most this share of the memory available now.
_FLOAT32_MEMORY_SHARE = 0.4


@dataclass
class LoadedModel:
    """A model ready to run, with what the engine needs to know about it."""

    model: nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper
    config: dict
    source: ModelSource
    weights: str  # the weight format in use: quantized | float16 | bfloat16 | float32
    fingerprint: str
    context_length: int
    supports_cascade: bool  # True for our llama-family model
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.source.name

    def nbytes(self) -> int:
        """Bytes held by the weights."""
        return sum(v.nbytes for _, v in tree_flatten(self.model.parameters()))


def choose_weight_format(requested: str, *, stored_quantized: bool, n_params: int) -> str:
    """Pick the weight format to run in.

    ``auto``: on Metal, what is stored (quantized stays quantized: the fast path there).
    On the CPU backend, float32 (only float32 reaches BLAS: ~19 tok/s decode vs ~8
    quantized and ~3 float16, DESIGN §2) when it fits in memory, else what is stored.

    Raises:
        OptionError: an unknown format.
    """
    if requested not in WEIGHT_FORMATS:
        raise OptionError(
            f"invalid weights {requested!r}: choose one of {', '.join(WEIGHT_FORMATS)}"
        )
    if requested != "auto":
        return requested
    if is_metal():
        return "quantized" if stored_quantized else "stored"
    fits = n_params * 4 <= _FLOAT32_MEMORY_SHARE * psutil.virtual_memory().available
    if fits:
        return "float32"
    return "quantized" if stored_quantized else "stored"


def _count_params(weights: dict[str, mx.array], qmods: dict[str, tuple[int, int]]) -> int:
    n = 0
    for name, w in weights.items():
        prefix = name.rsplit(".", 1)[0]
        if name.endswith((".scales", ".biases")) and prefix in qmods:
            continue
        if name.endswith(".weight") and prefix in qmods:
            n += w.size * 32 // qmods[prefix][1]
        else:
            n += w.size
    return n


def _convert(model: nn.Module, fmt: str) -> str:
    """Convert a loaded model in place to ``fmt``; return the format in use."""
    quantized = any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())
    if fmt in ("quantized", "stored"):
        if fmt == "quantized" and not quantized:
            nn.quantize(model, group_size=64, bits=4)
        return "quantized" if quantized or fmt == "quantized" else _dtype_name(model)
    if quantized:
        dequantize_model(model)
    model.set_dtype(_DTYPES[fmt])
    return fmt


def _dtype_name(model: nn.Module) -> str:
    for _, v in tree_flatten(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            return str(v.dtype).split(".")[-1]
    return "float32"


def _load_gguf(source: ModelSource, weights: str) -> LoadedModel:
    from mlotspark.models.tokenizer import load_gguf_tokenizer

    raw, meta = gguf.read_gguf(source.path)
    config = gguf.gguf_config(meta, raw)
    tensors = gguf.map_weight_names(raw)
    qmods = gguf.quantized_modules(tensors)
    fmt = choose_weight_format(weights, stored_quantized=bool(qmods), n_params=_count_params(tensors, qmods))
    model = llama.Model(llama.ModelArgs.from_dict(config))
    if qmods:
        nn.quantize(
            model,
            class_predicate=lambda p, m: {"group_size": qmods[p][0], "bits": qmods[p][1]}
            if p in qmods
            else False,
        )
    tensors = model.sanitize(tensors)
    try:
        model.load_weights(list(tensors.items()), strict=True)
    except ValueError as e:
        raise ModelFormatError(f"weights of {source.path} do not match a {config['model_type']} model: {e}") from e
    fmt = _convert(model, fmt)
    mx.eval(model.parameters())
    tokenizer = load_gguf_tokenizer(meta)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        source=source,
        weights=fmt,
        fingerprint=model_fingerprint(source),
        context_length=int(config["max_position_embeddings"]),
        supports_cascade=True,
    )


def _model_classes(config: dict):
    if config.get("model_type") in llama.SUPPORTED_TYPES:
        return llama.Model, llama.ModelArgs
    return _get_classes(config)


def _load_hf_dir(source: ModelSource, weights: str) -> LoadedModel:
    from mlotspark.models.tokenizer import load_hf_tokenizer

    try:
        model, config = mlx_lm_load_model(Path(source.path), lazy=True, get_model_classes=_model_classes)
    except (ValueError, FileNotFoundError) as e:
        raise ModelFormatError(f"cannot load model directory {source.path}: {e}") from e
    quantized = "quantization" in config
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    if quantized:
        bits = config["quantization"].get("bits", 4)
        n_params = n_params * 32 // bits  # packed uint32 -> elements (upper bound)
    fmt = _convert(model, choose_weight_format(weights, stored_quantized=quantized, n_params=n_params))
    mx.eval(model.parameters())
    ours = isinstance(model, llama.Model)
    ctx = config.get("max_position_embeddings") or config.get("max_seq_len") or 4096
    return LoadedModel(
        model=model,
        tokenizer=load_hf_tokenizer(Path(source.path)),
        config=config,
        source=source,
        weights=fmt,
        fingerprint=model_fingerprint(source),
        context_length=int(ctx),
        supports_cascade=ours,
    )


def load(source: ModelSource, weights: str = "auto") -> LoadedModel:
    """Load ``source`` in weight format ``weights`` (see ``choose_weight_format``).

    Raises:
        ModelFormatError: corrupt file, unsupported architecture, mismatched weights.
        OptionError: an unknown weight format.
    """
    if weights not in WEIGHT_FORMATS:
        choose_weight_format(weights, stored_quantized=False, n_params=0)
    try:
        if source.kind == "gguf":
            return _load_gguf(source, weights)
        return _load_hf_dir(source, weights)
    except ModelFormatError as e:
        if str(source.path) in str(e) and "\n" not in str(e):
            raise
        # Parts of the file checked deep down (tokenizer, config) do not know its name.
        raise ModelFormatError(f"{source.path}: {_one_line(e)}") from e
    except MlotsparkError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RuntimeError, UnicodeError) as e:
        # A file that passed the layout check but holds values no model can have
        # (a string where a count should be, a vocabulary shorter than its ids).
        raise ModelFormatError(f"cannot load model {source.path}: {type(e).__name__}: {_one_line(e)}") from e


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:300] + "..."
