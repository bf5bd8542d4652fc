"""Load one rank's share of a model: the handshake, then its layers only.

Every rank resolves the model on its own disk and hashes it (``model_fingerprint``);
the ranks exchange fingerprints and free memory before any weight is read, so a
rank with other files is refused by number, and the layer split is known to all.
Safetensors weights load lazily, so a rank reads only its own layers' bytes; MLX's
GGUF reader reads the whole file, so with GGUF a rank's *peak* is the file size and
its *resident* weights are its share (the slices of other ranks are dropped).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import psutil
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model as mlx_lm_load_model

from mlotspark.errors import DistributedError, ModelFormatError, OptionError
from mlotspark.models import execution, llama, sampling_defaults
from mlotspark.models.formats import gguf
from mlotspark.models.hub.catalogue import ModelSource, alias_name, model_fingerprint
from mlotspark.platform.blas import set_blas_threads
from mlotspark.platform.dtypes import activation_dtype, settle_quantized_activations
from mlotspark.models.loader import LoadedModel, choose_weight_format, stated_tie
from mlotspark.models.loader import convert_weights  # the loader's one conversion rule
from mlotspark.models.materialize import materialize
from mlotspark.distributed.group import RankGroup, host_name, join
from mlotspark.distributed.pipeline import PipelineModel
from mlotspark.distributed.split import SPLITS, plan_layers
from mlotspark.distributed.tensor import check_tensor_split, shard_model

MODES = ("pipeline", "tensor")


@dataclass
class DistributedSetup:
    """How a model is spread over the ranks; kept in ``LoadedModel.extra["distributed"]``.

    Args:
        mode: ``pipeline`` or ``tensor``.
        group: this process's RankGroup.
        layers: per rank, its ``[start, end)`` layer range (tensor: every rank all layers).
        ranks: per rank, what it reported at the handshake (host, free memory, fingerprint).
    """

    mode: str
    group: RankGroup
    layers: list[tuple[int, int]]
    ranks: list[dict] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def size(self) -> int:
        return self.group.size


def load(source: ModelSource, weights: str = "auto", mode: str = "pipeline", split: str = "memory",
         group: RankGroup | None = None) -> LoadedModel:
    """Load this rank's share of ``source``. Every rank of the group must call it.

    Args:
        source: the resolved model on this rank's disk.
        weights: weight format (``loader.WEIGHT_FORMATS``); ``auto`` is agreed by all ranks.
        mode: ``pipeline`` (layers split across ranks) or ``tensor`` (heads split).
        split: pipeline only: ``memory`` (in proportion to free memory) or ``even``.
        group: the rank group; None joins the one the launcher set up.

    Returns:
        A LoadedModel whose ``model`` runs this rank's share and whose
        ``extra["distributed"]`` is the DistributedSetup.

    Raises:
        OptionError: an unknown mode or split.
        DistributedError: model files differ across ranks (naming the rank), or the
            model cannot be split that way (tensor: head counts named).
        ModelFormatError: not a llama-family model.
    """
    check_distributed(mode, split)
    group = group or join()
    fingerprint = model_fingerprint(source)
    facts = {"rank": group.rank, "host": host_name(), "model": source.name, "fingerprint": fingerprint,
             "free_bytes": int(psutil.virtual_memory().available)}
    ranks = group.gather_json(facts)
    _check_same_model(ranks)
    _share_cores(ranks, facts["host"])
    model, config, tokenizer, stored_quantized, sampling = _read_lazily(source)
    args = model.args
    if mode == "tensor":
        check_tensor_split(args, group.size, source.name)
        layers = [(0, args.num_hidden_layers)] * group.size
        share = model
    else:
        layers = plan_layers(args.num_hidden_layers, [r["free_bytes"] for r in ranks], split)
        start, end = layers[group.rank]
        share = PipelineModel(model, group.group, start, end, hidden_dtype=mx.float32)
    del model
    n_params = sum(v.size for _, v in tree_flatten(share.parameters()))
    if stored_quantized:
        n_params *= 8  # packed 4-bit words -> elements (an upper bound, as the loader does)
    # Every rank must run the same format (the hidden states' dtype crosses ranks).
    choices = group.gather_json(choose_weight_format(weights, stored_quantized=stored_quantized, n_params=n_params))
    fmt = choices[0] if len(set(choices)) == 1 else next(c for c in choices if c != "float32")
    fmt = convert_weights(share, fmt)
    if fmt == "quantized":  # as loader.load: half-precision activations on a GPU
        settle_quantized_activations(share)
    if mode == "tensor":
        shard_model(share, group.group)
    mx.eval(share.parameters())
    runner = execution.prepare(share)  # how this rank's steps run (models/execution.py), as a single process
    materialize(share)  # private arrays too (RoPE tables): the engine thread runs this share
    if mode == "pipeline":
        # What rank 0's layers send on, not what its embedding makes: a quantized embedding
        # gives float16 (its scales) while F32 norms promote the layers' output to float32.
        dtype = str(activation_dtype(share)) if group.rank == 0 else None
        share.hidden_dtype = getattr(mx, group.broadcast_json(dtype).split(".")[-1])
    group.barrier()
    setup = DistributedSetup(mode=mode, group=group, layers=layers, ranks=ranks)
    return LoadedModel(
        model=share,
        tokenizer=tokenizer,
        config=config,
        source=source,
        weights=fmt,
        fingerprint=fingerprint,
        context_length=int(config.get("max_position_embeddings") or 4096),
        supports_cascade=mode == "pipeline",  # each rank's cascade holds its own layers' memory
        sampling=sampling,  # the model's recommended sampling, as a single process has it
        extra={"distributed": setup},
        runner=runner,
    )


def check_distributed(mode: str, split: str = "memory") -> None:
    """Validate ``Engine.load``'s ``distributed`` and ``split`` before anything loads.

    Raises:
        OptionError: naming the bad value.
    """
    if mode not in MODES:
        raise OptionError(f"invalid distributed mode {mode!r}: choose one of {', '.join(MODES)}")
    if split not in SPLITS:
        raise OptionError(f"invalid split {split!r}: choose one of {', '.join(SPLITS)}")


def _check_same_model(ranks: list[dict]) -> None:
    ref = ranks[0]
    for r in ranks[1:]:
        if r["fingerprint"] != ref["fingerprint"]:
            raise DistributedError(
                f"rank {r['rank']} ({r['host']}) has other model files than rank 0: "
                f"{r['model']} fingerprint {r['fingerprint']} != {ref['model']} {ref['fingerprint']}"
            )


def _share_cores(ranks: list[dict], host: str) -> None:
    """Ranks on one machine split its cores between their BLAS thread pools.

    Each OpenBLAS pool sized for the whole machine made two local ranks ~8x slower
    than with a core each (decode 0.5 vs 3.6 tok/s on 2 cores, measured here).
    An explicit ``OPENBLAS_NUM_THREADS`` wins.
    """
    local = sum(1 for r in ranks if r["host"] == host)
    if local > 1 and "OPENBLAS_NUM_THREADS" not in os.environ:
        set_blas_threads(max(1, (os.cpu_count() or 1) // local))


def _classes(config: dict) -> tuple[type, type]:
    if config.get("model_type") not in llama.SUPPORTED_TYPES:
        raise ModelFormatError(
            f"distributed runs need a llama-family model ({', '.join(llama.SUPPORTED_TYPES)}), "
            f"not {config.get('model_type')!r}"
        )
    return llama.Model, llama.ModelArgs


def _read_lazily(source: ModelSource) -> tuple[llama.Model, dict, Any, bool, Any]:
    """The full-size model with its weights attached but not evaluated, its config,
    tokenizer, whether it is stored quantized, and its sampling defaults."""
    if source.kind == "gguf":
        from mlotspark.models.tokenizer import load_gguf_tokenizer

        raw, meta = gguf.read_gguf(source.path)
        config = gguf.gguf_config(meta, raw)
        tensors = gguf.map_weight_names(raw)
        del raw
        qmods = gguf.quantized_modules(tensors)
        cls, args_cls = _classes(config)
        model = cls(args_cls.from_dict(config))
        if qmods:
            nn.quantize(model, class_predicate=lambda p, m: {"group_size": qmods[p][0], "bits": qmods[p][1]}
                        if p in qmods else False)
        try:
            model.load_weights(list(model.sanitize(tensors).items()), strict=True)
        except ValueError as e:
            raise ModelFormatError(f"weights of {source.path} do not match a {config['model_type']} model: {e}") from e
        sampling = sampling_defaults.model_defaults(alias_name(source) or source.name, gguf_meta=meta)
        return model, config, load_gguf_tokenizer(meta), bool(qmods), sampling
    from mlotspark.models.tokenizer import load_hf_tokenizer

    try:
        model, config = mlx_lm_load_model(Path(source.path), lazy=True, get_model_classes=_classes,
                                          model_config=stated_tie(Path(source.path)))
    except (ValueError, FileNotFoundError) as e:
        raise ModelFormatError(f"cannot load model directory {source.path}: {e}") from e
    sampling = sampling_defaults.model_defaults(source.name, model_dir=Path(source.path))
    return model, config, load_hf_tokenizer(Path(source.path)), "quantization" in config, sampling
