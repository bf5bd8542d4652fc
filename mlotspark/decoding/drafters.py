"""Drafters for speculative decoding: prompt lookup (n-grams) and a draft model.

A drafter proposes up to ``k`` next tokens after a context; the target model then
verifies them in one forward pass (``speculative.py``). Prompt lookup proposes the
tokens that followed the latest earlier occurrence of the context's last n-gram (no
extra model: it pays off when a reply copies from its context, as with memories put
into the prompt). mlx-lm never merged it (PR #1478), and its draft-model loop samples
and matches rather than rejection-samples, so both drafters are ours.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import mlx.core as mx

from mlotspark.errors import OptionError

__all__ = ["Drafter", "PromptLookupDrafter", "DraftModelDrafter", "load_draft_model"]

#: logprobs (N, V) -> the sampling distribution (N, V); None means greedy.
Distribution = Callable[[mx.array], mx.array] | None


class Drafter(Protocol):
    """Anything that proposes draft tokens."""

    name: str

    def propose(self, context: list[int], k: int, dist: Distribution) -> tuple[list[int], mx.array | None]:
        """Up to ``k`` draft tokens after ``context``, and their draft distributions.

        Args:
            context: every token so far (the last one is being fed to the target now).
            k: most tokens to propose (0 is allowed).
            dist: the sampling distribution (None = greedy).

        Returns:
            (tokens, q): q is (len(tokens), V) probabilities the tokens were drawn from,
            or None when each token was chosen deterministically (a point mass).
        """
        ...


class PromptLookupDrafter:
    """Drafts by copying what followed the latest earlier match of the context's tail.

    Args:
        ngram_max: longest tail n-gram tried first (default 4).
        ngram_min: shortest tail n-gram accepted (default 2: unigram matches are
            mostly noise in free text).
    """

    name = "prompt_lookup"

    def __init__(self, ngram_max: int = 4, ngram_min: int = 2):
        if not 1 <= ngram_min <= ngram_max:
            raise OptionError(f"invalid n-gram range {ngram_min}..{ngram_max}")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> latest end (exclusive)
        self._indexed = 0  # n-grams ending at positions < this are indexed

    def _index(self, context: list[int], upto: int) -> None:
        for end in range(max(self._indexed, 1), upto + 1):
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end - n >= 0:
                    self._ends[tuple(context[end - n : end])] = end
        self._indexed = max(self._indexed, upto + 1)

    def propose(self, context: list[int], k: int, dist: Distribution = None) -> tuple[list[int], None]:
        """The up-to-``k`` tokens that followed the latest earlier match (point masses)."""
        L = len(context)
        # Index every n-gram that ends before the tail, so the tail never matches itself.
        self._index(context, L - 1)
        if k <= 0:
            return [], None
        for n in range(min(self.ngram_max, L - 1), self.ngram_min - 1, -1):
            end = self._ends.get(tuple(context[L - n :]))
            if end is not None and end < L:
                return list(context[end : end + k]), None
        return [], None


class DraftModelDrafter:
    """Drafts with a smaller model that shares the target's vocabulary.

    Its cache follows the context: tokens it holds that the target rejected are
    trimmed away at the next proposal, and missing ones are fed in one pass.

    Args:
        model: the draft model's runner (``runner(tokens (1, L), cache) -> logits``; a bare model runs plainly).
        prefill_step_size: tokens per forward pass when catching up on a long context.
    """

    name = "draft"

    def __init__(self, model: Any, prefill_step_size: int = 512):
        from mlotspark.caches.kinds import make_cache
        from mlotspark.models.execution import runner_for

        self.model = runner_for(model)
        self.cache = make_cache(model, None)
        self.tokens: list[int] = []  # what self.cache holds
        self.prefill_step_size = prefill_step_size

    def _sync(self, context: list[int]) -> mx.array:
        """Bring the cache to ``context``; return the last position's logprobs (1, V)."""
        n = 0
        limit = min(len(self.tokens), len(context) - 1)  # the last token is always re-fed
        while n < limit and self.tokens[n] == context[n]:
            n += 1
        if n < len(self.tokens):
            for c in self.cache:
                c.trim(len(self.tokens) - n)
            del self.tokens[n:]
        feed = context[n:]
        while len(feed) > self.prefill_step_size:
            self.model(mx.array(feed[: self.prefill_step_size])[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
            feed = feed[self.prefill_step_size :]
        logits = self.model(mx.array(feed)[None], cache=self.cache)[:, -1, :]
        self.tokens = list(context)
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def propose(self, context: list[int], k: int, dist: Distribution = None) -> tuple[list[int], mx.array | None]:
        """``k`` tokens drawn from the draft model (greedy when ``dist`` is None)."""
        if k <= 0:
            return [], None
        logprobs = self._sync(context)
        tokens: list[int] = []
        qs = []
        for i in range(k):
            if dist is None:
                tok = mx.argmax(logprobs, axis=-1)
            else:
                q = dist(logprobs)  # (1, V)
                qs.append(q)
                tok = mx.random.categorical(mx.log(q))
            t = int(tok.item())
            tokens.append(t)
            if i < k - 1:
                logits = self.model(mx.array([[t]]), cache=self.cache)[:, -1, :]
                logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
                self.tokens.append(t)
        return tokens, (mx.concatenate(qs, axis=0) if qs else None)


# ------------------------------------------------------------- loading drafts
_LOADED: dict[str, Any] = {}


def load_draft_model(name: str, target: Any, tokenizer: Any) -> Any:
    """Load (once) the draft model ``name`` and check it shares the target's vocabulary.

    Args:
        name: alias, ``.gguf`` path, mlx-lm directory or Hugging Face id.
        target: the target model or its runner (its vocabulary size is compared).
        tokenizer: the target's tokenizer (a sample text must encode the same).

    Raises:
        OptionError: the draft's vocabulary differs from the target's.
        ModelError: the draft cannot be found or loaded.
    """
    from mlotspark.models import loader
    from mlotspark.models.hub import catalogue
    from mlotspark.models.execution import runner_for

    loaded = _LOADED.get(name)
    if loaded is None:
        loaded = loader.load(catalogue.resolve(name, progress=False))
        _LOADED.clear()  # keep one draft model in memory
        _LOADED[name] = loaded
    sample = "Speculative decoding: 12 drafts, 3 accepted."
    v_target = getattr(getattr(runner_for(target).model, "args", None), "vocab_size", None)
    v_draft = getattr(getattr(loaded.model, "args", None), "vocab_size", None)
    if v_target != v_draft or tokenizer.encode(sample) != loaded.tokenizer.encode(sample):
        raise OptionError(
            f"invalid draft_model {name!r}: its vocabulary ({v_draft} tokens) differs from the "
            f"target's ({v_target}); a draft model must share the tokenizer"
        )
    return loaded.runner
