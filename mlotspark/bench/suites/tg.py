"""``tg``: decode speed, tok/s over ``-g`` generated tokens (llama-bench's tg128).

The prompt is 16 random tokens; EOS is ignored so every run decodes ``-g`` tokens.
Speed is (tokens − 1) / (last token − first token) on both engines.
"""

from __future__ import annotations

from mlotspark.bench.context import BenchContext, figure
from mlotspark.bench.figures import Figure

CASES: tuple[str, ...] = ()
DESCRIPTION = "decode tok/s over -g generated tokens"
PROMPT_TOKENS = 16


def steps(ctx: BenchContext, cases: tuple[str, ...]) -> int:
    return ctx.rounds


def check(ctx: BenchContext, cases: tuple[str, ...]) -> None:
    return None


def run(ctx: BenchContext, cases: tuple[str, ...]) -> list[Figure]:
    g = ctx.config.gen_tokens
    ids = ctx.random_ids(PROMPT_TOKENS)

    def ours() -> dict[str, float]:
        with ctx.ignoring_eos():
            r = ctx.ours(ids, g)
        return {"decode": r.decode_tps, "peak memory": r.peak_mb}

    def ref() -> dict[str, float]:
        r = ctx.mlx_lm(ids, g)
        return {"decode": r.decode_tps, "peak memory": r.peak_mb}

    mine, theirs = ctx.measure(f"tg{g}", ours, ref if ctx.compare else None)
    case = f"tg{g}"
    notes = f"{PROMPT_TOKENS}-token prompt, EOS ignored"
    return [
        figure("tg", case, "decode", "tok/s", True, mine, theirs, notes=notes),
        figure("tg", case, "peak memory", "MB", False, mine, theirs, notes="MLX peak, weights included"),
    ]
