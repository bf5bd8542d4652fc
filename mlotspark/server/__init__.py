"""``mlotspark serve``: the engine behind an OpenAI-compatible HTTP API.

- ``app``: the Starlette app, shared state, API-key check, errors, shutdown.
- ``routes``: chat/completions, completions, models, health, metrics.
- ``schemas``: request checks (4xx naming the field).
- ``responses``: OpenAI response shapes (replies, streamed chunks, usage).
- ``runner``: one request on the engine (``Engine.submit``), events for asyncio.
- ``prompt_cache``: resent histories matched by token prefix (kept across restarts).
- ``metrics``: Prometheus text.
"""

from mlotspark.server.app import DEFAULT_MAX_QUEUE, ServerState, create_app
from mlotspark.server.prompt_cache import PromptCache
from mlotspark.server.schemas import EXTENSION_KEY, APIError

__all__ = ["APIError", "DEFAULT_MAX_QUEUE", "EXTENSION_KEY", "PromptCache", "ServerState", "create_app"]
