"""Load a resolved model: weights, config and tokenizer, in the chosen weight format.

Our llama-family model (``models.llama``) runs llama, mistral, qwen2, qwen3 and GGUF
``llama``/``qwen2``/``qwen3``, since the memory cascade needs its attention; every other
architecture of an mlx-lm directory runs on mlx-lm's own classes (full attention only).
"""

from __future__ import annotations

import json
import logging
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import psutil
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes, dequantize_model
from mlx_lm.utils import load_model as mlx_lm_load_model

from mlotspark.errors import MlotsparkError, ModelFormatError, OptionError
from mlotspark.models import execution, llama, sampling_defaults
from mlotspark.models.hub import inventory
from mlotspark.models.formats import float32_cache, gguf, gguf_convert, safetensors_check, weight_formats
from mlotspark.models.materialize import materialize
from mlotspark.models.hub.catalogue import ModelSource, alias_name, model_fingerprint
from mlotspark.models.sampling_defaults import SamplingDefaults
from mlotspark.models.tokenizer import load_gguf_tokenizer, load_hf_tokenizer
from mlotspark.platform.device import is_metal
from mlotspark.platform.dtypes import settle_quantized_activations

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
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)  # the model's recommendation
    extra: dict = field(default_factory=dict)  # weight_formats, gguf_types, load (GGUF files)
    #: What the runtime calls to run the model (``models/execution.py``), bound at load;
    #: a plain one when none is given, or when the one given runs another model (a copy
    #: of a ``LoadedModel`` with its model replaced).
    runner: execution.Runner | None = None

    def __post_init__(self) -> None:
        if self.runner is None or self.runner.model is not self.model:
            self.runner = execution.runner_for(self.model)

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def execution(self) -> execution.Runner:
        """How the model's steps run (``models/execution.py``), chosen when it was loaded: the runner."""
        return self.runner

    def nbytes(self) -> int:
        """Bytes held by the weights."""
        return sum(v.nbytes for _, v in tree_flatten(self.model.parameters()))


def choose_weight_format(requested: str, *, stored_quantized: bool, n_params: int) -> str:
    """Pick the weight format to run in.

    ``auto``: on Metal (or CUDA), what is stored (quantized stays quantized: the fast path
    there; GGUF formats MLX cannot unpack are re-quantized, see ``weight_formats``).
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
    if is_metal() or mx.default_device().type == mx.DeviceType.gpu:  # Metal, or CUDA
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


def convert_weights(model: nn.Module, fmt: str, strategy: execution.Runner | None = None) -> str:
    """Convert a loaded model in place to ``fmt``; return the format in use.

    Args:
        model: the model as loaded.
        fmt: ``quantized | stored | float16 | bfloat16 | float32``.
        strategy: the execution strategy the model will run with, which widens float
            formats its way (``Runner.widen``; default: as mlx-lm does).
    """
    quantized = any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())
    if fmt in ("quantized", "stored"):
        if fmt == "quantized" and not quantized:
            nn.quantize(model, group_size=64, bits=4)
        return "quantized" if quantized or fmt == "quantized" else _dtype_name(model)
    if strategy is not None:
        strategy.widen(model, _DTYPES[fmt])
        return fmt
    if quantized:
        dequantize_model(model)
    model.set_dtype(_DTYPES[fmt])
    return fmt


def _dtype_name(model: nn.Module) -> str:
    for _, v in tree_flatten(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            return str(v.dtype).split(".")[-1]
    return "float32"


def _read_gguf_any(path: Path, progress: bool) -> tuple[dict, dict, dict[str, str], bool, dict]:
    """Tensors, metadata and tensor types of a GGUF file, by the fastest reader that can.

    Returns:
        ``(tensors, meta, types, native, load_info)``: ``native`` is True when MLX
        read the file itself (quantized tensors as MLX triples); else every tensor
        was dequantized by ``gguf`` (or came from the conversion cache).
    """
    # Converted before (only files MLX cannot read are): straight from the cache.
    conv = gguf_convert.load_cached(path)
    if conv is None:
        n_tensors = gguf.check_gguf(path)  # counts and offsets against the file size, before MLX trusts them
        try:
            raw, meta = mx.load(str(path), return_metadata=True)
            # MLX skips what it cannot read (an unknown type) without a word: count the tensors.
            got = sum(1 for k in raw if not k.endswith((".scales", ".biases")))
            native = got == n_tensors and weight_formats.mlx_reads_exactly(raw, meta)
        except Exception:  # K-quants, a truncated file: gguf-py reads it or names the fault
            native = False
        if native:
            return raw, meta, weight_formats.native_types(raw, meta), True, {"reader": "mlx"}
        conv = gguf_convert.load_converted(path, progress=progress)
    info = {"reader": "gguf", "from_cache": conv.from_cache, "seconds": round(conv.seconds, 3)}
    return conv.tensors, conv.metadata, conv.types, False, info


def _build(config: dict, ours: bool) -> nn.Module:
    if ours:
        return llama.Model(llama.ModelArgs.from_dict(config))
    cls, args_cls = _get_classes(config)
    return cls(args_cls.from_dict(config))


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    return fn(*args), time.perf_counter() - t0


def _load_gguf(source: ModelSource, weights: str, progress: bool, strategy: execution.Runner) -> LoadedModel:
    path = Path(source.path)
    # The tokenizer is built beside the weights: tokenizers' Rust parser and MLX's
    # reads and casts all release the GIL, so they overlap (a 262k-token vocabulary
    # takes ~1 s to parse, about what the weights take from a cache). Leaving the
    # ``with`` waits for it, also when the weights fail.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlotspark-tokenizer") as pool:
        tokenizer, built, t0 = None, None, time.perf_counter()
        cached = _float32_entry(path, weights, strategy)
        if cached is not None:  # its metadata is the GGUF's: the tokenizer starts before the weights are read
            tokenizer = pool.submit(_timed, load_gguf_tokenizer, cached.metadata, gguf_convert.tokenizer_cache(path))
            built = _from_float32_cache(path, cached)
        if built is not None:
            meta, types, native = cached.metadata, cached.types, cached.native
            load_info = {"reader": "float32-cache", "from_cache": True}
            read_s, widen_s, written = time.perf_counter() - t0, 0.0, None
        else:
            (raw, meta, types, native, load_info), read_s = _timed(_read_gguf_any, path, progress)
            tokenizer = tokenizer or pool.submit(_timed, load_gguf_tokenizer, meta, gguf_convert.tokenizer_cache(path))
            (built, fused), widen_s = _timed(_gguf_weights, path, raw, meta, types, native, weights, strategy)
            written = _write_float32_cache(path, built, fused, meta, types, native, strategy, load_info)
        model, config, fmt, spec = built
        table = weight_formats.precision_table(types, fmt, native=native)
        tok, tokenizer_s = tokenizer.result()
        # Seconds per phase: read (the file, the conversion cache, or the float32 cache with
        # its weights), widen (build, cast, evaluate the weights; 0 from the float32 cache),
        # tokenizer (beside those), write (the float32 cache, when written), materialize (``load``).
        phases = {"read": round(read_s, 3), "widen": round(widen_s, 3), "tokenizer": round(tokenizer_s, 3)}
        if written is not None:
            phases["write"] = round(written, 3)
        load_info["phases"] = phases
        return LoadedModel(
            model=model,
            tokenizer=tok,
            config=config,
            source=source,
            weights=fmt,
            fingerprint=model_fingerprint(source),
            context_length=int(config["max_position_embeddings"]),
            supports_cascade=spec.ours,
            sampling=sampling_defaults.model_defaults(alias_name(source) or source.name, gguf_meta=meta),
            extra={"weight_formats": table, "gguf_types": gguf_convert.format_counts(types), "load": load_info},
        )


def _float32_entry(path: Path, weights: str, strategy: execution.Runner) -> float32_cache.Cached | None:
    """The float32 cache of ``path`` when this load would run float32 under a strategy that
    keeps one (the CPU's) and the cache is fresh and intact; else None."""
    if weights not in ("auto", "float32") or not strategy.float32_cache or not float32_cache.enabled():
        return None
    cached = float32_cache.load(path)
    if cached is None:
        return None
    stored_quantized = any(t not in weight_formats.FLOAT_TYPES for t in cached.types.values())
    if choose_weight_format(weights, stored_quantized=stored_quantized, n_params=cached.n_params) != "float32":
        return None  # too big for float32 now: the stored format, from the GGUF
    return cached


def _from_float32_cache(path: Path, cached: float32_cache.Cached) -> tuple[nn.Module, dict, str, Any] | None:
    """``(model, config, "float32", architecture spec)`` read from the float32 cache; None
    (the entry removed) when its tensors do not fit the model or cannot be read."""
    spec = gguf.architecture(cached.metadata, path)
    model = _build(cached.config, spec.ours)
    try:
        float32_cache.place(model, cached.tensors)
    except (ValueError, RuntimeError) as e:
        log.info("float32 cache of %s does not fit or cannot be read (%s): widening again", path, _one_line(e))
        float32_cache.discard(path)
        return None
    return model, cached.config, "float32", spec


def _write_float32_cache(path: Path, built: tuple, fused: dict[str, mx.array], meta: dict, types: dict[str, str],
                         native: bool, strategy: execution.Runner, load_info: dict) -> float | None:
    """Write the float32 cache after this load widened ``path`` for a strategy that keeps
    one; the seconds it took, or None when none was written. A failure only costs the
    next load its speed-up: it is logged and noted in ``load_info``, never raised."""
    model, config, fmt, _ = built
    if fmt != "float32" or not strategy.float32_cache or not float32_cache.enabled():
        return None
    t0 = time.perf_counter()
    try:
        written = float32_cache.save(path, model, fused, config=config, metadata=meta, types=types, native=native)
    except (MlotsparkError, OSError) as e:
        log.warning("float32 cache not written (the next load widens again): %s", e)
        load_info["float32_cache"] = f"not written: {e}"
        return None
    load_info["float32_cache"] = f"written, {written} bytes" if written else "not written: no room on disk"
    return time.perf_counter() - t0


def _gguf_weights(path: Path, raw: dict, meta: dict, types: dict[str, str], native: bool,
                  weights: str, strategy: execution.Runner) -> tuple[tuple[nn.Module, dict, str, Any],
                                                                              dict[str, mx.array]]:
    """The model of a GGUF file with its weights in place, in weight format ``weights``.

    Returns:
        ``((model, config, format in use, architecture spec), fused)``: ``fused`` holds
        the buffers of layer groups the strategy widened into one (``widen.group_key``).
    """
    arch_name = meta.get("general.architecture")
    spec = gguf.architecture(meta, path)
    config = gguf.gguf_config(meta, raw, path)
    tensors = gguf.map_weight_names(raw, arch_name)
    qmods = gguf.quantized_modules(tensors) if native else {}
    stored_quantized = any(t not in weight_formats.FLOAT_TYPES for t in types.values())
    fmt = choose_weight_format(weights, stored_quantized=stored_quantized, n_params=_count_params(tensors, qmods))
    model = _build(config, spec.ours)
    if qmods:
        nn.quantize(
            model,
            class_predicate=lambda p, m: {"group_size": qmods[p][0], "bits": qmods[p][1]}
            if p in qmods
            else False,
        )
    if hasattr(model, "sanitize"):  # not every mlx-lm class has one (phi3)
        tensors = model.sanitize(tensors)
    try:
        model.load_weights(list(tensors.items()), strict=True)
    except ValueError as e:
        raise ModelFormatError(f"weights of {path} do not match a {config['model_type']} model: {e}") from e
    fused: dict[str, mx.array] = {}
    if fmt in _DTYPES:  # widened the strategy's way (on the CPU: all cores, fused groups)
        fused = strategy.widen(model, _DTYPES[fmt])
    elif native:
        fmt = convert_weights(model, fmt)
    elif fmt == "stored":  # a float-only file (BF16, F16) on a GPU: run it as stored
        stored = weight_formats.FLOAT_TYPES[max(set(types.values()), key=list(types.values()).count)]
        model.set_dtype(_DTYPES[stored])
        fmt = stored
    elif fmt == "quantized":
        module_types = {}
        for name, gtype in types.items():
            key = gguf.rename(name, arch_name)
            if key and key.endswith(".weight"):
                module_types[key[: -len(".weight")]] = gtype
        # bfloat16 scales and activations: float16's range overflows in Gemma 3 (mlx-lm clips it there)
        model.set_dtype(mx.bfloat16)
        weight_formats.requantize(model, module_types)
        fmt = "quantized"
    mx.eval(model.parameters())
    return (model, config, fmt, spec), fused


def _model_classes(config: dict):
    if "model_type" not in config:  # mlx-lm: a bare KeyError
        raise ModelFormatError(f"config.json names no model_type (architectures: {config.get('architectures')})")
    if config.get("model_type") in llama.SUPPORTED_TYPES:
        return llama.Model, llama.ModelArgs
    return _get_classes(config)


def stated_tie(path: Path) -> dict | None:
    """``{"tie_word_embeddings": False}`` when config.json does not say and the weights hold
    an ``lm_head.weight``: mlx-lm's classes default to tied and would drop that head unread
    (transformers' Llama defaults to untied). None otherwise."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        if "tie_word_embeddings" in config or "tie_word_embeddings" in config.get("text_config", {}):
            return None
        stored = set().union(*(safetensors_check.tensor_names(f) for f in path.glob("model*.safetensors")))
    except (OSError, ValueError, AttributeError, struct.error):
        return None  # mlx-lm's load names what is wrong with the files
    return {"tie_word_embeddings": False} if "lm_head.weight" in stored else None


def stated_context(spec: str | None) -> int | None:
    """The trained context of a model that runs the memory cascade, read from its files'
    metadata without loading it (``chat`` checks its cascade flags before its app starts).

    Args:
        spec: what ``--model`` names (None: the default model).

    Returns:
        The context in tokens; None for a model on mlx-lm's classes, one not on disk, or
        files that do not say (the load then checks, as always).
    """
    from mlotspark.models.hub.catalogue import resolve

    try:
        path = Path(resolve(spec, pull=False, progress=False).path)
        if path.is_dir():
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
            ours = config.get("model_type") in llama.SUPPORTED_TYPES
            return int(config["max_position_embeddings"]) if ours else None
        meta, _ = gguf_convert.read_metadata(path)  # from the conversion cache when fresh
        arch = gguf.ARCHITECTURES.get(meta.get("general.architecture"))
        return int(meta[f"{meta['general.architecture']}.context_length"]) if arch and arch.ours else None
    except (MlotsparkError, OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _load_hf_dir(source: ModelSource, weights: str, strategy: execution.Runner) -> LoadedModel:
    path = Path(source.path)
    try:
        model, config = mlx_lm_load_model(path, lazy=True, get_model_classes=_model_classes,
                                          model_config=stated_tie(path))
    except (ValueError, FileNotFoundError) as e:
        raise ModelFormatError(f"cannot load model directory {source.path}: {_one_line(e)}") from e
    quantized = "quantization" in config
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    if quantized:
        bits = config["quantization"].get("bits", 4)
        n_params = n_params * 32 // bits  # packed uint32 -> elements (upper bound)
    fmt = convert_weights(model, choose_weight_format(weights, stored_quantized=quantized, n_params=n_params), strategy)
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
        sampling=sampling_defaults.model_defaults(source.name, model_dir=Path(source.path)),
    )


def load(source: ModelSource, weights: str = "auto", progress: bool = True) -> LoadedModel:
    """Load ``source`` in weight format ``weights`` (see ``choose_weight_format``).

    Args:
        source: the resolved model.
        weights: ``auto | quantized | float16 | bfloat16 | float32`` (default auto).
        progress: progress bar while a GGUF file is converted the first time (default True).

    Raises:
        ModelFormatError: corrupt file, unsupported architecture, mismatched weights.
        OptionError: an unknown weight format.
    """
    if weights not in WEIGHT_FORMATS:
        choose_weight_format(weights, stored_quantized=False, n_params=0)
    try:
        t0 = time.perf_counter()
        strategy = execution.choose_runner()  # how its steps will run here: it also widens the weights
        loaded = (_load_gguf(source, weights, progress, strategy) if source.kind == "gguf"
                  else _load_hf_dir(source, weights, strategy))
        t1 = time.perf_counter()
        if loaded.weights == "quantized":  # on a GPU: half-precision activations and KV (platform/dtypes.py)
            settle_quantized_activations(loaded.model)
        loaded.runner = execution.prepare(loaded.model, strategy)  # how its steps run here (memory-neutral: nothing else holds the arrays now)
        # Private arrays too (RoPE frequency tables): the engine thread runs what we built here.
        materialize(loaded.model)
        phases = loaded.extra.setdefault("load", {}).setdefault("phases", {})
        phases["materialize"] = round(time.perf_counter() - t1, 3)
        loaded.extra["load"]["seconds_total"] = round(time.perf_counter() - t0, 3)
        inventory.remember(source)  # a path opened by hand shows in `mlotspark list`
        return loaded
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
