"""Tensor parallelism: every rank runs every layer with a share of the heads.

MLX's sharded linear layers (``mlx.nn.layers.distributed.shard_linear``) split
q/k/v and the MLP's gate/up by output rows ("all-to-sharded") and o/down by input
columns ("sharded-to-all", which ends in an ``all_sum``), as mlx-lm's ``shard`` does.
It needs the query heads, the KV heads and the MLP width to divide by the rank count.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx.nn.layers.distributed import QuantizedShardedToAllLinear, ShardedToAllLinear, shard_linear

from mlotspark.errors import DistributedError


def check_tensor_split(args: Any, ranks: int, name: str) -> None:
    """Refuse a model whose heads or MLP width do not divide by ``ranks``.

    Args:
        args: the model's ModelArgs.
        ranks: the group size.
        name: the model's name, for the message.

    Raises:
        DistributedError: naming the head counts (and suggesting the pipeline).
    """
    heads, kv_heads, ffn = args.num_attention_heads, args.num_key_value_heads, args.intermediate_size
    if heads % ranks or kv_heads % ranks or ffn % ranks:
        raise DistributedError(
            f"tensor parallelism cannot split {name} over {ranks} ranks: its {heads} attention heads, "
            f"{kv_heads} KV heads and MLP width {ffn} must all divide by {ranks}; use --distributed pipeline"
        )


class _EagerShardedToAll(ShardedToAllLinear):
    """MLX's sharded-to-all layer with its input and its ``all_sum`` evaluated at once:
    left lazy inside the step's graph, the CPU backend's ring collectives hung both
    ranks (as in ``pipeline``)."""

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ self["weight"].T
        mx.eval(y)
        y = mx.distributed.all_sum(y, group=self.group)
        mx.eval(y)
        return y + self["bias"] if "bias" in self else y


class _EagerQuantizedShardedToAll(QuantizedShardedToAllLinear):
    """The quantized twin of ``_EagerShardedToAll``."""

    def __call__(self, x: mx.array) -> mx.array:
        y = mx.quantized_matmul(x, self["weight"], scales=self["scales"], biases=self.get("biases"),
                                transpose=True, group_size=self.group_size, bits=self.bits, mode=self.mode)
        mx.eval(y)
        y = mx.distributed.all_sum(y, group=self.group)
        mx.eval(y)
        return y + self["bias"] if "bias" in self else y


def _sharded_to_all(layer: Any, group: Any) -> Any:
    out = shard_linear(layer, "sharded-to-all", group=group)
    out.__class__ = _EagerQuantizedShardedToAll if isinstance(out, QuantizedShardedToAllLinear) else _EagerShardedToAll
    return out


def shard_model(model: Any, group: Any) -> None:
    """Replace every layer's projections of a llama-family ``model`` by their shards, in place.

    Args:
        model: ``models.llama.Model`` (checked with ``check_tensor_split`` first).
        group: the MLX group.
    """
    n = group.size()
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for proj in ("q_proj", "k_proj", "v_proj"):
            setattr(attn, proj, shard_linear(getattr(attn, proj), "all-to-sharded", group=group))
        attn.o_proj = _sharded_to_all(attn.o_proj, group)
        attn.n_heads //= n  # the attention reshapes by these counts
        attn.n_kv_heads //= n
        mlp.gate_proj = shard_linear(mlp.gate_proj, "all-to-sharded", group=group)
        mlp.up_proj = shard_linear(mlp.up_proj, "all-to-sharded", group=group)
        mlp.down_proj = _sharded_to_all(mlp.down_proj, group)
