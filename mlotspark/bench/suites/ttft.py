"""``ttft``: time to first token, cold / warm turn / restored from disk / prefix-cache hit.

- ``cold``: the chat prompt "What is the capital of France?" (37 tokens with the
  default model's template), nothing cached; mlx-lm: ``stream_generate`` on the same ids.
- ``warm``: a conversation's second turn while its first turn's KV is in memory;
  mlx-lm: its prompt cache holding the same tokens, kept in memory.
- ``restored``: the same second turn after the warm cache was dropped, so the
  snapshot comes from disk; mlx-lm: ``save_prompt_cache`` / ``load_prompt_cache``
  (the load is timed, as ours is).
- ``prefix-hit``: the first turn of a new conversation whose system prompt's KV is
  in the prefix cache; mlx-lm has no prefix cache: it prefills the whole prompt.

Conversation cases time what the user waits for (the conversation's
``turn_ttft_s``: cache lookup, restore, queue and prefill) and also report the
speed-up over prefilling the same prompt cold, measured in the same repetition.
Semantic memory is switched off so that only the KV caches are measured; the
conversations live in the run's private scratch home.
"""

from __future__ import annotations

from typing import Any, Callable

from mlotspark.bench.context import BenchContext, SuiteUnavailable, figure
from mlotspark.bench.figures import Figure

CASES = ("cold", "warm", "restored", "prefix-hit")
DESCRIPTION = "time to first token: cold, warm turn, restored from disk, prefix-cache hit"

CHAT_PROMPT = "What is the capital of France?"
FOLLOW_UP = "And what is the capital of Germany?"
# A system prompt of a realistic size (~60 tokens): what the prefix cache shares.
SYSTEM = (
    "You are a helpful assistant running on a laptop. Answer briefly and accurately, "
    "in plain language. If a question is ambiguous, ask one short clarifying question. "
    "When you are not sure of a fact, say so instead of guessing."
)
PRIME_TOKENS = 8  # the first turn's reply length (greedy)
_EXPECTED = {"warm": "warm", "restored": "snapshot", "prefix-hit": "prefix"}


def _cases(cases: tuple[str, ...]) -> tuple[str, ...]:
    return cases or CASES


def steps(ctx: BenchContext, cases: tuple[str, ...]) -> int:
    return ctx.rounds * len(_cases(cases))


def check(ctx: BenchContext, cases: tuple[str, ...]) -> None:
    conv = [c for c in _cases(cases) if c != "cold"]
    missing = [a for a in ("conversation", "persistence") if not hasattr(ctx.engine, a)]
    if conv and missing:
        raise SuiteUnavailable(
            f"ttft {'/'.join(conv)} needs persistent conversations "
            f"(Engine.{missing[0]}), which this build does not have"
        )


def run(ctx: BenchContext, cases: tuple[str, ...]) -> list[Figure]:
    out: list[Figure] = []
    turns = _Turns(ctx) if any(c != "cold" for c in _cases(cases)) else None
    for case in _cases(cases):
        out += _cold(ctx) if case == "cold" else turns.measure(case)  # type: ignore[union-attr]
    return out


def _cold(ctx: BenchContext) -> list[Figure]:
    ids = ctx.engine.encode(CHAT_PROMPT)
    mine, theirs = ctx.measure(
        "ttft cold",
        lambda: {"TTFT": ctx.ours(ids, 1).ttft_s * 1000},
        (lambda: {"TTFT": ctx.mlx_lm(ids, 1).ttft_s * 1000}) if ctx.compare else None,
    )
    return [figure("ttft", "cold", "TTFT", "ms", False, mine, theirs,
                   notes=f"{len(ids)}-token chat prompt {CHAT_PROMPT!r}")]


def _turn_ttft(result: Any) -> float:
    """Seconds the user waited for the turn's first piece of text."""
    x = result.stats.extra
    if result.text and "turn_ttft_s" in x:
        return float(x["turn_ttft_s"])
    # No text came out (an EOS or a partial character): the engine's own parts.
    return float(x.get("prepare_s", 0.0)) + float(x.get("queue_s", 0.0)) + result.stats.ttft_s


class _Turns:
    """Conversation turns in the scratch home, one fresh conversation per repetition."""

    def __init__(self, ctx: BenchContext):
        self.ctx = ctx
        self.engine = ctx.engine
        self.n = 0
        self.engine.persistence.set_budgets(memory=False, learn=False)
        self.seeded = False

    def new(self, kind: str) -> Any:
        self.n += 1
        return self.engine.conversation(f"bench-{kind}-{self.n}", system=SYSTEM)

    def measure(self, case: str) -> list[Figure]:
        ctx = self.ctx
        state: dict[str, Any] = {}
        ours = self._ours(case, state)
        ref = self._ref(case, state) if ctx.compare else None
        mine, theirs = ctx.measure(f"ttft {case}", ours, ref)
        n_new = state["prompt"] - state["cached"]
        notes = f"{state['prompt']}-token prompt, {state['cached']} from the {_EXPECTED[case]} cache, {n_new} prefilled"
        if case == "prefix-hit" and ctx.compare:
            notes += "; mlx-lm has no prefix cache: full prefill"
        return [
            figure("ttft", case, "TTFT", "ms", False, mine, theirs, notes=notes),
            figure("ttft", case, "speed-up vs cold", "x", True, mine, None, key="speed-up",
                   notes=f"same prompt prefilled cold: {_median(mine['cold TTFT']):.0f} ms"),
        ]

    def _ours(self, case: str, state: dict) -> Callable[[], dict[str, float]]:
        ctx = self.ctx

        def one() -> dict[str, float]:
            if case == "prefix-hit":
                if not self.seeded:  # any earlier turn with SYSTEM stores its prefix
                    self.new("seed").send(CHAT_PROMPT, max_tokens=1, temperature=0)
                    self.seeded = True
                conv, text = self.new("prefix"), CHAT_PROMPT
            else:
                conv, text = self.new(case), FOLLOW_UP
                conv.send(CHAT_PROMPT, max_tokens=PRIME_TOKENS, temperature=0)
                if case == "restored" and not conv.release_warm():
                    raise SuiteUnavailable("ttft restored: the conversation's warm cache could not be dropped")
            ids = self.engine.encode(conv.render(text))
            result = conv.send(text, max_tokens=1, temperature=0)
            source = result.stats.extra.get("cache_source")
            if source != _EXPECTED[case]:
                raise SuiteUnavailable(
                    f"ttft {case}: the turn should reuse the {_EXPECTED[case]} cache but used {source!r}"
                )
            if len(ids) != result.stats.prompt_tokens:
                raise SuiteUnavailable(
                    f"ttft {case}: the turn prefilled {result.stats.prompt_tokens} tokens but the "
                    f"rendered conversation has {len(ids)}: cannot time the same prompt cold"
                )
            state.update(ids=ids, prompt=result.stats.prompt_tokens, cached=result.stats.cached_tokens)
            ttft = _turn_ttft(result)
            cold = ctx.ours(ids, 1).ttft_s
            return {"TTFT": ttft * 1000, "cold TTFT": cold * 1000, "speed-up": cold / ttft}

        return one

    def _ref(self, case: str, state: dict) -> Callable[[], dict[str, float]]:
        ctx = self.ctx

        def one() -> dict[str, float]:
            ids, cached = state["ids"], state["cached"]  # set by the warm-up / first run of ours
            if case == "prefix-hit":
                return {"TTFT": ctx.mlx_lm(ids, 1).ttft_s * 1000}
            if case == "warm":
                cache = ctx.mlx_lm_prefilled(ids[:cached])
                return {"TTFT": ctx.mlx_lm(ids[cached:], 1, prompt_cache=lambda: cache).ttft_s * 1000}
            from mlx_lm.models.cache import load_prompt_cache

            path = self._saved_mlx_lm_cache(ids[:cached])
            r = ctx.mlx_lm(ids[cached:], 1, prompt_cache=lambda: load_prompt_cache(path))
            return {"TTFT": r.ttft_s * 1000}

        return one

    def _saved_mlx_lm_cache(self, ids: list[int]) -> str:
        """mlx-lm's prompt cache of ``ids``, saved with ``save_prompt_cache`` (untimed)."""
        from mlx_lm.models.cache import save_prompt_cache

        path = str(self.ctx.workdir / "mlx_lm_prompt_cache.safetensors")
        self.ctx.run_mlx_lm(save_prompt_cache, path, self.ctx.mlx_lm_prefilled(ids))
        return path


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values) if values else float("nan")
