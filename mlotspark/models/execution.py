"""How a loaded model's steps run on this machine: one runner per model, built once at load.

``llama.py`` is the architecture as mlx-lm writes it. How its steps run here is a
``Runner``, chosen from the device when the model is loaded (``choose_runner``) and bound
to it (``prepare``). The runtime, beams, speculative decoding, distributed ranks and
mlx-lm's ``generate_step`` (which calls what it is given as ``model(tokens, cache=...)``)
call the runner, never the model:

- ``forward(tokens, caches)``: logits (B, L, V) of any step;
- ``step(token, caches)``: one token of one sequence, where a runner may leave MLX;
- ``takes(caches)`` / ``prefers_unpacked(rows)``: what the batcher asks before packing rows;
- ``attention``: the attention function the caches made for this runner get
  (``make_cache``, ``adopt``), so no cache reads global or context state to choose it.

The runners:

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

Before that, the loader asks the runner to widen the weights when the format in use is
wider than what is stored (``Runner.widen``): plainly, as mlx-lm does, except on the CPU
runner, which spreads the casts over the cores and widens q/k/v and gate/up straight into
their fused buffers (``cpu/widen.py``), and whose GGUF loads keep a float32 copy of the
widened weights to read next time (``float32_cache``, ``models/formats/float32_cache.py``).

Binding (``prepare``) happens once, at load: the model object keeps its class; the CPU
runner swaps its weight-bearing layers (``nn.Linear``/``nn.Embedding``/``MLP``) for
``MatvecLinear``/``MatvecEmbedding``/``PrefillMLP``, subclasses with the same parameters.

``MLOTSPARK_EXECUTION=cpu|gpu|plain`` (or ``prepare(model, "gpu")`` in a test) forces a
runner on any device: the GPU one runs on the CPU too, only without its speed-up there.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence, Union

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.utils import dequantize_model

from mlotspark.errors import OptionError
from mlotspark.models import llama
from mlotspark.models.cpu import cpu_step, cpu_step_gemma, prefill_ops, widen as widening
from mlotspark.caches.kv import give_attention
from mlotspark.models.cpu.matvec import MatvecEmbedding, MatvecLinear

#: Environment variable that forces a runner for every model loaded (tests, benchmarks).
ENV = "MLOTSPARK_EXECUTION"

__all__ = ["ENV", "CpuRunner", "GpuRunner", "PlainRunner", "PrefillMLP", "Runner", "choose_runner",
           "fuse_projections", "prepare", "runner_for"]


class Runner:
    """How one model's steps run: the runtime calls it instead of the model.

    Built unbound (the loader asks it to widen the weights first), then bound to its model
    once by ``prepare``. Subclasses override ``install`` (at load), ``forward``/``step``
    (each call) and ``takes`` (what the batcher asks).
    """

    #: ``cpu | gpu | plain``: what ``choose_runner`` and ``MLOTSPARK_EXECUTION`` call it.
    name = "plain"
    #: Whether a float32 load of a GGUF keeps the widened weights on disk and reads them
    #: next time (``models/formats/float32_cache.py``) instead of widening again.
    float32_cache = False
    #: The attention function (``prefill_ops.attention``'s signature) the caches made for
    #: this runner get: MLX's own here.
    attention: Callable[..., mx.array] = staticmethod(prefill_ops.attention)

    def __init__(self) -> None:
        #: The bound model (None until ``prepare``).
        self.model: Any = None

    # ----------------------------------------------------------- at load
    def fused_groups(self, model: nn.Module) -> list[tuple[str, ...]]:
        """Module paths of sibling layers whose weights this runner keeps as row views of
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
        """Bind ``model`` and arrange its weight-bearing layers for this runner (once, at load)."""
        self.model = model

    # ----------------------------------------------------------- each step
    def forward(self, tokens: mx.array, caches: Optional[Sequence[Any]] = None) -> mx.array:
        """Logits (B, L, V) of ``tokens`` (B, L) over ``caches`` (one per layer, or None)."""
        if caches is not None and tokens.shape == (1, 1):
            return self.step(tokens, caches)
        return self.model(tokens, caches)

    def step(self, token: mx.array, caches: Sequence[Any]) -> mx.array:
        """Logits (1, 1, V) of one token (1, 1) of one sequence over its ``caches``."""
        return self.model(token, caches)

    def __call__(self, inputs: mx.array, cache: Optional[Sequence[Any]] = None) -> mx.array:
        """``forward`` with a model's call signature: what mlx-lm's ``generate_step`` calls."""
        return self.forward(inputs, cache)

    # ----------------------------------------------------------- what others ask
    @property
    def layers(self) -> list:
        """The model's layers (mlx-lm's ``make_prompt_cache`` counts them)."""
        return self.model.layers

    @property
    def reduce_scores(self) -> Optional[Callable[[mx.array], mx.array]]:
        """The model's ``ScoreReducer`` when it is split across ranks, else None."""
        return getattr(self.model, "reduce_scores", None)

    def make_cache(self) -> list:
        """The model's own per-layer caches, with this runner's attention."""
        if hasattr(self.model, "make_cache"):  # as mlx-lm's make_prompt_cache: phi3 has none
            caches = self.model.make_cache()
        else:
            from mlotspark.caches.kv import KVCache

            caches = [KVCache() for _ in self.model.layers]
        return self.adopt(caches)

    def adopt(self, caches: Sequence[Any]) -> list:
        """Give ``caches`` made elsewhere (restored from a snapshot or a prefix cache) this
        runner's attention; mlx-lm's own cache classes have none to take. Returns them."""
        return give_attention(caches, self.attention)

    def takes(self, caches: Sequence[Any]) -> bool:
        """Whether a one-token step of one sequence over ``caches`` leaves MLX (the NumPy step)."""
        return False

    def prefers_unpacked(self, rows: Sequence[Sequence[Any]]) -> bool:
        """Whether these rows (each a sequence's caches, all plain KV) decode faster one by
        one through ``step`` than packed into one batched forward."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class PlainRunner(Runner):
    """MLX op by op, as mlx-lm runs the model: nothing installed."""


class CpuRunner(Runner):
    """MLX's CPU backend: the NumPy step, ``W @ x`` products, CPU prefill forms, fused projections.

    Only our llama-family layers get all of these (``llama.py``, also as a distributed
    rank's share); mlx-lm's own model classes (gemma3, phi3) get the ``W @ x`` products,
    Gemma 3 its own NumPy step (``cpu_step_gemma.py``), and otherwise run as mlx-lm runs them.
    """

    name = "cpu"
    float32_cache = True  # only float32 reaches BLAS here, and reading it beats widening again
    attention = staticmethod(prefill_ops.cpu_attention)
    #: A row stepped on its own runs through NumPy, ~2x mlx-lm's decode; packed rows stay on
    #: MLX. Packing pays only from this many rows: two packed rows gave 0.71x the tokens/s of
    #: one NumPy row, four 1.22x (measured, batched decode).
    PACK_FROM = 4

    def __init__(self, fuse: bool = True, numpy_step: bool = True) -> None:
        """Args:
            fuse: put q/k/v and gate/up in one buffer each (default True; tests compare
                with separate weights).
            numpy_step: one-token steps through NumPy where it applies (default True;
                False leaves them on MLX with ``W @ x``: tests, ``benchmarks/decode_overhead.py``)."""
        super().__init__()
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
        super().install(model)
        modules = [m for _, m in model.named_modules()]
        if not any(isinstance(m, llama.TransformerBlock) for m in modules):
            _matvec_layers(modules)  # mlx-lm's classes (gemma3, phi3): their products only
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

    def _numpy(self) -> Any:
        """The NumPy step module for the bound model, or None (it runs on MLX)."""
        if not self.numpy_step:
            return None
        if isinstance(self.model, llama.Model):
            return cpu_step
        return cpu_step_gemma if cpu_step_gemma.applies(self.model) else None

    def step(self, token: mx.array, caches: Sequence[Any]) -> mx.array:
        numpy = self._numpy()
        logits = numpy.run(self.model, token, caches) if numpy is not None else None  # None: on MLX
        if logits is None:
            return self.model(token, caches)
        self.numpy_steps += 1
        return logits

    def takes(self, caches: Sequence[Any]) -> bool:
        numpy = self._numpy()
        return numpy is not None and numpy.takes(self.model, caches)

    def prefers_unpacked(self, rows: Sequence[Sequence[Any]]) -> bool:
        return len(rows) < self.PACK_FROM and all(self.takes(c) for c in rows)


class GpuRunner(Runner):
    """Metal and CUDA: a one-token step (L == 1) through compiled pieces.

    Only attention over the cache, whose context grows each token, runs op by op;
    everything between two attentions (output projection, residual, norm, MLP,
    residual, the next layer's norm and q/k/v) is one compiled call, so ~60 small ops
    per layer cost one dispatch from Python and their elementwise work is fused. On
    this CPU they cut graph building per token (6.3 -> 5.5 ms) but not the step (16.2
    vs 17.6 tok/s, measured), where the BLAS calls dominate.
    """

    name = "gpu"

    def __init__(self) -> None:
        super().__init__()
        self._pieces: Optional[list] = None

    @property
    def compiled(self) -> bool:
        """Whether the pieces were built (a one-token step ran through them)."""
        return self._pieces is not None

    def install(self, model: nn.Module) -> None:
        super().install(model)
        self._pieces = None

    def forward(self, tokens: mx.array, caches: Optional[Sequence[Any]] = None) -> mx.array:
        model = self.model
        if not isinstance(model, llama.Model) or caches is None or tokens.shape[1] != 1 or caches[0] is None:
            return model(tokens, caches)
        inner = model.model
        h = inner.embed_tokens(tokens)
        mask = create_attention_mask(h, caches[0])
        pieces = self._compiled(inner)
        q, k, v = pieces[0](h)
        last = len(inner.layers) - 1
        for i, (layer, c) in enumerate(zip(inner.layers, caches)):
            attn = layer.self_attn.attend(q, k, v, mask=mask, cache=c)
            if i < last:
                h, q, k, v = pieces[i + 1](h, attn)
            else:
                h = pieces[-1](h, attn)
        return model.logits(h)

    def step(self, token: mx.array, caches: Sequence[Any]) -> mx.array:
        return self.forward(token, caches)

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


_RUNNERS = {"cpu": CpuRunner, "gpu": GpuRunner, "plain": PlainRunner}


def choose_runner(device: Any = None, override: Optional[str] = None) -> Runner:
    """A fresh, unbound runner for one model.

    Args:
        device: an ``mx.Device`` (default: MLX's default device).
        override: ``cpu | gpu | plain`` (default: ``MLOTSPARK_EXECUTION``, else from the device).

    Returns:
        ``CpuRunner`` on the CPU backend, ``GpuRunner`` on a GPU, unless overridden.

    Raises:
        OptionError: an unknown runner name.
    """
    name = override or os.environ.get(ENV) or None
    if name is None:
        device = device or mx.default_device()
        name = "cpu" if device.type == mx.DeviceType.cpu else "gpu"
    if name not in _RUNNERS:
        raise OptionError(f"execution strategy {name!r} is not one of {', '.join(_RUNNERS)} ({ENV})",
                          options=("execution",))
    return _RUNNERS[name]()


def prepare(model: nn.Module, runner: Union[Runner, str, None] = None) -> Runner:
    """Bind a runner to ``model`` (the loader does, once; a test may again).

    Whatever an earlier ``prepare`` swapped is undone first (fused weights stay fused:
    the same values).

    Args:
        model: a loaded model (ours or mlx-lm's).
        runner: an unbound instance, a name, or None for ``choose_runner()``.

    Returns:
        The bound runner: call it, not the model.
    """
    if not isinstance(runner, Runner):
        runner = choose_runner(override=runner)
    _restore(model)
    runner.install(model)
    return runner


def runner_for(model: Any) -> Runner:
    """``model`` itself when it is a runner, else a plain runner bound to it (a model a test
    built by hand; nothing is swapped)."""
    if isinstance(model, Runner):
        return model
    runner = PlainRunner()
    runner.model = model
    return runner


class PrefillMLP(llama.MLP):
    """The gated MLP with ``silu(g) * u`` as ``prefill_ops.silu_mul`` for many tokens
    (``exp`` as a vectorised polynomial); one-token steps keep ``nn.silu``, so decode
    is unchanged. Only the CPU runner installs it."""

    def __call__(self, x: mx.array) -> mx.array:
        g, u = self.gate_proj(x), self.up_proj(x)
        if x.shape[-2] > 1 and prefill_ops.ENABLED:
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


# ------------------------------------------------------------ layer swaps
#: Swapped layer class -> the class it replaced (``_restore``).
_SWAPPED = {MatvecLinear: nn.Linear, MatvecEmbedding: nn.Embedding, PrefillMLP: llama.MLP}


def _restore(model: nn.Module) -> None:
    """Undo the layer swaps of an earlier ``prepare``."""
    for _, m in model.named_modules():
        if type(m) in _SWAPPED:
            m.__class__ = _SWAPPED[type(m)]
