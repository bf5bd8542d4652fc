"""Argument helpers shared by the command modules."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mlotspark.errors import OptionError
from mlotspark.models.hub.aliases import ACCELERATED_DEFAULT, DEFAULT_MODEL

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


_INT_MAX = 2**63 - 1  # SQLite's and the stores' largest integer


def _int_at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if not low <= v <= _INT_MAX:  # past int64 the library's own check named a range starting at 0
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}" if v < low
                                         else f"must be from {low} to {_INT_MAX}, got {v}")
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


def add_memory_args(p: argparse.ArgumentParser) -> None:
    """``--memory-writer`` and ``--no-memory``: semantic memory's switches (``memory_kwargs``)."""
    g = p.add_argument_group("semantic memory")
    g.add_argument("--memory-writer", choices=("auto", "model", "simple"), default="auto",
                   help="who decides what a turn changes in memory: simple (keep what the user says; act on "
                        "'remember that' / 'forget'), model (the chat model proposes the changes in one constrained "
                        "call) or auto (default: the model where it was measured to do better, else simple)")
    g.add_argument("--no-memory", action="store_true",
                   help="neither read nor write semantic memory (`mlotspark memory` still shows what is stored)")


def memory_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``Engine.load``'s memory arguments from ``add_memory_args``' flags."""
    return {"memory_writer": getattr(args, "memory_writer", "auto"), "memory": not getattr(args, "no_memory", False)}


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
    g.add_argument("--reasoning-budget", type=int, default=None, metavar="TOKENS",
                   help="a reasoning model's thinking tokens before its close tag is forced (0 = none)")
    g.add_argument("--reasoning-effort", choices=("none", "minimal", "low", "medium", "high"), default=None,
                   help="the thinking budget by name: none/minimal 0, low 512, medium 2048, high unbounded")
    g.add_argument("--no-think", dest="think", action="store_const", const=False, default=None,
                   help="turn a reasoning model's thinking off (its template's switch, else a budget of 0)")


def sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "stop",
            "reasoning_budget", "reasoning_effort", "think")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


# ------------------------------------------------------------------ the memory cascade
#: The flags that shape the cascade: (argparse dest, ``CascadeConfig`` field).
CASCADE_FLAGS = (("window", "window"), ("sinks", "sinks"), ("block_size", "block_size"),
                 ("top_k_blocks", "top_k"), ("routing", "routing"), ("block_kind", "block_kind"))
CASCADE_MODES = ("auto", "on", "off")


def add_cascade_args(p: argparse.ArgumentParser) -> None:
    """``--cascade {auto,on,off}``, the flags that shape it and ``--no-cascade``: the same
    flags, with the same meaning, for ``generate``, ``serve`` and ``chat``."""
    g = p.add_argument_group(
        "memory cascade",
        "Full attention keeps every token of the context; the memory cascade attends the sinks, a "
        "recent window and the episodic blocks it retrieves, so a prompt past the model's context "
        "runs in bounded memory. These flags hold for every request: each prompt of generate, each "
        "request of serve (every client's), each turn of chat.",
    )
    g.add_argument("--cascade", choices=CASCADE_MODES, default=None,
                   help="auto = full attention while prompt + max_tokens fit the model's context, the "
                        "cascade (shaped by the flags below) past it; on = the cascade for every request, "
                        "short ones too (slower than full attention on a prompt that fits: on a server "
                        "every request pays it); off = never, a prompt past the context is refused "
                        "(default: on when a flag below is given, else auto; with --distributed, else off)")
    g.add_argument("--window", type=positive_int, default=None,
                   help="recent tokens always attended (default: an eighth of the model's context, "
                        "kept within 64-4096: 1024 for 8k)")
    g.add_argument("--sinks", type=non_negative_int, default=None,
                   help="first tokens always attended, the attention sinks (default 64; fewer for models "
                        "with under 2k tokens of context)")
    g.add_argument("--block-size", type=positive_int, default=None,
                   help="tokens per episodic block (default 32; 16 for models with under 2k tokens of "
                        "context)")
    g.add_argument("--top-k-blocks", dest="top_k_blocks", type=non_negative_int, default=None,
                   help="episodic blocks retrieved per step, 0 = sinks + window only (default 32; fewer "
                        "for short contexts: at most a quarter of the context)")
    # Written out (importing the cascade's config would load MLX); a test keeps them equal to ROUTINGS.
    g.add_argument("--routing", choices=["sequence", "rolling", "token", "hybrid", "question"], default=None,
                   help="how blocks are chosen (default question)")
    g.add_argument("--block-kind", choices=["auto", "float16", "q8", "q4"], default=None,
                   help="storage of episodic blocks (default auto: float16, and 8-bit in memory "
                        "for the least recently used once the episodic budget is reached, before "
                        "any spill to disk)")
    g.add_argument("--no-cascade", action="store_true", help="the same as --cascade off")


def _shaping_flags(args: argparse.Namespace) -> list[str]:
    """The shaping flags given, as typed (``--top-k-blocks``), in ``CASCADE_FLAGS`` order."""
    return ["--" + dest.replace("_", "-") for dest, _ in CASCADE_FLAGS if getattr(args, dest, None) is not None]


def cascade_mode(args: argparse.Namespace) -> str:
    """``auto``, ``on`` or ``off`` for the flags: ``--cascade`` as given, ``--no-cascade`` =
    ``off``; unsaid, ``on`` when a shaping flag is given, else ``auto``.

    Raises:
        OptionError: ``--no-cascade`` with ``--cascade on|auto``, or ``off`` with a shaping flag.
    """
    given = _shaping_flags(args)
    mode = getattr(args, "cascade", None)
    no = getattr(args, "no_cascade", False)
    if no and mode not in (None, "off"):
        raise OptionError(f"--no-cascade conflicts with --cascade {mode}: --no-cascade is --cascade off")
    if no or mode == "off":
        if given:
            raise OptionError(f"{'--no-cascade' if no else '--cascade off'} conflicts with {given[0]}: "
                              "it shapes the memory cascade, which is off")
        return "off"
    return mode or ("on" if given else "auto")


def cascade_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``Engine.load``'s cascade keywords for the flags: ``cascade`` None (off), a dict of
    the shaping flags given (on: always the cascade, sized against the loaded model's
    context) or ``"auto"`` with those flags as ``cascade_settings``.

    Raises:
        OptionError: a conflict (``cascade_mode``; with the cascade forced on,
            ``--speculative`` or ``--cache-kind``, which it cannot honour) or a bad value.
    """
    mode = cascade_mode(args)
    if mode == "off":
        return {"cascade": None}
    given = {field: getattr(args, dest) for dest, field in CASCADE_FLAGS if getattr(args, dest, None) is not None}
    if mode == "on":  # every request through the cascade: what it cannot honour is refused
        forced = "--cascade on" if getattr(args, "cascade", None) == "on" else _shaping_flags(args)[0]
        if getattr(args, "speculative", None):
            raise OptionError(f"--speculative conflicts with {forced}: the memory cascade decodes "
                              "plainly (it cannot verify drafts token by token)")
        if getattr(args, "cache_kind", None):
            raise OptionError(f"--cache-kind conflicts with {forced}: the memory cascade keeps its "
                              "own KV (choose it with --block-kind)")
        for flag, dest in (("--beams", "num_beams"), ("--num-return-sequences", "num_return_sequences")):
            if (getattr(args, dest, None) or 1) > 1:
                raise OptionError(f"{flag} conflicts with {forced}: it copies a KV cache per reply, "
                                  "which the memory cascade cannot")
    if given:
        from mlotspark.memory.cascade.config import CascadeConfig
        from mlotspark.runtime.cache_choice import VALUES_ONLY_CONTEXT

        # The values now, so a bad one fails before the model loads; their sizes are checked
        # against the loaded model's own context by Engine.load.
        CascadeConfig.for_model(VALUES_ONLY_CONTEXT, **given)
    if mode == "on":
        return {"cascade": given}
    return {"cascade": "auto", "cascade_settings": given} if given else {"cascade": "auto"}


def cascade_shape(kw: dict[str, Any]) -> dict[str, Any]:
    """The shaping flags given in ``cascade_kwargs``' result (``{"window": 512}``; {} for none)."""
    return kw.get("cascade_settings") or (kw["cascade"] if isinstance(kw.get("cascade"), dict) else {})


def start_hub(servers: dict) -> Any:
    """Start the MCP servers (``chat --mcp``, ``serve --mcp``) and say on stderr which failed;
    the chat starts them before its app takes the terminal."""
    from mlotspark.tools import McpHub

    print(f"starting MCP servers: {', '.join(servers)} …", file=sys.stderr, flush=True)
    hub = McpHub(servers).start()
    for name, why in hub.errors.items():
        print(f"MCP server {name}: {why}", file=sys.stderr)
    return hub
