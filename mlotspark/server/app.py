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

import contextlib
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

from mlotspark.server.metrics import Metrics
from mlotspark.server.prompt_cache import PromptCache
from mlotspark.server.schemas import APIError

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE = 64
OPEN_PATHS = ("/health", "/metrics")  # no API key needed: liveness probes and scrapers


class ServerState:
    """What the routes share: engine, prompt cache, metrics, jobs in flight.

    Args:
        engine: a loaded Engine.
        api_key: required as ``Authorization: Bearer KEY`` on ``/v1/*`` when set.
        max_queue: requests that may wait for a batch slot; past it, 503 + ``Retry-After``.
        prompt_cache: the token-prefix KV cache for resent histories (None = off).
        aliases: other model ids this server answers to (e.g. the ``--model`` argument).
    """

    def __init__(self, engine: Any, *, api_key: str | None = None, max_queue: int = DEFAULT_MAX_QUEUE,
                 prompt_cache: PromptCache | None = None, aliases: tuple[str, ...] = ()):
        self.engine = engine
        self.api_key = api_key or None
        self.max_queue = max_queue
        self.prompt_cache = prompt_cache
        self.model_id = engine.model_name
        self.served = [self.model_id] + [a for a in aliases if a and a != self.model_id]  # accepted ids
        self.listed = [self.model_id]  # what /v1/models shows (an alias may be a file path)
        self.created = int(time.time())
        self.metrics = Metrics(self.live_figures)
        self.jobs: set[Any] = set()
        self.closing = False
        self._lock = threading.Lock()
        self._mean_s = 5.0  # running mean of request durations (Retry-After estimate)

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
            self.jobs.discard(job)
            if duration_s is not None:
                self._mean_s = 0.8 * self._mean_s + 0.2 * duration_s

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
        status = self.engine.scheduler_status()
        status.pop("governor", None)
        out: dict[str, Any] = {"scheduler": status}
        pc = self.prompt_cache
        tiers = {"working": status.get("kv_bytes", 0)}
        if pc is not None:
            with contextlib.suppress(RuntimeError):  # entries changed under us: skip this scrape's figure
                out["prompt_cache"] = stats = pc.stats()
                tiers["episodic_prompt_cache"] = stats.get("bytes", 0)
        persistence = self.engine.opened_persistence  # only once conversations are in use
        if persistence is not None:
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
                self.engine.run_on_engine(self.prompt_cache.save)
        self.engine.close()


def _error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(state: ServerState) -> Starlette:
    """The Starlette app serving ``state``'s engine (routes in ``routes.py``)."""
    from mlotspark.server import routes

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if state.prompt_cache is not None:
            state.engine.run_on_engine(state.prompt_cache.load)
        try:
            yield
        finally:
            state.close()

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        state.metrics.requests.labels(_endpoint(request), str(exc.status)).inc()
        return _error_response(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        state.metrics.requests.labels(_endpoint(request), str(exc.status_code)).inc()
        e = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                     code="not_found" if exc.status_code == 404 else None)
        return _error_response(e)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        state.metrics.requests.labels(_endpoint(request), "500").inc()
        return _error_response(APIError(500, f"internal error: {type(exc).__name__}", type="server_error"))

    app = Starlette(
        routes=routes.build(state),
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
        response = _error_response(APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                            code="invalid_api_key"))
        await response(scope, receive, send)


def _endpoint(request: Request) -> str:
    return _endpoint_of(request.url.path)


def _endpoint_of(path: str) -> str:
    known = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
    return path if path in known else "other"


__all__ = ["DEFAULT_MAX_QUEUE", "ServerState", "create_app"]
