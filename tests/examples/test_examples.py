"""Each example runs end to end as a user would run it (`python examples/NAME.py --base-url
URL`), as a subprocess against a live gateway on the real model, and prints its turn table."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk
from tests.examples.live import HAS_TOOL_CALLS, NO_TOOL_CALLS, real_model_gateway

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TABLE_HEADER = ["turn", "branch", "cached", "computed", "output", "ttft_ms", "tools"]


@pytest.fixture(scope="module")
def real_gateway(redis_url: str) -> Iterator[str]:
    with real_model_gateway(redis_url) as base_url:
        yield base_url


def run_example(name: str, base_url: str, *extra: str) -> list[str]:
    done = subprocess.run([sys.executable, str(EXAMPLES / name), "--base-url", base_url, *extra],
                          capture_output=True, text=True, timeout=300, cwd=EXAMPLES.parent)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.split() == TABLE_HEADER for line in lines), done.stdout
    return lines


def table_rows(lines: list[str]) -> list[list[str]]:
    start = next(n for n, line in enumerate(lines) if line.split() == TABLE_HEADER) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def test_best_of_n(real_gateway: str) -> None:
    lines = run_example("best_of_n.py", real_gateway, "--n", "3")
    rows = table_rows(lines)
    assert len(rows) == 4  # the opening turn, then one per branch
    computed = [int(row[3]) for row in rows[1:]]
    assert all(c < computed[0] for c in computed[1:]), lines
    assert any("came from the cache" in line for line in lines)


def test_rewind_retry(real_gateway: str) -> None:
    rows = table_rows(run_example("rewind_retry.py", real_gateway))
    assert len(rows) == 4
    assert all(int(row[2]) > 0 for row in rows[1:])  # every later turn reuses cached history


@pytest.mark.skipif(not HAS_TOOL_CALLS, reason=NO_TOOL_CALLS)
def test_coding_agent(real_gateway: str) -> None:
    lines = run_example("coding_agent.py", real_gateway)
    rows = table_rows(lines)
    assert len(rows) >= 6 and all(row[6] != "-" for row in rows[:6]), lines  # tools each turn
    for row in rows[1:]:  # later turns read most of their prompt from the prefix cache
        cached, computed = int(row[2]), int(row[3])
        assert cached >= 0.8 * (cached + computed), lines
    # The native API: every call's arguments parsed into an object, and the next turn on the
    # branch is the tool turn with one result per call, in order.
    session_id = next(line.split()[1] for line in lines if line.startswith("session "))
    with sdk.Client(real_gateway) as client:
        session = client.sessions.get(session_id)
        chain = [session.get_turn(session.refresh().branches["main"])]
        while chain[-1].parent_id is not None:
            chain.append(session.get_turn(chain[-1].parent_id))
    chain.reverse()
    assistant = [turn for turn in chain if turn.role == "assistant"]
    assert len(assistant) == len(rows) >= 6
    assert all(turn.tool_calls for turn in assistant[:6])
    for turn, after in zip(chain, chain[1:], strict=False):
        if turn.role == "assistant" and turn.tool_calls:
            assert all(isinstance(c["arguments"], dict) for c in turn.tool_calls)
            assert after.role == "tool"
            assert [m["tool_call_id"] for m in after.messages] == [
                c["id"] for c in turn.tool_calls]
            assert all(m["content"] for m in after.messages)
