"""How a loaded model's steps execute: one strategy per model, chosen once at load.

``llama.py`` is the architecture as mlx-lm writes it. How its steps run on this machine
is a strategy, chosen from the device when the model is loaded (``choose_strategy``)
and installed on it (``prepare``):

- ``cpu`` (the default on MLX's CPU backend): a one-token step of one sequence over a
  plain float32 cache runs in NumPy (``cpu_step.py``: sgemv, ~2x mlx-lm's decode);
  other one-token products as ``W @ x`` (``matvec.py``); prefill's attention and MLP
  activation in the forms of ``prefill_ops.py``; each layer's q/k/v and gate/up in one
  buffer (``fuse_projections``). All four exist because MLX's CPU backend sends every
  product to ``cblas_sgemm`` and computes ``exp`` per element; Metal has neither problem.
- ``gpu`` (the default on Metal and CUDA): a one-token step through compiled pieces,
  one call between two attentions, so Python builds ~30 calls per token instead of ~600
  ops (host time is what limits small models there).
- ``plain``: MLX op by op, as mlx-lm runs the model.

Before that, the loader asks the strategy to widen the weights when the format in use is
wider than what is stored (``ExecutionStrategy.widen``): plainly, as mlx-lm does, except on
the CPU strategy, which spreads the casts over the cores and widens q/k/v and gate/up
straight into their fused buffers (``widen.py``), and whose GGUF loads keep a float32 copy
of the widened weights to read next time (``float32_cache``, ``models/formats/float32_cache.py``).

Installing swaps classes on the model's instances, never its parameters: the model's
class becomes a subclass of the same name whose ``__call__`` asks the strategy, and (cpu)
its ``nn.Linear``/``nn.Embedding``/``MLP`` layers become ``MatvecLinear``/
``MatvecEmbedding``/``PrefillMLP``. Parameter names and weights stay as loaded, and
every caller of ``model(tokens, cache)`` (the runtime, beams, speculative decoding,
mlx-lm's ``generate_step``) runs the strategy. Code that must know how a step will run
(the batcher: does a row take the NumPy step?) asks ``strategy_of(model)``.

``MLOTSPARK_EXECUTION=cpu|gpu|plain`` (or ``prepare(model, "gpu")`` in a test) forces a
strategy on any device: the GPU one runs on the CPU too, only without its speed-up there.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.utils import dequantize_model

from mlotspark.errors import OptionError
from mlotspark.models import llama
from mlotspark.models.cpu import cpu_step, cpu_step_gemma, prefill_ops, widen as widening
from mlotspark.models.cpu.matvec import MatvecEmbedding, MatvecLinear

#: Environment variable that forces a strategy for every model loaded (tests, benchmarks).
ENV = "MLOTSPARK_EXECUTION"

__all__ = ["ENV", "CpuStrategy", "ExecutionStrategy", "GpuStrategy", "PlainStrategy", "PrefillMLP",
           "choose_strategy", "fuse_projections", "prepare", "strategy_of"]


class ExecutionStrategy:
    """How one model's steps run (one instance per model: it may keep per-model state).

    Subclasses override ``install`` (at load), ``forward`` (each call of the model, once
    installed) and ``takes`` (what the batcher asks).
    """

    #: ``cpu | gpu | plain``: what ``choose_strategy`` and ``MLOTSPARK_EXECUTION`` call it.
    name = "plain"
    #: Whether a float32 load of a GGUF keeps the widened weights on disk and reads them
    #: next time (``models/formats/float32_cache.py``) instead of widening again.
    float32_cache = False

    def fused_groups(self, model: nn.Module) -> list[tuple[str, ...]]:
        """Module paths of sibling layers whose weights this strategy keeps as row views of
        one buffer (``fuse_projections``); the loader widens and caches them so."""
        return []

    def widen(self, model: nn.Module, dtype: mx.Dtype) -> dict[str, mx.array]:
        """Dequantize and cast ``model``'s weights to ``dtype`` in place, and evaluate them:
        as mlx-lm does (``dequantize_model``, then ``set_dtype``).

        Returns:
            The buffers of groups fused on the way (none here), by ``widen.group_key``.
        """
        if any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules()):
            dequantize_model(model)
        model.set_dtype(dtype)
        mx.eval(model.parameters())
        return {}

    def install(self, model: nn.Module) -> None:
        """Make ``model`` run through this strategy (swap classes, arrange weights)."""

    def forward(self, model: nn.Module, inputs: mx.array, cache: Optional[list]) -> mx.array:
        """Logits (B, L, V) of ``inputs`` (B, L): the model's own forward, unless the strategy runs it its way."""
        return _plain_call(model, inputs, cache)

    def takes(self, model: nn.Module, cache: Sequence[Any]) -> bool:
        """Whether a one-token step of one sequence over ``cache`` runs outside MLX (the
        NumPy step): the batcher then steps such rows one by one instead of packing them."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class PlainStrategy(ExecutionStrategy):
    """MLX op by op, as mlx-lm runs the model: nothing installed."""


class CpuStrategy(ExecutionStrategy):
    """MLX's CPU backend: the NumPy step, ``W @ x`` products, CPU prefill forms, fused projections.

    Only our llama-family layers get all of these (``llama.py``, also as a distributed
    rank's share); mlx-lm's own model classes (gemma3, phi3) get the ``W @ x`` products,
    Gemma 3 its own NumPy step (``cpu_step_gemma.py``), and otherwise run as mlx-lm runs them.
    """

    name = "cpu"
    float32_cache = True  # only float32 reaches BLAS here, and reading it beats widening again

    def __init__(self, fuse: bool = True, numpy_step: bool = True) -> None:
        """Args:
            fuse: put q/k/v and gate/up in one buffer each (default True; tests compare
                with separate weights).
            numpy_step: one-token steps through NumPy where it applies (default True;
                False leaves them on MLX with ``W @ x``: tests, ``benchmarks/decode_overhead.py``)."""
        self.fuse, self.numpy_step = fuse, numpy_step
        #: One-token steps that ran in NumPy (tests check the engine's decode took it).
        self.numpy_steps = 0

    def fused_groups(self, model: nn.Module) -> list[tuple[str, ...]]:
        if not (self.fuse and isinstance(model, llama.Model)):
            return []
        out = []
        for i in range(len(model.model.layers)):
            at, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
            out += [(f"{at}.q_proj", f"{at}.k_proj", f"{at}.v_proj"), (f"{mlp}.gate_proj", f"{mlp}.up_proj")]
        return out

    def widen(self, model: nn.Module, dtype: mx.Dtype) -> dict[str, mx.array]:
        """On all cores, quantized layers dequantized straight to ``dtype``, and (float32)
        q/k/v and gate/up widened straight into their fused buffers (``widen.py``)."""
        groups = self.fused_groups(model) if dtype == mx.float32 else []
        return widening.widen(model, dtype, groups=groups)

    def install(self, model: nn.Module) -> None:
        modules = [m for _, m in model.named_modules()]
        if not any(isinstance(m, llama.TransformerBlock) for m in modules):
            _matvec_layers(modules)  # mlx-lm's classes (gemma3, phi3): their products only
            if cpu_step_gemma.applies(model):
                _route_calls(model)  # its one-token steps through forward: the NumPy step
            return
        if self.fuse and isinstance(model, llama.Model):
            fuse_projections(model)  # what the NumPy step reads in fewer products
        for m in modules:
            if isinstance(m, (llama.Attention, llama.MLP)):
                for child in m.children().values():
                    if type(child) is nn.Linear:
                        child.__class__ = MatvecLinear
                if type(m) is llama.MLP:
                    m.__class__ = PrefillMLP
            elif type(m) is llama.LlamaModel and type(m.get("embed_tokens")) is nn.Embedding:
                m.embed_tokens.__class__ = MatvecEmbedding
            elif type(m) is llama.Model and type(m.get("lm_head")) is nn.Linear:
                m.lm_head.__class__ = MatvecLinear
        _route_calls(model)

    def forward(self, model: nn.Module, inputs: mx.array, cache: Optional[list]) -> mx.array:
        if cache is not None and inputs.shape == (1, 1) and self.numpy_step:
            step = cpu_step if isinstance(model, llama.Model) else cpu_step_gemma if cpu_step_gemma.applies(model) else None
            logits = step.run(model, inputs, cache) if step is not None else None  # None: on MLX
            if logits is not None:
                self.numpy_steps += 1
                return logits
        token = prefill_ops.forms_on.set(True)  # the caches' attention reads it (prefill_ops.attention)
        try:
            return _plain_call(model, inputs, cache)
        finally:
            prefill_ops.forms_on.reset(token)

    def takes(self, model: nn.Module, cache: Sequence[Any]) -> bool:
        if not self.numpy_step:
            return False
        if isinstance(model, llama.Model):
            return cpu_step.takes(model, cache)
        return cpu_step_gemma.applies(model) and cpu_step_gemma.takes(model, cache)


class GpuStrategy(ExecutionStrategy):
    """Metal and CUDA: a one-token step (L == 1) through compiled pieces.

    Only attention over the cache, whose context grows each token, runs op by op;
    everything between two attentions (output projection, residual, norm, MLP,
    residual, the next layer's norm and q/k/v) is one compiled call, so ~60 small ops
    per layer cost one dispatch from Python and their elementwise work is fused. On
    this CPU they cut graph building per token (6.3 -> 5.5 ms) but not the step (16.2
    vs 17.6 tok/s, benchmarks/RESULTS.md "Issue 12"), where the BLAS calls dominate.
    """

    name = "gpu"

    def __init__(self) -> None:
        self._pieces: Optional[list] = None

    @property
    def compiled(self) -> bool:
        """Whether the pieces were built (a one-token step ran through them)."""
        return self._pieces is not None

    def install(self, model: nn.Module) -> None:
        if isinstance(model, llama.Model):
            self._pieces = None
            _route_calls(model)

    def forward(self, model: nn.Module, inputs: mx.array, cache: Optional[list]) -> mx.array:
        if cache is None or inputs.shape[1] != 1 or cache[0] is None:
            return _plain_call(model, inputs, cache)
        inner = model.model
        h = inner.embed_tokens(inputs)
        mask = create_attention_mask(h, cache[0])
        pieces = self._compiled(inner)
        q, k, v = pieces[0](h)
        last = len(inner.layers) - 1
        for i, (layer, c) in enumerate(zip(inner.layers, cache)):
            attn = layer.self_attn.attend(q, k, v, mask=mask, cache=c)
            if i < last:
                h, q, k, v = pieces[i + 1](h, attn)
            else:
                h = pieces[-1](h, attn)
        return model.logits(h)

    def _compiled(self, inner: llama.LlamaModel) -> list:
        # Built on first use, after the loader converted the weights. The modules are
        # implicit inputs (``inputs=``, read at each call), so a later ``update`` of the
        # weights is seen, not frozen into the compiled graph.
        if self._pieces is None:
            layers, norm = inner.layers, inner.norm

            def begin(layer: llama.TransformerBlock, x: mx.array) -> tuple:
                return layer.self_attn.project(layer.input_layernorm(x))

            def end(layer: llama.TransformerBlock, x: mx.array, attn: mx.array) -> mx.array:
                h = x + layer.self_attn.output(attn)
                return h + layer.mlp(layer.post_attention_layernorm(h))

            def between(i: int):
                def step(x, attn):
                    h = end(layers[i], x, attn)
                    return (h, *begin(layers[i + 1], h))
                return mx.compile(step, inputs=[layers[i], layers[i + 1]])

            self._pieces = (
                [mx.compile(lambda x: begin(layers[0], x), inputs=[layers[0]])]
                + [between(i) for i in range(len(layers) - 1)]
                + [mx.compile(lambda x, attn: norm(end(layers[-1], x, attn)), inputs=[layers[-1], norm])]
            )
        return self._pieces


_STRATEGIES = {"cpu": CpuStrategy, "gpu": GpuStrategy, "plain": PlainStrategy}


def choose_strategy(device: Any = None, override: Optional[str] = None) -> ExecutionStrategy:
    """A fresh strategy for one model.

    Args:
        device: an ``mx.Device`` (default: MLX's default device).
        override: ``cpu | gpu | plain`` (default: ``MLOTSPARK_EXECUTION``, else from the device).

    Returns:
        ``CpuStrategy`` on the CPU backend, ``GpuStrategy`` on a GPU, unless overridden.

    Raises:
        OptionError: an unknown strategy name.
    """
    name = override or os.environ.get(ENV) or None
    if name is None:
        device = device or mx.default_device()
        name = "cpu" if device.type == mx.DeviceType.cpu else "gpu"
    if name not in _STRATEGIES:
        raise OptionError(f"execution strategy {name!r} is not one of {', '.join(_STRATEGIES)} ({ENV})",
                          options=("execution",))
    return _STRATEGIES[name]()


def prepare(model: nn.Module, strategy: Union[ExecutionStrategy, str, None] = None) -> ExecutionStrategy:
    """Install a strategy on ``model`` (the loader does, once; a test may again).

    Whatever an earlier ``prepare`` swapped is undone first (fused weights stay fused:
    the same values).

    Args:
        model: a loaded model (ours or mlx-lm's).
        strategy: an instance, a name, or None for ``choose_strategy()``.

    Returns:
        The installed strategy (also ``strategy_of(model)``).
    """
    if not isinstance(strategy, ExecutionStrategy):
        strategy = choose_strategy(override=strategy)
    _restore(model)
    strategy.install(model)
    object.__setattr__(model, "_execution", strategy)  # not a parameter of the model
    return strategy


def strategy_of(model: Any) -> ExecutionStrategy:
    """The strategy ``prepare`` installed on ``model``; a plain one if none was."""
    found = getattr(model, "__dict__", {}).get("_execution")
    return found if found is not None else _PLAIN


_PLAIN = PlainStrategy()


class PrefillMLP(llama.MLP):
    """The gated MLP with ``silu(g) * u`` as ``prefill_ops.silu_mul`` for many tokens
    (``exp`` as a vectorised polynomial); one-token steps keep ``nn.silu``, so decode
    is unchanged."""

    def __call__(self, x: mx.array) -> mx.array:
        g, u = self.gate_proj(x), self.up_proj(x)
        if x.shape[-2] > 1 and prefill_ops.use_cpu_prefill_ops():
            return self.down_proj(prefill_ops.silu_mul(g, u))
        return self.down_proj(nn.silu(g) * u)


def fuse_projections(model: llama.Model) -> int:
    """Put each layer's q/k/v weights, and its gate/up weights, in one buffer each, the
    modules keeping row views of it (same values, same memory once the old arrays go).

    Why: a one-token step on the CPU (``cpu_step.py``) then reads each group with one
    sgemv instead of three or two, and rotates q and k in one pass: fewer NumPy calls
    per token, which is the step's host overhead. MLX's own paths see the same
    weights. Only groups of dense float32 ``Linear`` weights are fused (what that
    step runs); anything else is left as it is, and so is a group that already lies back
    to back in one buffer (the loader widened or read it so).

    Returns:
        How many groups were fused.
    """
    fused = 0
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        for group in ((at.q_proj, at.k_proj, at.v_proj), (mlp.gate_proj, mlp.up_proj)):
            if not all(type(m) in (nn.Linear, MatvecLinear) and m.weight.dtype == mx.float32 for m in group):
                continue
            if len({m.weight.shape[1] for m in group}) != 1 or cpu_step.one_buffer([m.weight for m in group]):
                continue
            whole = mx.concatenate([m.weight for m in group])
            mx.eval(whole)
            start = 0
            for m in group:
                rows = m.weight.shape[0]
                m.weight = whole[start:start + rows]  # a view: MLX slices share the buffer
                start += rows
            mx.eval([m.weight for m in group])
            fused += 1
    if fused:
        mx.clear_cache()  # the separate arrays' memory back to the system, not MLX's cache
    return fused


def _matvec_layers(modules: Sequence[nn.Module]) -> None:
    """Give the dense float32 ``nn.Linear``/``nn.Embedding`` layers of a model that is not
    ours their one-token ``W @ x`` form (``matvec.py``): Gemma 3 270M's tied 262144x640
    output layer (671 MB of its 1,072) otherwise takes OpenBLAS's packed GEMM at a third of
    the bandwidth every token. Quantized layers are other classes and stay as they are."""
    for m in modules:
        if type(m) is nn.Linear and m.weight.dtype == mx.float32:
            m.__class__ = MatvecLinear
        elif type(m) is nn.Embedding and m.weight.dtype == mx.float32:
            m.__class__ = MatvecEmbedding


# ------------------------------------------------------------ class swaps
#: Swapped layer class -> the class it replaced (``_restore``).
_SWAPPED = {MatvecLinear: nn.Linear, MatvecEmbedding: nn.Embedding, PrefillMLP: llama.MLP}
_ROUTED: dict[type, type] = {}  # model class -> its subclass whose __call__ asks the strategy


def _route_calls(model: nn.Module) -> None:
    """Make ``model(inputs, cache)`` call its strategy's ``forward``: a subclass of the
    model's class, same name, only ``__call__`` differs (Python looks ``__call__`` up on
    the class, so an instance attribute would not do)."""
    cls = type(model)
    routed = _ROUTED.get(cls)
    if routed is None:
        def __call__(self, inputs: mx.array, cache: Optional[list] = None) -> mx.array:
            return self.__dict__["_execution"].forward(self, inputs, cache)

        routed = type(cls.__name__, (cls,), {"__call__": __call__, "plain_class": cls, "__doc__": cls.__doc__,
                                             "__module__": cls.__module__, "__qualname__": cls.__qualname__})
        _ROUTED[cls] = routed
    model.__class__ = routed


def _plain_call(model: nn.Module, inputs: mx.array, cache: Optional[list]) -> mx.array:
    """The model's own forward (its class's ``__call__``, not the routed one)."""
    return type(model).__dict__.get("plain_class", type(model)).__call__(model, inputs, cache)


def _restore(model: nn.Module) -> None:
    """Undo the class swaps of an earlier ``prepare``."""
    plain = type(model).__dict__.get("plain_class")
    if plain is not None:
        model.__class__ = plain
    for _, m in model.named_modules():
        if type(m) in _SWAPPED:
            m.__class__ = _SWAPPED[type(m)]
