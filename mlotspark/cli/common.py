"""Argument helpers shared by the command modules."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mlotspark.models.aliases import ACCELERATED_DEFAULT, DEFAULT_MODEL

# Option names (API) whose flag is not ``--`` + the name with dashes, so errors in the
# CLI name the flag the user typed.
FLAGS = {
    "temperature": "--temp",
    "num_beams": "--beams",
    "response_format": "--json-schema",
}


def flag(name: str) -> str:
    """The CLI flag of option ``name`` (``num_beams`` -> ``--beams``)."""
    return FLAGS.get(name) or "--" + name.replace("_", "-")


def note(text: str) -> None:
    """Tell the user once, on stderr, how one option limited another."""
    print(f"mlotspark: note: {text}", file=sys.stderr)


def _int_at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
    return v


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


WEIGHT_CHOICES = ("auto", "quantized", "float16", "bfloat16", "float32")
WEIGHTS_HELP = ("weight format to run in (default auto: float32 through BLAS on the CPU backend, or as "
                "stored when float32 would not fit in memory; as stored on a GPU, Metal or CUDA)")
MODEL_HELP = (f"alias, .gguf file, mlx-lm model directory or Hugging Face repo id (default: {DEFAULT_MODEL} "
              f"on the CPU, {ACCELERATED_DEFAULT} on a GPU; `mlotspark info` names it)")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=None, help=MODEL_HELP)
    p.add_argument("--weights", default="auto", choices=WEIGHT_CHOICES, help=WEIGHTS_HELP)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=None, help="most tokens to generate (default 512)")
    g.add_argument("--temp", "--temperature", dest="temperature", type=float, default=None,
                   help="sampling temperature, 0 = greedy (default: the model's recommendation, else 0.7; see `mlotspark info -m`)")
    g.add_argument("--top-k", type=int, default=None,
                   help="keep the k most likely tokens, 0 = off (default: the model's recommendation, else 0)")
    g.add_argument("--top-p", type=float, default=None,
                   help="nucleus sampling in (0, 1], 1 = off (default: the model's recommendation, else 0.95)")
    g.add_argument("--min-p", type=float, default=None,
                   help="drop tokens below MIN_P x the top token's probability, in [0, 1), 0 = off "
                        "(default: the model's recommendation, else 0)")
    g.add_argument("--repetition-penalty", type=float, default=None,
                   help="penalise tokens of the last 64, > 0, 1 = off (default: the model's recommendation, else 1)")
    g.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: not reseeded)")
    g.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop before this text (repeatable)")


def sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "stop")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


