"""Tried 2026-11-29, not kept: is "B updates A" learnable from MPNet pair features?

Logistic regression on [a*b, |a-b|, cos] of (older, newer) pairs, leave-one-set-out over the five
update sets' FIT halves (train on four, test on the fifth); negatives: the same-kind pairs, the ten
background entries nearest each newer fact, older facts against other updates' newer ones. Each
set's threshold lets 2% of its background neighbours pass; cosine alone is the baseline.

    .venv/bin/python benchmarks/history/memory-update-pair-classifier-tried.py fit

Figures in ``benchmarks/figures/semantic.md``, "Round 12".
"""
import json, sys, random
from pathlib import Path
import numpy as np
sys.path.insert(0, "benchmarks")
import memory_updates as mu
from mlotspark.models import bundles
from mlotspark.memory.semantic import MPNetEmbedder
D = Path("benchmarks/data")
SETS = ["memory_updates.json", "memory_updates_round2.json", "memory_updates_round3.json", "memory_updates_round4.json", "memory_updates_round5.json"]
emb = MPNetEmbedder(bundles.pull(bundles.MPNET_MODEL, progress=False))
cache = {}
def vec(texts):
    new = [t for t in set(texts) if t not in cache]
    if new:
        for t, v in zip(new, np.asarray(emb.embed(new), dtype=np.float32)):
            cache[t] = v / np.linalg.norm(v)
    return np.stack([cache[t] for t in texts])
bg = mu.background()
B = vec(bg)
PART = sys.argv[1] if len(sys.argv) > 1 else "fit"
def examples(name, part):
    d = json.loads((D / name).read_text())
    ups = [d["updates"][i] for i in mu.halves(len(d["updates"]), 0)[part]]
    prs = [d["unrelated_pairs"][i] for i in mu.halves(len(d["unrelated_pairs"]), 1)[part]]
    pos = [(u["old"], u["new"]) for u in ups]
    neg_pair = [(p["a"], p["b"]) for p in prs]
    # background neighbours of each new sentence (not its old): what a store compares it with
    N = vec([u["new"] for u in ups]) @ B.T
    neg_bg = [(bg[j], u["new"]) for k, u in enumerate(ups) for j in np.argsort(-N[k])[:10] if bg[j] != u["old"]]
    # old vs other updates' new sentences of the same set (another slot changed)
    neg_cross = [(ups[i]["old"], ups[j]["new"]) for i in range(len(ups)) for j in range(len(ups)) if i != j]
    random.Random(0).shuffle(neg_cross)
    return pos, neg_pair, neg_bg, neg_cross[:60]
def feats(pairs):
    a = vec([p[0] for p in pairs]); b = vec([p[1] for p in pairs])
    return np.concatenate([a * b, np.abs(a - b), (a * b).sum(1, keepdims=True)], 1)
def train(X, y, lam, iters=3000, lr=5.0):
    w = np.zeros(X.shape[1]); b0 = 0.0
    pw = (y == 0).sum() / max(1, (y == 1).sum())  # balance
    sw = np.where(y == 1, pw, 1.0)
    for _ in range(iters):
        p = 1 / (1 + np.exp(-(X @ w + b0)))
        g = (p - y) * sw
        w -= lr * (X.T @ g / len(y) + lam * w); b0 -= lr * g.mean()
    return w, b0
data = {s: examples(s, PART) for s in SETS}
for lam in [1e-3, 1e-2, 1e-1]:
    rows = []
    for test in SETS:
        tr = [data[s] for s in SETS if s != test]
        P = sum((x[0] for x in tr), []); Nn = sum((x[1] + x[2] + x[3] for x in tr), [])
        X = feats(P + Nn); y = np.array([1] * len(P) + [0] * len(Nn))
        w, b0 = train(X, y, lam)
        pos, npair, nbg, ncross = data[test]
        sp = feats(pos) @ w + b0; sb = feats(nbg) @ w + b0; spr = feats(npair) @ w + b0; sc = feats(ncross) @ w + b0
        t = np.quantile(sb, 0.98)  # threshold: 2% of background neighbours pass
        rows.append((test[15:-5] or "1", (sp > t).mean(), (spr > t).mean(), (sc > t).mean()))
    print(f"lam={lam}: " + "  ".join(f"{n}: upd {a:.0%} pairs {b:.0%} cross {c:.0%}" for n, a, b, c in rows))
# cosine alone baseline at the same 2% background rate
for test in SETS:
    pos, npair, nbg, ncross = data[test]
    c = lambda ps: (vec([p[0] for p in ps]) * vec([p[1] for p in ps])).sum(1)
    t = np.quantile(c(nbg), 0.98)
    print(f"cosine alone {test}: upd {(c(pos) > t).mean():.0%} pairs {(c(npair) > t).mean():.0%} cross {(c(ncross) > t).mean():.0%}")
