"""mini-swe-agent (PyPI `mini-swe-agent`), unmodified, with its default config (`mini.yaml`),
runs 8 steps on a tiny repo task against a live `radixgate serve`, through litellm's
`openai/<model>` provider with `api_base`.

The 135M model does not solve the task; what is tested is that the agent runs its 8 steps end to
end and that every model call after the first reads at least 90% of its prompt from the cache
(usage as litellm reports it in the agent's trajectory, cross-checked with the turns the server
stored). Client-side options only: `tool_choice=required` (the small model rarely calls a tool on
its own, and three replies without one end the run), `parallel_tool_calls=false` (one command per
step, as the config's instructions ask), `temperature=0` (a reproducible run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agents.live_serve import LiveServer, turn_table

pytestmark = [
    pytest.mark.slow,
    # Not imported here: its __init__ creates ~/.config/mini-swe-agent and loads a .env from it.
    pytest.mark.skipif(importlib.util.find_spec("minisweagent") is None,
                       reason="mini-swe-agent is not installed (pip install mini-swe-agent)")]

STEPS = 8
MIN_CACHED_RATIO = 0.90

CALC = '''\
"""A tiny calculator library."""


def add(a, b):
    """Return the sum of a and b."""
    return a - b


def mul(a, b):
    """Return the product of a and b."""
    return a * b
'''

TEST_CALC = '''\
from calc import add, mul


def test_add():
    assert add(2, 3) == 5


def test_mul():
    assert mul(2, 3) == 6
'''

# An issue as a user would file it: what is wrong, the failing test run, what is expected.
TASK = '''\
calc.add returns the difference of its arguments instead of their sum

The package in the current directory is a tiny calculator library (calc.py, tested by
test_calc.py). Its `add` function is documented as "Return the sum of a and b", but it
subtracts its second argument instead, so every caller that adds two numbers gets a wrong
result. `mul` is fine. The test suite catches it:

```
$ python -m pytest -q test_calc.py
F.                                                                       [100%]
=================================== FAILURES ===================================
___________________________________ test_add ___________________________________

    def test_add():
>       assert add(2, 3) == 5
E       assert -1 == 5
E        +  where -1 = add(2, 3)

test_calc.py:5: AssertionError
=========================== short test summary info ============================
FAILED test_calc.py::test_add - assert -1 == 5
1 failed, 1 passed in 0.03s
```

The code in question, from calc.py:

```python
def add(a, b):
    """Return the sum of a and b."""
    return a - b
```

Expected behaviour: `add(2, 3)` returns 5, `add(-1, 1)` returns 0 and `add(0.5, 0.25)` returns
0.75, for ints and floats alike. Actual behaviour: `add(2, 3)` returns -1, `add(-1, 1)`
returns -2 and `add(0.5, 0.25)` returns 0.25.

Steps to reproduce, outside the test suite:

```
$ python -c "from calc import add; print(add(2, 3), add(-1, 1), add(0.5, 0.25))"
-1 -2 0.25
```

Context: `add` is the building block of the other helpers that downstream code uses to total
invoices and to sum the rows of reports, so the wrong sign silently corrupts every total, and
the numbers look plausible enough that nobody noticed for a while. The bug came in with the
last refactoring of calc.py, which reordered the operators of the two functions; the commit
message says "tidy up", and no test covered `add` until test_calc.py was added this week.

The tests that fail and pass today, from test_calc.py:

```python
from calc import add, mul


def test_add():
    assert add(2, 3) == 5      # fails: add(2, 3) == -1


def test_mul():
    assert mul(2, 3) == 6      # passes
```

| call           | expected | actual |
|----------------|----------|--------|
| add(2, 3)      | 5        | -1     |
| add(-1, 1)     | 0        | -2     |
| add(0.5, 0.25) | 0.75     | 0.25   |
| mul(2, 3)      | 6        | 6      |

Environment: Linux, Python 3.11, pytest 8. Nothing outside the standard library is needed, and
there is no build step: the tests import calc.py straight from the current directory.

Please fix `add` in calc.py so that `python -m pytest -q test_calc.py` passes. Do not change
the test file, and keep the function's name, signature and docstring as they are.
'''


def mini_command(server: LiveServer, traj: Path) -> list[str]:
    """The command line (the `mini` console script of this environment)."""
    mini = Path(sys.executable).with_name("mini")  # installed with the package
    return [
        str(mini), "-y", "--exit-immediately", "-m", f"openai/{server.model}", "-l", "0",
        "-c", "mini.yaml",
        "-c", f"model.model_kwargs.api_base={server.url}/v1",
        "-c", "model.model_kwargs.tool_choice=required",
        "-c", "model.model_kwargs.parallel_tool_calls=false",
        "-c", "model.model_kwargs.temperature=0",
        "-c", "model.model_kwargs.max_tokens=256",
        "-c", f"agent.step_limit={STEPS}",
        "-o", str(traj), "-t", TASK]


def mini_env(config_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "MSWEA_", "LITELLM_"))}
    return {**env,
            "OPENAI_API_KEY": "anything",        # open access: any key is the local tenant
            "MSWEA_CONFIGURED": "true",          # skip the interactive first-run setup
            "MSWEA_GLOBAL_CONFIG_DIR": str(config_dir),  # not the user's ~/.config
            "MSWEA_COST_TRACKING": "ignore_errors",      # litellm has no price for this model
            "LITELLM_LOCAL_MODEL_COST_MAP": "True"}      # no fetch of the remote cost map


def model_calls(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """litellm's response of every model call, in order (a reply that failed to parse keeps
    its response on the message that reports the format error)."""
    return [m["extra"]["response"] for m in trajectory["messages"]
            if isinstance(m.get("extra"), dict) and isinstance(m["extra"].get("response"), dict)]


def test_mini_swe_agent_runs_8_steps_on_the_cache(live_server: LiveServer,
                                                  tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    (repo / "test_calc.py").write_text(TEST_CALC)
    traj, log = tmp_path / "mini.traj.json", tmp_path / "mini.log"
    before = set(live_server.session_ids())
    mark = live_server.log_mark()

    started = time.monotonic()
    with log.open("wb") as out:
        done = subprocess.run(mini_command(live_server, traj), cwd=repo,
                              env=mini_env(tmp_path / "mini-config"), stdin=subprocess.DEVNULL,
                              stdout=out, stderr=subprocess.STDOUT, timeout=600)
    wall = time.monotonic() - started
    output = log.read_text(errors="replace")
    assert done.returncode == 0, output[-4000:]

    trajectory = json.loads(traj.read_text())
    calls = model_calls(trajectory)
    usage = [(c["usage"]["prompt_tokens"],
              (c["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
             for c in calls]
    print(f"\nmini-swe-agent: {len(calls)} model calls in {wall:.1f} s, exit status "
          f"{trajectory['info']['exit_status']}")
    for i, (prompt, cached) in enumerate(usage, 1):
        print(f"  call {i}: prompt {prompt:>5}  cached {cached:>5}  ratio {cached / prompt:.3f}")
    assert trajectory["info"]["exit_status"] == "LimitsExceeded", output[-4000:]
    assert trajectory["info"]["model_stats"]["api_calls"] == STEPS
    assert len(calls) == STEPS
    for i, (prompt, cached) in enumerate(usage[1:], 2):
        assert cached >= MIN_CACHED_RATIO * prompt, f"call {i}: {cached}/{prompt} cached"

    # The server's side: one new session holding the 8 calls as one path of turns.
    (sid,) = set(live_server.session_ids()) - before
    turns = live_server.assistant_turns(sid)
    print(turn_table(turns))
    assert [(t.input_tokens, t.cached_tokens) for t in turns] == usage
    statuses = [s for _, path, s in live_server.requests_since(mark)
                if path.startswith("/v1/chat/completions")]
    assert statuses == [200] * STEPS
