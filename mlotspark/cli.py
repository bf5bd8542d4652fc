"""``mlotspark`` command line: generate, pull, info (more commands join as built).

A user mistake prints one line ``mlotspark: error: ...`` and exits 2; Ctrl+C exits
130 without a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

from . import _blas  # noqa: F401  (OpenBLAS before MLX)
from .errors import MlotsparkError

SAMPLE_PROMPT = "What is the capital of France? Answer in one sentence."


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", "-m", default=None,
        help="alias (default: smollm2-135m-instruct), .gguf file, mlx-lm model directory or Hugging Face repo id",
    )
    p.add_argument(
        "--weights", default="auto", choices=["auto", "quantized", "float16", "bfloat16", "float32"],
        help="weight format to run in; auto = float32 through BLAS on the CPU backend, as stored on Metal (default: auto)",
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=None, help="most tokens to generate (default 512)")
    g.add_argument("--temp", "--temperature", dest="temperature", type=float, default=None,
                   help="sampling temperature, 0 = greedy (default 0.7)")
    g.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens, 0 = off (default 0)")
    g.add_argument("--top-p", type=float, default=None, help="nucleus sampling in (0, 1] (default 0.95)")
    g.add_argument("--min-p", type=float, default=None, help="min-p filter in [0, 1) (default 0)")
    g.add_argument("--repetition-penalty", type=float, default=None, help="> 0, 1 = off (default 1)")
    g.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    g.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop before this text (repeatable)")


def _sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "stop")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def cmd_generate(args: argparse.Namespace) -> int:
    from .engine import Engine

    options = _sampling_options(args)
    prompt = args.prompt
    if prompt == "-":
        prompt = sys.stdin.read()
    engine = Engine.load(args.model, weights=args.weights, progress=sys.stderr.isatty())
    engine.options(**options)  # validate before any work
    messages: Any = prompt
    if args.system and not args.raw:
        messages = [{"role": "system", "content": args.system}, {"role": "user", "content": prompt}]
    if args.json:
        result = engine.generate(messages, raw=args.raw, **options)
        out = {"text": result.text, "tokens": result.tokens, **result.stats.to_dict()}
        print(json.dumps(out, ensure_ascii=False))
        return 0
    stats = None
    for piece in engine.stream(messages, raw=args.raw, **options):
        if isinstance(piece, str):
            sys.stdout.write(piece)
            sys.stdout.flush()
        else:
            stats = piece
    sys.stdout.write("\n")
    if stats is not None and args.verbose:
        print(
            f"[{stats.prompt_tokens} prompt tokens, {stats.generation_tokens} generated; "
            f"TTFT {stats.ttft_s * 1000:.0f} ms, prefill {stats.prefill_tps:.1f} tok/s, "
            f"decode {stats.decode_tps:.1f} tok/s, peak {stats.peak_memory_mb:.0f} MB, "
            f"finish: {stats.finish_reason}]",
            file=sys.stderr,
        )
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from . import registry

    source = registry.pull(args.model, progress=True, force=args.force)
    print(f"{source.name}: {source.path}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .device import device_info, format_info

    info = device_info()
    print(json.dumps(info, indent=2, default=str) if args.json else format_info(info))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlotspark",
        description="A desktop LLM inference engine on MLX, with a memory cascade.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("generate", help="generate a reply to a prompt, streamed to stdout",
                       description="Generate a reply to a prompt, streamed to stdout.")
    p.add_argument("-p", "--prompt", default=SAMPLE_PROMPT,
                   help="the prompt ('-' reads stdin; default: a sample question)")
    p.add_argument("--system", default=None, help="a system prompt (chat mode)")
    p.add_argument("--raw", action="store_true", help="send the prompt as-is, without the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object with the text and stats")
    p.add_argument("-v", "--verbose", action="store_true", help="print speed figures to stderr")
    _add_model_args(p)
    _add_sampling_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("pull", help="fetch a model into $MLOTSPARK_HOME",
                       description="Fetch a model (default: smollm2-135m-instruct) into $MLOTSPARK_HOME/models.")
    p.add_argument("model", nargs="?", default=None, help="alias or Hugging Face repo id")
    p.add_argument("--force", action="store_true", help="fetch again even if present")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("info", help="device, BLAS, MLX version, memory and model status")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except MlotsparkError as e:
        print(f"mlotspark: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nmlotspark: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
