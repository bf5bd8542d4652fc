"""The machine underneath: which BLAS MLX calls, which device it runs on.

- ``blas``: resolves a fast OpenBLAS before anything imports MLX (Linux CPU backend).
- ``device``: device facts for ``mlotspark info``, Metal limits (guarded: no-ops off
  Metal), MLX's peak memory.
- ``memory``: which memory signal and budget are in force, and MLX's allocator limit.

May import: ``mlotspark.errors``, ``mlotspark.options`` (argument checks) and third-party packages
only (the bottom layer).
"""
