"""mlx-lm's own model class holding *our* loaded weights: the yardstick.

Tests compare greedy tokens against it and ``bench --compare mlx-lm`` times it in
the same process. Parameter names are identical, so the twin shares our arrays
(no copy, same weight format).
"""

from __future__ import annotations

import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

from mlotspark.models.loader import LoadedModel


def mlx_lm_twin(loaded: LoadedModel) -> nn.Module:
    """An mlx-lm model of the same architecture sharing ``loaded``'s weights."""
    cls, args_cls = _get_classes(loaded.config)
    twin = cls(args_cls.from_dict(loaded.config))
    if hasattr(twin, "sanitize"):
        # for its effect on the structure: gemma3's drops lm_head when the embedding is tied
        twin.sanitize(dict(tree_flatten(loaded.model.parameters())))
    # Same layer types as ours (quantized or not), so the shared arrays fit.
    quantized = {
        name: {"group_size": m.group_size, "bits": m.bits}
        for name, m in loaded.model.named_modules()
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    }
    if quantized:
        nn.quantize(twin, class_predicate=lambda p, m: quantized.get(p, False))
    twin.update(loaded.model.parameters())
    return twin
