"""``GET /metrics``: Prometheus text exposition of the server and its engine.

Counters and histograms are updated as requests end (``prometheus_client``, one
registry per app so several servers in one process never share figures); the
engine's live state — queue, batch size and cap, thermal state, KV and prompt-cache
bytes, hit rates — is read when Prometheus scrapes, by a collector.
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
THERMAL_STATES = ("nominal", "fair", "serious", "critical")

_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500)
_DURATION_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class Metrics:
    """The server's Prometheus metrics.

    Args:
        snapshot: called at scrape time; returns the live figures (see
            :meth:`ServerState.live_figures`): ``scheduler`` (``Engine.status``
            without the governor), ``prompt_cache`` (``PromptCache.stats``),
            ``tiers`` (bytes per memory tier).
    """

    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("mlotspark_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("mlotspark_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.cached_tokens = Counter("mlotspark_cached_prompt_tokens",
                                     "Prompt tokens taken from a cache or snapshot (not prefilled)", registry=r)
        self.completion_tokens = Counter("mlotspark_completion_tokens", "Tokens generated", registry=r)
        self.rejected = Counter("mlotspark_rejected_requests", "Requests refused with 503: queue full", registry=r)
        self.cancelled = Counter("mlotspark_cancelled_requests", "Requests whose client went away", registry=r)
        self.ttft = Histogram("mlotspark_ttft_seconds", "Time to first token (queue + prefill)",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.decode_tps = Histogram("mlotspark_decode_tokens_per_second", "Decode speed of each request",
                                    buckets=_TPS_BUCKETS, registry=r)
        self.duration = Histogram("mlotspark_request_duration_seconds", "Request time, arrival to last byte",
                                  buckets=_DURATION_BUCKETS, registry=r)
        r.register(_LiveCollector(snapshot))

    def finished(self, endpoint: str, prompt: int, cached: int, completion: int, ttft_s: float,
                 decode_tps: float, duration_s: float) -> None:
        """Count a request that generated (any finish reason)."""
        self.requests.labels(endpoint, "200").inc()
        self.prompt_tokens.inc(prompt)
        self.cached_tokens.inc(cached)
        self.completion_tokens.inc(completion)
        self.ttft.observe(ttft_s)
        if decode_tps > 0:
            self.decode_tps.observe(decode_tps)
        self.duration.observe(duration_s)

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)


class _LiveCollector:
    """Gauges read from the engine at scrape time."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]):
        self.snapshot = snapshot

    def describe(self) -> list:
        return []  # no eager collect at registration: the engine may not be ready yet

    def collect(self) -> Any:
        live = self.snapshot()
        s = live.get("scheduler", {})

        def gauge(name: str, doc: str, value: Any) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=float(value or 0))

        yield gauge("mlotspark_queue_length", "Requests waiting for a batch slot", s.get("queued"))
        yield gauge("mlotspark_batch_size", "Sequences in the last decode step", s.get("batch_size"))
        yield gauge("mlotspark_batch_cap", "Batch cap set by the thermal governor", s.get("cap"))
        yield gauge("mlotspark_running_requests", "Requests prefilling or decoding",
                    (s.get("running") or 0) + (s.get("prefilling") or 0))
        yield gauge("mlotspark_decode_tokens_per_second_aggregate", "Aggregate decode speed (last window)",
                    s.get("decode_tps"))
        state = GaugeMetricFamily("mlotspark_thermal_state", "1 for the governor's current thermal state",
                                  labels=["state"])
        for name in THERMAL_STATES:
            state.add_metric([name], 1.0 if s.get("state") == name else 0.0)
        yield state
        tiers = GaugeMetricFamily("mlotspark_memory_bytes", "Bytes held per memory tier", labels=["tier"])
        for tier, value in (live.get("tiers") or {}).items():
            tiers.add_metric([tier], float(value or 0))
        yield tiers
        pc = live.get("prompt_cache") or {}
        yield gauge("mlotspark_prompt_cache_entries", "Entries in the server's prompt cache", pc.get("entries"))
        yield gauge("mlotspark_prompt_cache_hit_rate", "Prompt-cache hits / lookups", pc.get("hit_rate"))
        hits = GaugeMetricFamily("mlotspark_cache_lookups", "Prompt-cache and snapshot lookups by result",
                                 labels=["cache", "result"])
        hits.add_metric(["prompt", "hit"], float(pc.get("hits") or 0))
        hits.add_metric(["prompt", "miss"], float(pc.get("misses") or 0))
        for result, value in (live.get("snapshot_turns") or {}).items():
            hits.add_metric(["conversation", result], float(value or 0))
        yield hits
        rate = live.get("snapshot_hit_rate")
        if rate is not None:
            yield gauge("mlotspark_snapshot_hit_rate", "Conversation turns continued from a snapshot", rate)


__all__ = ["CONTENT_TYPE", "Metrics", "THERMAL_STATES"]
