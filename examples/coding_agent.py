"""A small coding agent: the model lists, reads and writes files and runs shell commands inside a
throwaway sandbox folder, through `sdk.AgentLoop`, which runs the tools it calls and feeds the
results back until it answers.

    make run                                   # the gateway, in another terminal
    .venv/bin/python examples/coding_agent.py  # [--base-url URL] [--api-key KEY]

The task is a plan of tool steps. A 135M model left to itself answers in text after a step or
two, so each step's turn is forced to call its tool (`tool_choice={"name": ...}`, one per turn,
in order); the model still writes the arguments. The turn after the plan (`tool_choice="none"`)
ends the run, and a follow-up question continues the session. Every turn extends the one
before, so the prefix cache serves most of each later prompt: see the `cached` column of the
table printed at the end.

The sandbox confines paths and the shell's working folder, with a timeout; it is a folder, not a
security boundary.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import sdk

TASK = """greet.py crashes. Fix it, one tool call per step:
1. list_files to see the workspace.
2. read_file greet.py.
3. run_shell "python greet.py" to see the error.
4. write_file greet.py with the bug fixed.
5. run_shell "python greet.py" again.
6. read_file greet.py to check the fix."""
QUESTION = "What was the bug? Answer in one sentence."
# The tool each step's turn must call; the turn after them answers (the loop's "none").
PLAN = ["list_files", "read_file", "run_shell", "write_file", "run_shell", "read_file"]
FILES = {
    "greet.py": 'def greet(name):\n    return "Hello, " + nme\n\nprint(greet("world"))\n',
    "README.txt": "A tiny project with one script, greet.py.\n",
}


class Sandbox:
    """Tools over one folder: paths must stay inside it; the shell runs there with a timeout."""

    def __init__(self, root: Path, timeout_s: float = 10.0) -> None:
        self.root, self.timeout_s = root.resolve(), timeout_s

    def _path(self, relative: str) -> Path:
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"{relative!r} is outside the workspace")
        return path

    def list_files(self) -> list[str]:
        """List every file of the workspace."""
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())

    def read_file(self, path: str) -> str:
        """Read a text file of the workspace.

        Args:
            path: The file's path relative to the workspace root, e.g. "greet.py".
        """
        return self._path(path).read_text()[:4000]

    def write_file(self, path: str, content: str) -> str:
        """Write a text file in the workspace, replacing it if it exists.

        Args:
            path: The file's path relative to the workspace root, e.g. "greet.py".
            content: The whole new content of the file.
        """
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return f"wrote {len(content)} characters to {path}"

    def run_shell(self, command: str) -> str:
        """Run a shell command in the workspace folder; returns its exit code and output.

        Args:
            command: The command line, e.g. "python greet.py".
        """
        # `python` is this interpreter; HOME is the workspace.
        path = os.pathsep.join([os.path.dirname(sys.executable),
                                os.environ.get("PATH", "/usr/bin:/bin")])
        env = {"PATH": path, "HOME": str(self.root)}
        done = subprocess.run(command, shell=True, cwd=self.root, env=env, text=True,
                              capture_output=True, timeout=self.timeout_s)
        output = f"{done.stdout}{done.stderr}".replace(str(self.root), ".")
        return f"exit code {done.returncode}\n{output[-1000:]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=os.environ.get("RADIXGATE_API_KEY"))
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="radixgate-sandbox-"))
    try:
        for name, text in FILES.items():
            (root / name).write_text(text)
        box = Sandbox(root)
        with sdk.Client(args.base_url, args.api_key) as client:
            loop = sdk.AgentLoop.create(
                client, [box.list_files, box.read_file, box.write_file, box.run_shell],
                system=("You are a coding agent. Use the tools to work in the workspace, "
                        "then answer in plain text."),
                tool_choice="none", max_turns=len(PLAN) + 1, generate={"max_tokens": 96})
            # Turn k calls PLAN[k] (tool_choice="required" would let the model pick any tool);
            # the turn after the plan uses the loop's tool_choice, "none": a text answer.
            result = loop.run(TASK, tool_choice=[{"name": name} for name in PLAN])
            answer = loop.run(QUESTION)  # the same branch: the whole history is cached
        print(f"session {loop.session.id}")  # its turns: GET /v1/sessions/{id}/tree, or the /ui
        for record in result.turns:
            for ran in record.tool_results:
                lines = ran.content.strip().splitlines() or [""]
                shown = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
                print(f"tool {ran.call.name}({ran.call.arguments}) -> {shown[:80]}")
        print(f"\n{QUESTION}\n{answer.text.strip()}\n")
        print(sdk.turn_table(result.turns + answer.turns))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
