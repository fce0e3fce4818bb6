"""`radixgate serve` through faults, as real processes on the real model.

- A fresh server is open (the official clients with a dummy key work) and says so; a key made
  by `radixgate keys create` reaches the store it uses, and then keys are enforced.
- SIGKILL of the embedded Valkey under load: requests during the outage get 503
  store_unavailable (never a 500), it comes back from its AOF, and no acknowledged turn is lost.
- SIGKILL of the engine worker during 16 concurrent sessions: no non-streamed turn fails, and a
  stream interrupted mid-output is continued by the SDK's retry.
- No child outlives serve, on SIGTERM or SIGKILL.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

import sdk
from benchmarks.serve_process import ServeProcess, wait_gone

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServeProcess]:
    serve = ServeProcess.start(tmp_path / "state")
    try:
        yield serve
    finally:
        serve.stop(signal.SIGKILL)


def _turn(http: httpx.Client, sid: str, text: str, max_tokens: int) -> httpx.Response:
    return http.post(f"/v1/sessions/{sid}/turns", json={
        "messages": [{"role": "user", "content": text}],
        "generate": {"max_tokens": max_tokens}})


def test_open_access_then_keys_from_the_same_store(tmp_path: Path) -> None:
    server = ServeProcess.start(tmp_path / "state")
    try:
        assert "open access" in server.log
        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="anything", max_retries=0)
        reply = oai.chat.completions.create(model="gpt-4o-mini", max_tokens=8, messages=[
            {"role": "user", "content": "Say hello."}])
        assert reply.choices[0].message.content
        claude = anthropic.Anthropic(base_url=server.url, api_key="sk-ant-dummy", max_retries=0)
        message = claude.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=[
            {"role": "user", "content": "Say hello."}])
        assert message.content and message.usage.output_tokens > 0

        made = server.radixgate("keys", "create", "--tenant", "me",
                                "--state-dir", str(server.state_dir))
        assert made.returncode == 0, made.stderr
        key = made.stdout.strip()
        assert key.startswith("rg-") and "running server" in made.stderr
        with pytest.raises(openai.AuthenticationError):
            oai.chat.completions.create(model="gpt-4o-mini", max_tokens=4, messages=[
                {"role": "user", "content": "hi"}])
        keyed = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
        assert keyed.chat.completions.create(model="gpt-4o-mini", max_tokens=4, messages=[
            {"role": "user", "content": "hi"}]).choices

        children = [server.pids()["engine_pid"], server.pids()["valkey_pid"]]
        assert server.stop(signal.SIGTERM) == 0
        assert wait_gone(children, 5.0) == []
        # With no server running, the key goes into the embedded store's data on disk.
        offline = server.radixgate("keys", "create", "--tenant", "later",
                                   "--state-dir", str(server.state_dir))
        assert offline.returncode == 0 and "no server is running" in offline.stderr
        nowhere = server.radixgate("keys", "create", "--tenant", "x",
                                   "--state-dir", str(tmp_path / "empty"))
        assert nowhere.returncode == 2 and "no radixgate store under" in nowhere.stderr
    finally:
        server.stop(signal.SIGKILL)


def test_valkey_sigkill_under_load_loses_no_acknowledged_turn(server: ServeProcess) -> None:
    num_sessions, num_turns = 6, 6
    acknowledged: list[tuple[str, str]] = []  # (session id, assistant turn id)
    errors: Counter[str] = Counter()
    lock = threading.Lock()
    killed = threading.Event()

    def worker(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=300) as http:
            sid = None
            done = 0
            while done < num_turns:
                try:
                    if sid is None:
                        r = http.post("/v1/sessions", json={})
                        if r.status_code == 201:
                            sid = r.json()["id"]
                    else:
                        r = _turn(http, sid, f"Session {i}, question {done}.", 8)
                        if r.status_code == 200:
                            with lock:
                                acknowledged.append((sid, r.json()["id"]))
                            done += 1
                except httpx.HTTPError as exc:
                    with lock:
                        errors[f"transport:{type(exc).__name__}"] += 1
                    continue
                if r.status_code >= 400:
                    with lock:
                        errors[f"{r.status_code}:{r.json()['error']['type']}"] += 1
                    assert r.status_code == 503 and r.headers["retry-after"] == "1"
                    time.sleep(0.2)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(num_sessions)]
    for thread in threads:
        thread.start()
    while len(acknowledged) < num_sessions:  # everyone is under way
        time.sleep(0.05)
    valkey_pid = server.pids()["valkey_pid"]
    os.kill(valkey_pid, signal.SIGKILL)
    killed.set()
    for thread in threads:
        thread.join(600)
    ready = server.wait_ready(until="store_restarts", value=1)
    assert ready["store_pid"] != valkey_pid
    assert set(errors) <= {"503:store_unavailable"}, errors  # never a 500
    # Every acknowledged turn is in the store, on its session's branch.
    assert len(acknowledged) == num_sessions * num_turns
    for sid, turn_id in acknowledged:
        r = server.http.get(f"/v1/sessions/{sid}/turns/{turn_id}")
        assert r.status_code == 200, (sid, turn_id, r.text)
    heads = {sid: server.http.get(f"/v1/sessions/{sid}").json()["branches"]["main"]
             for sid, _ in acknowledged}
    assert set(heads.values()) <= {turn for _, turn in acknowledged}
    print(f"\nValkey SIGKILL: {len(acknowledged)} turns acknowledged, 0 lost, "
          f"errors {dict(errors)}")


def test_engine_sigkill_during_16_sessions(server: ServeProcess) -> None:
    num_sessions, num_turns = 16, 3
    results: Counter[str] = Counter()
    lock = threading.Lock()
    sids = [server.http.post("/v1/sessions", json={}).json()["id"] for _ in range(num_sessions)]
    stream_sid = server.http.post("/v1/sessions", json={}).json()["id"]
    started = threading.Barrier(num_sessions + 2)
    streamed: dict[str, Any] = {}
    first_text = threading.Event()

    def worker(sid: str) -> None:
        with httpx.Client(base_url=server.url, timeout=600) as http:
            started.wait()
            for n in range(num_turns):
                r = _turn(http, sid, f"Tell me fact number {n} about the sea.", 24)
                with lock:
                    results[str(r.status_code) if r.status_code == 200
                            else f"{r.status_code}:{r.text[:200]}"] += 1

    def stream() -> None:
        with sdk.Client(server.url) as client:
            session = client.sessions.get(stream_sid)
            started.wait()
            with session.stream("Write a long story about a lighthouse keeper.",
                                max_tokens=120) as s:
                texts = []
                for text in s.text_stream:
                    texts.append(text)
                    first_text.set()
                streamed["text"] = "".join(texts)
                streamed["turn"] = s.get_final_turn()

    threads = [threading.Thread(target=worker, args=(sid,)) for sid in sids]
    threads.append(threading.Thread(target=stream))
    for thread in threads:
        thread.start()
    started.wait()
    assert first_text.wait(300)
    engine_pid = server.pids()["engine_pid"]
    os.kill(engine_pid, signal.SIGKILL)
    for thread in threads:
        thread.join(900)
    assert results == Counter({"200": num_sessions * num_turns})  # 0 errors on non-streamed
    ready = server.wait_ready()
    assert ready["engine_restarts"] == 1 and ready["engine_pid"] != engine_pid
    turn = streamed["turn"]
    stored = server.http.get(f"/v1/sessions/{stream_sid}/turns/{turn.id}").json()
    assert streamed["text"] == stored["content"] == turn.content
    view = server.http.get(f"/v1/sessions/{stream_sid}").json()
    assert len(view["turns"]) == 3  # continued, not generated twice
    print(f"\nengine SIGKILL: {sum(results.values())} non-streamed turns, all 200; "
          f"the stream continued to {turn.usage.output_tokens if turn.usage else '?'} tokens")


def test_no_child_outlives_a_sigkilled_serve(server: ServeProcess) -> None:
    pids = server.pids()
    children = [pids["engine_pid"], pids["valkey_pid"]]
    server.stop(signal.SIGKILL)
    assert wait_gone(children, 5.0) == []


def _processes_naming(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_text():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_a_truncated_model_stops_serve_naming_the_tensor(tmp_path: Path) -> None:
    """A GGUF cut short (an interrupted download): `serve` exits with an error that names the
    tensor whose bytes are missing, and leaves no engine worker or store behind."""
    from engine.models.locate import resolve_model_path

    cut = tmp_path / "cut.gguf"
    whole = resolve_model_path("smollm2-135m").read_bytes()
    cut.write_bytes(whole[: len(whole) * 3 // 5])
    with pytest.raises(AssertionError, match=r"serve exited \(\d+\)") as failed:
        ServeProcess.start(tmp_path / "state", "--model", str(cut))
    assert re.search(r"tensor '[^']+'.*truncated or corrupt", str(failed.value)), failed.value
    deadline = time.monotonic() + 10
    while _processes_naming(str(cut)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_naming(str(cut)) == []
    assert _processes_naming(str(tmp_path / "state")) == []
