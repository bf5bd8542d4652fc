"""Foundation benchmark (issue 2): mlotspark vs mlx-lm on the same weights, with llama.cpp for reference.

Prefill tok/s on a 512-token prompt, decode tok/s over 128 tokens and TTFT on the
37-token chat prompt "What is the capital of France?", both engines in one process,
interleaved, median of the repetitions, as ratios. llama.cpp's figures are those
measured on this machine in DESIGN §7 (not re-measured here).

    nice python benchmarks/engine_vs_mlx_lm.py [-r 5] [--ttft-reps 15] [--model M] [--update-results]

It is ``mlotspark bench --suite pp,tg --compare mlx-lm`` and ``--suite ttft:cold``
(more repetitions: it is short and noisy) plus the llama.cpp columns;
``--update-results`` rewrites only the section "Foundation: mlotspark vs mlx-lm" of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import mlotspark  # noqa: F401  (OpenBLAS before MLX)
from mlotspark.bench import BenchConfig, Figure, Report, parse_suites, render, run_bench
from mlotspark.bench.formats import header_lines, num

RESULTS = Path(__file__).with_name("RESULTS.md")
SECTION = "## Foundation: mlotspark vs mlx-lm"
# DESIGN §7, SmolLM2-135M-Instruct Q4_1 GGUF, 2 threads, on a quiet machine:
# llama.cpp via llama-bench (flash-attn off / on, its best figure used for ratios), and
# mlx-lm 0.32 with dequantized float32 weights + OpenBLAS.
LLAMA_CPP = {"prefill": ("251 / 295", 295.0), "decode": ("116 / 101", 116.0), "TTFT": ("110–140", 110.0)}
MLX_LM_QUIET = {"prefill": 185.0, "decode": 12.0, "TTFT": 350.0}


def _pick(report: Report, suite: str, metric: str) -> Figure:
    return next(f for f in report.figures if f.suite == suite and f.metric == metric)


def _spread(values: list[float]) -> str:
    return f"{num(statistics.median(values))} [{num(min(values))}–{num(max(values))}]"


def foundation_table(speed: Report, ttft: Report) -> str:
    """The issue-2 table: both engines, the same-run ratio, and where that puts us against llama.cpp.

    "projected" = our same-run ratio to mlx-lm applied to mlx-lm's quiet-machine figure
    (DESIGN §7): an estimate, for when this run's machine was too loaded for its
    absolute numbers to compare with llama.cpp's quiet-machine ones.
    """
    rows = [
        ("prefill tok/s, 512-token prompt", _pick(speed, "pp", "prefill"), "prefill", True),
        ("decode tok/s, 128 tokens", _pick(speed, "tg", "decode"), "decode", True),
        ("TTFT ms, 37-token chat prompt", _pick(ttft, "ttft", "TTFT"), "TTFT", False),
    ]
    lines = [
        "| figure | reps | mlotspark median [min–max] | mlx-lm median [min–max] | **mlotspark ÷ mlx-lm** "
        "| projected quiet-machine mlotspark | llama.cpp (DESIGN §7) | projected ÷ llama.cpp (best) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, f, key, higher in rows:
        ratio = f.ratio or float("nan")
        quiet = MLX_LM_QUIET[key] * ratio if higher else MLX_LM_QUIET[key] / ratio
        shown, best = LLAMA_CPP[key]
        vs = quiet / best if higher else best / quiet
        lines.append(
            f"| {label} | {len(f.values)} | {_spread(f.values)} | {_spread(f.reference)} | **{ratio:.2f}x** | "
            f"{num(quiet)} | {shown} | {vs:.2f}x |"
        )
    return "\n".join(lines)


def section(speed: Report, ttft: Report, command: str) -> str:
    h = speed.header
    return "\n".join([
        SECTION,
        "",
        f"Measured {h['date']} with `{command}`: prefill and decode with -r repetitions, TTFT with "
        "--ttft-reps (it is short and noisy), each after 1 warm-up, the two engines interleaved in one "
        f"process (alternating which goes first), on the same {h.get('weights', 'float32')} weights. Ratios > 1 mean mlotspark "
        "is better; each is the median of the per-repetition ratios. Absolute figures depend on the load "
        "of this shared 2-core machine (see the load average in the headers): compare llama.cpp through "
        "the projected column, which applies our same-run ratio to mlx-lm's quiet-machine figure from "
        "DESIGN §7 (mlx-lm float32 + OpenBLAS: ~185 tok/s prefill, ~12 tok/s decode, ~350 ms TTFT).",
        "",
        foundation_table(speed, ttft),
        "",
        "Run headers:",
        "",
        "```",
        *header_lines(speed),
        "",
        *header_lines(ttft),
        "```",
        "",
    ])


def update_results(text: str) -> None:
    """Replace (or append) only the foundation section of RESULTS.md."""
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    new = pattern.sub(lambda _: text + "\n", old) if pattern.search(old) else old.rstrip("\n") + "\n\n" + text
    RESULTS.write_text(new)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--weights", default="auto")
    p.add_argument("-r", "--repetitions", type=int, default=5, help="prefill and decode repetitions (default 5)")
    p.add_argument("--ttft-reps", type=int, default=15, help="TTFT repetitions (default 15)")
    p.add_argument("--json", default=None, help="also write both reports as JSON here")
    p.add_argument("--update-results", action="store_true", help="rewrite the foundation section of RESULTS.md")
    args = p.parse_args(argv)
    common = dict(model=args.model, weights=args.weights, prompt_tokens=512, gen_tokens=128, compare="mlx-lm")
    command = f"nice python benchmarks/engine_vs_mlx_lm.py -r {args.repetitions} --ttft-reps {args.ttft_reps}" + (
        f" --model {args.model}" if args.model else "") + (f" --weights {args.weights}" if args.weights != "auto" else "")
    speed = run_bench(BenchConfig(repetitions=args.repetitions, suites=parse_suites("pp,tg"), **common),
                      command=command + "  # pp,tg")
    ttft = run_bench(BenchConfig(repetitions=args.ttft_reps, suites=parse_suites("ttft:cold"), **common),
                     command=command + "  # ttft:cold")
    print(render(speed, "table"))
    print(render(ttft, "table"))
    text = section(speed, ttft, command)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"speed": speed.to_dict(), "ttft": ttft.to_dict()}, indent=2))
    if args.update_results:
        update_results(text)
        print(f"updated {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
