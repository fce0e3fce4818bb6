"""Claude Code (`@anthropic-ai/claude-code` from npm), unmodified, in `-p` mode with
`--bare --tools Read,Bash` and a short system prompt, against a live `radixgate serve`.

Each run must exit 0 within 5 minutes, and the server's session for it (named by Claude Code's
`X-Claude-Code-Session-Id`, which is the `session_id` of its JSON result) must show every turn
after the first reading the cache. Every request Claude Code sent must have been answered 200
(its first request carries a mid-conversation system message, which the gateway once rejected
with a 400).

- `test_claude_code_continue_reads_the_cache`: a question, then a follow-up with `--continue` (a
  new process that resumes the conversation from its transcript and sends the whole of it
  again). The small model answers in text; it does not call the tools it is offered.
- `test_claude_code_tool_use_reads_the_cache`: the agent loop with a tool. The 135M model does
  not call a tool on its own, so the run asks for one on every request (`tool_choice: any`
  through `CLAUDE_CODE_EXTRA_BODY`) and gives the run a tool that ends it: `--json-schema`, with
  which Claude Code adds its `StructuredOutput` tool and finishes (exit 0) once the model calls
  it. The model calls `Read` on notes.txt, Claude Code runs it, and the file's content tells it
  to answer through `StructuredOutput`. (`--max-turns` would stop a forced loop too, but exits
  1 with `error_max_turns`.)

Client-side settings only, through Claude Code's own options and environment variables:
`CLAUDE_CODE_MAX_OUTPUT_TOKENS=256` (Claude Code asks for 32k-128k output tokens, which the 135M
model on CPU would spend minutes filling) and `CLAUDE_CODE_EXTRA_BODY` with `temperature: 0` (a
reproducible run), plus `tool_choice` in the second test.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agents.claude_code_install import ClaudeCode
from tests.e2e.agents.live_serve import LiveServer, turn_table

pytestmark = pytest.mark.slow

SYSTEM_PROMPT = "You are a coding assistant. Be brief."
PROMPTS = ["Read calc.py.", "In one word: what does add return?"]
BUDGET_S = 300.0


def claude_env(claude_code: ClaudeCode, server: LiveServer, home: Path,
               extra_body: dict[str, Any] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "CLAUDE_", "DISABLE_"))}
    return {**env, "PATH": claude_code.path, "HOME": str(home),
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "anything",  # open access: any key is the local tenant
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256",
            "CLAUDE_CODE_EXTRA_BODY": json.dumps(extra_body or {"temperature": 0})}


def claude_command(claude_code: ClaudeCode, prompt: str, *extra: str) -> list[str]:
    return [str(claude_code.claude), "-p", prompt, *extra, "--bare", "--tools", "Read,Bash",
            "--system-prompt", SYSTEM_PROMPT, "--output-format", "json"]


def server_session(server: LiveServer, claude_session_id: str, before: set[str]) -> str:
    """The one session created since `before` for Claude Code's session id (its hint)."""
    ours = [sid for sid in set(server.session_ids()) - before
            if server.session(sid)["metadata"].get("session_hint") == claude_session_id]
    assert len(ours) == 1, ours
    return ours[0]


def test_claude_code_continue_reads_the_cache(live_server: LiveServer, claude_code: ClaudeCode,
                                             tmp_path: Path) -> None:
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    env = claude_env(claude_code, live_server, home)
    before = set(live_server.session_ids())
    mark = live_server.log_mark()

    started = time.monotonic()
    results: list[dict[str, Any]] = []
    for i, prompt in enumerate(PROMPTS):
        left = BUDGET_S - (time.monotonic() - started)
        command = claude_command(claude_code, prompt, *(["--continue"] if i else []))
        done = subprocess.run(command, cwd=project, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=max(left, 1.0))
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        results.append(json.loads(done.stdout))
    wall = time.monotonic() - started
    print(f"\nClaude Code {claude_code.version()}: {len(PROMPTS)} invocations in {wall:.1f} s")
    for result in results:
        print(f"  {result['subtype']}, {result['num_turns']} turns, "
              f"{result['duration_ms'] / 1000:.1f} s: {result['result'][:80]!r}")
        assert result["is_error"] is False, result
    assert wall < BUDGET_S
    session_ids = {r["session_id"] for r in results}
    assert len(session_ids) == 1, "--continue did not resume the conversation"

    statuses = [(path, s) for _, path, s in live_server.requests_since(mark)
                if path.startswith("/v1/messages")]
    assert statuses and all(s == 200 for _, s in statuses), statuses
    (claude_sid,) = session_ids
    turns = live_server.assistant_turns(server_session(live_server, claude_sid, before))
    print(turn_table(turns))
    assert len(turns) == len(statuses) >= 2
    for i, turn in enumerate(turns[1:], 2):
        assert turn.cached_tokens > 0, f"turn {i} read nothing from the cache"


NOTES = 'The task is done. Now call StructuredOutput with answer "done".\n'
TOOL_PROMPT = "Read notes.txt and do what it says."
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}},
                 "required": ["answer"]}
FORCE_A_TOOL = {"temperature": 0, "tool_choice": {"type": "any",
                                                  "disable_parallel_tool_use": True}}


def test_claude_code_tool_use_reads_the_cache(live_server: LiveServer, claude_code: ClaudeCode,
                                              tmp_path: Path) -> None:
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    (project / "notes.txt").write_text(NOTES)
    before = set(live_server.session_ids())
    mark = live_server.log_mark()

    started = time.monotonic()
    done = subprocess.run(
        claude_command(claude_code, TOOL_PROMPT, "--json-schema", json.dumps(ANSWER_SCHEMA)),
        cwd=project, env=claude_env(claude_code, live_server, home, FORCE_A_TOOL),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=BUDGET_S)
    wall = time.monotonic() - started
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    result = json.loads(done.stdout)
    print(f"\nClaude Code {claude_code.version()} with a tool: {result['subtype']}, "
          f"{result['num_turns']} turns in {wall:.1f} s, result {result['result']!r}")
    assert result["is_error"] is False and result["subtype"] == "success", result
    assert result["structured_output"] == {"answer": "done"}, result

    statuses = [s for _, path, s in live_server.requests_since(mark)
                if path.startswith("/v1/messages")]
    assert statuses == [200] * len(statuses) and len(statuses) >= 2, statuses
    turns = live_server.assistant_turns(server_session(live_server, result["session_id"], before))
    print(turn_table(turns))
    names = [call["name"] for turn in turns for call in turn.tool_calls]
    assert names[0] == "Read" and names[-1] == "StructuredOutput", names
    assert len(turns) == len(statuses)
    for i, turn in enumerate(turns[1:], 2):
        assert turn.cached_tokens > 0, f"turn {i} read nothing from the cache"
