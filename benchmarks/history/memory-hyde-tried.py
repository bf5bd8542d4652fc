"""Tried 2026-11-29, not kept: HyDE for semantic memory's retrieval, on memory_eval's FIT half only.

The chat model (Qwen2.5-Coder-0.5B through ``Engine.generate``, greedy, 24 tokens) writes a
hypothetical first-person answer to each question; its MPNet vector is mixed with the question's
(pure cosine, no lexical part). ``argv[1]`` is the prompt ({q}: the question).

    .venv/bin/python benchmarks/history/memory-hyde-tried.py ["PROMPT {q}"]

Figures in ``benchmarks/figures/semantic.md``, "Round 12".
"""
import json, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, "benchmarks")
import memory_eval as me
from mlotspark.models import bundles
from mlotspark.memory.semantic import MPNetEmbedder
from mlotspark import Engine
D = Path("benchmarks/data")
doc = json.loads((D/"memory_eval.json").read_text()); fresh = json.loads((D/"memory_eval_fresh.json").read_text())
pairs = doc["pairs"] + fresh["pairs"]
corpus = [p["fact"] for p in pairs] + doc["distractors"] + fresh["distractors"]
qs = [p["question"] for p in pairs]
fitq = me.sets(doc, fresh, 0, 0)["fit"][0]
emb = MPNetEmbedder(bundles.pull(bundles.MPNET_MODEL, progress=False))
def norm(a):
    a = np.asarray(a, dtype=np.float32); return a / np.linalg.norm(a, axis=1, keepdims=True)
C = norm(emb.embed(corpus)); Q = norm(emb.embed([qs[i] for i in fitq]))
eng = Engine.load("qwen2.5-coder-0.5b")
PROMPT = sys.argv[1] if len(sys.argv) > 1 else ("Write one short sentence the user might have said about themselves that answers "
          "this question (make up the details): {q}")
hyp = []
t0 = time.time()
for i in fitq:
    r = eng.generate(PROMPT.format(q=qs[i]), max_tokens=24, temperature=0.0)
    hyp.append(r.text.strip().split("\n")[0])
print(f"{len(hyp)} generations in {time.time()-t0:.0f}s")
for i, h in list(zip(fitq, hyp))[:12]: print(repr(qs[i]), '->', repr(h))
H = norm(emb.embed(hyp))
def r3(S):
    return np.mean([j in np.argsort(-S[k])[:3] for k, j in enumerate(fitq)])
def r1(S):
    return np.mean([np.argmax(S[k]) == j for k, j in enumerate(fitq)])
SQ, SH = Q @ C.T, H @ C.T
for w in [0, 0.3, 0.5, 0.7, 1.0]:
    S = (1-w)*SQ + w*SH
    print(f"w_hyp={w}: fit recall@3 {r3(S):.3f} recall@1 {r1(S):.3f}")
S = norm((1-0.5)*Q + 0.5*H) @ C.T
print(f"vector mean: fit recall@3 {r3(S):.3f} recall@1 {r1(S):.3f}")

