"""``mlotspark check MODEL``: the conformance matrix on one model (``bench/conformance.py``):
every feature the docs promise, through ``serve`` and the real client SDKs, a few tokens
a cell. ``mlotspark bench --suite conformance`` runs it on the catalogue's chat models."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from typing import Any, Iterator

from mlotspark.errors import OptionError

#: The catalogue's chat models, which the shipped capabilities cover.
CATALOGUE_CHAT = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b", "gemma3-270m")
SDKS = ("openai", "anthropic", "ollama", "jsonschema")


def _cells(text: str | None) -> tuple[str, ...]:
    from mlotspark.bench.conformance import CELLS

    if not text:
        return CELLS
    cells = tuple(c.strip() for c in text.split(",") if c.strip())
    for c in cells:
        if c not in CELLS:
            raise OptionError(f"unknown cell {c!r} for --cells: choose from {', '.join(CELLS)}")
    return cells


def _need_sdks() -> None:
    import importlib.util

    missing = [m for m in SDKS if importlib.util.find_spec(m) is None]
    if missing:
        raise OptionError(f"the conformance matrix talks through the real client SDKs; missing: {', '.join(missing)} "
                          f"(pip install {' '.join(missing)})")


def run_models(models: list[str], cells: tuple[str, ...], weights: str = "auto") -> dict[str, Any]:
    """The matrix of each model, loaded one at a time (greedy), progress on stderr."""
    from mlotspark.bench.conformance import run_matrix
    from mlotspark.cli.progress import announce_pull, step_lines
    from mlotspark.engine import Engine

    _need_sdks()
    results: dict[str, Any] = {}
    for spec in models:
        announce_pull(spec)
        with step_lines():
            engine = Engine.load(spec, weights=weights, progress=sys.stderr.isatty(), temperature=0.0)
        print(f"mlotspark: check: {spec}", file=sys.stderr, flush=True)

        def told(name: str, cell: Any) -> None:
            print(f"  {cell.mark} {name}" + (f": {cell.detail}" if cell.status != "ok" else ""), file=sys.stderr,
                  flush=True)

        with _scratch_home():  # the cells' conversations and memories are not the user's
            results[spec] = run_matrix(engine, cells, on_cell=told)  # its server's lifespan closes the engine
    return results


@contextlib.contextmanager
def _scratch_home() -> Iterator[None]:
    """``$MLOTSPARK_HOME`` in a temporary folder while the cells run (the models folder
    stays where it is): a cell tells the model facts, which semantic memory would keep."""
    from mlotspark.models.hub.aliases import MODELS_ENV, models_dir

    saved = {k: os.environ.get(k) for k in ("MLOTSPARK_HOME", MODELS_ENV)}
    with tempfile.TemporaryDirectory(prefix="mlotspark-check-") as tmp:
        os.environ[MODELS_ENV] = str(models_dir())
        os.environ["MLOTSPARK_HOME"] = tmp
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def write_capabilities(results: dict[str, Any], command: str) -> str:
    """Write the catalogue models' cells into the shipped ``capabilities.json``; its path."""
    import datetime
    import json

    from mlotspark.models.hub.capabilities import MEASURED_FILE, measured
    from mlotspark.storage import atomic_write

    doc = dict(measured())
    models = dict(doc.get("models", {}))
    for name, cells in results.items():
        if name in CATALOGUE_CHAT:
            models[name] = {c: cell.status for c, cell in cells.items()}
    doc.update(command=command, date=datetime.date.today().isoformat(), models=models)
    atomic_write(MEASURED_FILE, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return str(MEASURED_FILE)


def report(results: dict[str, Any], output: str | None) -> int:
    """Print (or write) the table; exit 1 when a cell failed (a refusal is no failure)."""
    from mlotspark.bench.conformance import render
    from mlotspark.storage import atomic_write

    text = render(results) + "\n"
    if output:
        atomic_write(output, text)
        print(f"mlotspark: check: wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    failed = any(cell.status == "fail" for cells in results.values() for cell in cells.values())
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    cells = _cells(args.cells)
    return report(run_models([args.model], cells, args.weights), args.output)


def register(sub: Any) -> None:
    from mlotspark.cli.common import MODEL_HELP, WEIGHT_CHOICES, WEIGHTS_HELP

    p = sub.add_parser(
        "check", help="run the conformance matrix on a model: what it can do, measured",
        description="Try every feature the docs promise on MODEL's real weights, through mlotspark serve "
                    "and the real openai, anthropic and ollama clients (a few tokens a cell): chat, streaming, "
                    "stop strings, JSON schema, tool calls (required, named, auto, streamed, with results), "
                    "logprobs, Anthropic and Ollama tools, embeddings, a conversation, the memory cascade. "
                    "Each cell is ✓ ok, — refused with a reason, or ✗ failed; exit 1 when one failed.")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--cells", default=None, help="comma-separated cells (default: all)")
    p.add_argument("--weights", default="auto", choices=WEIGHT_CHOICES, help=WEIGHTS_HELP)
    p.add_argument("--output", "-o", default=None, metavar="FILE", help="write the table to FILE (markdown)")
    p.set_defaults(func=run)
