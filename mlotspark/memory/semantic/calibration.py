"""How search scores are combined, which score puts an entry into the prompt, and when a newer
entry takes an older one's place, per embedder (figures: ``benchmarks/memory_eval.py`` and
``benchmarks/memory_updates.py``, in ``benchmarks/RESULTS.md``).

- **Hashing** (the fallback): ``score = 0.5 * cosine + 0.5 * lexical``, inject at 0.35:
  hashed words only match shared words, so both halves count alike.
- **Sentence embedders** (MPNet, the default, and MiniLM): ``score = max(cosine, w * cosine +
  (1 - w) * lexical)``: cosine carries paraphrases ("What is the name of my dog?" / "My dog is
  called Biscuit."), the lexical part (FTS5 BM25 x IDF coverage) only *raises* an entry, for
  exact names, numbers and rare words.

The injection threshold depends on whether the message speaks about the user (``about_user``:
a first-person word outside a request). Cosine alone cannot separate a stored fact's question
(0.26-0.49 for MiniLM) from prompts about nothing stored (up to 0.49: "Give me a recipe for
pancakes." vs "The recipe calls for two cups of flour"); questions about the user's life say
so ("my", "I", "we"), general prompts and first-person requests ("I need a name for my blog.",
``is_request``) rarely do. Thresholds were chosen on the eval's fit half with unrelated
injections at most 5%. Only entries within ``margin`` of the best one are injected: other
facts of the same kind otherwise crowd the top 3 and a small model answers from whichever it sees.

``supersede`` and ``newer_gap`` are the question-time rule of ``search.newest_of_alike``,
chosen on the five older update sets (updates whose newer fact wins plus same-kind pairs kept
apart, as many as possible together).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Calibration:
    """Scoring and injection thresholds for one embedder.

    Attributes:
        vector_weight: share of cosine in ``w * cosine + (1 - w) * lexical``.
        lexical_raises_only: take ``max(cosine, weighted sum)``, so words only raise a score.
        threshold_about_user: inject at or above this when the message is about the user.
        threshold_other: inject at or above this otherwise.
        margin: inject only entries within this of the best entry's score.
        supersede: cosine between two entries at or above which the newer may replace
            the older when a question finds them about as relevant (``search.newest_of_alike``).
        newer_gap: how much lower than the older entry the question may score the newer
            one for the newer to take its place.
    """

    vector_weight: float
    lexical_raises_only: bool
    threshold_about_user: float
    threshold_other: float
    margin: float = 1.0
    supersede: float = 0.5
    newer_gap: float = 0.1

    def score(self, cosine: float, lexical: float) -> float:
        """The combined score in [0, 1] of one entry.

        Args:
            cosine: vector similarity (negative already clipped to 0).
            lexical: normalised lexical score in [0, 1].

        Returns:
            The score.
        """
        mixed = self.vector_weight * cosine + (1.0 - self.vector_weight) * lexical
        return min(1.0, max(cosine, mixed) if self.lexical_raises_only else mixed)

    def threshold(self, query: str) -> float:
        """The injection threshold for ``query``: ``threshold_about_user`` when it speaks about
        the user (``about_user``), else ``threshold_other``."""
        return self.threshold_about_user if about_user(query) else self.threshold_other


HASHING = Calibration(vector_weight=0.5, lexical_raises_only=False, threshold_about_user=0.35, threshold_other=0.35)
MINILM = Calibration(vector_weight=0.5, lexical_raises_only=True, threshold_about_user=0.34, threshold_other=0.55, margin=0.05,
                     newer_gap=0.1)
# all-mpnet-base-v2: words weigh 0.2 (as much recall@3 as 0.5, the fact injected more often); thresholds
# with unrelated injections <= 4% on the fit half (the held-out half ran a point above).
MPNET = Calibration(vector_weight=0.8, lexical_raises_only=True, threshold_about_user=0.37, threshold_other=0.57, margin=0.05,
                    supersede=0.4, newer_gap=0.04)

# A clause that opens with a wish or a task ("I need ...", "we're planning ...",
# "can you ...", "suggest ..."): the speaker is the asker, not the topic. Only at a
# clause start, so that "What do I like best?" or "Do I need glasses?" stay questions about the user.
_CLAUSE = r"(?:^|[.,;:!?]\s*)"
_WISH = (rf"{_CLAUSE}(?:i|we)(?:'d| would)? (?:need|want|wish|like|love|wonder|have to|must)\b"
         rf"|{_CLAUSE}(?:i|we)(?:'m| am|'re| are) (?:trying|curious|looking|planning|preparing|learning|writing"
         r"|confused|stuck|bored|hosting|organi[sz]ing|thinking)\b")
_TASK = (r"\b(?:can|could|would|will) you (?!remind|tell|recall|remember)"
         rf"|{_CLAUSE}(?:please )?(?:suggest|write|give|summari[sz]e|explain|describe|list|recommend|check|translate"
         r"|make|create|draft|compose|help|teach|fix|correct)\b"
         r"|\bany (?:ideas|tips|strategies|suggestions)\b")
_REQUEST_CLAUSE = re.compile(f"{_WISH}|{_TASK}", re.I)
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|i've|i'd|me|my|mine|myself|we|we're|us|our|ours|ourselves)\b", re.I)
# Asking for help or a how-to is not a statement about oneself: "how do I sort a list?".
_REQUEST = re.compile(r"\bhow (?:do|can|could|should|would|to) (?:i|we)\b|\b(?:give|tell|show|help|teach|let) (?:me|us)\b", re.I)


def about_user(query: str) -> bool:
    """Whether a message speaks about the user (first person outside requests).

    Args:
        query: any text.

    Returns:
        True for "What's my dog called?", "Where do I live?"; False for "How do I
        reverse a list?", "Tell me a joke", "What is the capital of France?", and
        for first-person requests (``is_request``): "I need a name for my blog.".
    """
    text = query.replace("’", "'")
    return bool(_FIRST_PERSON.search(_REQUEST.sub(" ", text))) and not is_request(text)


def is_request(query: str) -> bool:
    """Whether a message asks for a task or for knowledge rather than about the user's own facts.

    Args:
        query: any text.

    Returns:
        True for "I need a name for my new cooking blog.", "We're hosting a dinner
        party, suggest a starter.", "Can you check my sentence?"; False for "What do
        I like best?", "Do I need glasses?", "Where's my car parked again?".
    """
    return bool(_REQUEST_CLAUSE.search(query.strip().replace("’", "'")))


def calibration_for(embedder_name: str) -> Calibration:
    """The calibration of an embedder, by its name.

    Args:
        embedder_name: ``Embedder.name``.

    Returns:
        ``MPNET`` or ``MINILM`` for their vectors, else ``HASHING`` (also for injected
        embedders, whose scales are unknown: the hashing calibration is the neutral one).
    """
    if embedder_name.startswith("mpnet-"):
        return MPNET
    return MINILM if embedder_name.startswith("minilm-") else HASHING
