"""``mlotspark serve``'s app over a loaded engine, in this process, on a free loopback port.

uvicorn runs the real ASGI app in a thread, so the real client libraries (``openai``,
``anthropic``, ``ollama``) talk HTTP to it as to ``mlotspark serve``: what the
conformance matrix (``bench/conformance.py``) and the tests drive.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import httpx


class LocalServer:
    """Serve ``engine`` with ``create_app`` on 127.0.0.1 until ``stop()``.

    Args:
        engine: a loaded Engine (closed by ``stop()`` through the app's lifespan).
        **state: ``ServerState`` keywords (``api_key``, ``prompt_cache`` ...; the prompt
            cache is off unless given).
    """

    def __init__(self, engine: Any, **state: Any):
        import uvicorn

        from mlotspark.server import ServerState, create_app

        state.setdefault("prompt_cache", None)
        self.state = ServerState(engine, **state)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(self.state), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="local-server", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("the local server did not start within 60 s")

    @property
    def model(self) -> str:
        """The served model's id (what requests name)."""
        return self.state.model_id

    def openai(self, **kw: Any) -> Any:
        """An ``openai.OpenAI`` client of this server."""
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "unused"), timeout=120,
                             max_retries=0, **kw)

    def anthropic(self) -> Any:
        """An ``anthropic.Anthropic`` client of this server."""
        import anthropic

        return anthropic.Anthropic(base_url=self.url, api_key="unused", max_retries=0, timeout=120)

    def ollama(self) -> Any:
        """An ``ollama.Client`` of this server."""
        import ollama

        return ollama.Client(host=self.url, timeout=120)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


__all__ = ["LocalServer"]
