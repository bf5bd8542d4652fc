"""The ASGI application of ``mlotspark serve`` (Starlette; uvicorn runs it).

One :class:`ServerState` holds the engine, the server's prompt cache, the metrics
and the jobs in flight; ``create_app`` wires the routes (``routes.py``), the API-key
check and OpenAI-shaped errors around it. The engine is loaded before the app is
made, so the port opens only once the model is ready.

Shutdown (SIGINT/SIGTERM, see ``cli/serve.py``): :meth:`ServerState.begin_shutdown`
refuses new requests with 503 and ends every stream in flight with an error event;
the lifespan's exit then saves the prompt cache and closes the engine (which saves
its prefix cache and stops the engine thread), so nothing persisted is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import threading
import time
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlotspark.errors import OptionError
from mlotspark.platform.device import release_idle_memory
from mlotspark.server.metrics import Metrics
from mlotspark.server.models import ModelPool, Slot
from mlotspark.server.prompt_cache import PromptCache
from mlotspark.server.response_store import ResponseStore
from mlotspark.server.schemas import APIError

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE = 64
OPEN_PATHS = ("/", "/health", "/metrics")  # no API key needed: liveness probes and scrapers


class ServerState:
    """What the routes share: engine, prompt cache, metrics, jobs in flight.

    Args:
        engine: a loaded Engine.
        api_key: required as ``Authorization: Bearer KEY`` on ``/v1/*`` when set.
        max_queue: requests that may wait for a batch slot; past it, 503 + ``Retry-After``.
        prompt_cache: the token-prefix KV cache for resent histories (None = off).
        aliases: other model ids this server answers to (e.g. the ``--model`` argument);
            ``default`` always names the loaded model.
        response_store: stored ``/v1/responses`` and their KV snapshots (default: under the
            home directory, ``DEFAULT_STORE_BUDGET``).
    """

    def __init__(self, engine: Any, *, api_key: str | None = None, max_queue: int = DEFAULT_MAX_QUEUE,
                 prompt_cache: PromptCache | None = None, aliases: tuple[str, ...] = (),
                 pool: ModelPool | None = None, response_store: ResponseStore | None = None, mcp: Any = None):
        self.engine = engine
        self.response_store = response_store if response_store is not None else ResponseStore()
        # ``serve --mcp``: the started McpHub whose tools a Responses request's ``mcp`` tool runs
        self.mcp = mcp
        self.api_key = api_key or None
        self.max_queue = max_queue
        self.prompt_cache = prompt_cache
        self.model_id = engine.model_name
        self.pool = pool or ModelPool(load=_no_loading, keep_alive_s=-1)
        if self.pool.default is None:
            self.pool.add(self.model_id, self.model_id, engine)
        self.pool.default.prompt_cache = prompt_cache
        # Other names of the default model: "default" (as mlx_lm.server's default_model), the aliases.
        self.aliases = [a for a in ("default", *aliases) if a and a not in self.pool.slots]
        self.created = int(time.time())
        self.metrics = Metrics(self.live_figures)
        self.jobs: set[Any] = set()
        self.closing = False
        self._lock = threading.Lock()
        self._mean_s = 5.0  # running mean of request durations (Retry-After estimate)
        self._ended = 0  # requests ended since the last idle collection

    @property
    def served(self) -> list[str]:
        """Model ids requests may name now (on-demand ones are checked by ``find``)."""
        return self.pool.names() + self.aliases

    @property
    def listed(self) -> list[str]:
        """What ``/v1/models`` shows: the models given at start and those in allowed folders."""
        return self.pool.servable()

    def find(self, name: Any) -> Slot | None:
        """The slot a request's ``model`` names; None when it names none (the parse says why).

        Raises:
            APIError: 404 for a model this server cannot serve.
        """
        if not isinstance(name, str) or not name:
            return None
        if name in self.aliases:
            return self.pool.default
        return self.pool.find(name)

    async def open_model(self, body: Any) -> Slot | None:
        """The request's model, resident and counted as in use (``release`` ends that)."""
        slot = self.find(body.get("model") if isinstance(body, dict) else None)
        return None if slot is None else await self.pool.acquire(slot)

    async def embed(self, texts: list[str]) -> tuple[Any, int]:
        """Vectors of ``texts`` (``engine.memory.embed``) and the tokens the encoder read.

        The encoder is blocking work (on the engine thread for MiniLM): it is awaited
        on the loop's executor, so other requests keep streaming meanwhile.
        """
        from mlotspark.server.embeddings import token_count

        def work() -> tuple[Any, int]:
            return self.engine.memory.embed(texts), token_count(self.engine, texts)

        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, work)
        except OptionError as e:
            raise APIError(400, str(e), param="input") from None

    def token_text(self, token: int) -> str:
        """One token's text (for logprobs)."""
        return self.engine.tokenizer.decode([token])

    # -------------------------------------------------------------- admission
    def cap(self) -> int:
        try:
            return max(1, int(self.engine.scheduler.governor.status(last=0)["cap"]))
        except Exception:  # noqa: BLE001  a governor that cannot tell: the engine's max batch
            return max(1, int(getattr(self.engine.scheduling, "max_batch", 1)))

    def admit(self, job: Any) -> None:
        """Take ``job`` in, or refuse it: 503 while shutting down or past ``max_queue``.

        Requests beyond the batch cap wait in the engine's queue; ``max_queue`` bounds them.
        """
        with self._lock:
            if self.closing:
                raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
            waiting = len(self.jobs) - self.cap()
            if waiting >= self.max_queue:
                self.metrics.rejected.inc()
                retry = max(1, round(self._mean_s * (waiting + 1) / self.cap()))
                raise APIError(503, f"server busy: {waiting} requests already wait for a batch slot "
                                    f"(--max-queue {self.max_queue}); retry in about {retry} s",
                               type="server_error", code="queue_full", headers={"Retry-After": str(retry)})
            self.jobs.add(job)

    def release(self, job: Any, duration_s: float | None = None) -> None:
        with self._lock:
            if job not in self.jobs:
                return
            self.jobs.discard(job)
            if duration_s is not None:
                self._mean_s = 0.8 * self._mean_s + 0.2 * duration_s
        slot = getattr(job, "server", None)
        if isinstance(slot, Slot):
            self.pool.release(slot)
        self._ended += 1

    def collect_when_idle(self) -> bool:
        """A cyclic collection when nothing is in flight and requests ended since the last one.

        A request's KV is referenced from its handle, which the HTTP stack's per-request
        reference cycles (frames of a cut-off stream, tracebacks) keep alive until Python's
        cyclic collector runs: measured, 64 streams left ~70 MB of MLX memory held until then.
        Collecting when idle (the reaper's tick, every second) frees it and stalls no token;
        then MLX's buffer cache and the C heap's free pages go back to the system
        (``release_idle_memory``), or a burst's memory stays in the process's RSS.

        Returns:
            True when it collected.
        """
        if self.jobs or not self._ended:
            return False
        ended = self._ended
        gc.collect()
        release_idle_memory()
        self._ended -= ended  # one released by a finalizer meanwhile waits for the next tick
        return True

    @property
    def settled(self) -> bool:
        """Nothing in flight and every ended request collected (``collect_when_idle``)."""
        return not self.jobs and not self._ended

    def begin_shutdown(self) -> None:
        """Refuse new requests; end the ones in flight with an error event (thread-safe)."""
        with self._lock:
            self.closing = True
            jobs = list(self.jobs)
        for job in jobs:
            job.fail(APIError(503, "the server is shutting down", type="server_error", code="shutting_down"))

    # -------------------------------------------------------------- figures
    def live_figures(self) -> dict[str, Any]:
        """Scheduler status, prompt-cache stats and bytes per memory tier (for /health, /metrics)."""
        status = self.engine.status()
        status.pop("governor", None)
        out: dict[str, Any] = {"scheduler": status}
        pc = self.prompt_cache
        tiers = {"working": status.get("kv_bytes", 0)}
        if pc is not None:
            with contextlib.suppress(RuntimeError):  # entries changed under us: skip this scrape's figure
                out["prompt_cache"] = stats = pc.stats()
                tiers["episodic_prompt_cache"] = stats.get("bytes", 0)
        persistence = self.engine.persistence
        if persistence.opened:  # only once conversations or memory are in use
            with contextlib.suppress(Exception):
                t = persistence.stats()
                tiers["working_conversations"] = t["working"]["bytes"]
                tiers["episodic_snapshots"] = t["episodic"]["bytes"]
                tiers["episodic_prefix_cache"] = t["prefix_cache"]["bytes"]
                tiers["semantic"] = t["semantic"].get("bytes", 0)
                out["snapshot_turns"] = t["episodic"]["turns"]
                out["snapshot_hit_rate"] = t["episodic"]["hit_rate"]
        out["tiers"] = tiers
        return out

    def close(self) -> None:
        """Save the prompt cache and close the engine (the lifespan's exit)."""
        self.begin_shutdown()
        if self.prompt_cache is not None:
            with contextlib.suppress(Exception):
                self.engine.scheduler.call(self.prompt_cache.save)
        self.pool.default.prompt_cache = None  # saved just now
        self.response_store.close()  # its writes in flight end first
        for slot in self.pool.resident():
            if slot is not self.pool.default:
                self.pool.unload(slot)
        if self.mcp is not None:
            with contextlib.suppress(Exception):
                self.mcp.close()  # the MCP servers' processes end with the server
        self.engine.close()


def _no_loading(spec: str) -> Any:
    raise APIError(404, f"model '{spec}' is not loaded by this server", param="model", code="model_not_found")


async def _reap(state: ServerState, every_s: float = 1.0) -> None:
    """Each tick: collect cycles if the server went idle; unload models idle past their
    keep-alive (an engine's close waits for its thread, hence the executor)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every_s)
        try:
            state.collect_when_idle()
            await loop.run_in_executor(None, state.pool.reap)
        except Exception:  # noqa: BLE001  the next round tries again
            log.exception("unloading idle models failed")


def _error_response(e: APIError, path: str = "") -> JSONResponse:
    """``e`` in the shape of the API ``path`` belongs to: Anthropic's, Ollama's, else OpenAI's."""
    if path.startswith("/v1/messages"):
        from mlotspark.server.anthropic_api import anthropic_error

        body = anthropic_error(e)
    elif path.startswith("/api/"):
        body = {"error": e.message}  # Ollama's
    else:
        body = e.body()
    return JSONResponse(body, status_code=e.status, headers=e.headers)


def create_app(state: ServerState) -> Starlette:
    """The Starlette app serving ``state``'s engine (routes in ``routes.py``)."""
    from mlotspark.server import anthropic_api, ollama_api, responses_routes, routes

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if state.prompt_cache is not None:
            state.engine.scheduler.call(state.prompt_cache.load)
        reaper = asyncio.create_task(_reap(state))
        try:
            yield
        finally:
            if reaper is not None:
                reaper.cancel()
            state.close()

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        state.metrics.requests.labels(_endpoint(request), str(exc.status)).inc()
        return _error_response(exc, request.url.path)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        state.metrics.requests.labels(_endpoint(request), str(exc.status_code)).inc()
        e = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                     code="not_found" if exc.status_code == 404 else None)
        return _error_response(e, request.url.path)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        state.metrics.requests.labels(_endpoint(request), "500").inc()
        return _error_response(APIError(500, f"internal error: {type(exc).__name__}", type="server_error"),
                               request.url.path)

    app = Starlette(
        routes=routes.build(state) + responses_routes.build(state) + anthropic_api.build(state)
        + ollama_api.build(state),
        lifespan=lifespan,
        middleware=[Middleware(KeyCheck, state=state)],
        exception_handlers={APIError: api_error, HTTPException: http_error, Exception: server_error},
    )

    app.state.mlotspark = state
    return app


class KeyCheck:
    """ASGI middleware: ``/v1/*`` needs ``Authorization: Bearer KEY`` when a key is set.

    A plain ASGI middleware (not ``BaseHTTPMiddleware``), so streamed responses and
    client disconnects pass through untouched.
    """

    def __init__(self, app: Any, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        key = self.state.api_key
        if scope["type"] != "http" or not key or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else headers.get("x-api-key", "")
        if hmac.compare_digest(token.encode(), key.encode()):
            await self.app(scope, receive, send)
            return
        self.state.metrics.requests.labels(_endpoint_of(scope.get("path", "")), "401").inc()
        response = _error_response(APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' "
                                                 "or 'x-api-key: KEY'", code="invalid_api_key"), scope.get("path", ""))
        await response(scope, receive, send)


def _endpoint(request: Request) -> str:
    return _endpoint_of(request.url.path)


def _endpoint_of(path: str) -> str:
    known = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/messages", "/v1/models", "/health",
             "/v1/responses", "/v1/messages/count_tokens",
             "/metrics", "/api/chat", "/api/generate", "/api/embed", "/api/tags", "/api/show", "/api/ps", "/api/version")
    return path if path in known else "other"


__all__ = ["DEFAULT_MAX_QUEUE", "ServerState", "create_app"]
