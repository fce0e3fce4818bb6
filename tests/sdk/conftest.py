"""A live gateway for the SDK: the real app in a real uvicorn on a free port, in a background
thread, over the tiny random-weight model, an in-process engine and the real Redis."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import torch
import uvicorn
from redis.asyncio import Redis

from engine.client import EngineClient
from engine.engine import Engine, EngineConfig
from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.tiny_model import tiny_model

MAX_BODY_BYTES = 8192


@pytest.fixture(scope="module")
def live_server(redis_url: str) -> Iterator[str]:
    """Base URL of a running gateway; its Redis keys are deleted afterwards."""
    torch.set_num_threads(1)
    tokenizer = Tokenizer.from_gguf(embedded_gguf_path())
    loaded = tiny_model(tokenizer)
    prefix = f"test:{uuid.uuid4().hex}:"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    holder: dict[str, uvicorn.Server] = {}
    failure: list[BaseException] = []

    async def serve() -> None:
        engine_client = EngineClient.in_process(
            Engine(loaded, EngineConfig(kv_memory_bytes=64 << 20)))
        client = Redis.from_url(redis_url)
        settings = GatewaySettings(redis_url=redis_url, key_prefix=prefix,
                                   max_body_bytes=MAX_BODY_BYTES)
        app = create_app(settings, engine_client=engine_client, redis=client,
                         tokenizer=tokenizer, model_name="tiny")
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        holder["server"] = server
        try:
            await server.serve(sockets=[sock])
        finally:
            await engine_client.close()
            await client.aclose()

    def main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the fixture below
            failure.append(exc)

    thread = threading.Thread(target=main, name="sdk-live-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (holder.get("server") and holder["server"].started):
        assert not failure, failure
        assert time.monotonic() < deadline, "the live gateway did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        holder["server"].should_exit = True
        thread.join(30)
        sock.close()
        sync_redis = redis.Redis.from_url(redis_url)
        try:
            stale = list(sync_redis.scan_iter(match=f"{prefix}*", count=1000))
            if stale:
                sync_redis.unlink(*stale)
        finally:
            sync_redis.close()
