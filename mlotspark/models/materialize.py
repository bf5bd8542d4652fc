"""Evaluate everything a model holds, so another thread can run it.

Since MLX 0.31.2 each thread has its own default stream, and a graph recorded on one
thread cannot be evaluated on another ("There is no Stream(cpu, 0) in current
thread"). Models are loaded on the caller's thread and run on the engine thread, so
every array a model holds must be computed before the engine thread touches it.
``model.parameters()`` is not enough: MLX leaves ``_``-prefixed attributes out, and
that is where RoPE classes keep their frequencies (our ``FactorRoPE``, mlx-lm's
``Llama3RoPE``, ``YarnRoPE``, ``SuScaledRoPE``), built lazily in ``__init__``.
So this walks every module's attributes, public and private, whatever the class.
"""

from __future__ import annotations

from typing import Any, Iterator

import mlx.core as mx
import mlx.nn as nn

__all__ = ["held_arrays", "materialize"]


def _arrays(value: Any, depth: int = 0) -> Iterator[mx.array]:
    if isinstance(value, mx.array):
        yield value
    elif depth < 4 and isinstance(value, (list, tuple)):  # a table of arrays, not a module tree
        for v in value:
            yield from _arrays(v, depth + 1)
    elif depth < 4 and isinstance(value, dict) and not isinstance(value, nn.Module):
        for v in value.values():
            yield from _arrays(v, depth + 1)


def held_arrays(model: nn.Module) -> list[mx.array]:
    """Every array ``model`` holds: parameters, buffers and private attributes of each module.

    Args:
        model: any MLX module (ours, mlx-lm's, a pipeline share).

    Returns:
        The arrays, each once.
    """
    seen: dict[int, mx.array] = {}
    for _, module in model.named_modules():
        # The module's dict holds its arrays (private ones too); vars() holds what
        # __setattr__ kept as plain attributes (a class may tuck arrays in there).
        for value in (*module.values(), *vars(module).values()):
            for a in _arrays(value):
                seen.setdefault(id(a), a)
    return list(seen.values())


def materialize(model: nn.Module) -> None:
    """Compute every array ``model`` holds (see ``held_arrays``), on this thread, now.

    Args:
        model: the loaded model; after this call any thread may run it.
    """
    mx.eval(held_arrays(model))
