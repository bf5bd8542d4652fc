"""``mlotspark generate``: a reply to a prompt, streamed to stdout."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..options import GenerationOptions
from .common import add_model_args, add_sampling_args, sampling_options

SAMPLE_PROMPT = "What is the capital of France? Answer in one sentence."


def run(args: argparse.Namespace) -> int:
    from ..engine import Engine

    options = sampling_options(args)
    prompt = args.prompt
    if prompt == "-":
        prompt = sys.stdin.read()
    GenerationOptions().merged(**options)  # a bad value fails before the model loads
    engine = Engine.load(args.model, weights=args.weights, progress=sys.stderr.isatty())
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




def register(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate a reply to a prompt, streamed to stdout",
                       description="Generate a reply to a prompt, streamed to stdout.")
    p.add_argument("-p", "--prompt", default=SAMPLE_PROMPT,
                   help="the prompt ('-' reads stdin; default: a sample question)")
    p.add_argument("--system", default=None, help="a system prompt (chat mode)")
    p.add_argument("--raw", action="store_true", help="send the prompt as-is, without the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object with the text and stats")
    p.add_argument("-v", "--verbose", action="store_true", help="print speed figures to stderr")
    add_model_args(p)
    add_sampling_args(p)
    p.set_defaults(func=run)
