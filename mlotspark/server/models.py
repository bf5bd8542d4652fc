"""Several models behind one server: which may be served, loading on first use, unloading when idle.

A :class:`ModelPool` holds one :class:`Slot` per model the server may serve: those given at
start (``--model``, repeatable; the first is the default, loaded before the port opens and
kept resident) and those a request names that the operator allowed: a ``.gguf`` file or an
mlx-lm directory inside a folder given with ``--allow-load DIR`` (a request never opens a
path outside those folders), or a catalogue alias (pulled on demand only with
``--allow-pull``). Each slot has its own engine — its own scheduler and KV — and prompt
cache. A slot loads on first use (the request waits; ``/health`` shows it loading, with the
stage and how far it got: the ``mlotspark.steps`` its load reports, such as a pull or a GGUF conversion,
and the seconds since it began), unloads
after ``keep_alive`` seconds idle (-1 = never; the clock is injectable, so tests need not
wait), and at most ``max_models`` are resident, the least recently used idle one making
room. ``"default"`` names the first model.

With a :class:`~mlotspark.server.governance.SharedGovernor` the engines share one memory
budget and one thermal governor: each is loaded with its own share of it, a model that does
not fit first unloads idle models (least recently used first) and is refused with a
one-line error naming the sizes when it still does not.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mlotspark import steps
from mlotspark.errors import MlotsparkError, ModelNotFoundError
from mlotspark.server.governance import SharedGovernor
from mlotspark.server.schemas import APIError

log = logging.getLogger(__name__)

DEFAULT_KEEP_ALIVE_S = 300.0  # as Ollama's default
MODEL_SUFFIXES = (".gguf",)


@dataclass
class Slot:
    """One servable model and, while loaded, its engine and prompt cache.

    It offers what a request's :class:`~mlotspark.server.runner.Job` reads of the server
    (``engine``, ``prompt_cache``).
    """

    name: str  # the id requests use
    spec: str  # what Engine.load is given (an alias or a path)
    pinned: bool = False  # the default model: never unloaded for idleness or room
    engine: Any = None
    prompt_cache: Any = None
    last_used: float = 0.0
    active: int = 0  # requests in flight
    loading: bool = False
    load_started: float = 0.0  # the pool's clock when the load in progress began
    load_steps: dict[str, steps.StepProgress] = field(default_factory=dict)  # its steps running, oldest first
    loads: int = 0
    error: str | None = None
    keep_alive_s: float | None = None  # a request's own keep_alive (Ollama's), else the pool's
    share: Any = None  # its GovernorShare, with a shared governor
    weights_bytes: int = 0  # its weights when last loaded (0: not known yet)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def loaded(self) -> bool:
        return self.engine is not None

    def token_text(self, token: int) -> str:
        """One token's text (for logprobs)."""
        return self.engine.tokenizer.decode([token])

    def load_progress(self, now: float) -> dict | None:
        """Where the load in progress stands (``/health``), None when none is.

        Args:
            now: the pool's clock.

        Returns:
            ``stage`` (the newest step the load runs, e.g. ``converting model.gguf (once)``, or
            ``loading``), ``done``/``total``/``unit`` of that step (0/None/"" without a measure;
            unit ``B``: bytes) and ``elapsed_s`` since the load began.
        """
        if not self.loading:
            return None
        running = list(self.load_steps.values())  # replaced whole on each event: safe to read here
        step = running[-1] if running else steps.StepProgress("loading")
        return {"stage": step.name, "done": step.done, "total": step.total, "unit": step.unit,
                "elapsed_s": round(max(0.0, now - self.load_started), 3)}

    def _stepped(self, event: steps.StepProgress) -> None:
        running = {k: v for k, v in self.load_steps.items() if k != event.name}
        if not event.finished:
            running[event.name] = event
        self.load_steps = running


class ModelPool:
    """The models a server may serve and the ones resident now.

    Args:
        load: ``load(spec) -> Engine`` (``Engine.load`` with the server's settings).
        make_cache: ``make_cache(engine) -> PromptCache | None`` for a newly loaded engine.
        keep_alive_s: unload a model idle this long (-1 = never).
        max_models: most models resident at once.
        allow_load: folders whose model files a request may name.
        allow_pull: catalogue aliases not on disk may be pulled on demand.
        clock: seconds, monotonic (injectable for tests).
        governance: one memory budget and thermal governor for every engine; ``load`` is
            then called as ``load(spec, governor=share)``.
        estimate: ``estimate(spec) -> bytes`` of a model's weights before its first load
            (default: its files' size, a lower bound; the loaded size is checked again).
    """

    def __init__(self, load: Callable[[str], Any], make_cache: Callable[[Any], Any] | None = None, *,
                 keep_alive_s: float = DEFAULT_KEEP_ALIVE_S, max_models: int = 3,
                 allow_load: tuple[Path, ...] = (), allow_pull: bool = False,
                 clock: Callable[[], float] = time.monotonic, governance: SharedGovernor | None = None,
                 estimate: Callable[[str], int] | None = None):
        self.load_fn, self.make_cache = load, make_cache
        self.governance, self.estimate = governance, estimate or stored_bytes
        self._load_lock = threading.Lock()  # one load at a time: room is made for one model at once
        self.keep_alive_s, self.max_models = keep_alive_s, max(1, max_models)
        self.allow_load = tuple(Path(d).expanduser().resolve() for d in allow_load)
        self.allow_pull, self.clock = allow_pull, clock
        self.slots: dict[str, Slot] = {}
        self.default: Slot | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------- what may be served
    def add(self, name: str, spec: str, engine: Any = None, prompt_cache: Any = None, share: Any = None) -> Slot:
        """A model given at start (the first is the default, kept resident); ``engine`` when
        it is loaded already (with ``share``, the governor it was loaded with)."""
        slot = Slot(name, spec, pinned=self.default is None, engine=engine, prompt_cache=prompt_cache,
                    last_used=self.clock(), loads=int(engine is not None), share=share)
        if engine is not None and self.governance is not None:
            if slot.share is None:
                slot.share = self.governance.share(name)
            slot.share.name = name
            slot.weights_bytes = int(engine.loaded.nbytes())
            self.governance.settle(slot.share, slot.weights_bytes)
        self.slots[name] = slot
        if self.default is None:
            self.default = slot
        return slot

    def find(self, name: str) -> Slot:
        """The slot a request's ``model`` names (made on first use when allowed).

        Raises:
            APIError: 404 naming the models this server serves.
        """
        if name == "default" and self.default is not None:
            return self.default
        slot = self.slots.get(name) or self.slots.get(name.removesuffix(":latest"))
        if slot is not None:
            return slot
        spec = self._allowed(name)
        if spec is None and name.endswith(":latest"):  # Ollama's clients name a listed alias so
            name = name.removesuffix(":latest")
            spec = self._allowed(name)
        if spec is None:
            raise APIError(404, f"model '{name}' does not exist; this server serves {', '.join(self.servable())}"
                                f"{' or files in ' + ', '.join(map(str, self.allow_load)) if self.allow_load else ''}"
                                f"{' or any catalogue alias (pulled on demand)' if self.allow_pull else ''}",
                           param="model", code="model_not_found")
        with self._lock:
            return self.slots.setdefault(name, Slot(name, spec, last_used=self.clock()))

    def _allowed(self, name: str) -> str | None:
        """What ``Engine.load`` gets for an on-demand ``name``, or None when it is not allowed."""
        from mlotspark.models.hub import catalogue

        if name in catalogue.ALIASES:
            try:
                catalogue.resolve(name, pull=False, progress=False)
                return name
            except ModelNotFoundError:
                return name if self.allow_pull else None
        for root in self.allow_load:
            path = Path(name).expanduser()
            path = (path if path.is_absolute() else root / path).resolve()
            if not path.is_relative_to(root) or not path.exists():
                continue
            if (path.is_file() and path.suffix.lower() in MODEL_SUFFIXES) or (path / "config.json").is_file():
                return str(path)
        return None

    def names(self) -> list[str]:
        return list(self.slots)

    def servable(self) -> list[str]:
        """Model ids to list: those given at start, the model files in the allowed folders,
        then the catalogue aliases on disk (each loads when a request names it), but for one
        a slot already serves from its file."""
        from mlotspark.models.hub import catalogue

        out = self.names()
        files = {_resolved(s.spec) for s in self.slots.values()}  # what is listed already, by path
        for root in self.allow_load:
            for p in sorted(root.iterdir()) if root.is_dir() else []:
                if (p.suffix.lower() in MODEL_SUFFIXES and p.is_file()) or (p / "config.json").is_file():
                    files.add(p.resolve())
                    if p.name not in out:
                        out.append(p.name)
        try:
            rows = [catalogue.model_status(name) for name in catalogue.ALIASES]
        except MlotsparkError as e:  # a models folder that cannot be read: list what else there is
            log.warning("catalogue aliases not listed: %s", e)
            rows = []
        for row in rows:
            if row["pulled"] and row["name"] not in out and _resolved(row["path"]) not in files:
                out.append(row["name"])
        return out

    # ------------------------------------------------------------- loading and unloading
    async def acquire(self, slot: Slot) -> Slot:
        """Make ``slot`` resident (loading it in the executor if need be) and count a request on it.

        Raises:
            APIError: 503 when every resident model is busy and none can make room; 500 when
                the model cannot be loaded.
        """
        slot.active += 1  # counted first: the reaper never unloads a slot a request waits for
        slot.last_used = self.clock()
        try:
            if not slot.loaded:
                await asyncio.get_running_loop().run_in_executor(None, self._load, slot)
        except BaseException:
            slot.active -= 1
            raise
        if slot.share is not None:
            slot.share.active = slot.active
        return slot

    def release(self, slot: Slot) -> None:
        slot.active = max(0, slot.active - 1)
        slot.last_used = self.clock()
        if slot.share is not None:
            slot.share.active = slot.active

    def _load(self, slot: Slot) -> None:
        with slot._lock, self._load_lock:  # one load per slot; other requests wait for it
            if slot.loaded:
                return
            self._make_room(slot)
            gov = self.governance
            if gov is not None:
                self._make_memory_room(slot, slot.weights_bytes or self.estimate(slot.spec))
                slot.share = slot.share or gov.share(slot.name)
            slot.loading, slot.error, slot.load_started, slot.load_steps = True, None, self.clock(), {}
            here = threading.get_ident()
            # Steps are process-wide; this load's are those reported on this thread.
            stop_listening = steps.listen(lambda e: slot._stepped(e) if threading.get_ident() == here else None)
            try:
                slot.engine, slot.prompt_cache = self._open(slot)
            finally:
                stop_listening()
                slot.loading, slot.load_steps = False, {}
            slot.loads, slot.last_used = slot.loads + 1, self.clock()
            log.info("model %s loaded (%d resident)", slot.name, len(self.resident()))

    def _open(self, slot: Slot) -> tuple[Any, Any]:
        """Load ``slot``'s engine, check it fits the memory budget, open its prompt cache."""
        gov = self.governance
        try:
            engine = self.load_fn(slot.spec) if gov is None else self.load_fn(slot.spec, governor=slot.share)
        except MlotsparkError as e:
            slot.error = str(e)
            raise APIError(500, f"model '{slot.name}' could not be loaded: {e}", type="server_error") from None
        if gov is not None:
            slot.weights_bytes = int(engine.loaded.nbytes())  # the estimate was a lower bound: check again
            try:
                self._make_memory_room(slot, slot.weights_bytes)
            except APIError as e:
                engine.close()
                slot.error = e.message
                raise
            gov.settle(slot.share, slot.weights_bytes)
        cache = self.make_cache(engine) if self.make_cache is not None else None
        if cache is not None:
            engine.scheduler.call(cache.load)
        return engine, cache

    def _make_room(self, slot: Slot) -> None:
        resident = [s for s in self.resident() if s is not slot]
        while len(resident) >= self.max_models:
            idle = sorted((s for s in resident if not s.pinned and s.active == 0), key=lambda s: s.last_used)
            if not idle:
                raise APIError(503, f"cannot load '{slot.name}': {len(resident)} models are resident "
                                    f"(--max-models {self.max_models}) and none is idle; retry later",
                               type="server_error", code="models_busy", headers={"Retry-After": "5"})
            self.unload(idle[0])
            resident.remove(idle[0])

    def _make_memory_room(self, slot: Slot, need: int) -> None:
        """Unload idle models, least recently used first, until ``slot`` (weights ``need``) fits
        the memory budget.

        Raises:
            APIError: 503 (retry later) when it would fit once busy models are idle; 507 when
                it cannot fit beside the models kept resident whatever happens.
        """
        gov = self.governance
        assert gov is not None
        fit = gov.fits(slot.name, need)
        while not fit.ok:
            idle = sorted((s for s in self.resident() if s is not slot and not s.pinned and s.active == 0),
                          key=lambda s: s.last_used)
            if not idle:
                break
            log.info("unloading %s to make room for %s: %s", idle[0].name, slot.name, fit.line)
            self.unload(idle[0])
            fit = gov.fits(slot.name, need)
        if fit.ok:
            return
        movable = tuple(s.share for s in self.resident() if s is not slot and not s.pinned and s.share is not None)
        if movable and gov.fits(slot.name, need, without=movable).ok:
            raise APIError(503, f"cannot load now: {fit.line}; the others are busy, retry later",
                           type="server_error", code="insufficient_memory", headers={"Retry-After": "10"})
        raise APIError(507, f"cannot load: {fit.line}", type="server_error", code="insufficient_memory")

    def unload(self, slot: Slot) -> None:
        """Close ``slot``'s engine (its prompt cache saved first)."""
        engine, cache = slot.engine, slot.prompt_cache
        slot.engine = slot.prompt_cache = None
        if engine is None:
            return
        if self.governance is not None and slot.share is not None:
            self.governance.leave(slot.share)
        if cache is not None:
            try:
                engine.scheduler.call(cache.save)
            except Exception:  # noqa: BLE001  a cache: losing it loses no data
                log.warning("prompt cache of %s not saved", slot.name)
        engine.close()
        log.info("model %s unloaded", slot.name)

    def resident(self) -> list[Slot]:
        return [s for s in self.slots.values() if s.loaded]

    def keep_alive_of(self, slot: Slot) -> float:
        return self.keep_alive_s if slot.keep_alive_s is None else slot.keep_alive_s

    def reap(self) -> list[str]:
        """Unload the models idle past their keep-alive; returns their names."""
        now, gone = self.clock(), []
        for s in self.resident():
            keep = self.keep_alive_of(s)
            if keep >= 0 and not s.pinned and s.active == 0 and not s.loading and now - s.last_used >= keep:
                self.unload(s)
                gone.append(s.name)
        return gone

    def expires_in(self, slot: Slot) -> float | None:
        """Seconds until ``slot`` unloads if it stays idle (None: never)."""
        keep = self.keep_alive_of(slot)
        if slot.pinned or keep < 0:
            return None
        return max(0.0, keep - (self.clock() - slot.last_used))

    def close(self) -> None:
        for s in self.resident():
            self.unload(s)


def _resolved(spec: str) -> Path | None:
    """The file or folder a model spec names, if it names one on disk (an alias does not)."""
    try:
        path = Path(spec).expanduser()
        return path.resolve() if path.exists() else None
    except (OSError, ValueError):
        return None


def model_capabilities(name: str, engine: Any = None) -> Any:
    """What model ``name`` can do (``models.hub.capabilities``): measured for a catalogue alias
    (found by its name or, once loaded, by its file), else read off its template.

    Args:
        name: the model's id on this server.
        engine: its engine when loaded (its file names the alias; its template its tools).
    """
    from mlotspark.decoding.tool_calls import tool_format
    from mlotspark.models.hub.capabilities import capabilities
    from mlotspark.models.hub.catalogue import alias_name

    source = getattr(getattr(engine, "loaded", None), "source", None)
    alias = alias_name(source) if source is not None else None
    has_tools = engine is not None and tool_format(getattr(engine, "tokenizer", None)) is not None
    return capabilities(alias or name, has_tools=has_tools)


def stored_bytes(spec: str) -> int:
    """Bytes of a model's files on disk (0 when unknown): a lower bound of its loaded weights."""
    path = Path(spec).expanduser()
    if not path.exists():
        try:
            from mlotspark.models.hub import catalogue

            path = Path(catalogue.resolve(spec, pull=False, progress=False).path)
        except Exception:  # noqa: BLE001  not stored (pulled on load): the loaded size decides
            return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.glob("*.safetensors")) if path.is_dir() else 0


def parse_keep_alive(value: object) -> float | None:
    """Ollama's ``keep_alive`` in seconds: a number, or ``"10s"`` / ``"5m"`` / ``"1h"``; negative = never.

    Returns:
        Seconds (-1 = never), or None for a value that is not one of those (ignored).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return -1.0 if value < 0 else float(value)
    if isinstance(value, str) and value.strip():
        text = value.strip().lower()
        unit = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        for suffix in ("ms", "s", "m", "h"):
            if text.endswith(suffix):
                try:
                    n = float(text[: -len(suffix)]) * unit[suffix]
                except ValueError:
                    return None
                return -1.0 if n < 0 else n
        try:
            n = float(text)
        except ValueError:
            return None
        return -1.0 if n < 0 else n
    return None


__all__ = ["DEFAULT_KEEP_ALIVE_S", "ModelPool", "Slot", "parse_keep_alive", "stored_bytes"]
