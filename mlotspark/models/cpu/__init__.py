"""The CPU backend's fast paths: what a loaded model runs instead of MLX's own ops on
MLX's CPU backend, where float32 through OpenBLAS is the lever (DESIGN §2).

- ``cpu_step``: one-token decode steps of one sequence in NumPy (llama family);
  ``cpu_step_gemma``: the same for Gemma 3.
- ``matvec``: one-token matrix-vector products in the layout OpenBLAS runs fastest.
- ``prefill_ops``: prefill (many tokens at once): attention in query blocks, RMSNorm,
  RoPE and the other work around the GEMMs; also the attention ``caches.kv`` calls.
- ``widen``: a loaded model's weights widened to one float dtype, over several cores.

``models.execution`` chooses these at load. May import what ``models`` may, and
``models.llama`` (the RoPE forms the steps reproduce) and ``caches.kv`` (the cache a
NumPy step writes into).
"""
