"""``mlotspark generate``: a reply to a prompt, streamed to stdout."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mlotspark.memory.cascade import CascadeConfig
from mlotspark.errors import OptionError
from mlotspark.options import GenerationOptions
from mlotspark.cli import distributed
from mlotspark.cli.batch import add_batch_args, add_scheduler_args, scheduler_kwargs
from mlotspark.cli.common import add_model_args, add_sampling_args, positive_int, sampling_options

# A context so long that no span exceeds it: checks flag values, not their fit.
VALUES_ONLY_CONTEXT = 1 << 30

SAMPLE_PROMPT = "What is the capital of France? Answer in one sentence."


def run(args: argparse.Namespace) -> int:
    from mlotspark.engine import Engine

    options = sampling_options(args)
    options.update(_decoding_options(args))
    if args.prompts:  # a file of prompts through the batcher
        from mlotspark.cli import batch

        return batch.run(args, options)
    prompt = args.prompt
    if prompt == "-":
        prompt = sys.stdin.read()
    GenerationOptions().merged(**options)  # a bad value fails before the model loads
    cascade = cascade_choice(args)  # validated again against the model once loaded
    messages: Any = prompt
    if args.system and not args.raw:
        messages = [{"role": "system", "content": args.system}, {"role": "user", "content": prompt}]
    if args.distributed:  # under mlx.launch: rank 0 prints, the other ranks follow it
        def load() -> Any:
            return Engine.load(args.model, weights=args.weights, progress=False,
                               cascade=None if cascade == "auto" else cascade,
                               distributed=args.distributed, split=args.split, rank_timeout=args.rank_timeout)

        return distributed.run_ranked(args, load, lambda engine: _reply(engine, args, messages, options))
    engine = Engine.load(args.model, weights=args.weights, progress=sys.stderr.isatty(),
                         cascade=cascade, **scheduler_kwargs(args))
    return _reply(engine, args, messages, options)


def _reply(engine: Any, args: argparse.Namespace, messages: Any, options: dict[str, Any]) -> int:
    """Generate and print the reply (text stream, sequences or ``--json``)."""
    if args.json:
        result = engine.generate(messages, raw=args.raw, **options)
        out = {"text": result.text, "tokens": result.tokens, **result.stats.to_dict()}
        if result.sequences:
            out["sequences"] = [{"text": h.text, "tokens": h.tokens, "score": h.score,
                                 "logprob": h.logprob, "finish_reason": h.finish_reason}
                                for h in result.sequences]
        print(json.dumps(out, ensure_ascii=False))
        return 0
    if options.get("num_return_sequences", 1) > 1:
        result = engine.generate(messages, raw=args.raw, **options)
        for i, h in enumerate(result.sequences, 1):
            print(f"--- {i} (score {h.score:.4f}, {h.finish_reason})\n{h.text}")
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
    add_scheduler_args(p)
    add_batch_args(p)
    add_cascade_args(p)
    distributed.add_distributed_args(p)
    g = p.add_argument_group("decoding")
    g.add_argument("--beams", dest="num_beams", type=positive_int, default=None,
                   help="beam search width, 1 = off (default 1)")
    g.add_argument("--length-penalty", type=float, default=None,
                   help="beam score = logprob / length ** this (default 1.0)")
    g.add_argument("--num-return-sequences", type=positive_int, default=None,
                   help="replies to return: the best beams, or independent samples (default 1)")
    g.add_argument("--speculative", choices=["prompt_lookup", "draft"], default=None,
                   help="exact speculative decoding: n-gram lookup in the context, or a draft model")
    g.add_argument("--draft-model", default=None,
                   help="draft model for --speculative draft (same vocabulary as --model)")
    g.add_argument("--cache-kind", choices=["float16", "q8", "q4", "auto"], default=None,
                   help="KV cache of the working memory; auto = fits the memory, keeps quality, fastest")
    p.set_defaults(func=run)


def _decoding_options(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("num_beams", "length_penalty", "num_return_sequences", "speculative", "draft_model", "cache_kind")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def add_cascade_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "memory cascade",
        "Default: plain full attention while the prompt fits the model's context, the "
        "cascade past it. Any of these flags turns the cascade on; --no-cascade turns it off.",
    )
    g.add_argument("--window", type=positive_int, default=None, help="local window of the working memory (tokens)")
    g.add_argument("--sinks", type=int, default=None, help="attention-sink tokens always kept")
    g.add_argument("--block-size", type=positive_int, default=None, help="tokens per episodic block")
    g.add_argument("--top-k-blocks", dest="top_k_blocks", type=int, default=None,
                   help="episodic blocks retrieved per step; 0 = sinks + window only")
    g.add_argument("--routing", choices=["sequence", "rolling", "token", "hybrid"], default=None,
                   help="how blocks are chosen (default hybrid)")
    g.add_argument("--block-kind", choices=["float16", "q8", "q4"], default=None,
                   help="storage of episodic blocks (default float16)")
    g.add_argument("--no-cascade", action="store_true", help="plain full attention only")


def cascade_choice(args: argparse.Namespace) -> dict[str, Any] | str | None:
    """The ``cascade`` argument of ``Engine.load``: 'auto', None (--no-cascade) or the
    cascade flags that were given (sized against the loaded model's context)."""
    flags = {
        "window": args.window, "sinks": args.sinks, "block_size": args.block_size,
        "top_k": args.top_k_blocks, "routing": args.routing, "block_kind": args.block_kind,
    }
    given = {k: v for k, v in flags.items() if v is not None}
    if args.no_cascade:
        if given:
            raise OptionError(f"--no-cascade conflicts with --{next(iter(given)).replace('_', '-')}")
        return None
    if given:
        # Check the values now, so a bad one fails before the model loads; the sizes are
        # checked against the loaded model's own context by Engine.load.
        CascadeConfig.from_flags(VALUES_ONLY_CONTEXT, **given)
        return given
    return "auto"
