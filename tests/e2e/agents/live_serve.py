"""A live `radixgate serve` for the agent tests, and what it stored.

`LiveServer` starts the real CLI (`python -m gateway.cli serve`, embedded Valkey under its own
state dir, open access: no key is stored), waits for /readyz, and on `stop()` sends SIGTERM and
then makes sure none of its children (engine worker, Valkey) is left. The sessions it stored are
read back through the native API (`GET /v1/sessions/{sid}`, `GET .../turns/{tid}`); the list of
the tenant's session ids comes from the store itself (`rg:t:local:sessions`), since the API has no
listing route.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from benchmarks.serve_process import ServeProcess, is_alive, wait_gone
from sessions.keys import tenant_index_key

TENANT = "local"  # open access: every request is this tenant
SESSIONS_KEY = tenant_index_key("rg:", TENANT)  # serve's default key prefix "rg:"
_ACCESS_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


@dataclass(frozen=True)
class AssistantTurn:
    """One generated turn as the server stored it."""

    id: str
    depth: int
    input_tokens: int  # the whole prompt of that model call
    cached_tokens: int
    computed_tokens: int
    output_tokens: int
    finish_reason: str | None
    tool_calls: list[dict[str, Any]]

    @property
    def cached_ratio(self) -> float:
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0


class LiveServer:
    def __init__(self, state_dir: Path, *flags: str, kv_memory_mib: int = 1024) -> None:
        """`flags`: more `serve` options (default: the embedded model on one thread)."""
        self.process = ServeProcess.start(state_dir, *(flags or ("--threads", "1")),
                                          kv_memory_mib=kv_memory_mib)
        self.url = self.process.url
        self.http = self.process.http
        self.model = str(self.http.get("/v1/models").json()["data"][0]["id"])

    @property
    def log(self) -> str:
        return self.process.log

    def log_mark(self) -> int:
        """A position in serve's log; `requests_since` reads the access lines after it."""
        return len(self.process.log_path.read_bytes())

    def requests_since(self, mark: int) -> list[tuple[str, str, int]]:
        """(method, path, status) of every HTTP request logged after `mark`."""
        text = self.process.log_path.read_bytes()[mark:].decode(errors="replace")
        return [(m["method"], m["path"], int(m["status"])) for m in _ACCESS_LINE.finditer(text)]

    def session_ids(self) -> list[str]:
        """The tenant's sessions, oldest first."""
        client = redis.Redis.from_url(str(self.process.pids()["valkey_url"]),
                                      decode_responses=True)
        try:
            return [str(sid) for sid in client.zrange(SESSIONS_KEY, 0, -1)]
        finally:
            client.close()

    def session(self, sid: str) -> dict[str, Any]:
        r = self.http.get(f"/v1/sessions/{sid}")
        r.raise_for_status()
        return dict(r.json())

    def assistant_turns(self, sid: str) -> list[AssistantTurn]:
        """The assistant turns on the path from the root to the session's deepest branch head,
        root first, with the usage the server recorded for each."""
        session = self.session(sid)
        by_id = {t["id"]: t for t in session["turns"]}
        head = max(session["branches"].values(), key=lambda tid: by_id[tid]["depth"])
        path: list[dict[str, Any]] = []
        node: str | None = head
        while node is not None:
            path.append(by_id[node])
            node = by_id[node]["parent_id"]
        out = []
        for summary in reversed(path):
            if summary["role"] != "assistant":
                continue
            turn = self.http.get(f"/v1/sessions/{sid}/turns/{summary['id']}").json()
            usage = turn["usage"]
            out.append(AssistantTurn(
                id=turn["id"], depth=turn["depth"], input_tokens=usage["input_tokens"],
                cached_tokens=usage["cached_tokens"], computed_tokens=usage["computed_tokens"],
                output_tokens=usage["output_tokens"], finish_reason=turn.get("finish_reason"),
                tool_calls=list(turn.get("tool_calls") or [])))
        return out

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM, then no child left behind (SIGKILL for any that outlived serve)."""
        try:
            pids = self.process.pids()
        except (OSError, ValueError):
            pids = {}
        children = [p for p in (pids.get("engine_pid"), pids.get("valkey_pid"))
                    if isinstance(p, int) and p > 0]
        self.process.stop(signal.SIGTERM)
        for pid in wait_gone(children, 10.0):
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        assert wait_gone(children, 5.0) == [], "a child of serve outlived it"


def turn_table(turns: list[AssistantTurn]) -> str:
    """One line per turn: prompt, cached, computed, output tokens, cached share, finish."""
    lines = [f"{'#':>2} {'prompt':>6} {'cached':>6} {'computed':>8} {'output':>6} {'ratio':>6}"
             "  finish"]
    for i, t in enumerate(turns, 1):
        lines.append(f"{i:>2} {t.input_tokens:>6} {t.cached_tokens:>6} {t.computed_tokens:>8} "
                     f"{t.output_tokens:>6} {t.cached_ratio:>6.3f}  {t.finish_reason}")
    return "\n".join(lines)
