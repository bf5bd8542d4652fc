"""``mlotspark pull`` and ``mlotspark info``."""

from __future__ import annotations

import argparse
import json
from typing import Any


def run_pull(args: argparse.Namespace) -> int:
    from mlotspark.models import bundles, catalogue

    if args.model in bundles.BUNDLES:  # the sentence embedder: a zip of files, not one GGUF
        path = bundles.pull(args.model, progress=True, force=args.force)
        print(f"{args.model}: {path}")
        return 0
    source = catalogue.pull(args.model, progress=True, force=args.force)
    print(f"{source.name}: {source.path}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from mlotspark.models.catalogue import default_model_line
    from mlotspark.platform.device import device_info, format_info
    from mlotspark.runtime.scheduler_config import governor_snapshot

    info = device_info()
    info["default_model"] = default_model_line()
    info["memory_embedder"] = _embedder_line()
    gov = governor_snapshot()  # an engine loaded elsewhere reports its own: Engine.scheduler_status()
    if args.json:
        info["governor"] = gov
    else:
        info["governor"] = f"{gov['state']}, batch cap {gov['cap']} ({gov['mode']}): {gov['reason']}"
    print(json.dumps(info, indent=2, default=str) if args.json else format_info(info))
    return 0


def _embedder_line() -> str:
    """Which embedder semantic memory uses now (loads nothing: a few stat calls)."""
    from mlotspark.errors import MlotsparkError
    from mlotspark.memory.semantic import default_embedder, describe_embedder

    try:
        return describe_embedder(default_embedder())
    except MlotsparkError as e:  # a bad $MLOTSPARK_EMBEDDER must not break `info`
        return f"unknown ({e})"


def register(sub: Any) -> None:
    p = sub.add_parser("pull", help="fetch a model into $MLOTSPARK_HOME",
                       description="Fetch a model (default: smollm2-135m-instruct) into $MLOTSPARK_HOME/models.")
    p.add_argument("model", nargs="?", default=None,
                   help="alias (all-minilm-l6-v2: sentence embeddings for memory) or Hugging Face repo id")
    p.add_argument("--force", action="store_true", help="verify and fetch again if needed")
    p.set_defaults(func=run_pull)

    p = sub.add_parser("info", help="device, BLAS, MLX version, memory and model status")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_info)
