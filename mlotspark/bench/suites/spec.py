"""``spec``: speculative decoding's speed-up over plain decoding, and its acceptance rate.

Case ``prompt_lookup``: the chat prompt asks to repeat a passage, so drafts taken
from the prompt should often be accepted. Each repetition decodes the same prompt
greedily with and without ``speculative="prompt_lookup"`` (order alternating); the
speed-up is their ratio within the repetition, the acceptance rate comes from the
engine's ``stats.extra``. With ``--compare mlx-lm``, the ratio column compares our
speculative decode with mlx-lm's plain ``stream_generate`` (mlx-lm has no prompt
lookup; its speculative decoding needs a separate draft model).
"""

from __future__ import annotations

from typing import Any

from mlotspark.errors import MlotsparkError
from mlotspark.bench.context import BenchContext, SuiteUnavailable, figure
from mlotspark.bench.figures import Figure

CASES = ("prompt_lookup",)
DESCRIPTION = "speculative decoding: speed-up over plain decoding and acceptance rate"

PASSAGE = (
    "The Loire is the longest river in France. It rises in the Massif Central, flows north "
    "towards Orleans, then west through Tours and Angers, and reaches the Atlantic Ocean at "
    "Saint-Nazaire. Its valley is known for its castles, its vineyards and its gardens, and a "
    "large part of it is listed as a World Heritage Site. The river is often called the last "
    "wild river of France, because its course has changed little over the centuries."
)
PROMPT = f"Repeat the following text exactly, word for word.\n\n{PASSAGE}"


def steps(ctx: BenchContext, cases: tuple[str, ...]) -> int:
    return ctx.rounds


def acceptance(extra: dict) -> float | None:
    """The acceptance rate (0..1) in ``stats.extra``, wherever the engine put it.

    Looks for a key with "accept" and "rate" in its name, or for counts of accepted
    and drafted (proposed) tokens, at the top level or one level down.
    """
    levels = [extra] + [v for v in extra.values() if isinstance(v, dict)]
    for d in levels:
        for key, value in d.items():
            if "accept" in key and "rate" in key and isinstance(value, (int, float)):
                return float(value) / (100.0 if value > 1 else 1.0)
        accepted = next((v for k, v in d.items() if k.startswith("accept") and isinstance(v, int)), None)
        drafted = next((v for k, v in d.items() if k.startswith(("draft", "propos")) and isinstance(v, int)), None)
        if accepted is not None and drafted:
            return accepted / drafted
    return None


def check(ctx: BenchContext, cases: tuple[str, ...]) -> None:
    ids = ctx.engine.encode(PROMPT)
    try:
        r = ctx.engine.submit(prompt_ids=ids, max_tokens=4, temperature=0.0, speculative="prompt_lookup").result()
    except MlotsparkError as e:
        raise SuiteUnavailable(f"spec needs speculative decoding in the engine: {e}") from None
    if acceptance(r.stats.extra) is None:
        raise SuiteUnavailable(
            "spec needs speculative decoding in the engine: speculative='prompt_lookup' is accepted "
            "as an option but no acceptance rate comes back in stats.extra, so it is not implemented yet"
        )


def run(ctx: BenchContext, cases: tuple[str, ...]) -> list[Figure]:
    g = ctx.config.gen_tokens
    ids = ctx.engine.encode(PROMPT)
    turn = [0]

    def ours() -> dict[str, float]:
        turn[0] += 1
        runs: dict[str, Any] = {}
        for mode in (("plain", "spec") if turn[0] % 2 else ("spec", "plain")):
            extra = {"speculative": "prompt_lookup"} if mode == "spec" else {}
            with ctx.ignoring_eos():  # as mlx-lm's side: every run decodes -g tokens
                runs[mode] = ctx.ours(ids, g, **extra)
        spec, plain = runs["spec"], runs["plain"]
        rate = acceptance(spec.extra)
        return {
            "decode": spec.decode_tps,
            "plain decode": plain.decode_tps,
            "speed-up": spec.decode_tps / plain.decode_tps if plain.decode_tps else float("nan"),
            "acceptance": 100.0 * (rate if rate is not None else float("nan")),
            "tokens": spec.tokens,
        }

    def ref() -> dict[str, float]:
        return {"decode": ctx.mlx_lm(ids, g).decode_tps}

    mine, theirs = ctx.measure("spec prompt_lookup", ours, ref if ctx.compare else None)
    tokens = int(min(mine.get("tokens", [0]) or [0]))
    note = f"{len(ids)}-token prompt (repeat a passage), {tokens} tokens decoded"
    return [
        figure("spec", "prompt_lookup", "decode", "tok/s", True, mine, theirs,
               notes=note + ("; mlx-lm: plain decoding" if ctx.compare else "")),
        figure("spec", "prompt_lookup", "speed-up vs plain", "x", True, mine, None, key="speed-up"),
        figure("spec", "prompt_lookup", "acceptance", "%", True, mine, None),
    ]
