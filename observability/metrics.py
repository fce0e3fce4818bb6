"""Prometheus metrics of one gateway app, in its own `CollectorRegistry` (never the global one).

Two sources:
- per turn, recorded by the gateway as turns finish (`observe_turn`, `observe_unfinished`):
  TTFT and inter-token latency histograms, requests by finish reason, prompt / cached /
  generated token counters;
- engine state, fetched from the engine's `Stats` at scrape time and handed to `render`:
  prefix-cache query/hit token counters, the radix-cache hit rate, KV pages, running and
  waiting requests, drafted and accepted token counters.

Names follow vLLM's with a `radixgate_` prefix. No session id (or any unbounded value) is ever a
label: that belongs on spans.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from observability.turn_spans import TurnOutcome

# OTel gen_ai.server.time_to_first_token advice; vLLM's INTER_TOKEN_LATENCY_BUCKETS.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                   40.96, 81.92)
FINISH_REASONS = ("stop", "length", "abort", "error")
ROUTE_REASONS = ("only", "bound", "prefix", "least_loaded")  # gateway.engine_pool


class EngineStats(Protocol):
    """What `render` reads of the engine's `Stats` message (engine.protocol.Stats fits)."""

    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def num_pages(self) -> int: ...
    @property
    def num_free_pages(self) -> int: ...
    @property
    def num_cached_pages(self) -> int: ...
    @property
    def prefix_query_tokens(self) -> int: ...
    @property
    def prefix_hit_tokens(self) -> int: ...
    @property
    def num_drafted(self) -> int: ...
    @property
    def num_accepted(self) -> int: ...
    @property
    def hit_rate(self) -> float: ...


class EngineStatsCollector(Collector):
    """Exposes the last `Stats` snapshot handed to it. Counters mirror the engine's own running
    totals (they reset when a worker restarts, which Prometheus' `rate()` handles)."""

    def __init__(self) -> None:
        self.snapshot: EngineStats | None = None

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        yield GaugeMetricFamily("radixgate_engine_up",
                                "1 when the engine answered the scrape's stats request",
                                value=0 if s is None else 1)
        if s is None:
            return
        yield CounterMetricFamily("radixgate_prefix_cache_queries_tokens",
                                  "Prompt tokens looked up in the prefix cache",
                                  value=s.prefix_query_tokens)
        yield CounterMetricFamily("radixgate_prefix_cache_hits_tokens",
                                  "Prompt tokens found in the prefix cache",
                                  value=s.prefix_hit_tokens)
        yield GaugeMetricFamily("radixgate_radix_cache_hit_rate",
                                "Prefix-cache hit tokens / query tokens since the engine started",
                                value=s.hit_rate)
        used = s.num_pages - s.num_free_pages
        yield GaugeMetricFamily("radixgate_kv_pages_used",
                                "KV pages held by requests or the prefix cache", value=used)
        yield GaugeMetricFamily("radixgate_kv_pages_total", "KV pages in the pool",
                                value=s.num_pages)
        yield GaugeMetricFamily("radixgate_kv_pages_cached",
                                "KV pages held by the prefix cache", value=s.num_cached_pages)
        yield GaugeMetricFamily("radixgate_kv_cache_usage_perc",
                                "Fraction of KV pages used (0-1)",
                                value=used / s.num_pages if s.num_pages else 0.0)
        yield GaugeMetricFamily("radixgate_num_requests_running",
                                "Requests in the engine's running batch", value=s.num_running)
        yield GaugeMetricFamily("radixgate_num_requests_waiting",
                                "Requests queued in the engine", value=s.num_waiting)
        yield CounterMetricFamily("radixgate_spec_decode_num_draft_tokens",
                                  "Tokens proposed by the drafter", value=s.num_drafted)
        yield CounterMetricFamily("radixgate_spec_decode_num_accepted_tokens",
                                  "Drafted tokens the target model accepted",
                                  value=s.num_accepted)


class GatewayMetrics:
    """All metrics of one app. `registry` is created here unless given."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("radixgate_time_to_first_token_seconds",
                              "Engine arrival to first token, per request", buckets=TTFT_BUCKETS,
                              registry=r)
        self.itl = Histogram("radixgate_inter_token_latency_seconds",
                             "Mean gap between output tokens, per request (decode time / gaps)",
                             buckets=ITL_BUCKETS, registry=r)
        self.queue_time = Histogram("radixgate_request_queue_time_seconds",
                                    "Engine arrival to first scheduled step, per request",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("radixgate_e2e_request_latency_seconds",
                             "Engine arrival to finish, per request", buckets=LATENCY_BUCKETS,
                             registry=r)
        self.finished = Counter("radixgate_requests_finished",
                                "Engine requests of turns, by finish reason",
                                ["finish_reason"], registry=r)
        for reason in FINISH_REASONS:
            self.finished.labels(reason)
        self.prompt_tokens = Counter("radixgate_prompt_tokens",
                                     "Prompt tokens of finished requests", registry=r)
        self.cached_tokens = Counter("radixgate_prompt_tokens_cached",
                                     "Prompt tokens of finished requests read from the cache",
                                     registry=r)
        self.computed_tokens = Counter("radixgate_prompt_tokens_computed",
                                       "Prompt tokens of finished requests run through the model",
                                       registry=r)
        self.generation_tokens = Counter("radixgate_generation_tokens",
                                         "Output tokens of finished requests", registry=r)
        self.routes = Counter("radixgate_worker_routes",
                              "Turns sent to an engine worker, by why that one: the only worker, "
                              "bound (it generated the parent), prefix (longest cached prefix), "
                              "least_loaded", ["reason"], registry=r)
        for reason in ROUTE_REASONS:
            self.routes.labels(reason)
        self.engine = EngineStatsCollector()
        r.register(self.engine)

    def observe_turn(self, outcome: TurnOutcome) -> None:
        """Record one finished engine request. Mutates the counters and histograms only."""
        self.finished.labels(outcome.finish_reason).inc()
        self.prompt_tokens.inc(outcome.input_tokens)
        self.cached_tokens.inc(outcome.cached_tokens)
        self.computed_tokens.inc(outcome.computed_tokens)
        self.generation_tokens.inc(outcome.output_tokens)
        self.queue_time.observe(outcome.queue_s)
        self.e2e.observe(outcome.queue_s + outcome.prefill_s + outcome.decode_s)
        if outcome.finish_reason == "abort":
            return  # latency of an aborted request says nothing about serving speed
        if outcome.has_ttft:
            self.ttft.observe(outcome.ttft_s)
        itl = outcome.inter_token_s
        if itl is not None:
            self.itl.observe(itl)

    def observe_route(self, reason: str) -> None:
        self.routes.labels(reason).inc()

    def observe_unfinished(self, reason: str) -> None:
        """A turn whose engine request never reported a result: "abort" (client went away)
        or "error"."""
        self.finished.labels(reason).inc()

    def render(self, stats: EngineStats | None) -> bytes:
        """The text exposition, engine metrics from `stats` (None: the engine did not answer,
        only `radixgate_engine_up 0` of them)."""
        self.engine.snapshot = stats
        return generate_latest(self.registry)
