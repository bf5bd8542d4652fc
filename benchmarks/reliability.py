"""The reliability tests at full counts (no suite: kills, corrupts and soaks processes), with a table of what it found.

CI runs ``tests/reliability`` as a seeded sample; this runs the same tests with
``MLOTSPARK_RELIABILITY_FULL=1`` (200 kills, 1,000 mutated GGUF files and 170 per
other store, 2 x 50 and 4 x 25 concurrent turns, 1,000 soak turns), collects the
figures each test records (kept in ``$TMPDIR/mlotspark-reliability-figures.jsonl`` so
parts can run separately, each under ten minutes) and prints a markdown table of the
latest run of each part, as pasted into ``benchmarks/RESULTS.md``::

    flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/reliability.py --part kill
    flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/reliability.py --part corrupt concurrency soak other

Each part runs in its own pytest process; ``--seed`` changes every random choice.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = {
    "kill": ["tests/reliability/test_kill.py"],
    "corrupt": ["tests/reliability/test_corrupt.py"],
    "concurrency": ["tests/reliability/test_concurrency.py"],
    "soak": ["tests/reliability/test_soak.py"],
    "other": ["tests/reliability/test_bad_input.py", "tests/reliability/test_disk.py", "tests/reliability/test_security.py"],
}
FIGURES = Path(tempfile.gettempdir()) / "mlotspark-reliability-figures.jsonl"  # kept between --part runs


def run_part(part: str, seed: int) -> dict:
    """Run one part's tests at full counts; return its pytest outcome and figures."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as f:
        report = f.name
    env = dict(os.environ, MLOTSPARK_RELIABILITY_FULL="1", MLOTSPARK_RELIABILITY_SEED=str(seed),
               MLOTSPARK_RELIABILITY_REPORT=report)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PARTS[part]],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [json.loads(ln) for ln in Path(report).read_text().splitlines() if ln.strip()]
    os.unlink(report)
    summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"[{part}] {summary} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if done.returncode != 0:
        print(done.stdout[-4000:], file=sys.stderr)
    return {"part": part, "seed": seed, "pytest": summary, "ok": done.returncode == 0,
            "seconds": round(time.perf_counter() - t0), "figures": lines}


def table(runs: list[dict]) -> str:
    """The markdown table of the collected runs (the latest run of each part)."""
    latest = {r["part"]: r for r in runs}
    rows = ["| part | inputs | result | tests |", "|---|---|---|---|"]
    if "kill" in latest:
        for f in [f for f in latest["kill"]["figures"] if f.get("part") == "kill"]:
            rows.append(
                f"| kill at any instant | {f.get('kills', 0)} SIGKILLs ({f.get('in_write', 0)} inside a write step, "
                f"{f.get('timed', 0)} at a uniform instant), {f.get('completed', 0)} completed turns | "
                f"unreadable stores {f.get('unreadable', 0)}, lost turns {f.get('lost', 0)}, lost memory facts "
                f"{f.get('lost_facts', 0)}, half snapshots {f.get('snapshots_bad', 0)} (checked whole {f.get('snapshots_ok', 0)}, "
                f"refused {f.get('snapshots_refused', 0)}), prefix entries refused {f.get('prefix_refused', 0)}, "
                f"driver crashes {f.get('crashed', 0)} | {latest['kill']['pytest']} |")
        for f in [f for f in latest["kill"]["figures"] if f.get("part") == "batch_kill"]:
            rows.append(f"| kill: batch --output | {f['kills']} SIGKILLs of `generate --prompts --output`, then "
                        f"resumed | {f['lines']} result lines, duplicates {f['duplicates']}, every prompt once | "
                        f"{latest['kill']['pytest']} |")
    if "corrupt" in latest:
        by_kind: dict[str, Counter] = {}
        for f in latest["corrupt"]["figures"]:
            by_kind.setdefault(f["kind"], Counter()).update(o if o in ("ok", "typed") else "FAIL: " + o for o in f["outcomes"])
        total = sum(sum(c.values()) for c in by_kind.values())
        bad = sum(n for c in by_kind.values() for o, n in c.items() if o.startswith("FAIL"))
        detail = "; ".join(f"{k} {sum(c.values())} ({c['typed']} typed errors, {c['ok']} opened)" for k, c in by_kind.items())
        rows.append(f"| corrupt files (Hypothesis) | {total} mutated inputs: {detail} | signals, hangs, tracebacks, "
                    f"unnamed or multi-line errors: {bad} | {latest['corrupt']['pytest']} |")
    if "concurrency" in latest:
        for f in [f for f in latest["concurrency"]["figures"] if f.get("part") == "concurrency"]:
            rows.append(f"| concurrency | {f['processes']} processes x {f['turns']} turns, one home | lost turns "
                        f"{f['lost_turns']}, lost memory notes {f['lost_notes']}, errors {f['errors']}, "
                        f"'database is locked' {f['locked']} | {latest['concurrency']['pytest']} |")
        pulls = [f for f in latest["concurrency"]["figures"] if f.get("part") == "pull"]
        if pulls:
            rows.append(f"| concurrent pulls | {', '.join(str(f['processes']) for f in pulls)} processes pulling one "
                        f"model at once | one whole file, no temp files | {latest['concurrency']['pytest']} |")
    if "soak" in latest:
        for f in latest["soak"]["figures"]:
            rows.append(
                f"| soak | {f['turns']} turns in one process (cascade on every other conversation) | RSS "
                f"{f['rss_warm_mb']:.0f} -> {f['rss_end_mb']:.0f} MB after warm-up ({100 * f['rss_growth']:+.1f}%), "
                f"fds {f['fds_warm']} -> {f['fds_end']} (max {f['fds_max']}), spill max {f['spill_max_bytes'] / 1e3:.0f} kB "
                f"of a {f['spill_budget_bytes'] / 1e3:.0f} kB bound | {latest['soak']['pytest']} |")
    if "other" in latest:
        rows.append(f"| bad input, disk trouble, security | every option x NaN/inf/negative/zero/huge/empty (API, CLI, TUI), "
                    f"surrogates, NUL, 1M chars, typed special tokens; ENOSPC/EFBIG in turns, snapshots, memory, pulls; "
                    f"read-only home; planted links; edited snapshots | see tests | {latest['other']['pytest']} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", nargs="+", choices=[*PARTS, "all"], default=["all"])
    p.add_argument("--seed", type=int, default=16)
    args = p.parse_args()
    parts = list(PARTS) if "all" in args.part else args.part
    runs = [json.loads(ln) for ln in FIGURES.read_text().splitlines()] if FIGURES.exists() else []
    for part in parts:
        run = run_part(part, args.seed)
        runs.append(run)
        with FIGURES.open("a") as f:
            f.write(json.dumps(run) + "\n")
    print(table(runs))


if __name__ == "__main__":
    main()
