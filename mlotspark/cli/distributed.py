"""The ``--distributed`` flags of ``generate`` and ``info``, run under ``mlx.launch``.

Every rank runs the same command line (``mlx.launch --hosts … -- mlotspark generate
--distributed pipeline …``); rank 0 prints, the other ranks follow rank 0 and print
nothing. A rank failure ends rank 0 with one ``mlotspark: error:`` line and exit
status 3, at once: its worker thread may be stuck inside MLX waiting on the dead
rank. Every rank leaves with ``os._exit`` after flushing its output (see ``_exit``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

from mlotspark.errors import DistributedError

#: exit status of a rank that lost the others (2 is a user mistake, 130 Ctrl+C).
EXIT_RANKS_FAILED = 3

# The choices of mlotspark.distributed, written out: importing that package loads MLX, and
# building the parser must not (``--help`` stays light). tests/test_startup.py keeps them equal.
MODES = ("pipeline", "tensor")
SPLITS = ("memory", "even")
DEFAULT_TIMEOUT_S = 120.0


def add_distributed_args(p: argparse.ArgumentParser, *, info: bool = False) -> None:
    """``--distributed``, ``--split`` and ``--rank-timeout``."""
    g = p.add_argument_group(
        "distributed (run every rank with mlx.launch)",
        "One model across the ranks mlx.launch starts (ring over TCP/Thunderbolt, JACCL over RDMA on "
        "Thunderbolt 5, or MPI: the launcher picks). Rank 0 prints; the others follow it.",
    )
    g.add_argument("--distributed", choices=MODES, default=None,
                   help="pipeline: layers split across ranks; tensor: attention heads split")
    if info:
        return
    g.add_argument("--split", choices=SPLITS, default="memory",
                   help="pipeline layers per rank: by free memory or evenly (default memory)")
    g.add_argument("--rank-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"fail when the other ranks make no progress this long (default {DEFAULT_TIMEOUT_S:g} s)")


def run_ranked(args: argparse.Namespace, load: Callable[[], Any], lead: Callable[[Any], int]) -> int:
    """Load a distributed engine on this rank; rank 0 runs ``lead(engine)``, the others follow.

    Args:
        args: parsed flags (for ``--json`` of errors, unused otherwise).
        load: returns the loaded Engine (``Engine.load(..., distributed=...)``).
        lead: rank 0's work with the engine; returns the exit status.

    Returns:
        The exit status (rank 0's, or 0 on the others once rank 0 closes).
    """
    try:
        engine = load()
    except DistributedError as e:
        _die(e)
    try:
        if engine.rank != 0:
            engine.follow()
            _exit(0)
        try:
            status = lead(engine)
        finally:
            engine.close()
    except DistributedError as e:
        _die(e)
    _exit(status)
    return status


def _die(e: DistributedError) -> None:
    print(f"mlotspark: error: {e}", file=sys.stderr)
    _exit(EXIT_RANKS_FAILED)


def _exit(status: int) -> None:
    # Leave without interpreter teardown: after a worker thread ran MLX over the ring,
    # teardown aborted ("terminate called without an active exception", exit -6),
    # and after a rank failure a worker may still be blocked inside MLX.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_info(args: argparse.Namespace) -> int:
    """``mlotspark info --distributed MODE``: every rank's memory, thermal state and step time."""
    from mlotspark.engine import Engine

    def lead(engine: Any) -> int:
        info = engine.info()
        if args.json:
            print(json.dumps(info, indent=2, default=str))
            return 0
        d = info["distributed"]
        print(f"{info['model']} ({info['weights']}), {d['mode']} over {len(d['ranks'])} ranks, "
              f"{d.get('backend') or 'unknown'} backend")
        for r in d["ranks"]:
            step = "-" if r["last_step_ms"] is None else f"{r['last_step_ms']:.1f} ms"
            print(f"  rank {r['rank']} on {r['host']}: layers {r['layers'][0]}-{r['layers'][1] - 1}, "
                  f"weights {r['weights_mb']:.0f} MB, RSS {r['rss_mb']:.0f} MB, "
                  f"{r['available_mb'] / 1e3:.1f} GB free, thermal {r['thermal']}, last step {step}")
        return 0

    return run_ranked(args, lambda: Engine.load(getattr(args, "model", None), distributed=args.distributed,
                                                progress=False, cascade=None), lead)
