"""``mlotspark ps``: the models a running ``mlotspark serve`` holds (Ollama's ``/api/ps``)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from mlotspark.errors import MlotsparkError

DEFAULT_URL = "http://127.0.0.1:8080"


def run(args: argparse.Namespace) -> int:
    import httpx

    key = args.api_key or os.environ.get("MLOTSPARK_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        health = httpx.get(args.url.rstrip("/") + "/health", headers=headers, timeout=10).json()
    except (httpx.HTTPError, ValueError) as e:
        raise MlotsparkError(f"no mlotspark server answers at {args.url}: {e}") from None
    models = health.get("models") or []
    if args.json:
        print(json.dumps(models, indent=2))
        return 0
    print(f"{'NAME':40} {'STATE':9} {'SIZE':>9} {'KV BUDGET':>10} {'IN FLIGHT':>9} {'IDLE':>8} {'UNLOADS IN':>10}")
    for m in models:
        state = "loading" if m.get("loading") else "loaded" if m.get("loaded") else "-"
        size = f"{m['bytes'] / 1e6:,.0f} MB" if m.get("bytes") else "-"
        kv = f"{m['kv_budget_bytes'] / 1e6:,.0f} MB" if m.get("kv_budget_bytes") is not None else "-"
        idle = f"{m['idle_s']:.0f} s" if m.get("idle_s") is not None else "-"
        left = m.get("expires_in_s")
        unloads = "never" if m.get("loaded") and left is None else (f"{left:.0f} s" if left is not None else "-")
        name = m["name"] + (" (default)" if m.get("default") else "")
        print(f"{name[:40]:40} {state:9} {size:>9} {kv:>10} {m.get('requests_in_flight', 0):>9} {idle:>8} "
              f"{unloads:>10}")
    budget = health.get("memory_budget")
    if budget:
        print(f"memory budget {budget['budget_bytes'] / 1e6:,.0f} MB: weights {budget['weights_bytes'] / 1e6:,.0f} MB, "
              f"KV {budget['kv_share_bytes'] / 1e6:,.0f} MB per resident model; one thermal governor")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("ps", help="list the models a running server holds",
                       description="List the models a running `mlotspark serve` knows: loaded or not, "
                                   "memory, requests in flight, idle time and when each unloads.")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the server (default {DEFAULT_URL})")
    p.add_argument("--api-key", default=None, help="the server's key (default: $MLOTSPARK_API_KEY)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)


__all__ = ["register", "run"]
