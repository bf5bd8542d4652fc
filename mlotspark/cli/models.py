"""``mlotspark pull``, ``list``, ``rm`` and ``info``, and the ``--models-dir`` flag of every command."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from mlotspark.cli.common import WEIGHT_CHOICES
from mlotspark.cli.distributed import add_distributed_args


def run_pull(args: argparse.Namespace) -> int:
    from mlotspark.models.hub import bundles, catalogue

    if args.list:  # the chat models, then the sentence embedders `pull` also fetches
        rows = catalogue.list_models() + [bundles.bundle_status(name) for name in bundles.BUNDLES]
        print(catalogue.format_models(rows))
        return 0
    if args.model in bundles.BUNDLES:  # the sentence embedder: a zip of files, not one GGUF
        path = bundles.pull(args.model, progress=True, force=args.force)
        print(f"{args.model}: {path}")
        return 0
    source = catalogue.pull(args.model, progress=True, force=args.force)
    print(f"{source.name}: {source.path}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from mlotspark.models.hub import inventory

    if args.json:
        print(json.dumps(inventory.on_disk(), indent=2))
    else:
        print(inventory.format_on_disk())
    return 0


def run_rm(args: argparse.Namespace) -> int:
    from mlotspark.models.hub import inventory

    print(inventory.remove(args.model))
    return 0


def add_models_dir(*parsers: argparse.ArgumentParser) -> None:
    """``--models-dir DIR`` on the main parser and on every command (either place works)."""
    for i, p in enumerate(parsers):
        p.add_argument("--models-dir", metavar="DIR", default=None if i == 0 else argparse.SUPPRESS,
                       help="where models live (default: $MLOTSPARK_MODELS, else $MLOTSPARK_HOME/models)")


def apply_models_dir(args: argparse.Namespace) -> None:
    """Make ``--models-dir`` the models folder of this process (as ``$MLOTSPARK_MODELS``)."""
    from mlotspark.models.hub.aliases import MODELS_ENV

    if getattr(args, "models_dir", None):
        os.environ[MODELS_ENV] = str(os.path.abspath(os.path.expanduser(args.models_dir)))


def run_info(args: argparse.Namespace) -> int:
    if args.distributed:  # under mlx.launch: every rank loads its share, rank 0 reports all
        from mlotspark.cli import distributed

        return distributed.run_info(args)
    from mlotspark.models.hub.catalogue import catalogue_line, default_model_hint, default_model_line
    from mlotspark.platform.device import device_info, format_info
    from mlotspark.runtime.scheduler_config import governor_snapshot

    info = device_info()
    info["default_model"] = default_model_line()
    info["catalogue"] = catalogue_line()
    info["default_hint"] = default_model_hint()
    info["memory_embedder"] = _embedder_line()
    gov = governor_snapshot()  # an engine loaded elsewhere reports its own: Engine.status()
    if args.json:
        info["governor"] = gov
    else:
        info["governor"] = f"{gov['state']}, batch cap {gov['cap']} ({gov['mode']}): {gov['reason']}"
    if args.model:
        info.update(model_info(args.model, args.weights, as_json=args.json))
    print(json.dumps(info, indent=2, default=str) if args.json else format_info(info))
    return 0


def model_info(model: str, weights: str = "auto", *, as_json: bool = False) -> dict[str, Any]:
    """Facts of one model for ``mlotspark info -m``: how each stored format runs, and
    the sampling defaults with their sources. Loads the model (never downloads it);
    a GGUF file MLX cannot read is converted (and cached) on the way.

    Args:
        model: alias, ``.gguf`` path or model directory.
        weights: the weight format to report for (default ``auto``).
        as_json: nested values for ``--json``; else one printable line per fact.
    """
    from mlotspark.models import loader
    from mlotspark.models.hub import catalogue
    from mlotspark.models.sampling_defaults import KEYS, format_sampling

    loaded = loader.load(catalogue.resolve(model, pull=False), weights=weights)
    options, sources = loaded.sampling.effective()
    formats = loaded.extra.get("weight_formats", {})
    counts = loaded.extra.get("gguf_types", {})
    out: dict[str, Any] = {
        "model": loaded.name,
        "model_path": str(loaded.source.path),
        "architecture": loaded.config.get("model_type"),
        "memory_cascade": loaded.supports_cascade,
        "context_length": loaded.context_length,
        "weights": loaded.weights,
    }
    if as_json:
        out["weight_formats"] = {t: {"tensors": counts.get(t, 0), "runs_as": p} for t, p in formats.items()}
        out["sampling"] = {k: {"value": getattr(options, k), "source": sources[k]} for k in KEYS}
        return out
    for gtype, how in formats.items():
        out[f"format {gtype}"] = f"{counts.get(gtype, 0)} tensors -> {how}"
    out["sampling"] = format_sampling(options, sources)
    return out


def _embedder_line() -> str:
    """Which embedder semantic memory uses now (loads nothing: a few stat calls)."""
    from mlotspark.errors import MlotsparkError
    from mlotspark.memory.semantic import default_embedder, describe_embedder

    try:
        return describe_embedder(default_embedder())
    except MlotsparkError as e:  # a bad $MLOTSPARK_EMBEDDER must not break `info`
        return f"unknown ({e})"


def register(sub: Any) -> None:
    p = sub.add_parser("pull", help="fetch a model into the models folder",
                       description="Fetch a model (default: the device's default model, see `mlotspark info`) "
                                   "into the models folder ($MLOTSPARK_MODELS, else $MLOTSPARK_HOME/models).")
    p.add_argument("model", nargs="?", default=None,
                   help="alias (see --list; all-mpnet-base-v2 and all-minilm-l6-v2 are the sentence embedders "
                        "of semantic memory) or Hugging Face repo id")
    p.add_argument("--force", action="store_true",
                   help="check the sha256 of an alias already on disk and fetch it again if it differs; "
                        "for a Hugging Face repo id, ask the hub for changed files")
    p.add_argument("--list", action="store_true", help="list the catalogue (chat models and the sentence embedders of semantic "
                                                        "memory) with download sizes and which are present")
    p.set_defaults(func=run_pull)

    p = sub.add_parser("list", help="models on disk: pulled, opened by path before, in the Hugging Face cache",
                       description="Models on disk: catalogue models pulled into the models folder, Hugging Face "
                                   "repos pulled by id, GGUF files and directories opened by path before, and "
                                   "mlx-lm models in the Hugging Face cache.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_list)

    p = sub.add_parser("rm", help="remove a pulled model (a path opened before is only forgotten)",
                       description="Remove a model pulled into the models folder; a GGUF file or directory "
                                   "opened by path before is only forgotten (its files stay).")
    p.add_argument("model", help="alias, Hugging Face repo id, or a path `mlotspark list` shows")
    p.set_defaults(func=run_rm)

    p = sub.add_parser("info", help="device, BLAS, MLX version, memory and model status",
                       description="The device, BLAS, MLX and mlx-lm versions, the memory signal and KV "
                                   "budget in force, the default model and the catalogue, the memory "
                                   "embedder and the thermal governor's state; with --model, how that "
                                   "model's stored formats run and its sampling defaults.")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--model", "-m", default=None,
                   help="also load this model (alias, .gguf, directory) and show how each stored format runs "
                        "and its sampling defaults; with --distributed, the model the ranks load")
    p.add_argument("--weights", default="auto", choices=WEIGHT_CHOICES,
                   help="with --model: the weight format to load it in (default auto, as generate)")
    add_distributed_args(p, info=True)
    p.set_defaults(func=run_info)
