"""Thermal throttle over time (no suite: a scripted probe heats and cools the machine; `--suite batch` reads the real one).

The governor reads a ``ScriptedProbe`` (one reading per governor evaluation, about
one a second): calm, then 75 °C (fair), 85 °C (serious), 95 °C (critical), then
60 °C. The queue is kept full (more requests than ``max_batch``), so the batch
follows the cap. Per one-second bin: the cap, the mean batch, the aggregate decode
tok/s and the time paused. Writes a PNG (cap and batch on top, throughput below)
and prints a markdown table per governor state.

    nice python benchmarks/batch_throttle.py [--mode balanced] [--png FILE] [--json FILE]

matplotlib is not installed here (and not a dependency): the PNG is drawn with
numpy and encoded with zlib by ``mlotspark.bench.plot``'s helpers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import mlotspark  # noqa: F401  (OpenBLAS before MLX)
from mlotspark.bench.plot import LINE, _rect, _text, encode_png
from mlotspark.engine import Engine
from mlotspark.thermal.governor import ThermalGovernor
from mlotspark.thermal.probes import Reading, ScriptedProbe

# (temperature °C, readings); a reading is one governor evaluation (~1 s).
SCRIPT = [(50, 12), (75, 10), (85, 10), (95, 12), (60, 40)]
PROMPT = "Write a long story about a lighthouse keeper and a storm. Request {i}."
RED, BLUE, GREEN, GREY, PAUSE = (214, 39, 40), (31, 119, 180), (44, 160, 44), (225, 225, 225), (255, 220, 220)


def run(mode: str, max_batch: int, model: str | None) -> tuple[list, float]:
    readings = [Reading(temperature_c=float(t)) for t, n in SCRIPT for _ in range(n)]
    probe = ScriptedProbe(readings)
    gov = ThermalGovernor([probe], mode=mode, max_batch=max_batch, min_interval_s=1.0)
    engine = Engine.load(model, governor=gov, progress=False)
    engine.generate("Hi", max_tokens=2)  # warm-up, before the clock starts
    sched = engine.scheduler
    start = len(sched.timeline)
    t0 = time.perf_counter()
    handles, i = [], 0
    while probe.calls < len(readings) + 2:
        live = [h for h in handles if not h.done]
        while len(live) < 2 * max_batch:  # keep the queue full: the batch follows the cap
            live.append(engine.submit(PROMPT.format(i=i), temperature=0, max_tokens=96))
            handles.append(live[-1])
            i += 1
        time.sleep(0.2)
    for h in handles:
        h.cancel()
    steps = list(sched.timeline)[start:]
    engine.close()
    return steps, t0


def bins(steps: list, t0: float) -> list[dict]:
    """Per 1 s bin: state and cap (the last step ending by then), mean batch, tok/s, paused seconds.

    A step lasting [t - step_s, t] counts in each bin it overlaps, in proportion, so a
    step longer than a second (a busy machine) leaves no hole in the curves.
    """
    end = steps[-1].t - t0
    out, last = [], None
    for k in range(int(end) + 1):
        busy = batch_s = tokens = paused = 0.0
        for s in steps:
            a, b = s.t - t0 - s.step_s, s.t - t0
            share = max(0.0, min(b, k + 1) - max(a, k))
            if share <= 0:
                continue
            if s.paused:
                paused += share
            else:
                frac = share / s.step_s if s.step_s > 0 else 1.0
                busy += share
                batch_s += s.batch * share
                tokens += s.batch * frac
        ended = [s for s in steps if s.t - t0 < k + 1]
        last = ended[-1] if ended else last
        if last is None:
            continue
        out.append({
            "t": k,
            "state": last.state,
            "cap": last.cap,
            "batch": batch_s / busy if busy else 0.0,
            "tok_s": round(tokens, 1),  # tokens decoded in this second
            "paused_s": paused,
        })
    return out


def plot(rows: list[dict], max_batch: int, path: Path, title: str) -> None:
    """Two panels over time: cap (red) and batch (blue); aggregate tok/s (green)."""
    W, H, margin, left = 900, 570, 16, 70
    img = np.full((H, W, 3), 255, dtype=np.uint8)
    _text(img, margin, margin, title[:70])
    _rect(img, margin, margin + LINE + 4, 20, 4, RED)
    _text(img, margin + 26, margin + LINE, "cap")
    _rect(img, margin + 80, margin + LINE + 4, 20, 4, BLUE)
    _text(img, margin + 106, margin + LINE, "batch")
    _rect(img, margin + 190, margin + LINE + 4, 20, 4, GREEN)
    _text(img, margin + 216, margin + LINE, "tok/s")
    _rect(img, margin + 300, margin + LINE, 20, 10, PAUSE)
    _text(img, margin + 326, margin + LINE, "paused")
    n = max(r["t"] for r in rows) + 1
    plot_w = W - left - margin
    x = lambda t: left + int(t * plot_w / n)  # noqa: E731
    top1, h1 = 90, 190  # cap / batch panel
    top2, h2 = 320, 190  # throughput panel
    peak = max(1.0, max(r["tok_s"] for r in rows))
    for r in rows:  # pause shading first, under the lines
        if r["paused_s"] > 0.05:
            for top, h in ((top1, h1), (top2, h2)):
                _rect(img, x(r["t"]), top, max(1, x(r["t"] + 1) - x(r["t"])), h, PAUSE)
    for top, h, hi, label in ((top1, h1, max_batch, "batch"), (top2, h2, peak, "tok/s")):
        _rect(img, left, top + h, plot_w, 1, (0, 0, 0))
        _rect(img, left, top, 1, h, (0, 0, 0))
        for frac in (0.0, 0.5, 1.0):
            y = top + h - int(frac * h)
            _rect(img, left + 1, y, plot_w, 1, GREY)
            _text(img, margin, y - 6, f"{hi * frac:.0f}")
        _text(img, margin, top - LINE - 2, label)
    for t in range(0, n, 10):
        _text(img, x(t) - 6, top2 + h2 + 6, str(t))
    _text(img, W - margin - 10 * 12, top2 + h2 + 6 + LINE, "seconds")

    def line(key: str, top: int, h: int, hi: float, color: tuple) -> None:
        prev = None
        for r in rows:
            y = top + h - int(min(r[key], hi) / hi * h)
            x0, x1 = x(r["t"]), x(r["t"] + 1)
            _rect(img, x0, y - 1, max(1, x1 - x0), 3, color)  # a step line
            if prev is not None:
                _rect(img, x0 - 1, min(prev, y) - 1, 3, abs(prev - y) + 3, color)
            prev = y

    line("batch", top1, h1, max_batch, BLUE)
    line("cap", top1, h1, max_batch, RED)
    line("tok_s", top2, h2, peak, GREEN)
    path.write_bytes(encode_png(img))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="balanced", choices=["performance", "balanced", "efficiency"])
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--model", default=None)
    ap.add_argument("--png", default="benchmarks/batch_throttle.png")
    ap.add_argument("--json", default=None, help="write the per-second bins here")
    args = ap.parse_args(argv)

    load0 = os.getloadavg()[0]
    steps, t0 = run(args.mode, args.max_batch, args.model)
    rows = bins(steps, t0)
    load1 = os.getloadavg()[0]
    title = f"scripted heat-up, {args.mode} mode, max batch {args.max_batch}"
    plot(rows, args.max_batch, Path(args.png), title)
    if args.json:
        Path(args.json).write_text(json.dumps(rows))

    print(f"\n{title}; {len(rows)} s, load average {load0:.1f} -> {load1:.1f} on {os.cpu_count()} cores; "
          f"plot: {args.png}\n")
    print("| second | state | cap | mean batch | tok/s | paused s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['t']} | {r['state']} | {r['cap']} | {r['batch']:.1f} | {r['tok_s']:.0f} | {r['paused_s']:.1f} |")
    print("\n| state | seconds | cap (range) | mean batch | aggregate tok/s | paused s |")
    print("|---|---|---|---|---|---|")
    for state in ("nominal", "fair", "serious", "critical"):
        rs = [r for r in rows if r["state"] == state]
        if not rs:
            continue
        caps = [r["cap"] for r in rs]
        print(f"| {state} | {len(rs)} | {min(caps)}-{max(caps)} | {statistics.fmean(r['batch'] for r in rs):.1f} "
              f"| {statistics.fmean(r['tok_s'] for r in rs):.1f} | {sum(r['paused_s'] for r in rs):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
