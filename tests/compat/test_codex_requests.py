"""The requests Codex CLI 0.171 really sends (captured by `tests/e2e/agents/codex_install.py`'s
setup: `tests/compat/fixtures/codex_request_{1,2}.json`, the second from `codex exec resume`).

Accepted as they are (developer messages, id-less replays, a `namespace` and a `web_search` tool,
`client_metadata`, `reasoning`, `include`), counted by `input_tokens`, and placed by prefix: the
resend's conversation extends the first one's path hashes, so it lands on the first one's turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.compat.responses_items import (
    native_messages,
    native_tools,
    normalize_input,
    split_system,
)
from sessions import path_hashes, root_path_hash
from tests.compat.conftest import Live

FIXTURES = Path(__file__).parent / "fixtures"


def _request(n: int) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / f"codex_request_{n}.json").read_text())
    return body


def _hashes(body: dict[str, Any]) -> list[str]:
    leading, messages = split_system(native_messages(normalize_input(body["input"])))
    tools, _ = native_tools(body["tools"])
    root = root_path_hash(model="m", system="\n".join(leading), tools=tools)
    return path_hashes(root, messages)


def test_resend_extends_the_first_requests_path() -> None:
    first, second = _hashes(_request(1)), _hashes(_request(2))
    assert len(first) == 3 and len(second) == 5  # root, 2 user messages; + reply, + user
    assert second[:3] == first
    tools, custom = native_tools(_request(1)["tools"])
    assert len(tools) == 7 and not custom  # the namespace and web_search are not offered


def test_captured_requests_are_accepted(live: Live) -> None:
    with live.http() as http:
        counts = []
        for n in (1, 2):
            body = {**_request(n), "model": "gpt-5-codex"}
            body.pop("stream")
            r = http.post("/v1/responses/input_tokens", json=body)
            assert r.status_code == 200, r.text
            counts.append(r.json()["input_tokens"])
    assert 4000 < counts[0] < counts[1]
