"""The activation dtype of quantized weights on a GPU: half precision, not float32.

A native GGUF (Q4_0 / Q4_1 / Q8_0, the default model) keeps its F32 norms beside
float16 quantization scales; ``rms_norm`` then returns float32 and so does every
``quantized_matmul`` after it: activations and KV at twice the bytes and half the
speed on Metal. On a GPU every floating parameter outside the packed weights
(norms, float embeddings, scales, biases) is cast to float16, or to bfloat16 when the
model already holds bfloat16 (its range: float16 overflows in Gemma 3). The CPU
backend keeps float32 (half precision never reaches BLAS there, DESIGN §2).

``MLOTSPARK_GPU_DTYPES=1`` applies the GPU rule on the CPU (tests, and ranks started
by ``mlx.launch`` in a test); ``0`` turns it off on a GPU.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["FORCE_ENV", "activation_dtype", "on_gpu", "settle_quantized_activations"]

FORCE_ENV = "MLOTSPARK_GPU_DTYPES"


def on_gpu() -> bool:
    """Whether the GPU dtype rule applies: MLX's default device is a GPU (Metal or
    CUDA), unless ``MLOTSPARK_GPU_DTYPES`` says otherwise."""
    forced = os.environ.get(FORCE_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.gpu


def settle_quantized_activations(model: Any, gpu: bool | None = None) -> Any:
    """Cast a quantized model's floating parameters to its half dtype, on a GPU only.

    Args:
        model: a loaded model with quantized layers (``weights="quantized"``).
        gpu: apply the rule (default :func:`on_gpu`).

    Returns:
        The dtype the activations now run in (``mx.float16`` / ``mx.bfloat16``), or None
        when nothing changed (the CPU backend).
    """
    if not (on_gpu() if gpu is None else gpu):
        return None
    import mlx.core as mx
    from mlx.utils import tree_flatten

    floats = {v.dtype for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)}
    target = mx.bfloat16 if mx.bfloat16 in floats else mx.float16
    model.set_dtype(target)  # floating parameters only: the packed uint32 weights stay
    mx.eval(model.parameters())
    return target


def activation_dtype(model: Any) -> Any:
    """The dtype a model's activations (and so its KV) run in.

    Not the embedding weight's dtype: a quantized model stores uint32 there. The
    activations take the widest floating dtype among the parameters they meet
    (quantization scales, norms, float embeddings): F32 norms beside float16 scales
    make float32 activations, as MLX's type promotion does.

    Returns:
        An ``mx.Dtype`` (``mx.float32`` when the model holds no floating parameter).
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    order = {mx.float16: 1, mx.bfloat16: 1, mx.float32: 2}
    found = {v.dtype for _, v in tree_flatten(model.parameters()) if v.dtype in order}
    if not found:
        return mx.float32
    if found == {mx.float16, mx.bfloat16}:
        return mx.float32  # float16 meets bfloat16: MLX promotes to float32
    return max(found, key=lambda d: order[d])
