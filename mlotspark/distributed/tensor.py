"""Tensor parallelism: every rank runs every layer with a share of the heads.

MLX's sharded linear layers (``mlx.nn.layers.distributed.shard_linear``) split
q/k/v and the MLP's gate/up by output rows ("all-to-sharded") and o/down by input
columns ("sharded-to-all", which ends in an ``all_sum``), as mlx-lm's ``shard`` does.
It needs the query heads, the KV heads and the MLP width to divide by the rank count.
"""

from __future__ import annotations

from typing import Any

from mlx.nn.layers.distributed import shard_linear

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
        attn.o_proj = shard_linear(attn.o_proj, "sharded-to-all", group=group)
        attn.n_heads //= n  # the attention reshapes by these counts
        attn.n_kv_heads //= n
        mlp.gate_proj = shard_linear(mlp.gate_proj, "all-to-sharded", group=group)
        mlp.up_proj = shard_linear(mlp.up_proj, "all-to-sharded", group=group)
        mlp.down_proj = shard_linear(mlp.down_proj, "sharded-to-all", group=group)
