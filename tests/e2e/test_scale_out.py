"""Two `radixgate serve` gateways over one Redis and two engine workers, as across hosts:
gateway A starts the workers (`--workers 2`), gateway B routes to them (`--workers 0 --engine
tcp://...`). Real processes, real model, real HTTP.

Every turn of a session, whichever gateway takes it, runs on the worker that generated its
parent; after a worker is SIGKILLed, its sessions go on (re-prefilled from the ledger) and
settle on a worker again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.worker import free_port

pytestmark = pytest.mark.slow


class Gateway:
    def __init__(self, state_dir: Path, redis_url: str, prefix: str, *args: str) -> None:
        port = free_port()
        env = {**os.environ, "RADIXGATE_REDIS_URL": redis_url, "RADIXGATE_KEY_PREFIX": prefix}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--state-dir",
             str(state_dir), "--threads", "1", "--kv-memory", "128", *args], env=env)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)

    def ready(self, num_up: int = 2) -> dict[str, Any]:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "serve exited"
            try:
                r = self.http.get("/readyz", timeout=5)
                body: dict[str, Any] = r.json()
                if r.status_code == 200 and sum(w["up"] for w in body["workers"]) >= num_up:
                    return body
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise AssertionError("serve did not become ready")

    def turn(self, sid: str, text: str) -> dict[str, Any]:
        r = self.http.post(f"/v1/sessions/{sid}/turns", json={
            "messages": [{"role": "user", "content": text}],
            "generate": {"max_tokens": 6, "temperature": 0}})
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def routes(self) -> dict[str, float]:
        text = self.http.get("/metrics").text
        return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("radixgate_worker_routes_total{")}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)
        self.http.close()


@pytest.fixture
def gateways(tmp_path: Path, redis_url: str, redis_key_prefix: str
             ) -> Iterator[tuple[Gateway, Gateway]]:
    a = Gateway(tmp_path / "a", redis_url, redis_key_prefix, "--workers", "2")
    b: Gateway | None = None
    try:
        workers = a.ready()["workers"]
        remote = [arg for w in workers for arg in ("--engine", w["name"])]
        b = Gateway(tmp_path / "b", redis_url, redis_key_prefix, "--workers", "0", *remote)
        b.ready()
        yield a, b
    finally:
        for gateway in (b, a):
            if gateway is not None:
                gateway.stop()


def test_two_gateways_route_each_session_to_one_worker_and_survive_a_worker_kill(
        gateways: tuple[Gateway, Gateway], redis_url: str, redis_key_prefix: str) -> None:
    a, b = gateways
    store = redis.Redis.from_url(redis_url)

    def worker_of(sid: str, turn_id: str) -> str:
        raw = store.hget(f"{redis_key_prefix}{{{sid}}}:t:{turn_id}", "worker")
        assert isinstance(raw, bytes) and raw, f"turn {turn_id} has no worker"
        return raw.decode()

    sids = [a.http.post("/v1/sessions", json={"system": f"Agent {i}."}).json()["id"]
            for i in range(4)]
    placed: dict[str, str] = {}
    for round_ in range(4):
        for i, sid in enumerate(sids):
            gateway = (a, b)[(round_ + i) % 2]
            reply = gateway.turn(sid, f"step {round_}")
            worker = worker_of(sid, reply["id"])
            assert placed.setdefault(sid, worker) == worker, f"session {sid} moved"
            if round_:
                assert reply["usage"]["cached_tokens"] > 0
    bound = a.routes().get("bound", 0) + b.routes().get("bound", 0)
    assert bound == 12  # 4 sessions x 3 later turns, half through each gateway

    victim = a.ready()["workers"][0]
    os.kill(int(victim["pid"]), signal.SIGKILL)
    moved = [sid for sid in sids if placed[sid] == victim["worker_id"]]
    for i, sid in enumerate(sids):  # through both gateways, before and after the restart
        reply = (a, b)[i % 2].turn(sid, "after the kill")
        if sid in moved:
            assert worker_of(sid, reply["id"]) != victim["worker_id"]
    restarted = a.ready()["workers"][0]
    assert restarted["restarts"] == 1 and restarted["worker_id"] != victim["worker_id"]
    b.ready()  # B's heartbeat finds the restarted worker at the same address
    for sid in sids:  # settled again: the next turn follows its parent
        first = worker_of(sid, a.turn(sid, "once more")["id"])
        assert worker_of(sid, b.turn(sid, "and again")["id"]) == first
    store.close()
