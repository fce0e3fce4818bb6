"""The gateway with an in-process engine in a real uvicorn on a free loopback port, in a daemon
thread: for tests, benchmarks and SDK checks that need real HTTP without spawning processes."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from opentelemetry.trace import TracerProvider

from engine.client import EngineClient
from engine.engine import Engine, EngineConfig
from engine.models.loader import LoadedModel
from engine.tokenizer import Tokenizer
from gateway import event_loop
from gateway.app import create_app
from gateway.settings import GatewaySettings
from sessions.redis_client import open_client


@contextmanager
def serve_local(loaded: LoadedModel | None, settings: GatewaySettings, *, model_name: str,
                kv_memory_bytes: int, start_timeout_s: float = 60.0,
                tracer_provider: TracerProvider | None = None,
                engine_url: str | None = None,
                tokenizer: Tokenizer | None = None) -> Iterator[str]:
    """Yield the base URL once uvicorn has started; stop it and close the engine client and the
    Redis pool on exit. `settings.redis_url` must be set. Raises RuntimeError if it won't start.
    `tracer_provider` goes to `create_app` (tests pass one with an in-memory exporter). With
    `engine_url` the engine is that worker (`radixgate engine`), as under `serve`, and `loaded`
    may be None when `tokenizer` is given; else an engine runs in a thread of this process on
    `loaded`."""
    if settings.redis_url is None:
        raise ValueError("serve_local needs settings.redis_url")
    tok = tokenizer or (loaded.tokenizer if loaded is not None else None)
    if tok is None or (loaded is None and engine_url is None):
        raise ValueError("serve_local needs a model, or an engine_url and a tokenizer")
    redis_url = settings.redis_url
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    box: dict[str, uvicorn.Server] = {}
    failure: list[BaseException] = []

    async def serve() -> None:
        if engine_url is not None:
            engine_client = await EngineClient.connect(engine_url)
        else:
            assert loaded is not None
            engine_client = EngineClient.in_process(
                Engine(loaded, EngineConfig(kv_memory_bytes=kv_memory_bytes)))
        client = open_client(redis_url)
        app = create_app(settings, engine_client=engine_client, redis=client,
                         tokenizer=tok, model_name=model_name,
                         tracer_provider=tracer_provider)
        server = box["server"] = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                                               lifespan="on"))
        try:
            await server.serve(sockets=[sock])
        finally:
            await engine_client.close()
            await client.aclose()

    def main() -> None:
        try:
            event_loop.run(serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            failure.append(exc)

    thread = threading.Thread(target=main, name="radixgate-local-gateway", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not (box.get("server") and box["server"].started):
            if failure or not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the local gateway did not start: {failure!r}")
            time.sleep(0.05)
        yield base_url
    finally:
        if "server" in box:
            box["server"].should_exit = True
        thread.join(30)
        sock.close()
