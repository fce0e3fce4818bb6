"""A live gateway (real uvicorn, in-process engine on the tiny random model, the real Redis)
whose spans go to an in-memory exporter: `traced_gateway()` starts a fresh one per call."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import pytest
import torch
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine.models.loader import LoadedModel
from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.local_server import serve_local
from gateway.settings import GatewaySettings
from tests.tiny_model import tiny_model

MODEL = "tiny"
StartGateway = Callable[[], AbstractContextManager["TracedGateway"]]


@dataclass
class TracedGateway:
    base_url: str
    provider: TracerProvider
    exporter: InMemorySpanExporter

    def wait_for_spans(self, predicate: Callable[[list[ReadableSpan]], bool],
                       timeout_s: float = 10.0) -> list[ReadableSpan]:
        """The finished spans once `predicate` holds: the server ends its HTTP span after the
        last byte is sent, which may be just after the client has read the response."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = list(self.exporter.get_finished_spans())
            if predicate(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.02)


@pytest.fixture(scope="module")
def tiny_loaded_model() -> LoadedModel:
    torch.set_num_threads(1)
    return tiny_model(Tokenizer.from_gguf(embedded_gguf_path()))


@pytest.fixture
def traced_gateway(redis_url: str, redis_key_prefix: str,
                   tiny_loaded_model: LoadedModel) -> StartGateway:
    """`with traced_gateway() as gw:` a fresh gateway and engine with its own span exporter."""

    @contextmanager
    def start() -> Iterator[TracedGateway]:
        exporter = InMemorySpanExporter()
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        settings = GatewaySettings(redis_url=redis_url,
                                   key_prefix=f"{redis_key_prefix}{uuid.uuid4().hex[:8]}:")
        with serve_local(tiny_loaded_model, settings, model_name=MODEL,
                         kv_memory_bytes=64 << 20, tracer_provider=provider) as base_url:
            yield TracedGateway(base_url, provider, exporter)
        provider.shutdown()

    return start

