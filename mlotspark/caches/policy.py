"""``cache_kind="auto"``: the KV cache kind that fits a byte budget, keeps quality, and
runs fastest.

1. Kinds whose KV for the request's tokens exceeds the budget are dropped.
2. Quality gates on a probe passage, against float16 KV: mean ΔNLL of the next
   token and mean KL(p_float16 || p_kind) over the passage's positions.
3. Of the survivors, the fastest decode step wins; kinds within ``tie`` of the
   fastest count as equally fast and the more precise one is taken.

The probe (quality and speed of every kind) runs once per model, weight format and
device, and is stored in ``$MLOTSPARK_HOME/decoding/cache_kinds.json`` keyed by the
model fingerprint; later decisions only redo step 1 and 3 from it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import mlx.core as mx

from mlotspark import steps, storage
from mlotspark.errors import OptionError, StoreError
from mlotspark.caches.kinds import KINDS, kv_bytes, make_cache, runnable_kinds
from mlotspark.models.execution import runner_for

log = logging.getLogger(__name__)

__all__ = [
    "QualityGate",
    "KindProbe",
    "CacheDecision",
    "PROBE_TEXT",
    "PLAIN",
    "probe_cache_kinds",
    "choose_cache_kind",
    "decide_cache_kind",
    "request_cache",
]

#: A passage with names, numbers and repeats, so quantized keys have something to lose.
PROBE_TEXT = (
    "The harbour master's log, 14 March: the Aurora left berth 7 at 06:40 with 212 "
    "passengers and a cargo of timber, bound for Bergen. Wind from the south-west, "
    "force 5, rising. At 09:15 the Aurora reported a fault in her port engine and "
    "asked for a tug; the tug Halvard left at 09:32. By noon both ships were back at "
    "berth 7. The passengers were moved to the Stella, which sailed for Bergen at "
    "14:05, two hours late. Cause of the fault: a cracked fuel line, replaced the same "
    "day. The Aurora sailed again on 15 March at 06:40, on time, with 198 passengers."
)
#: ``CacheDecision.kind`` when no kind of ``KINDS`` can run: the model's own cache.
PLAIN = "plain"
_STORE = "cache_kinds.json"
_FORMAT = 1


@dataclass(frozen=True)
class QualityGate:
    """Largest quality loss a cache kind may show against float16 on the probe.

    Args:
        max_delta_nll: mean increase of the next-token NLL, nats (default 0.05).
        max_kl: mean KL(p_float16 || p_kind) of next-token distributions, nats (default 0.05).
    """

    max_delta_nll: float = 0.05
    max_kl: float = 0.05


@dataclass
class KindProbe:
    """What the probe measured for one kind."""

    kind: str
    delta_nll: float  # mean next-token NLL minus float16's, nats
    kl: float  # mean KL(p_float16 || p_kind), nats
    step_s: float  # median seconds of one decode step on the probe context


@dataclass
class CacheDecision:
    """The outcome of ``cache_kind="auto"`` for one budget."""

    kind: str
    budget_bytes: int
    tokens: int
    needed_bytes: dict[str, int]
    probes: dict[str, KindProbe]
    reason: str
    rejected: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def probe_cache_kinds(
    model: Any,
    probe_ids: list[int],
    kinds: tuple[str, ...] = KINDS,
    *,
    decode_steps: int = 6,
    clock: Callable[[], float] = time.perf_counter,
    on_kind: Callable[[str], None] | None = None,
) -> dict[str, KindProbe]:
    """Quality (vs float16) and decode-step time of each cache kind on ``probe_ids``.

    Args:
        model: the model's runner (or a bare model: run plainly); llama family for float16.
        probe_ids: probe tokens (a few hundred).
        kinds: kinds to probe; float16 is run as the reference (the model's own
            cache when float16 is not among them).
        decode_steps: timed one-token steps after the probe (median taken).
        clock: seconds (tests may pass a fake one).
        on_kind: called with each kind of ``kinds`` once it is probed (progress).
    """
    if len(probe_ids) < 8:
        raise OptionError(f"invalid probe of {len(probe_ids)} tokens: need at least 8")
    model = runner_for(model)  # each step as the engine runs it
    tokens = mx.array(probe_ids)[None]  # (1, T)
    targets = mx.array(probe_ids[1:])  # (T - 1,)
    skip = min(4, len(probe_ids) // 4)  # the first positions say little about the cache
    results: dict[str, KindProbe] = {}
    ref_logprobs = None
    # The reference: float16 KV, or the model's own cache where float16 cannot run.
    ref = "float16" if "float16" in kinds else None
    for kind in (ref,) + tuple(k for k in kinds if k != "float16"):
        cache = make_cache(model, kind)
        logits = model(tokens, cache=cache)[0, :-1].astype(mx.float32)  # (T - 1, V)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        nll = -mx.take_along_axis(logprobs, targets[:, None], axis=-1)[skip:, 0].mean()
        if ref_logprobs is None:
            ref_logprobs, ref_nll = logprobs, nll
        p_ref = mx.exp(ref_logprobs[skip:])
        kl = (p_ref * (ref_logprobs[skip:] - logprobs[skip:])).sum(axis=-1).mean()
        times = []
        y = mx.array([[probe_ids[-1]]])
        for _ in range(decode_steps):
            t0 = clock()
            out = model(y, cache=cache)
            y = mx.argmax(out[:, -1, :], axis=-1)[:, None]
            mx.eval(y)
            times.append(clock() - t0)
        times.sort()
        d_nll, kl_v = (nll - ref_nll).item(), max(kl.item(), 0.0)
        if kind is not None:
            results[kind] = KindProbe(kind, round(d_nll, 6), round(kl_v, 6), times[len(times) // 2])
            if on_kind is not None:
                on_kind(kind)
    return {k: results[k] for k in kinds if k in results}


def choose_cache_kind(
    probes: dict[str, KindProbe],
    needed_bytes: dict[str, int],
    budget_bytes: int,
    tokens: int,
    *,
    gate: QualityGate = QualityGate(),
    tie: float = 0.10,
) -> CacheDecision:
    """Pick a kind from probe results (a pure function: budget, gates, speed).

    Args:
        probes: ``probe_cache_kinds`` results.
        needed_bytes: KV bytes each kind needs for ``tokens``.
        budget_bytes: bytes the KV may take.
        tokens: tokens of context the request needs (for the message).
        gate: quality thresholds.
        tie: step times within this fraction of the fastest count as equal.

    Raises:
        OptionError: no kind fits the budget, or none that fits passes the gates.
    """
    mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
    rejected: dict[str, str] = {}
    fits = [k for k in KINDS if k in probes and needed_bytes[k] <= budget_bytes]
    for k in KINDS:
        if k in probes and k not in fits:
            rejected[k] = f"needs {mb(needed_bytes[k])} > budget {mb(budget_bytes)}"
    if not fits:
        needs = ", ".join(f"{k} {mb(needed_bytes[k])}" for k in KINDS if k in needed_bytes)
        raise OptionError(
            f"invalid cache_kind 'auto': no KV cache kind fits the budget of {mb(budget_bytes)} "
            f"for {tokens} tokens (needed: {needs}); raise the memory limit or lower max_tokens"
        )
    good = []
    for k in fits:
        p = probes[k]
        if p.delta_nll > gate.max_delta_nll or p.kl > gate.max_kl:
            rejected[k] = (f"fails the quality gate: dNLL {p.delta_nll:.4f} (max {gate.max_delta_nll}), "
                           f"KL {p.kl:.4f} (max {gate.max_kl})")
        else:
            good.append(k)
    if not good:
        why = "; ".join(f"{k} {rejected[k]}" for k in fits)
        raise OptionError(f"invalid cache_kind 'auto': within the budget of {mb(budget_bytes)} for "
                          f"{tokens} tokens, no kind keeps quality ({why})")
    fastest = min(probes[k].step_s for k in good)
    kind = next(k for k in good if probes[k].step_s <= fastest * (1 + tie))  # KINDS: most precise first
    reason = (f"{kind}: fits ({mb(needed_bytes[kind])} of {mb(budget_bytes)}), passes the gates, "
              f"step {probes[kind].step_s * 1000:.1f} ms (fastest {fastest * 1000:.1f} ms)")
    return CacheDecision(kind, budget_bytes, tokens, dict(needed_bytes), dict(probes), reason, rejected)


def _store_key(fingerprint: str, weights: str, device: str) -> tuple[str, str]:
    return fingerprint, f"{weights}@{device}"


def load_probes(fingerprint: str, setup: str) -> dict[str, KindProbe] | None:
    """Stored probe results for a model fingerprint and ``weights@device``, or None."""
    try:
        doc = storage.read_json(storage.subdir("decoding") / _STORE, default=None)
    except StoreError as e:  # a damaged file is a cache miss: probe again and rewrite it
        log.warning("cache probes not used: %s", e)
        return None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        return None
    try:
        entry = doc.get("models", {}).get(fingerprint, {}).get(setup)
        return {k: KindProbe(**v) for k, v in entry["probes"].items()} if entry else None
    except (TypeError, KeyError, AttributeError):
        return None  # an entry of another layout: probe again


def save_probes(fingerprint: str, setup: str, probes: dict[str, KindProbe], decision: CacheDecision | None) -> None:
    """Store probe results (and the latest decision) atomically; a store that cannot be
    written (read-only or full disk) only costs probing again next time."""
    try:
        _save_probes(fingerprint, setup, probes, decision)
    except StoreError as e:
        log.warning("cache probes not saved: %s", e)


def _save_probes(fingerprint: str, setup: str, probes: dict[str, KindProbe], decision: CacheDecision | None) -> None:
    path = storage.subdir("decoding") / _STORE
    with storage.FileLock(path.with_suffix(".lock")):
        try:
            doc = storage.read_json(path, default=None)
        except StoreError:
            doc = None  # damaged: rewritten whole
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            doc = {"format": _FORMAT, "models": {}}
        entry = doc["models"].setdefault(fingerprint, {}).setdefault(setup, {})
        entry["probes"] = {k: asdict(v) for k, v in probes.items()}
        entry["probed_at"] = entry.get("probed_at") or time.strftime("%Y-%m-%dT%H:%M:%S")
        if decision is not None:
            entry["last_decision"] = {"kind": decision.kind, "budget_bytes": decision.budget_bytes,
                                      "tokens": decision.tokens, "reason": decision.reason}
        storage.write_json(path, doc)


def decide_cache_kind(
    model: Any,
    tokenizer: Any,
    *,
    fingerprint: str,
    setup: str,
    budget_bytes: int,
    tokens: int,
    gate: QualityGate = QualityGate(),
    probe_ids: list[int] | None = None,
) -> CacheDecision:
    """``cache_kind="auto"`` for one model: probe once (stored), then choose.

    Args:
        model, tokenizer: the loaded model's runner (or the bare model) and tokenizer.
        fingerprint: the model's fingerprint (``LoadedModel.fingerprint``).
        setup: what else the probe depends on, e.g. ``"float32@cpu"``.
        budget_bytes: bytes the KV cache may take.
        tokens: context tokens the request needs.
        gate: quality thresholds.
        probe_ids: probe tokens (default: ``PROBE_TEXT`` encoded).

    Raises:
        OptionError: nothing fits or keeps quality (see ``choose_cache_kind``).
    """
    runner = runner_for(model)
    model = runner.model
    kinds, unavailable = runnable_kinds(model)
    if not kinds:  # nothing to choose from: the model's own cache, said in the reason
        why = "; ".join(f"{k}: {r}" for k, r in unavailable.items())
        return CacheDecision(PLAIN, budget_bytes, tokens, {}, {}, f"{PLAIN}: no other kind runs here ({why})",
                             dict(unavailable))
    needed = {k: kv_bytes(model, k, tokens) for k in kinds}
    probes = load_probes(fingerprint, setup)
    fresh = probes is None or not set(kinds) <= set(probes)
    if fresh:
        ids = probe_ids or list(tokenizer.encode(PROBE_TEXT))
        # Seconds on a big model, once per model and device: never silent.
        with steps.step(f"choosing the KV cache kind: probing {', '.join(kinds)} (once for this model)",
                        len(kinds), "kinds") as s:
            probes = probe_cache_kinds(runner, ids, kinds, on_kind=lambda _k: s.advance())
    probes = {k: p for k, p in probes.items() if k in kinds}
    try:
        decision = choose_cache_kind(probes, needed, budget_bytes, tokens, gate=gate)
    except OptionError:
        if fresh:
            save_probes(fingerprint, setup, probes, None)
        raise
    save_probes(fingerprint, setup, probes, decision)
    if unavailable:
        decision.rejected.update(unavailable)
        decision.reason += "; " + "; ".join(f"{k} cannot run: {r}" for k, r in unavailable.items())
    return decision


def kv_budget(memory_limit: int | None, weights_bytes: int) -> int:
    """Bytes the KV of one request may take (``platform.memory.memory_budget``):
    ``memory_limit`` less the weights; on Metal the recommended working set less the
    weights; elsewhere half the memory available now (the weights, resident, are
    already out of it: not subtracted twice)."""
    from mlotspark.platform.memory import memory_budget

    return memory_budget(weights_bytes, memory_limit).kv_bytes


def request_cache(
    loaded: Any, options: Any, prompt_tokens: int, *, device: str, budget_bytes: int,
    run: Callable[..., Any] | None = None,
) -> tuple[list, CacheDecision | None]:
    """A fresh cache for a request of ``loaded`` (a ``LoadedModel``) with ``options.cache_kind``.

    Args:
        loaded: the model, its tokenizer, fingerprint and weight format.
        options: the request's options (``cache_kind``, ``max_tokens``).
        prompt_tokens: tokens of the prompt (cached ones included).
        device: where it runs (part of the probe's key: ``device_info()["device"]``).
        budget_bytes: what one request's KV may take (``kv_budget``).
        run: runs the decision's MLX work on the engine thread (``engine.scheduler.call``);
            None calls it here.

    Returns:
        The per-layer cache, and the ``auto`` decision (None for a kind asked for by name).

    Raises:
        OptionError: ``auto`` with nothing that fits the budget and keeps quality.
    """
    kind = options.cache_kind
    if kind != "auto":
        return make_cache(loaded.runner, kind), None
    tokens = min(prompt_tokens + options.max_tokens, loaded.context_length)
    decision = (run or _call)(
        decide_cache_kind, loaded.runner, loaded.tokenizer, fingerprint=loaded.fingerprint,
        setup=f"{loaded.weights}@{device}", budget_bytes=budget_bytes, tokens=tokens,
    )
    return make_cache(loaded.runner, None if decision.kind == PLAIN else decision.kind), decision


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)
