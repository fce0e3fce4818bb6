"""The OpenAI Codex CLI (`@openai/codex` from npm), unmodified, against a live `radixgate serve`
with the embedded SmolLM2-135M (8k context: with the served catalogue's short
`base_instructions`, Codex's first prompt is about 2.6k tokens).

Codex is configured as a user would point it at radixgate (`$CODEX_HOME/config.toml`: a
`responses` provider, and `model_catalog_url` + `features.api_key_model_discovery`, so it reads
the served model's metadata from `GET /v1/models` instead of warning "Model metadata for `X` not
found. Defaulting to fallback metadata"). Two invocations run in the same project directory:
`codex exec` with a question, then `codex exec resume --last` with a follow-up (a new process
that resends the whole conversation, `store: false`, its session id as `prompt_cache_key`).
Each must exit 0 with a final message, every request Codex sent must be answered 200, Codex must
not print the fallback-metadata warning, and the second model call must read at least 90% of its
prompt from the prefix cache (the server's turn for it; Codex's `--json` `turn.completed` usage is
printed beside it).

Codex's whole default tool set is offered (7 function tools, a namespace tool, web search), and
Codex sends no temperature (nor has an option for one), so the 135M model samples at 1.0. Through
Codex's own `--output-schema` the answer is a yes/no JSON object (the grammar keeps it short and
well-formed); about 80% of first calls answer, the others call a tool, which Codex runs and
sends back, and the loop goes on until an answer. What a sampled model can do that no server can
help: a tool call whose arguments run to the output limit (4096 tokens; Codex sends no
`max_output_tokens`), which Codex reports as a failed turn ("Incomplete response returned,
reason: max_output_tokens", exit 1); and (Codex 0.171's default `goals` tools) a first
invocation in which the model called `create_goal` and never completed the goal, after which
`codex exec resume --output-schema` refuses to start before sending anything
("ActiveTurnOutputSchemaMismatch": Codex resumes the goal's own turn, which has no output schema).
Only those outcomes, with every request answered 200, start the pair again (a fresh `CODEX_HOME`
and project), at most `ATTEMPTS` times; anything else fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agents.claude_code_install import cache_dir
from tests.e2e.agents.codex_install import Codex, install_codex
from tests.e2e.agents.live_serve import LiveServer, turn_table
from tests.e2e.agents.test_claude_code import server_session

pytestmark = pytest.mark.slow

PROMPTS = ["Read calc.py and tell me whether add is correct.", "Is the bug in the return line?"]
ANSWER_SCHEMA = {"type": "object",
                 "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
                 "required": ["answer"], "additionalProperties": False}
MIN_CACHED_SHARE = 0.9
INVOCATION_TIMEOUT_S = 420.0  # a call that runs to 4096 output tokens takes 2-3 minutes
ATTEMPTS = 3
FALLBACK_WARNING = "Defaulting to fallback metadata"
OUT_OF_TOKENS = "Incomplete response returned, reason: max_output_tokens"
UNFINISHED_GOAL = "ActiveTurnOutputSchemaMismatch"
CODEX_PATHS = ("/v1/models", "/v1/responses")


@pytest.fixture(scope="module")
def codex() -> Codex:
    return install_codex()  # skips the test when npm or its registry is unavailable


def codex_config(server: LiveServer) -> str:
    return (f'model = "{server.model}"\n'
            'model_provider = "radixgate"\n'
            "[model_providers.radixgate]\n"
            'name = "radixgate"\n'
            f'base_url = "{server.url}/v1"\n'
            'env_key = "RADIXGATE_API_KEY"\n'
            'wire_api = "responses"\n'
            f'model_catalog_url = "{server.url}/v1/models"\n'
            "[features]\n"
            "api_key_model_discovery = true\n")


@dataclass(frozen=True)
class Invocation:
    """One `codex exec` process: its exit status, its `--json` events, its stderr."""

    returncode: int
    events: list[dict[str, Any]]
    stdout: str
    stderr: str

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]

    @property
    def thread_id(self) -> str:
        (started,) = self.of_type("thread.started")
        return str(started["thread_id"])

    @property
    def final_message(self) -> str | None:
        texts = [e["item"]["text"] for e in self.of_type("item.completed")
                 if e["item"].get("type") == "agent_message"]
        return texts[-1] if texts else None

    @property
    def usage(self) -> dict[str, Any]:
        done = self.of_type("turn.completed")
        return dict(done[-1]["usage"]) if done else {}

    def report(self) -> str:
        return (f"exit {self.returncode}\nstdout:\n{self.stdout[-4000:]}\n"
                f"stderr:\n{self.stderr[-2000:]}")


def run_codex(codex: Codex, args: list[str], *, project: Path, env: dict[str, str]
              ) -> Invocation:
    done = subprocess.run([str(codex.codex), *args], cwd=project, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=INVOCATION_TIMEOUT_S)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return Invocation(done.returncode, events, done.stdout, done.stderr)


def run_pair(codex: Codex, server: LiveServer, root: Path) -> list[Invocation]:
    """`codex exec`, then (if it succeeded) `codex exec resume --last`, in a fresh
    `CODEX_HOME` and project under `root`."""
    home, project = root / "codex-home", root / "project"
    home.mkdir()
    project.mkdir()
    (home / "config.toml").write_text(codex_config(server))
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    schema = root / "answer.schema.json"
    schema.write_text(json.dumps(ANSWER_SCHEMA))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "CODEX_", "RADIXGATE_"))}
    env.update(CODEX_HOME=str(home), HOME=str(root), RADIXGATE_API_KEY="anything")
    invocations: list[Invocation] = []
    for i, prompt in enumerate(PROMPTS):
        resume = ["resume", "--last"] if i else []
        args = ["exec", *resume, "--skip-git-repo-check", "--json",
                "--output-schema", str(schema), prompt]
        invocations.append(run_codex(codex, args, project=project, env=env))
        if invocations[-1].returncode != 0:
            break
    return invocations


def sampled_model_outcome(invocations: list[Invocation]) -> str | None:
    """Why a failed pair is the sampled model's doing, or None when it is not."""
    last = invocations[-1]
    if OUT_OF_TOKENS in last.stdout:
        return "the model ran out of output tokens in a tool call"
    if (len(invocations) == 2 and invocations[0].returncode == 0
            and UNFINISHED_GOAL in last.stderr):
        return "the model left a Codex goal unfinished, so resume refused the output schema"
    return None


def test_codex_exec_and_resume_read_the_cache(live_server: LiveServer, codex: Codex) -> None:
    version = codex.version()
    started = time.monotonic()
    for attempt in range(1, ATTEMPTS + 1):
        before = set(live_server.session_ids())
        mark = live_server.log_mark()
        attempt_started = time.monotonic()
        # CODEX_HOME outside /tmp: Codex refuses to put its helper aliases under /tmp (a warning).
        with tempfile.TemporaryDirectory(prefix="codex-", dir=cache_dir()) as root:
            invocations = run_pair(codex, live_server, Path(root))
        wall = time.monotonic() - attempt_started
        requests = [(m, p, s) for m, p, s in live_server.requests_since(mark)
                    if p.startswith(CODEX_PATHS)]
        details = "\n".join(inv.report() for inv in invocations)
        assert requests and all(s == 200 for _, _, s in requests), f"{requests}\n{details}"
        for inv in invocations:
            assert FALLBACK_WARNING not in inv.stdout + inv.stderr, inv.report()
        if len(invocations) == len(PROMPTS) and invocations[-1].returncode == 0:
            break
        # The only failures retried: what the sampled model did, not the server (see above).
        assert sampled_model_outcome(invocations), details
        print(f"\nattempt {attempt}: {sampled_model_outcome(invocations)} ({wall:.1f} s); "
              "starting again")
    else:
        pytest.fail(f"{ATTEMPTS} attempts, each ended by what the sampled model did")

    answers = []
    for inv in invocations:
        assert inv.returncode == 0, inv.report()
        assert not inv.of_type("turn.failed"), inv.report()
        message = inv.final_message
        assert message, f"no final message\n{inv.report()}"
        answers.append(json.loads(message)["answer"])
    assert set(answers) <= {"yes", "no"}, answers
    thread_ids = {inv.thread_id for inv in invocations}
    assert len(thread_ids) == 1, f"resume --last did not continue the thread: {thread_ids}"
    assert any(m == "GET" and p.startswith("/v1/models") for m, p, _ in requests), \
        "Codex never read the model catalogue"

    posts = [s for m, p, s in requests if m == "POST" and p.startswith("/v1/responses")]
    turns = live_server.assistant_turns(server_session(live_server, thread_ids.pop(), before))
    assert len(turns) == len(posts) >= len(PROMPTS), (len(turns), requests)
    second = turns[1]
    print(f"\nCodex {version} on {live_server.model}: {len(PROMPTS)} invocations, "
          f"{len(posts)} model calls in {wall:.1f} s (attempt {attempt}, "
          f"{time.monotonic() - started:.1f} s in all); answers {answers}; second call read "
          f"{second.cached_tokens}/{second.input_tokens} = {second.cached_ratio:.1%} "
          "from the cache")
    print("codex --json usage per invocation:", [inv.usage for inv in invocations])
    print(turn_table(turns))
    assert second.cached_ratio >= MIN_CACHED_SHARE, second
