"""``mlotspark bench``: latency and tokens/sec of the suites, optionally beside mlx-lm."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

from mlotspark.cli.common import add_model_args, non_negative_int, positive_int
from mlotspark.errors import OptionError


def _command(args: argparse.Namespace) -> str:
    """The run's settings as one command line that repeats it (recorded in the report)."""
    parts = ["mlotspark", "bench"]
    if getattr(args, "models_dir", None):  # where --model's alias was found
        parts += ["--models-dir", args.models_dir]
    if args.model:
        parts += ["--model", args.model]
    if args.weights != "auto":
        parts += ["--weights", args.weights]
    parts += ["-p", str(args.prompt_tokens), "-g", str(args.gen_tokens), "-r", str(args.repetitions),
              "--warmup", str(args.warmup), "--suite", args.suite]
    if args.compare:
        parts += ["--compare", args.compare]
    if any(s.strip().startswith(("long", "ruler")) for s in args.suite.split(",")):
        parts += ["--contexts", args.contexts]
    if any(s.strip().startswith("batch") for s in args.suite.split(",")):
        parts += ["--batch-sizes", args.batch_sizes]
    if args.seed:
        parts += ["--seed", str(args.seed)]
    if args.suite.strip() == "memory" and args.memory_set:
        parts += ["--memory-set", args.memory_set]
        if args.memory_writer != "auto":
            parts += ["--memory-writer", args.memory_writer]
    if args.suite.strip() == "serve":
        parts += ["--clients", args.clients, "--requests", str(args.requests), "--histories", str(args.histories),
                  "--max-batch", str(args.max_batch), "--responses-turns", str(args.responses_turns)]
    return " ".join(shlex.quote(p) for p in parts)


def _check_output(path: str, flag: str) -> Path:
    """``path`` if a report can be written there: checked before the model loads, so a
    long run's figures are not lost to a typo at the end.

    Raises:
        OptionError: a directory, or a place where no file can be created.
    """
    from mlotspark.errors import OptionError
    from mlotspark.storage import writable

    p = Path(path)
    if p.is_dir():
        raise OptionError(f"invalid {flag} {path!r}: it is a directory, name a file")
    if not writable(p.parent):
        raise OptionError(f"invalid {flag} {path!r}: cannot create a file in {str(p.parent)!r}")
    return p


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl+C, so the engine closes and the scratch directory goes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_conformance(args: argparse.Namespace) -> int:
    """``--suite conformance``: the conformance matrix (``mlotspark check``) on ``--model``,
    else on each catalogue chat model; ``--write-capabilities`` ships the figures."""
    from mlotspark.bench.conformance import CELLS
    from mlotspark.cli import check

    models = [args.model] if args.model else list(check.CATALOGUE_CHAT)
    results = check.run_models(models, CELLS, args.weights)
    if args.write_capabilities:
        path = check.write_capabilities(results, _command(args))
        print(f"mlotspark: bench: wrote {path}", file=sys.stderr)
    return check.report(results, args.output)


def run_memory(args: argparse.Namespace) -> int:
    """``--suite memory``: semantic memory as a user lives it (``bench/memory_eval.py``) on
    ``--model``, the set from ``--memory-set``, in a scratch home; JSON to ``--output`` or stdout."""
    import json

    from mlotspark.bench.memory_eval import evaluate
    from mlotspark.cli import check
    from mlotspark.cli.progress import announce_pull, step_lines
    from mlotspark.engine import Engine
    from mlotspark.storage import atomic_write

    if not args.memory_set:
        raise OptionError("--suite memory needs --memory-set FILE (updates, same_kind_pairs, retractions, paraphrases)")
    try:
        cases = json.loads(Path(args.memory_set).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise OptionError(f"invalid --memory-set {args.memory_set!r}: {e}") from None
    output = _check_output(args.output, "--output") if args.output else None
    from mlotspark.models.hub.aliases import default_model

    spec = args.model or default_model()
    announce_pull(spec)
    with check._scratch_home():
        with step_lines():
            engine = Engine.load(spec, weights=args.weights, progress=sys.stderr.isatty(), temperature=0.0)
        try:
            result = evaluate(engine, cases, on_part=lambda part, right, n: print(
                f"  {part}: {right}/{n}", file=sys.stderr, flush=True))
        finally:
            engine.close()
    result = {"command": _command(args), "model": spec, "memory_writer": args.memory_writer, **result}
    text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    if output is not None:
        atomic_write(output, text)
    else:
        sys.stdout.write(text)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    """``--suite serve``: ``mlotspark serve`` beside ``mlx_lm.server`` (``bench/serve.py``) on
    ``--model``; JSON (``--format json``) or markdown tables to ``--output`` or stdout."""
    import json

    from mlotspark.bench.config import parse_int_list
    from mlotspark.bench.serve import ServeConfig, render_markdown, run_serve as serve
    from mlotspark.models.hub.aliases import default_model
    from mlotspark.storage import atomic_write

    if args.format == "csv":
        raise OptionError("invalid --format csv for --suite serve: choose table or json")
    clients = parse_int_list(args.clients, "client count") if args.clients.strip() else ()
    config = ServeConfig(model=args.model or default_model(), clients=clients, requests=args.requests,
                         tokens=args.gen_tokens, histories=args.histories, repetitions=args.repetitions,
                         max_batch=args.max_batch, responses_turns=args.responses_turns)
    output = _check_output(args.output, "--output") if args.output else None
    with _terminate_as_exit():
        figures = serve(config, log=lambda line: print(line, file=sys.stderr, flush=True))
    record = {"command": _command(args), "model": config.model, "clients": list(config.clients),
              "requests": config.requests, "tokens": config.tokens, "repetitions": config.repetitions,
              "histories": config.histories, **figures}
    text = json.dumps(record, indent=1) + "\n" if args.format == "json" else render_markdown(record)
    if output is not None:
        atomic_write(output, text)
        print(f"mlotspark: bench: wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


ALONE_RUNNERS = {"serve": run_serve, "memory": run_memory, "conformance": run_conformance}


def run(args: argparse.Namespace) -> int:
    from mlotspark.bench.suites import ALONE

    names = [s.strip().partition(":")[0] for s in args.suite.split(",") if s.strip()]
    alone = [n for n in names if n in ALONE]
    if alone and len(names) == 1:
        return ALONE_RUNNERS[alone[0]](args)  # else parse_suites below names the one that runs alone
    if args.write_capabilities:
        raise OptionError("--write-capabilities needs --suite conformance")
    from mlotspark.bench import BenchConfig, parse_suites, plot_report, render, run_bench
    from mlotspark.bench.config import parse_int_list
    from mlotspark.bench.plot import check_path
    from mlotspark.errors import MlotsparkError
    from mlotspark.storage import atomic_write

    # Every setting is checked before the model loads: a typo costs nothing.
    plot = _check_output(str(check_path(args.plot)), "--plot") if args.plot else None
    output = _check_output(args.output, "--output") if args.output else None
    config = BenchConfig(
        model=args.model,
        weights=args.weights,
        prompt_tokens=args.prompt_tokens,
        gen_tokens=args.gen_tokens,
        repetitions=args.repetitions,
        warmup=args.warmup,
        suites=parse_suites(args.suite),
        compare=args.compare,
        contexts=parse_int_list(args.contexts, "context length"),
        batch_sizes=parse_int_list(args.batch_sizes, "batch size"),
        seed=args.seed,
    )
    progress = None if args.progress == "auto" else args.progress == "on"
    command = _command(args)
    with _terminate_as_exit():
        report = run_bench(config, show_progress=progress, command=command)
    text = render(report, args.format)
    failed = False
    if output is not None:
        try:
            atomic_write(output, text)
            print(f"mlotspark: bench: wrote {output}", file=sys.stderr)
        except MlotsparkError as e:  # e.g. the disk filled during the run: keep the figures
            sys.stdout.write(text)
            print(f"mlotspark: bench: {e}; the report went to stdout", file=sys.stderr)
            failed = True
    else:
        sys.stdout.write(text)
    if plot is not None:
        try:
            plot_report(report, plot)
            print(f"mlotspark: bench: wrote {plot}", file=sys.stderr)
        except MlotsparkError as e:
            print(f"mlotspark: bench: {e}", file=sys.stderr)
            failed = True
    for e in report.errors:
        print(f"mlotspark: bench: not run: {e.message}", file=sys.stderr)
    return 1 if any(not e.cell for e in report.errors) or failed else 0  # a cell not run is no failure


def _suites_epilog() -> str:
    from mlotspark.bench.suites import SUITES  # imports MLX: only when bench's help is shown

    from mlotspark.bench.suites import ALONE

    suites = "; ".join(f"{name}: {m.DESCRIPTION}" + (f" (cases {', '.join(m.CASES)})" if m.CASES else "")
                       for name, m in SUITES.items())
    alone = "; ".join(f"{name}: {line}" for name, line in ALONE.items())
    return f"Suites: {suites}. Suites that run alone (--suite NAME by itself): {alone}."


def _help_with_suites(p: argparse.ArgumentParser) -> str:
    p.epilog = p.epilog or _suites_epilog()
    return argparse.ArgumentParser.format_help(p)


def register(sub: Any) -> None:
    from mlotspark.bench.config import DEFAULT_SUITES

    p = sub.add_parser(
        "bench", help="latency and tokens/sec, side by side with mlx-lm",
        description=(
            "Measure prefill and decode speed, time to first token, long context, batching and "
            "speculative decoding (and, run alone: serve vs mlx_lm.server, semantic memory, the "
            "conformance matrix); each figure is the median, min and max of the repetitions after "
            "a warm-up. With --compare mlx-lm, mlx-lm runs on the same weights in the same process, "
            "interleaved, and a ratio column says how we compare (> 1: mlotspark better). "
            "Absolute numbers drift on a busy machine; the ratios measured side by side are what count."
        ),
    )
    p.format_help = lambda: _help_with_suites(p)  # type: ignore[method-assign]  # suites listed lazily
    add_model_args(p)
    p.add_argument("-p", "--prompt-tokens", type=positive_int, default=512, help="prompt tokens of the pp suite (default 512)")
    p.add_argument("-g", "--gen-tokens", type=positive_int, default=128,
                   help="tokens to decode in tg, long, batch and spec (default 128)")
    p.add_argument("-r", "--repetitions", type=positive_int, default=5, help="timed repetitions (default 5); ruler: cases per task and length, no warm-up")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed runs first (default 1)")
    p.add_argument("--suite", "-s", default=DEFAULT_SUITES,
                   help=f"comma-separated suites, or suite:case (default {DEFAULT_SUITES}; 'all' = every suite below)")
    p.add_argument("--compare", choices=["mlx-lm"], default=None,
                   help="also run mlx-lm on the same weights, interleaved, and print ratios")
    p.add_argument("--format", "-f", choices=["table", "json", "csv"], default="table", help="output format (default table)")
    p.add_argument("--output", "-o", default=None, metavar="FILE", help="write the report to FILE instead of stdout")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="also draw the figures as a PNG bar chart")
    p.add_argument("--contexts", default="1024,2048,4096", help="context lengths in tokens of the long and ruler suites, comma-separated (default 1024,2048,4096)")
    p.add_argument("--batch-sizes", default="1,2,4,8", help="batch sizes of the batch suite, comma-separated (default 1,2,4,8)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the random prompts (default 0)")
    p.add_argument("--progress", choices=["auto", "on", "off"], default="auto",
                   help="progress bar on stderr (default auto: when stderr is a terminal)")
    p.add_argument("--write-capabilities", action="store_true",
                   help="with --suite conformance: write the catalogue models' cells into the capabilities "
                        "mlotspark ships (what list, /v1/models and the chat's picker report)")
    p.add_argument("--memory-set", default=None, metavar="FILE",
                   help="with --suite memory: the cases (JSON: updates, same_kind_pairs, retractions, paraphrases)")
    p.add_argument("--memory-writer", choices=["auto", "model", "simple"], default="auto",
                   help="with --suite memory: who decides what a turn changes in memory (default auto)")
    p.add_argument("--clients", default="1,4,8,16",
                   help="with --suite serve: client counts, comma-separated, each measured in turn "
                        "(default 1,4,8,16; '' = no throughput)")
    p.add_argument("--requests", type=positive_int, default=2,
                   help="with --suite serve: requests each client sends, one after another (default 2)")
    p.add_argument("--histories", type=non_negative_int, default=3,
                   help="with --suite serve: ~2k-token histories for cold vs warm TTFT (default 3; 0 = skip)")
    p.add_argument("--max-batch", type=positive_int, default=16,
                   help="with --suite serve: our server's --max-batch (default 16)")
    p.add_argument("--responses-turns", type=non_negative_int, default=10,
                   help="with --suite serve: /v1/responses turns chained by previous_response_id after each "
                        "history's first; the last one's TTFT against the first's (default 10; 0 = skip)")
    p.set_defaults(func=run)
