"""Widening a loaded model's weights to one float dtype: spread over the CPU's cores, with
chosen layers widened straight into one shared buffer.

The plain way (``mlx_lm.utils.dequantize_model``, then ``model.set_dtype``) evaluates op
after op on one core, dequantizes in the scales' float16 (on an x86 CPU each float16
operation goes through float32 and back: ~3x slower than dequantizing in float32) and
then casts that float16 result again. Here:

- a quantized layer is dequantized straight to the target dtype, its scales and biases
  widened first: one pass, in the target's arithmetic, so float32 weights are the file's
  values without the intermediate float16 rounding of the plain way (< 2^-11 relative);
- the work is spread over several MLX CPU streams, each run by its own thread, and
  evaluated in one ``mx.eval``;
- each group of sibling layers named in ``groups`` (the CPU step's q/k/v and gate/up,
  ``execution.CpuRunner.fused_groups``) is concatenated in its stored, narrow form and
  widened once into one buffer, the layers keeping row views of it: the fused buffer is
  written once, instead of each layer's being widened and then copied into it.

Float parameters are cast as ``set_dtype`` casts them (bit for bit the same values).
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Iterable, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn

__all__ = ["default_workers", "group_key", "widen"]

# CPU streams, made once per loading thread: MLX streams belong to the thread that made them
# (a server or the chat loads models on worker threads).
_STREAMS = threading.local()


def default_workers() -> int:
    """Streams to spread the widening over: the cores this process may use, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


def group_key(paths: Sequence[str]) -> str:
    """The name of a fused group's buffer: its layers' weight names joined by ``|``
    (``model.layers.0.self_attn.q_proj.weight|...k_proj.weight|...v_proj.weight``)."""
    return "|".join(f"{p}.weight" for p in paths)


def _streams(n: int) -> list:
    made = _STREAMS.__dict__.setdefault("streams", [])
    while len(made) < n:
        made.append(mx.new_stream(mx.cpu))
    return made[:n]


def _quantized(m: nn.Module) -> bool:
    return isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))


def _in_dims(m: nn.Module) -> int:
    return m.scales.shape[-1] * m.group_size if _quantized(m) else m.weight.shape[-1]


def _elements(m: nn.Module) -> int:
    return m.weight.shape[0] * _in_dims(m)


def _dequantize(w: mx.array, scales: mx.array, biases: Optional[mx.array], m: nn.Module,
                dtype: mx.Dtype) -> mx.array:
    biases = None if biases is None else biases.astype(dtype)
    return mx.dequantize(w, scales.astype(dtype), biases, group_size=m.group_size, bits=m.bits,
                         mode=m.mode, dtype=dtype)


def _dense(m: nn.Module, weight: mx.array) -> nn.Module:
    """The plain layer that replaces quantized ``m``, holding ``weight`` (as
    ``dequantize_model`` builds it)."""
    if isinstance(m, nn.QuantizedEmbedding):
        out = nn.Embedding(*weight.shape)
    else:
        out = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in m)
        if "bias" in m:
            out.bias = m.bias
    out.weight = weight
    return out


def _fusable(group: Sequence[nn.Module]) -> bool:
    """Linear layers of one input width, all float or all quantized alike (one dequantize)."""
    if not all(isinstance(m, (nn.Linear, nn.QuantizedLinear)) for m in group):
        return False
    if len({_in_dims(m) for m in group}) != 1:
        return False
    first = group[0]
    if not _quantized(first):
        return not any(_quantized(m) for m in group)
    return all(_quantized(m) and (m.group_size, m.bits, m.mode) == (first.group_size, first.bits, first.mode)
               and (m.biases is None) == (first.biases is None) for m in group)


def _parents(model: nn.Module) -> dict[int, tuple[object, object]]:
    """id(module) -> (holder, key) such that ``holder[key]`` is the module (a parent module
    or a list of layers), for swapping quantized layers for plain ones."""
    out: dict[int, tuple[object, object]] = {}
    for _, parent in model.named_modules():
        for key, child in parent.children().items():
            if isinstance(child, nn.Module):
                out[id(child)] = (parent, key)
            elif isinstance(child, (list, tuple)):
                for i, c in enumerate(child):
                    if isinstance(c, nn.Module):
                        out[id(c)] = (child, i)
    return out


def widen(model: nn.Module, dtype: mx.Dtype = mx.float32, *, groups: Iterable[Sequence[str]] = (),
          workers: Optional[int] = None) -> dict[str, mx.array]:
    """Convert every float parameter of ``model`` to ``dtype`` and every quantized layer to a
    plain one in ``dtype``, in place, and evaluate them.

    Args:
        model: a loaded model (quantized layers, float16/bfloat16/float32 parameters).
        dtype: the floating dtype to run in (default float32).
        groups: module paths of sibling layers (``Linear`` or ``QuantizedLinear``, one
            input width), e.g. ``("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")``,
            whose weights end up as row views of one buffer, in that order. A group that
            does not qualify (mixed quantization, a path that is not there) is widened
            layer by layer.
        workers: CPU streams to spread the work over (default ``default_workers()``);
            on a GPU everything runs on the default stream.

    Returns:
        Each fused group's buffer by ``group_key`` (what ``float32_cache`` stores).
    """
    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    streams = _streams(workers or default_workers()) if on_cpu else []
    modules = dict(model.named_modules())
    parents = _parents(model)
    jobs: list[tuple[int, Callable[[], list[mx.array]]]] = []  # (bytes out, builds the lazy arrays)
    fused: dict[str, mx.array] = {}
    done: set[int] = set()

    def place(m: nn.Module, weight: mx.array) -> None:
        if _quantized(m):
            holder, key = parents[id(m)]
            holder[key] = _dense(m, weight)  # a parent module and a list both take item assignment
        else:
            m.weight = weight

    for paths in groups:
        group = tuple(modules.get(p) for p in paths)
        if len(group) < 2 or any(m is None or id(m) in done for m in group) or not _fusable(group):
            continue
        done.update(id(m) for m in group)

        def fuse(group=group, key=group_key(paths)) -> list[mx.array]:
            first = group[0]
            if _quantized(first):
                def cat(name: str) -> mx.array:
                    return mx.concatenate([getattr(m, name) for m in group])

                whole = _dequantize(cat("weight"), cat("scales"), None if first.biases is None else cat("biases"),
                                    first, dtype)
            else:
                whole = mx.concatenate([m.weight for m in group]).astype(dtype)
            fused[key] = whole
            rows, start = [], 0
            for m in group:
                n = m.weight.shape[0]
                rows.append(whole[start:start + n])  # a view of the one buffer
                start += n
            for m, w in zip(group, rows):
                place(m, w)
            return [whole, *rows]

        jobs.append((sum(_elements(m) for m in group) * dtype.size, fuse))

    for m in modules.values():
        if id(m) in done:
            continue
        if _quantized(m):
            def one(m=m) -> list[mx.array]:
                w = _dequantize(m.weight, m.scales, m.biases, m, dtype)
                place(m, w)
                return [w]

            jobs.append((_elements(m) * dtype.size, one))
            continue
        for name, v in m.items():
            # Parameters only, as ``set_dtype`` casts (private arrays, RoPE tables, stay as built).
            if (isinstance(v, mx.array) and not name.startswith("_") and mx.issubdtype(v.dtype, mx.floating)
                    and v.dtype != dtype):
                def cast(m=m, name=name) -> list[mx.array]:
                    m[name] = m[name].astype(dtype)
                    return [m[name]]

                jobs.append((v.size * dtype.size, cast))

    # Largest first, each onto the least loaded stream: the streams finish together.
    jobs.sort(key=lambda j: -j[0])
    load = [0] * len(streams)
    out: list[mx.array] = []
    for nbytes, build in jobs:
        if not streams:
            out.extend(build())
            continue
        i = load.index(min(load))
        load[i] += nbytes
        with mx.stream(streams[i]):
            out.extend(build())
    mx.eval(out)
    return fused
