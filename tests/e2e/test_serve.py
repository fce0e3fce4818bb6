"""`radixgate serve` over real HTTP: embedded Valkey, a real engine worker, the real model.

Covers: prefix reuse across turns, the ledger equal to a full render of the conversation, a
streamed turn, fork and rewind, a gateway SIGKILL + restart that keeps the session (AOF), and an
engine worker SIGKILL after which the next turn re-prefills from the ledger.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from engine.models.locate import embedded_gguf_path
from engine.tokenizer import Tokenizer
from gateway.worker import free_port
from sessions import SessionStore

pytestmark = pytest.mark.slow
PAGE = 16


class Server:
    def __init__(self, state_dir: Path, port: int) -> None:
        env = {k: v for k, v in os.environ.items() if k != "RADIXGATE_REDIS_URL"}
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--state-dir",
             str(state_dir), "--threads", "1", "--kv-memory", "256"], env=env)
        self.http = httpx.Client(base_url=self.url, timeout=120)
        self.wait_ready()

    def wait_ready(self, not_pid: int | None = None) -> dict[str, object]:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "serve exited"
            try:
                r = self.http.get("/readyz", timeout=5)
                if r.status_code == 200 and r.json()["engine_pid"] != not_pid:
                    return dict(r.json())
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError("serve did not become ready")

    def turn(self, sid: str, text: str, **extra: object) -> dict[str, object]:
        r = self.http.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": text}],
            "generate": {"max_tokens": 24}, **extra})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(30)
        self.http.close()


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    from gateway.serve import stop_leftovers
    from gateway.settings import GatewaySettings

    stop_leftovers(GatewaySettings(state_dir=tmp_path))


def _ledger(state_dir: Path, sid: str, turn_id: str) -> list[int]:
    url = json.loads((state_dir / "serve.json").read_text())["valkey_url"]

    async def read() -> list[int]:
        redis = Redis.from_url(url)
        try:
            return await SessionStore(redis).token_path(sid, turn_id, tenant="local")
        finally:
            await redis.aclose()

    return asyncio.run(read())


def test_serve_end_to_end(state_dir: Path) -> None:
    port = free_port()
    server = Server(state_dir, port)
    try:
        sid = server.http.post("/v1/sessions", json={}).json()["id"]
        history: list[dict[str, str]] = []
        questions = ["What is 2+2?", "And 3+3?", "Name a colour.", "Say hello.",
                     "Name a fruit.", "What is the capital of France?"]
        for i, question in enumerate(questions):  # a 6-turn session
            turn = server.turn(sid, question)
            usage = turn["usage"]
            assert isinstance(usage, dict)
            history += [{"role": "user", "content": question},
                        {"role": "assistant", "content": str(turn["content"])}]
            if i:
                delta = server.http.get(
                    f"/v1/sessions/{sid}/turns/{turn['parent_id']}").json()["num_tokens"]
                assert usage["cached_tokens"] > 0
                # Recomputed beyond the delta: the parent's partial last page, plus its last
                # sampled token and stop token, which never ran through the model (<= PAGE + 1).
                assert delta <= usage["computed_tokens"] <= delta + PAGE + 1
        # The ledger is exactly the template's rendering of the whole conversation.
        tok = Tokenizer.from_gguf(embedded_gguf_path())
        assert tok.chat_template is not None
        rendered = tok.encode(tok.chat_template.render(history))
        ledger = _ledger(state_dir, sid, str(turn["id"]))
        assert rendered[: len(ledger)] == ledger and len(rendered) - len(ledger) <= 1

        with server.http.stream("POST", f"/v1/sessions/{sid}/turns", json={
                "messages": [{"role": "user", "content": "Count to three."}],
                "generate": {"max_tokens": 16, "stream": True}}) as r:
            raw = "".join(r.iter_text())
        frames = [dict(line.split(": ", 1) for line in block.split("\n"))
                  for block in raw.strip().split("\n\n")]
        assert [f["event"] for f in frames][0] == "turn_start"
        assert frames[-1]["event"] == "turn_end"
        text = "".join(json.loads(f["data"])["text"] for f in frames
                       if f["event"] == "text_delta")
        end = json.loads(frames[-1]["data"])["turn"]
        assert server.http.get(f"/v1/sessions/{sid}/turns/{end['id']}").json()["content"] == text

        r = server.http.post(f"/v1/sessions/{sid}/fork",
                             json={"from_turn_id": turn["id"], "branch": "alt"})
        assert r.status_code == 201
        alt = server.turn(sid, "Another question?", branch="alt")
        assert alt["usage"]["cached_tokens"] > 0  # type: ignore[index]
        r = server.http.post(f"/v1/sessions/{sid}/rewind",
                             json={"branch": "main", "to_turn_id": turn["id"]})
        assert r.status_code == 200
        again = server.turn(sid, "Back on main.")
        assert again["usage"]["cached_tokens"] > 0  # type: ignore[index]
        before = server.http.get(f"/v1/sessions/{sid}").json()

        server.stop(signal.SIGKILL)  # the gateway crashes; its worker dies with it
        server = Server(state_dir, port)
        after = server.http.get(f"/v1/sessions/{sid}").json()
        assert after["branches"] == before["branches"] and after["version"] == before["version"]
        cold = server.turn(sid, "Still there?")
        assert cold["usage"]["cached_tokens"] == 0  # type: ignore[index]

        ready = server.wait_ready()
        os.kill(int(str(ready["engine_pid"])), signal.SIGKILL)
        server.wait_ready(not_pid=int(str(ready["engine_pid"])))
        reprefilled = server.turn(sid, "After the engine crash?")
        usage = reprefilled["usage"]
        assert isinstance(usage, dict)
        assert usage["cached_tokens"] == 0 and usage["computed_tokens"] == usage["input_tokens"]
    finally:
        server.stop()
