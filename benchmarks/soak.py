"""Soak through faults: many SDK sessions with forks and rewinds while the engine worker and the
embedded Valkey are each SIGKILLed once, then every session is deleted.

    python -m benchmarks.soak --json bench-results/soak.json [--sessions 32 --turns 20]

`radixgate serve` runs as a real process (embedded Valkey, appendfsync always) on the real
model. Each session is one thread with its own `sdk.Client` (retries on, as users run it):
`turns` appends to main (every other session streams them), one fork at a third of the way
with a turn on the new branch, and one rewind of main at two thirds. When a third of all turns
are acknowledged the engine worker is SIGKILLed; at two thirds, Valkey. Counted: turns
acknowledged (a 200 or a finished stream), errors by type that reached the caller after the
SDK's retries, acknowledged turns missing from the store afterwards (lost), each session's tree
invariants, and the engine's KV pages and pins after every session is deleted (held pages and
pins must be back to 0; evictable cache pages stay, reusable). Prints a table, writes JSON and
a PNG of acknowledged turns over time with the two kills.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

import sdk
from benchmarks.common import finish_notes, format_table, log, machine_notes, plot_path, write_json
from benchmarks.serve_process import ServeProcess
from engine.models.locate import embedded_gguf_path
from sessions import SessionStore


@dataclass
class Tally:
    """Shared by the session threads (under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    acknowledged: list[tuple[str, str, float]] = field(default_factory=list)  # sid, turn, t
    errors: Counter[str] = field(default_factory=Counter)
    sessions: list[str] = field(default_factory=list)

    def ack(self, sid: str, turn_id: str, started: float) -> None:
        with self.lock:
            self.acknowledged.append((sid, turn_id, time.monotonic() - started))

    def error(self, exc: Exception) -> None:
        kind = (f"{exc.status_code}:{exc.error_type}" if isinstance(exc, sdk.APIStatusError)
                else type(exc).__name__)
        with self.lock:
            self.errors[kind] += 1


def run_session(url: str, index: int, num_turns: int, max_tokens: int, tally: Tally,
                started: float) -> None:
    """One agent: `num_turns` on main, a fork with one turn, a rewind. Errors that survive the
    SDK's retries are counted and the turn is tried again (a user's loop would)."""
    is_streamed = index % 2 == 1
    with sdk.Client(url, api_key="soak", max_retries=6) as client:
        session = _retry(lambda: client.sessions.create(system="Answer in one sentence."),
                         tally)
        with tally.lock:
            tally.sessions.append(session.id)
        replies: list[str] = []
        for n in range(num_turns):
            text = f"Agent {index}, step {n}: name a tool and what it does."
            reply = _retry(lambda t=text: _append(session, t, max_tokens, is_streamed), tally)
            tally.ack(session.id, reply, started)
            replies.append(reply)
            if n == num_turns // 3:
                alt = _retry(lambda: _fork_and_append(session, f"alt-{index}", replies[-2],
                                                      max_tokens), tally)
                tally.ack(session.id, alt, started)
            if n == 2 * num_turns // 3:
                _retry(lambda: session.rewind("main", replies[-3]), tally)


def _fork_and_append(session: sdk.Session, branch: str, at_turn_id: str,
                     max_tokens: int) -> str:
    if branch not in (session.refresh().branches):  # a retry after the fork landed
        session.fork(at_turn_id, branch)
    return session.append("Try another way.", branch=branch, max_tokens=max_tokens).id


def _append(session: sdk.Session, text: str, max_tokens: int, is_streamed: bool) -> str:
    if not is_streamed:
        return session.append(text, max_tokens=max_tokens).id
    with session.stream(text, max_tokens=max_tokens) as stream:
        shown = "".join(stream.text_stream)
        turn = stream.get_final_turn()
    assert shown == (turn.content or ""), "a continued stream must show the stored text"
    return turn.id


def _retry(call: Any, tally: Tally, attempts: int = 20) -> Any:
    for attempt in range(attempts):
        try:
            return call()
        except (sdk.APIStatusError, sdk.APIConnectionError) as exc:
            tally.error(exc)
            if attempt == attempts - 1:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def kill_when(server: ServeProcess, tally: Tally, target: int, which: str,
              kills: list[dict[str, Any]], started: float) -> None:
    while len(tally.acknowledged) < target:
        time.sleep(0.05)
    pid = int(server.pids()[f"{which}_pid"])
    os.kill(pid, signal.SIGKILL)
    kills.append({"what": which, "pid": pid, "t_s": time.monotonic() - started,
                  "acknowledged_before": len(tally.acknowledged)})
    log(f"SIGKILL {which} (pid {pid}) after {len(tally.acknowledged)} acknowledged turns")


async def check_store(redis_url: str, tally: Tally) -> tuple[int, int]:
    """(acknowledged turns missing from the store, sessions checked); every tree's invariants."""
    redis = Redis.from_url(redis_url)
    try:
        store = SessionStore(redis)
        tenant = "local"
        missing = 0
        for sid, turn_id, _ in tally.acknowledged:
            try:
                await store.get_turn(sid, turn_id, tenant=tenant)
            except Exception:  # noqa: BLE001 - any failure to read it back is a loss
                missing += 1
        for sid in tally.sessions:
            await store.check_invariants(sid)
        return missing, len(tally.sessions)
    finally:
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=Path("bench-results/soak.json"))
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--kv-memory", type=int, default=1024, help="MiB of KV pool")
    args = parser.parse_args()
    notes = machine_notes(embedded_gguf_path())
    total = args.sessions * (args.turns + 1)
    tally, kills = Tally(), list[dict[str, Any]]()
    with tempfile.TemporaryDirectory(prefix="radixgate-soak-") as state:
        server = ServeProcess.start(Path(state), kv_memory_mib=args.kv_memory)
        try:
            baseline = server.wait_ready()
            log(f"serving at {server.url}; {args.sessions} sessions x {args.turns} turns")
            started = time.monotonic()
            threads = [threading.Thread(target=run_session, args=(
                server.url, i, args.turns, args.max_tokens, tally, started))
                for i in range(args.sessions)]
            threads += [threading.Thread(target=kill_when, args=(
                server, tally, total * k // 3, which, kills, started))
                for k, which in ((1, "engine"), (2, "valkey"))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - started
            ready = server.wait_ready(until="store_restarts", value=1)
            missing, num_checked = asyncio.run(check_store(server.pids()["valkey_url"], tally))
            with sdk.Client(server.url, api_key="soak") as client:
                for sid in tally.sessions:
                    client.sessions.delete(sid)
            after = server.wait_ready()
        finally:
            server.stop()
    finish_notes(notes)
    result = {
        "notes": notes, "sessions": args.sessions, "turns_per_session": args.turns,
        "max_tokens": args.max_tokens, "kv_memory_mib": args.kv_memory, "seconds": elapsed,
        "kills": kills,
        "acknowledged": len(tally.acknowledged), "expected": total, "lost": missing,
        "sessions_checked": num_checked, "errors": dict(tally.errors),
        "engine_restarts": ready["engine_restarts"], "store_restarts": ready["store_restarts"],
        "kv_baseline": {k: baseline[k] for k in ("num_held_pages", "num_pins", "num_free_pages")},
        "kv_after_delete": {k: after[k] for k in ("num_held_pages", "num_pins",
                                                  "num_free_pages", "num_cached_pages")},
        "timeline_s": [t for _, _, t in tally.acknowledged],
    }
    summarise(result)
    write_json(args.json, result)
    args.json.with_suffix(".txt").write_text(table(result) + "\n")
    plot(result, plot_path(args.json))


def table(result: dict[str, Any]) -> str:
    before, after = result["kv_baseline"], result["kv_after_delete"]
    errors = ", ".join(f"{k} x{v}" for k, v in sorted(result["errors"].items())) or "none"
    rows = [["turns acknowledged", f"{result['acknowledged']} of {result['expected']}"],
            ["turns lost", result["lost"]],
            ["errors after SDK retries", errors],
            ["engine / Valkey restarts",
             f"{result['engine_restarts']} / {result['store_restarts']}"],
            ["KV pages held by requests: baseline -> after delete",
             f"{before['num_held_pages']} -> {after['num_held_pages']}"],
            ["pins: baseline -> after delete", f"{before['num_pins']} -> {after['num_pins']}"],
            ["evictable cache pages after delete", after["num_cached_pages"]],
            ["wall time", f"{result['seconds']:.0f} s"]]
    return format_table(["soak", "value"], rows)


def summarise(result: dict[str, Any]) -> None:
    print(f"\nSoak: {result['sessions']} sessions x {result['turns_per_session']} turns, "
          "a fork and a rewind each, engine and Valkey SIGKILLed once\n")
    print(table(result))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    times = sorted(result["timeline_s"])
    ax.step(times, range(1, len(times) + 1), where="post", label="turns acknowledged")
    for kill in result["kills"]:
        ax.axvline(kill["t_s"], color="red" if kill["what"] == "engine" else "purple",
                   linestyle="--", label=f"SIGKILL {kill['what']}")
    ax.set(xlabel="seconds", ylabel="acknowledged turns",
           title=f"Soak: {result['acknowledged']} acknowledged, {result['lost']} lost")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
