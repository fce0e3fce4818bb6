"""`GET /metrics` parses as Prometheus text, and a multi-turn session moves the hit rate."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sdk import Client
from tests.observability.conftest import StartGateway

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(http: httpx.Client) -> tuple[set[str], Samples]:
    """(family names with their types, {(sample name, sorted labels): value})."""
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families: set[str] = set()
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        families.add(f"{family.name}:{family.type}")
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_parse_and_the_hit_rate_moves(traced_gateway: StartGateway) -> None:
    with traced_gateway() as gw, httpx.Client(base_url=gw.base_url, timeout=60) as http:
        families, before = scrape(http)
        for family in ("radixgate_prefix_cache_queries_tokens:counter",
                       "radixgate_prefix_cache_hits_tokens:counter",
                       "radixgate_radix_cache_hit_rate:gauge",
                       "radixgate_time_to_first_token_seconds:histogram",
                       "radixgate_inter_token_latency_seconds:histogram",
                       "radixgate_kv_pages_used:gauge", "radixgate_kv_pages_total:gauge",
                       "radixgate_num_requests_running:gauge",
                       "radixgate_num_requests_waiting:gauge",
                       "radixgate_spec_decode_num_draft_tokens:counter",
                       "radixgate_spec_decode_num_accepted_tokens:counter",
                       "radixgate_requests_finished:counter"):
            assert family in families, family
        assert value(before, "radixgate_engine_up") == 1
        assert value(before, "radixgate_radix_cache_hit_rate") == 0
        assert value(before, "radixgate_prefix_cache_queries_tokens_total") == 0
        assert value(before, "radixgate_time_to_first_token_seconds_count") == 0

        with Client(gw.base_url, max_retries=0) as client:
            session = client.sessions.create(system="Be brief.")
            turns = [session.append(f"question {i}: " + "tell me more " * 6, max_tokens=5)
                     for i in range(3)]
        _, after = scrape(http)

    usage = [t.usage for t in turns]
    assert all(u is not None for u in usage)
    cached = sum(u.cached_tokens for u in usage if u is not None)
    prompt = sum(u.input_tokens for u in usage if u is not None)
    assert cached > 0
    hit_rate = value(after, "radixgate_radix_cache_hit_rate")
    assert 0 < hit_rate < 1
    # The engine counted exactly this session's three requests.
    assert value(after, "radixgate_prefix_cache_hits_tokens_total") == cached
    assert value(after, "radixgate_prefix_cache_queries_tokens_total") == prompt
    assert hit_rate == cached / prompt
    assert value(after, "radixgate_prompt_tokens_cached_total") == cached
    assert value(after, "radixgate_time_to_first_token_seconds_count") == 3
    assert value(after, "radixgate_inter_token_latency_seconds_count") == 3
    finished = sum(value(after, "radixgate_requests_finished_total", finish_reason=reason)
                   for reason in ("stop", "length"))
    assert finished == 3
    assert value(after, "radixgate_requests_finished_total", finish_reason="abort") == 0
    assert value(after, "radixgate_generation_tokens_total") == sum(
        u.output_tokens for u in usage if u is not None)
    assert value(after, "radixgate_num_requests_running") == 0
    assert value(after, "radixgate_num_requests_waiting") == 0
    total = value(after, "radixgate_kv_pages_total")
    assert 0 < value(after, "radixgate_kv_pages_used") <= total
    drafted = value(after, "radixgate_spec_decode_num_draft_tokens_total")
    assert 0 <= value(after, "radixgate_spec_decode_num_accepted_tokens_total") <= drafted
