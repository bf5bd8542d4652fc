"""``mlotspark serve``: the engine behind OpenAI's, Anthropic's and Ollama's HTTP APIs.

- ``app``: the Starlette app, shared state, API-key check, errors (each API's shape), shutdown.
- ``routes``: OpenAI's chat/completions, completions, embeddings, models; health, metrics.
- ``responses_api``: OpenAI's ``/v1/responses`` requests, translated into chat requests.
- ``responses_routes``: its routes, response objects and streamed events.
- ``response_store``: stored responses and their chains' KV snapshots (disk budget).
- ``anthropic_api``: Anthropic's ``/v1/messages`` and ``/v1/messages/count_tokens``.
- ``ollama_api``: Ollama's ``/api/*``.
- ``embeddings``: embeddings requests and replies (OpenAI's, reused by Ollama's).
- ``exchange``: what every API's routes share (body, awaited outcome, disconnects, figures).
- ``models``: several models behind one server (on-demand loading, keep-alive, LRU).
- ``schemas``: request checks (4xx naming the field).
- ``responses``: OpenAI response shapes (replies, streamed chunks, usage).
- ``runner``: one request on the engine (``Engine.submit``), events for asyncio.
- ``prompt_cache``: resent histories matched by token prefix (kept across restarts).
- ``metrics``: Prometheus text.
- ``local``: the app over a loaded engine on a loopback port, in this process (the
  conformance matrix and the tests talk to it with the real SDKs).
"""

from mlotspark.server.app import DEFAULT_MAX_QUEUE, ServerState, create_app
from mlotspark.server.models import ModelPool
from mlotspark.server.prompt_cache import PromptCache
from mlotspark.server.schemas import EXTENSION_KEY, APIError

__all__ = ["APIError", "DEFAULT_MAX_QUEUE", "EXTENSION_KEY", "ModelPool", "PromptCache", "ServerState", "create_app"]
