"""Claude Code (`@anthropic-ai/claude-code` from npm), unmodified and *without* `--bare`: its
default system prompt and its whole default tool set, against a live
`radixgate serve --model gemma3-270m` (32k context; Claude Code's first request alone is longer
than the embedded model's 8k).

Three `-p` runs, the second and third with `--continue` (each a new process that sends the whole
conversation again). Each must exit 0 with a successful result, every request Claude Code sent
must be answered 200, and every model call after the first must read at least 90% of its prompt
from the prefix cache.

Gemma-3-270M is a base model: the test checks the protocol, not the answer. Through Claude Code's
own options it asks for structured output (`--json-schema`, which adds Claude Code's
`StructuredOutput` tool and ends the run once it is called) and forces that tool on every request
(`tool_choice` in `CLAUDE_CODE_EXTRA_BODY`), so each run is one tool call that the grammar keeps
valid, and the history each `--continue` resends carries tool use and tool results.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agents.claude_code_install import ClaudeCode
from tests.e2e.agents.live_serve import LiveServer, turn_table
from tests.e2e.agents.test_claude_code import claude_env, server_session

pytestmark = pytest.mark.slow

PROMPTS = ["Read calc.py and tell me whether add is correct.",
           "Is the bug in the return line?",
           "Should the fix be a plus sign?"]
ANSWER_SCHEMA = {"type": "object",
                 "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
                 "required": ["answer"]}
FORCE_STRUCTURED = {"temperature": 0,
                    "tool_choice": {"type": "tool", "name": "StructuredOutput",
                                    "disable_parallel_tool_use": True}}
MIN_CACHED_SHARE = 0.9
BUDGET_S = 900.0  # the first request prefills Claude Code's whole prompt on 2 CPU threads


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("serve-gemma"), "--model", "gemma3-270m",
                    "--max-context", "32768", "--threads", "2") as server:
        yield server


def test_claude_code_default_prompt_reads_the_cache(gemma_server: LiveServer,
                                                    claude_code: ClaudeCode,
                                                    tmp_path: Path) -> None:
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    env = claude_env(claude_code, gemma_server, home, FORCE_STRUCTURED)
    before = set(gemma_server.session_ids())
    mark = gemma_server.log_mark()

    started = time.monotonic()
    results: list[dict[str, Any]] = []
    for i, prompt in enumerate(PROMPTS):
        left = BUDGET_S - (time.monotonic() - started)
        command = [str(claude_code.claude), "-p", prompt, *(["--continue"] if i else []),
                   "--json-schema", json.dumps(ANSWER_SCHEMA), "--output-format", "json"]
        done = subprocess.run(command, cwd=project, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=max(left, 1.0))
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        results.append(json.loads(done.stdout))
    wall = time.monotonic() - started
    print(f"\nClaude Code {claude_code.version()} (no --bare) on gemma3-270m: "
          f"{len(PROMPTS)} invocations in {wall:.1f} s")
    for result in results:
        print(f"  {result['subtype']}, {result['num_turns']} turns, "
              f"{result['duration_ms'] / 1000:.1f} s: {result.get('structured_output')!r}")
        assert result["is_error"] is False and result["subtype"] == "success", result
        assert result["structured_output"]["answer"] in ("yes", "no"), result
    assert len({r["session_id"] for r in results}) == 1, "--continue did not resume"

    statuses = [(path, s) for _, path, s in gemma_server.requests_since(mark)
                if path.startswith("/v1/messages")]
    assert statuses and all(s == 200 for _, s in statuses), statuses
    turns = gemma_server.assistant_turns(
        server_session(gemma_server, results[0]["session_id"], before))
    print(turn_table(turns))
    assert len(turns) >= len(PROMPTS)
    # Without --bare the prompt is Claude Code's own: far past the embedded model's 8k.
    assert turns[0].input_tokens > 8192, turns[0]
    names = [call["name"] for turn in turns for call in turn.tool_calls]
    assert names.count("StructuredOutput") == len(PROMPTS), names
    for i, turn in enumerate(turns[1:], 2):
        assert turn.cached_ratio >= MIN_CACHED_SHARE, f"turn {i}: {turn}"

