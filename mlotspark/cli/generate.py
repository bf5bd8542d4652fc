"""``mlotspark generate``: a reply to a prompt, streamed to stdout."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mlotspark.errors import OptionError
from mlotspark.options import GenerationOptions
from mlotspark.runtime.progress import PrefillProgress
from mlotspark.results import ReasoningPiece
from mlotspark.cli import distributed
from mlotspark.cli.batch import add_batch_args, add_scheduler_args, scheduler_kwargs
from mlotspark.cli.progress import PrefillBar, StatusLine, announce_pull, step_lines
from mlotspark.cli.common import (add_cascade_args, add_model_args, add_sampling_args, cascade_kwargs, flag, note,
                                  positive_int, sampling_options)

SAMPLE_PROMPT = "What is the capital of France? Answer in one sentence."


def check_flags(args: argparse.Namespace) -> None:
    """Refuse flags that would be silently ignored together (one line naming both).

    Generation options are checked by ``GenerationOptions`` (the same check for the
    API, the CLI and the TUI); these are the flags only the CLI has.

    Raises:
        OptionError: naming both flags.
    """
    if getattr(args, "prompt_text", None) is not None:  # `mlotspark generate "Hello"`, as -p gives it
        if args.prompt is not None:
            raise OptionError("the prompt is given twice: as an argument and as --prompt; give one")
        args.prompt, args.prompt_text = args.prompt_text, None
    if args.raw and args.system is not None:
        raise OptionError("--system conflicts with --raw: a raw prompt has no chat template to put it in")
    if args.prompts is None:
        for name in ("output", "redo"):
            if getattr(args, name, None):
                raise OptionError(f"--{name} needs --prompts FILE (it is about a batch run)")
        return
    if args.prompt is not None:
        raise OptionError("--prompt conflicts with --prompts: give one prompt or a file of them")
    if args.json:
        raise OptionError("--json conflicts with --prompts: results are JSON lines in --output already")
    if args.verbose:
        raise OptionError("--verbose conflicts with --prompts: each result line carries its figures")
    if args.length_penalty is not None and (args.num_beams or 1) == 1:
        raise OptionError("--length-penalty needs --beams with --prompts: there each of "
                          "--num-return-sequences is a request of its own, never ranked")


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    options = sampling_options(args)
    options.update(_decoding_options(args))
    merged = GenerationOptions().merged(**options)  # a bad value or a conflict fails before the model loads
    for name, other in merged.ignored(set(options)):
        note(f"{flag(name)} has no effect with {flag(other)} 0: greedy decoding never samples")
    if args.prompts:  # a file of prompts through the batcher
        from mlotspark.cli import batch

        if args.distributed:  # rank 0 reads the file and batches it for every rank; the others follow
            cascade = _ranked_cascade(args)
            return distributed.run_ranked(args, lambda: _load_ranked(args, cascade),
                                          lambda engine: batch.run(args, options, cascade, lambda *_: engine))
        return batch.run(args, options, cascade_kwargs(args), load_engine)
    prompt = SAMPLE_PROMPT if args.prompt is None else args.prompt
    if prompt == "-":
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise OptionError("the prompt read from stdin is empty: pipe some text in, or give --prompt TEXT")
    elif not prompt.strip():
        raise OptionError(f"--prompt is {'empty' if not prompt else 'blank'}: give the text to answer "
                          "(or '-' to read it from stdin)")
    cascade = _ranked_cascade(args) if args.distributed else cascade_kwargs(args)  # checked again once loaded
    messages: Any = prompt
    if args.system and not args.raw:
        messages = [{"role": "system", "content": args.system}, {"role": "user", "content": prompt}]
    if args.distributed:  # under mlx.launch: rank 0 prints, the other ranks follow it
        return distributed.run_ranked(args, lambda: _load_ranked(args, cascade),
                                      lambda engine: _reply(engine, args, messages, options))
    return _reply(load_engine(args, cascade), args, messages, options)


def _ranked_cascade(args: argparse.Namespace) -> dict[str, Any]:
    """``cascade_kwargs`` across ranks: the cascade when forced on, else none (as before
    ``--cascade``: ``auto`` is not offered there).

    Raises:
        OptionError: ``--cascade auto`` with ``--distributed``.
    """
    if args.cascade == "auto":
        raise OptionError(f"--cascade auto conflicts with --distributed {args.distributed}: across ranks the "
                          "memory cascade runs only when forced on (--cascade on)")
    cascade = cascade_kwargs(args)
    return {"cascade": None} if cascade["cascade"] == "auto" else cascade


def _load_ranked(args: argparse.Namespace, cascade: dict[str, Any]) -> Any:
    """This rank's share of a distributed engine (under ``mlx.launch``)."""
    from mlotspark.engine import Engine

    return Engine.load(args.model, weights=args.weights, progress=False, **cascade,
                       distributed=args.distributed, split=args.split, rank_timeout=args.rank_timeout)


def _reply(engine: Any, args: argparse.Namespace, messages: Any, options: dict[str, Any]) -> int:
    """Generate and print the reply (text stream, sequences or ``--json``)."""
    if args.json:
        result = _generate(engine, messages, args.raw, options)
        out = {"text": result.text, "tokens": result.tokens, **result.stats.to_dict()}
        if result.reasoning:
            out["reasoning"] = result.reasoning
        if result.sequences:
            out["sequences"] = [{"text": h.text, "tokens": h.tokens, "score": h.score,
                                 "logprob": h.logprob, "finish_reason": h.finish_reason}
                                for h in result.sequences]
        print(json.dumps(out, ensure_ascii=False))
        return 0
    if options.get("num_return_sequences", 1) > 1:
        result = _generate(engine, messages, args.raw, options)
        for i, h in enumerate(result.sequences, 1):
            print(f"--- {i} (score {h.score:.4f}, {h.finish_reason})\n{h.text}")
        sys.stdout.flush()
        _tell(args, engine, result.stats)
        return 0
    stats = None
    bar = PrefillBar()  # on a terminal only, once the prefill has taken a second
    try:
        thinking = False
        for piece in engine.stream(messages, raw=args.raw, progress=True, **options):
            if isinstance(piece, ReasoningPiece):  # the thinking on stderr: stdout holds the answer alone
                bar.close()
                sys.stderr.write(piece.text)
                sys.stderr.flush()
                thinking = True
            elif isinstance(piece, str):
                bar.close()
                if thinking:
                    sys.stderr.write("\n")
                    thinking = False
                sys.stdout.write(piece)
                sys.stdout.flush()
            elif isinstance(piece, PrefillProgress):
                bar(piece)
            else:
                stats = piece
    finally:
        bar.close()
    sys.stdout.write("\n")
    sys.stdout.flush()  # the reply, then the story on stderr
    _tell(args, engine, stats)
    return 0


def load_engine(args: argparse.Namespace, cascade: dict[str, Any]) -> Any:
    """``Engine.load`` for the flags (``cascade``: ``cascade_kwargs``); on a terminal, a line
    says it is loading (the weights' conversion can take seconds) once a fetch, with its own
    bar, is done."""
    from mlotspark.engine import Engine
    from mlotspark.models.hub import catalogue

    tty = sys.stderr.isatty()
    announce_pull(args.model)
    with step_lines():  # piped: a fetch or a conversion still says so
        catalogue.resolve(args.model, pull=True, progress=tty)  # fetched first, so the bars never mix
        with StatusLine("loading the model", enabled=tty):
            return Engine.load(args.model, weights=args.weights, progress=tty, **cascade, **scheduler_kwargs(args))


def _generate(engine: Any, messages: Any, raw: bool, options: dict) -> Any:
    """``engine.generate`` with the prefill bar on a terminal."""
    with PrefillBar() as bar:
        return engine.submit(messages, raw=raw, on_progress=bar, **options).result()


def _tell(args: argparse.Namespace, engine: Any, stats: Any) -> None:
    """What the run could not do as asked (a note, always), then ``-v``: the story of the
    run on stderr (``GenerationStats.describe``) and the scheduler."""
    if stats is None:
        return
    # The cascade took over a long prompt (auto): it decodes plainly and keeps its own KV.
    spec = stats.extra.get("speculative") or {}
    if spec.get("fallback"):
        note(f"--speculative {spec.get('drafter')} did not run: {spec['fallback']} (decoded plainly)")
    cache = stats.extra.get("cache") or {}
    if getattr(args, "cache_kind", None) and cache.get("kind") == "cascade":
        note(f"--cache-kind {getattr(args, 'cache_kind')} did not apply: the memory cascade holds this context "
             f"({cache.get('why')}) with its own KV (--block-kind)")
    if not args.verbose:
        return
    lines = stats.describe()
    load = engine.loaded.extra.get("load") or {}
    if load.get("phases"):  # where a load's seconds went (the tokenizer is built beside the widening)
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in load["phases"].items())
        source = {"float32-cache": "from the float32 cache"}.get(load.get("reader")) or (
            "from the conversion cache" if load.get("from_cache") else load.get("reader", ""))
        lines.append(f"load: {load.get('seconds_total', 0):.2f} s ({parts}; {source})")
    status = engine.status()
    lines.append(f"scheduler: {status.get('mode')} mode, batch cap {status.get('cap')} "
                 f"({status.get('state')}: {status.get('reason')})")
    print("\n".join(f"[{line}]" for line in lines), file=sys.stderr)


def register(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate a reply to a prompt, streamed to stdout",
                       description="Generate a reply to a prompt, streamed to stdout.")
    p.add_argument("prompt_text", nargs="?", default=None, metavar="PROMPT",
                   help="the prompt (as -p gives it)")
    p.add_argument("-p", "--prompt", default=None,
                   help="the prompt ('-' reads stdin; default: a sample question)")
    p.add_argument("--system", default=None,
                   help="a system prompt (default: the chat template's own; not with --raw)")
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
                   help="exact speculative decoding: n-gram lookup in the context, or a draft model "
                        "(default: off)")
    g.add_argument("--draft-model", default=None,
                   help="draft model for --speculative draft (same vocabulary as --model)")
    g.add_argument("--cache-kind", choices=["float16", "q8", "q4", "auto"], default=None,
                   help="KV cache of the working memory: float16, 8- or 4-bit quantized, or auto = the "
                        "fastest kind that fits the memory and keeps quality (default: the model's "
                        "activation dtype, unquantized)")
    g.add_argument("--json-schema", default=None, metavar="FILE",
                   help="constrain the reply to JSON valid against the JSON schema in FILE (a file "
                        "holding {} = any JSON object)")
    p.set_defaults(func=run)


def _decoding_options(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("num_beams", "length_penalty", "num_return_sequences", "speculative", "draft_model", "cache_kind")
    out = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if getattr(args, "json_schema", None):
        out["response_format"] = json_schema_format(args.json_schema)
    return out


def json_schema_format(path: str) -> dict:
    """The ``response_format`` for ``--json-schema FILE``.

    Raises:
        OptionError: the file cannot be read or is not a JSON object.
    """
    from pathlib import Path

    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise OptionError(f"cannot read --json-schema {path}: {e.strerror}") from None
    except ValueError as e:
        raise OptionError(f"invalid --json-schema {path}: not JSON ({e})") from None
    if not isinstance(schema, dict):
        raise OptionError(f"invalid --json-schema {path}: the schema must be a JSON object")
    if not schema:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": Path(path).stem, "schema": schema}}
