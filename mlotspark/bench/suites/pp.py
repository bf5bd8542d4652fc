"""``pp``: prefill speed, tok/s on a prompt of ``-p`` random tokens (llama-bench's pp512).

Timed as the wall time of a one-token request: the whole prompt goes through the
model and one token comes out, for mlotspark and for mlx-lm's ``stream_generate``.
"""

from __future__ import annotations

from mlotspark.bench.context import BenchContext, figure
from mlotspark.bench.figures import Figure

CASES: tuple[str, ...] = ()
DESCRIPTION = "prefill tok/s on a -p token prompt"


def steps(ctx: BenchContext, cases: tuple[str, ...]) -> int:
    return ctx.rounds


def check(ctx: BenchContext, cases: tuple[str, ...]) -> None:
    return None


def run(ctx: BenchContext, cases: tuple[str, ...]) -> list[Figure]:
    p = ctx.config.prompt_tokens
    ids = ctx.random_ids(p)

    def ours() -> dict[str, float]:
        r = ctx.ours(ids, 1)
        return {"prefill": p / r.ttft_s, "peak memory": r.peak_mb}

    def ref() -> dict[str, float]:
        r = ctx.mlx_lm(ids, 1)
        return {"prefill": p / r.ttft_s, "peak memory": r.peak_mb}

    mine, theirs = ctx.measure(f"pp{p}", ours, ref if ctx.compare else None)
    case = f"pp{p}"
    return [
        figure("pp", case, "prefill", "tok/s", True, mine, theirs),
        figure("pp", case, "peak memory", "MB", False, mine, theirs, notes="MLX peak, weights included"),
    ]
