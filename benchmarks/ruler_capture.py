"""Reads `ruler.py --capture` output: per (layer, KV head) block masses and where the needles' blocks ranked.

``ruler.py --capture DIR`` saves one ``.npz`` per cascade case, so routing rules can
be compared offline on the very cases the matrix ran, without running the model
again (``python ruler_capture.py DIR``: where each needle ranked and whether the pass
pinned it, beside the reply):

- ``mass`` (layers, Hkv, n): ``question.block_mass`` of every layer at the pass
  (with ``--capture-queries``: (layers, Hkv, G * M, n), every query's share);
- ``chosen``: the blocks the pass pinned; ``n_blocks``, ``sinks``, ``block_size``;
- ``needle_blocks`` (needles, 2): first and last block each needle's tokens touch
  (-1 when the needle is still in sinks/window or was not found in the ids);
- ``wanted``: 1 for a needle the answer needs (the asked key's, every value of
  multivalue, both asked keys of multiquery, the whole vt chain), 0 for a
  look-alike (the other keys of multikey / multiquery).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from mlotspark.memory.cascade import question, routing


class Capture:
    """Wraps ``question.query_mass`` / ``question.consensus`` to record one pass per case.

    Args:
        per_query: keep each question query's mass, (layers, Hkv, G * M, n), not only
            the largest (so rules over fewer queries can be tried offline).
    """

    def __init__(self, per_query: bool = False) -> None:
        self.per_query = per_query
        self.masses: list[np.ndarray] = []
        self.chosen: tuple[int, ...] | None = None
        self._mass = question.query_mass
        self._consensus = question.consensus
        question.query_mass = self._record_mass
        question.consensus = self._record_consensus

    def _record_mass(self, cache: Any, n: int):
        m = self._mass(cache, n)
        self.masses.append(np.array(m if self.per_query else m.max(axis=1), dtype=np.float16 if self.per_query else np.float32))
        return m

    def _record_consensus(self, *args: Any, **kw: Any):
        self.masses = []
        self.chosen = self._consensus(*args, **kw)
        return self.chosen

    def reset(self) -> None:
        self.masses, self.chosen = [], None


def _find(ids: list[int], sub: list[int]) -> int:
    """Start of ``sub`` in ``ids`` (-1 if absent)."""
    n = len(sub)
    for i in range(len(ids) - n + 1):
        if ids[i : i + n] == sub:
            return i
    return -1


def needle_spans(engine: Any, ids: list[int], needles: tuple[str, ...]) -> list[tuple[int, int]]:
    """Token span [start, end) of each needle in ``ids`` ((-1, -1) if not found).

    The needle's raw tokens without its first and last (they may merge with the
    neighbouring space or sentence) are searched for.
    """
    out = []
    for nd in needles:
        toks = engine.encode(" " + nd, raw=True)
        core = toks[1:-1] if len(toks) > 3 else toks
        s = _find(ids, core)
        out.append((s - 1, s + len(core) + 1) if s >= 0 else (-1, -1))
    return out


def wanted(task: str, needles: tuple[str, ...], answers: tuple[str, ...]) -> list[int]:
    """1 for each needle the answer needs, 0 for a look-alike."""
    if task in ("niah_multikey", "niah_multiquery"):
        return [int(any(a in nd for a in answers)) for nd in needles]
    return [1] * len(needles)


def save(path: Path, cap: Capture, engine: Any, ids: list[int], case: Any, config: Any, record: dict) -> None:
    """Write what ``cap`` recorded for one case (nothing if the pass did not run)."""
    if not cap.masses or cap.chosen is None:
        return
    B, S = config.block_size, config.sinks
    n = cap.masses[0].shape[-1]
    blocks = []
    for s, e in needle_spans(engine, ids, case.needles):
        if s < 0:
            blocks.append((-1, -1))
            continue
        a, b = (s - S) // B, (e - 1 - S) // B
        blocks.append((a, b) if 0 <= a and b < n else (-1, -1))  # sinks or window: no routing needed
    np.savez_compressed(
        path, mass=np.stack(cap.masses), chosen=np.array(cap.chosen, dtype=np.int64), n_blocks=n,
        sinks=S, block_size=B, needle_blocks=np.array(blocks, dtype=np.int64).reshape(-1, 2),
        wanted=np.array(wanted(case.task, case.needles, case.answers), dtype=np.int64),
        record=json.dumps(record))


def pinned_by(score: np.ndarray, k: int, before: int, after: int) -> set[int]:
    """The blocks a rule taking the ``k`` best of ``score``, each with ``before`` blocks before
    it and ``after`` after it (at most ``k`` in all), would pin: the engine's own
    ``routing.top_blocks`` with ``lead`` and ``follow``."""
    import mlx.core as mx  # here: mlotspark's own imports load its BLAS before mlx does

    if len(score) <= k:
        return set(range(len(score)))
    return set(routing.top_blocks(mx.array(score)[None], k, after, lead=before)[0])


def report(path: Path, sharpen: int | None = None, around: tuple[int, int] | None = None) -> str:
    """One case's lines: the reply's score and tail, then each needle's blocks, whether the
    answer needs it, whether the pass pinned them, and their rank under the pass's
    consensus (0 = the best block): each (layer, KV head)'s mass to the power ``sharpen``
    (default: the ``question_sharpen`` the case ran with), summed, as ``question.consensus``
    scores; another ``sharpen`` ranks the same masses as that rule would have. ``around``
    (before, after): also whether ``pinned_by`` with the case's ``top_k`` would pin each needle."""
    d = np.load(path)
    rec = json.loads(str(d["record"]))
    if sharpen is None:
        sharpen = rec.get("cfg", {}).get("question_sharpen", 1)
    mass = d["mass"].astype(np.float64)
    if mass.ndim == 4:  # --capture-queries: the largest share of any query, as block_mass takes
        mass = mass.max(axis=2)
    score = (mass**sharpen).sum(axis=(0, 1))
    rank = np.empty(len(score), dtype=np.int64)
    rank[np.argsort(-score, kind="stable")] = np.arange(len(score))
    chosen = set(d["chosen"].tolist())
    if around is not None:
        other = pinned_by(score, int(rec.get("cfg", {}).get("top_k", len(chosen))), *around)
    lines = [f"{rec['task']} {rec['tokens']} tokens, depth {rec['depth']}: {int(d['n_blocks'])} blocks, "
             f"{len(chosen)} pinned; score {rec['score']}: {rec['reply'][-48:]!r} (answer {', '.join(rec['answers'])})"]
    for (a, b), need in zip(d["needle_blocks"].tolist(), d["wanted"].tolist()):
        what = "needed" if need else "look-alike"
        if a < 0:
            lines.append(f"  {what}: in sinks or window (or not found in the prompt's tokens)")
            continue
        blocks = range(a, b + 1)
        line = (f"  {what}: blocks {a}-{b}, pinned {sum(x in chosen for x in blocks)}/{len(blocks)}, "
                f"rank {', '.join(str(int(rank[x])) for x in blocks)}")
        if around is not None:
            line += f"; {around[0]} before + {around[1]} after: pinned {sum(x in other for x in blocks)}/{len(blocks)}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="Where the question pass ranked each needle of captured RULER cases.")
    p.add_argument("paths", nargs="+", type=Path, help=".npz files or folders of them (ruler.py --capture DIR)")
    p.add_argument("--sharpen", type=int, default=None,
                   help="rank as with this question_sharpen (default: the one each case ran with)")
    p.add_argument("--around", type=int, nargs=2, metavar=("BEFORE", "AFTER"), default=None,
                   help="also say whether taking BEFORE blocks before and AFTER after each chosen block "
                        "(the case's top_k in all; the engine takes 0 before and `follow` after) pins each needle")
    args = p.parse_args(argv)
    files = [f for x in args.paths for f in (sorted(x.glob("*.npz")) if x.is_dir() else [x])]
    if not files:
        p.error("no .npz captures in " + ", ".join(map(str, args.paths)))
    for f in files:
        print(f"{f.name}: {report(f, args.sharpen, args.around)}")


if __name__ == "__main__":
    main()
