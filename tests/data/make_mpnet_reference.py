"""Write ``mpnet_reference.json``: all-mpnet-base-v2 vectors computed by sentence-transformers.

Run once, in a scratch environment that is NOT the project's (torch stays out of it):

    python3 -m venv /tmp/stvenv
    /tmp/stvenv/bin/pip install torch==2.13.0 sentence-transformers   # the CPU wheel
    /tmp/stvenv/bin/python tests/data/make_mpnet_reference.py ~/.mlotspark/models/all-mpnet-base-v2

The model folder is the pulled one (``mlotspark pull all-mpnet-base-v2``), read
offline. The zip ships no ``modules.json``-listed ``2_Normalize`` folder and the
pull keeps only what our embedder reads, so the pipeline is built here from
sentence-transformers' own modules: Transformer (max_seq_length 384), mean
Pooling, Normalize, exactly as the model's ``modules.json`` lists them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

SENTENCES = [
    "My dog is called Biscuit and I live in Tromsø.",
    "What is the name of my dog?",
    "hi",
    "I moved to Porto last month, after six years in Utrecht.",
    "Forget that my cat is called Mochi.",
    "I'm allergic to peanuts — keep them out of every recipe, please!",
    "The quick brown fox jumps over the lazy dog; 42 × 7 = 294, naïve café façade.",
    "What is the capital of France?",
    # ~200 tokens: query-key distances past 128 reach MPNet's last relative buckets.
    " ".join(f"Sentence {i} of a long note about the garden, the roses and the old apple tree." for i in range(12)),
    # > 384 tokens: truncated at the model's max_seq_length.
    " ".join(["The library closes early on public holidays."] * 60),
]


def main() -> None:
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer, models

    folder = Path(sys.argv[1]).expanduser()
    word = models.Transformer(str(folder), max_seq_length=384)
    pool = models.Pooling(word.get_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[word, pool, models.Normalize()], device="cpu")
    vecs = model.encode(SENTENCES, batch_size=4, convert_to_numpy=True, normalize_embeddings=False)
    tokens = [len(model.tokenize([s])["input_ids"][0]) for s in SENTENCES]
    out = {
        "about": "all-mpnet-base-v2 sentence vectors from sentence-transformers (see make_mpnet_reference.py)",
        "sentence_transformers": sentence_transformers.__version__,
        "torch": torch.__version__,
        "max_seq_length": 384,
        "sentences": SENTENCES,
        "tokens": tokens,
        "vectors": [[float(f"{x:.7g}") for x in v] for v in vecs],
    }
    target = Path(__file__).with_name("mpnet_reference.json")
    target.write_text(json.dumps(out, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {target}: {len(SENTENCES)} vectors, tokens {tokens}")


if __name__ == "__main__":
    main()
