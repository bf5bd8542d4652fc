"""RULER beyond `--suite ruler`: the flags the GPU leases and the cascade's studies need (--layout, --capture, --block-kind, --resume).

RULER-style long-context cases through the memory cascade, sinks + window only, and
full attention; ``mlotspark bench --suite ruler`` runs the same tasks and haystacks at
the engine's defaults, and this script adds the cascade's own settings as flags, a
per-case record that a run cut by a time limit resumes, and the question pass's
captures (``ruler_capture.py`` reads them).

Tasks and haystacks: ``mlotspark/bench/ruler.py`` (Python's own documentation as
varied natural text, needles at evenly spread depths, seeded). Each case is asked
through the chat template, greedy; its score is the share of expected answers in
the reply.

    python benchmarks/ruler.py --multiples 1 2 4 8 --lengths 16384 32768 --trials 4 --out ruler.jsonl

Every case runs through the engine as a user's request does (``bench.ruler.answer``:
submitted to the scheduler, the engine's prefill chunks, the cascade's question pass
between prefill and decode); each record counts the question passes that ran.

``--layout`` moves the question: ``first`` (before the text), ``system`` (before the
text, after a system prompt that puts it past the cascade's sinks), ``turns`` (in the next
turn of an ``engine.conversation``, after the text; conversations in a scratch home); RULER
puts it last (``end``, the default), where the cascade's question pass reads the prompt.

Modes: ``cascade`` (``CascadeConfig.for_model`` of the model's context, as the
engine runs it, unless flags change it), ``streaming`` (the same with top_k 0:
sinks + window), ``full`` (plain KV; only where prompt + answer fit the model's
trained context). Lengths are multiples of the window plus ``--lengths`` (``--lengths`` alone:
only those; neither: 1, 2, 4 and 8 windows, 16,384 and 32,768 tokens).

Every case is one JSON line in ``--out`` (appended as soon as it is answered), so
a long matrix can be split into runs under a time limit: ``--stop-after`` starts
no case past a number of seconds (exit status 75 when cases are left),
``--resume`` skips the cases the file already holds for the same settings, and ``--summary`` prints the
table (k/n cases scored 1, and the mean score, per task x length x mode) of
everything a file holds without loading the model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any
from collections import defaultdict
from pathlib import Path

from mlotspark.bench.ruler import ANSWER_TOKENS, LAYOUTS, TASKS, depths, make_case, messages

def emit(record: dict, out: Path | None) -> None:
    """Print a JSON line and append it to ``out``."""
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        with open(out, "a") as f:
            f.write(line + "\n")


def command_line() -> str:
    return "python " + " ".join(sys.argv)


# Fields of CascadeConfig a flag may override (None = the model's default).
FLAGS = {
    "window": int, "sinks": int, "block_size": int, "top_k": int, "routing": str, "representation": str,
    "rolling_window": int, "follow": int, "question_pass": int, "question_sharpen": int,
    "question_focus": float, "question_queries": int, "chunk": int, "block_kind": str, "episodic_budget_mb": int,
    "answer_route": int, "lead": int,
}

# Cascade fields added after records were written, with the value those records ran with.
ADDED = {"question_queries": 16, "answer_route": 0, "lead": 0}


def case_key(rec: dict) -> tuple:
    """What makes two case records the same measurement (``--resume``).

    Full attention does not depend on the cascade's settings, and sinks + window
    (top_k 0) does not depend on how blocks are chosen, so those settings are left
    out of their keys: a run that changes only the routing re-runs only ``cascade``.
    """
    cfg = dict(rec.get("cfg") or {})
    budget = cfg.get("episodic_budget_mb")
    for k in ("episodic_budget_mb", "spill_dir"):  # where blocks are kept, not which are attended
        cfg.pop(k, None)
    for k, v in ADDED.items():  # records written before a field existed had its default
        if cfg.get(k, v) == v:
            cfg.pop(k, None)
    if cfg.get("block_kind") == "auto":
        # auto stores float16 until the budget binds, where blocks go 8-bit: a budget set on the
        # command line is part of the measurement; under the machine's (None) auto counts as the
        # float16 records written before it (each record's ``compressed`` says if it bound).
        cfg["block_kind"] = "float16" if budget is None else f"auto, {budget} MB"
    if rec["mode"] == "full":
        cfg = {}
    elif rec["mode"] == "streaming":
        cfg = {k: cfg.get(k) for k in ("window", "sinks", "block_size", "chunk", "block_kind")}
    return (rec["task"], rec["length"], rec["mode"], rec["trial"], rec["trials"], rec["seed"],
            rec.get("max_tokens"), rec.get("model"), json.dumps(cfg, sort_keys=True), rec.get("layout", "end"))


def read_cases(path: Path) -> list[dict]:
    """Case records (lines with a ``task``) of a JSON-lines file; [] if it does not exist."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            rec = json.loads(line)
            if "task" in rec and "trial" in rec:
                out.append(rec)
    return out


def latest(records: list[dict]) -> list[dict]:
    """The last record of each case and mode (a rerun with other settings supersedes)."""
    last: dict[tuple, dict] = {}
    for r in records:
        last[(r["task"], r["length"], r["mode"], r["trial"], r["trials"], r["seed"], r.get("layout", "end"))] = r
    return list(last.values())


def table(records: list[dict], label: str = "", details: bool = False) -> str:
    """Markdown table: per task x length, ``k/n (mean%)`` per mode, k = cases scored 1.

    Args:
        records: case records (one settings each, or the caller filtered them).
        label: a column note (e.g. which rule the cascade used).
        details: also each cell's largest peak memory and median decode ms/token.

    Returns:
        The table as text.
    """
    cells: dict[tuple[str, int, str], list[dict]] = defaultdict(list)
    modes: list[str] = []
    for r in records:  # a layout other than RULER's is a task of its own: "niah_single (first)"
        name = r["task"] + (f" ({r['layout']})" if r.get("layout", "end") != "end" else "")
        cells[(name, r["length"], r["mode"])].append({**r, "task": name})
        if r["mode"] not in modes:
            modes.append(r["mode"])
    order = {m: i for i, m in enumerate(("cascade", "streaming", "full"))}
    modes.sort(key=lambda m: order.get(m, 9))
    names = {"cascade": f"cascade{label}", "streaming": "sinks + window", "full": "full attention"}
    lines = [f"| task | tokens | {' | '.join(names.get(m, m) for m in modes)} |",
             "|---|---|" + "---|" * len(modes)]
    names_in = {t for t, _, _ in cells}
    for task in [f"{t}{suffix}" for t in TASKS for suffix in ("", *(f" ({x})" for x in LAYOUTS[1:]))]:
        if task not in names_in:
            continue
        for n in sorted({n for t, n, _ in cells if t == task}):
            row = []
            for m in modes:
                recs = cells.get((task, n, m), [])
                v = [r["score"] for r in recs]
                cell = f"{sum(s == 1.0 for s in v)}/{len(v)} ({statistics.mean(v):.0%})" if v else "n/a"
                if v and details:
                    peak = [r["peak_mb"] for r in recs if r.get("peak_mb")]
                    ms = [r["decode_ms"] for r in recs if r.get("decode_ms")]
                    cell += f", peak {max(peak) / 1e3:.1f} GB" if peak else ""
                    cell += f", {statistics.median(ms):.1f} ms/token" if ms else ""
                row.append(cell)
            lines.append(f"| {task} | {n} | {' | '.join(row)} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tasks", nargs="*", default=list(TASKS), choices=TASKS)
    p.add_argument("--window", type=int, default=None)
    p.add_argument("--sinks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--top-k-blocks", dest="top_k", type=int, default=None)
    p.add_argument("--routing", default=None)
    p.add_argument("--representation", default=None)
    p.add_argument("--block-kind", default=None, help="episodic blocks stored as auto | float16 | q8 | q4 (default auto)")
    p.add_argument("--episodic-budget-mb", type=int, default=None,
                   help="block payload kept in memory; past it blocks spill to disk (peak memory of a long case)")
    p.add_argument("--rolling-window", type=int, default=None)
    p.add_argument("--follow", type=int, default=None, help="blocks after each retrieved block taken with it")
    p.add_argument("--lead", type=int, default=None, help="blocks before each retrieved block taken with it (0 = none)")
    p.add_argument("--question-pass", type=int, default=None,
                   help="prompt tokens re-read with the blocks all layers' question queries agree on (0 = off)")
    p.add_argument("--question-sharpen", type=int, default=None,
                   help="exponent on each (layer, KV head)'s attention mass in the question pass (1 = plain sum)")
    p.add_argument("--question-focus", type=float, default=None,
                   help="pin only blocks scoring >= this share of the best (0 = the top-k best)")
    p.add_argument("--question-queries", type=int, default=None,
                   help="the prompt's last queries the question pass scores (default 16)")
    p.add_argument("--answer-route", type=int, default=None,
                   help="blocks per KV head each answer token's query routes to beside the pinned ones (0 = off)")
    p.add_argument("--cascade-chunk", dest="chunk", type=int, default=None,
                   help="tokens the cascade attends in one piece (default: the model's, 256 on the CPU)")
    p.add_argument("--multiples", type=int, nargs="*", default=None,
                   help="lengths as multiples of the window (default: 1 2 4 8, or none when --lengths is given)")
    p.add_argument("--lengths", type=int, nargs="*", default=None,
                   help="further lengths in tokens (default: 16384 32768 unless --lengths is given)")
    p.add_argument("--modes", nargs="*", default=["cascade", "streaming", "full"])
    p.add_argument("--trials", type=int, default=4, help="cases per task and length (depths spread evenly)")
    p.add_argument("--order", choices=("length", "trial"), default="length",
                   help="length: every case of a length before the next; trial: the first case of every "
                        "length and task, then the second, ... (a run cut by --stop-after covers every cell)")
    p.add_argument("--layout", choices=LAYOUTS, default="end",
                   help="where the question goes: end (RULER's), first (before the text), system (first, after "
                        "a ~110-token system prompt: past the cascade's sinks), turns (in a conversation's "
                        "next turn, after the text)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="answer tokens (default: per task, bench.ruler.ANSWER_TOKENS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", type=int, nargs="*", default=None, help="run only these trial indices (split a long run)")
    p.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    p.add_argument("--resume", action="store_true", help="skip cases --out already holds for the same settings")
    p.add_argument("--stop-after", type=float, default=None,
                   help="start no case after this many seconds; exit 75 if cases are left (rerun with --resume)")
    p.add_argument("--capture", type=Path, default=None,
                   help="save each cascade case's question-pass block masses here (ruler_capture.py)")
    p.add_argument("--capture-queries", action="store_true", help="--capture every question query's mass")
    p.add_argument("--summary", type=Path, nargs="*", default=None,
                   help="print the table of these JSON-lines files and exit (no model loaded)")
    p.add_argument("--details", action="store_true",
                   help="--summary: each cell's largest peak memory and median decode ms/token too")
    args = p.parse_args()
    if args.summary is not None:
        print(table(latest([r for f in args.summary for r in read_cases(f)]), details=args.details))
        return
    if args.resume and args.out is None:
        p.error("--resume needs --out")

    import mlx.core as mx
    from mlotspark.engine import Engine

    from mlotspark.bench.ruler import answer, answer_in_turns

    from mlotspark.memory.cascade import CascadeConfig

    if args.layout == "turns":  # conversations (and what they learn) in a scratch home, beside the models
        import os
        import tempfile

        from mlotspark.storage import home_path

        scratch = Path(tempfile.mkdtemp(prefix="ruler-turns-"))
        (scratch / "models").symlink_to(home_path() / "models", target_is_directory=True)
        os.environ["MLOTSPARK_HOME"] = str(scratch)
    engine = Engine.load(args.model, progress=False)
    cap = None
    if args.capture is not None:
        from ruler_capture import Capture, save

        args.capture.mkdir(parents=True, exist_ok=True)
        cap = Capture(per_query=args.capture_queries)
    trained = engine.loaded.context_length
    overrides = {k: getattr(args, k) for k in FLAGS if getattr(args, k) is not None}
    config = CascadeConfig.for_model(trained, **overrides)
    engines: dict[str, Any] = {"full": engine}  # turns: an engine per mode, its cascade the mode's

    def engine_for(mode: str) -> Any:
        if mode not in engines:
            from mlotspark.engine import Engine

            c = config if mode == "cascade" else CascadeConfig(**{**config.to_dict(), "top_k": 0})
            engines[mode] = Engine.load(args.model, cascade=c, progress=False)
        return engines[mode]
    cfg = config.to_dict()
    cfg.pop("spill_dir", None)
    emit({"command": command_line(), "config": cfg, "model": engine.model_name,
          "weights": engine.loaded.weights}, args.out)
    done = {case_key(r) for r in read_cases(args.out)} if args.resume else set()
    # Lengths asked for in tokens replace the default multiples: a GPU run of --lengths 262144
    # 1048576 once also ran 4k-32k cases, a quarter of its device time.
    multiples = args.multiples if args.multiples is not None else ([] if args.lengths else [1, 2, 4, 8])
    extra = list(args.lengths) if args.lengths is not None else [16384, 32768]
    lengths = [m * config.window for m in multiples] + extra
    if not lengths:
        p.error("no lengths to run: give --lengths or --multiples a value")
    mine: list[dict] = []
    started = time.perf_counter()
    left = False
    count = lambda text: len(engine.encode(text))  # noqa: E731  (chat template included)
    grid = [(n, task, i, depth) for n in lengths for task in args.tasks
            for i, depth in enumerate(depths(args.trials))]
    if args.order == "trial":
        grid.sort(key=lambda c: c[2])  # stable: lengths and tasks keep their order within a trial
    for n, task, i, depth in grid:
        if args.only is not None and i not in args.only:
            continue
        seed = args.seed * 100003 + n + i
        budget = args.max_tokens or ANSWER_TOKENS[task]
        base = {"task": task, "length": n, "trial": i, "trials": args.trials, "seed": seed,
                "max_tokens": budget, "model": engine.model_name, "cfg": cfg,
                **({"layout": args.layout} if args.layout != "end" else {})}
        todo = [m for m in args.modes if case_key({**base, "mode": m}) not in done]
        if not todo:
            continue
        if args.stop_after is not None and time.perf_counter() - started > args.stop_after:
            left = True
            continue
        case = make_case(task, n, depth, seed=seed, count_tokens=count)
        ids = engine.encode(case.text if args.layout == "turns" else messages(case, args.layout))
        for mode in todo:
            if mode == "full" and len(ids) + budget > trained:
                continue  # past the trained context full attention is not a fair reference
            t0 = time.perf_counter()
            if cap is not None:
                cap.reset()
            mx.reset_peak_memory()
            if args.layout == "turns":  # as a chat user asks about a text sent before
                result = answer_in_turns(engine_for(mode), case, budget, f"ruler-{task}-{n}-{i}-{mode}")
            else:
                result = answer(engine, ids, mode, config, budget)  # as a user's request runs
            cstats = result.stats.extra.get("cascade", {})
            passes = cstats.get("question_passes")
            rec = {**base, "mode": mode, "tokens": len(ids), "depth": round(depth, 3),
                   "score": case.score(result.text), "answers": list(case.answers),
                   "reply": result.text.strip()[:160], "s": round(time.perf_counter() - t0, 1),
                   "peak_mb": round(mx.get_peak_memory() / 1e6, 1), "question_passes": passes,
                   "compressed": cstats.get("store", {}).get("compressed"),  # blocks re-stored 8-bit
                   "ttft_s": round(result.stats.ttft_s, 2),
                   "decode_ms": round(1000 / result.stats.decode_tps, 2) if result.stats.decode_tps else None,
                   "device": result.stats.device}
            emit(rec, args.out)
            if cap is not None and mode == "cascade":
                save(args.capture / f"{task}_{n}_{i}of{args.trials}_s{seed}.npz", cap, engine, ids, case,
                     config, rec)
            mine.append(rec)
    print()
    print(table(mine, details=True))
    if left:
        print("stopped early (--stop-after): rerun with --resume for the cases left", file=sys.stderr)
        sys.exit(75)


if __name__ == "__main__":
    main()
