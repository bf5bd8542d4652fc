"""``mlotspark serve``'s app on a loaded engine, in this process, on a free loopback port
(``mlotspark.server.local``): the real client libraries talk HTTP to it."""

from mlotspark.server.local import LocalServer as LiveServer

__all__ = ["LiveServer"]
