"""A small coding agent: the model lists, reads and writes files and runs shell commands inside a
throwaway sandbox folder, through `sdk.AgentLoop`, which runs the tools it calls and feeds the
results back until it answers.

    make run                                   # the gateway, in another terminal
    .venv/bin/python examples/coding_agent.py  # [--base-url URL] [--api-key KEY]

The sandbox confines paths and the shell's working folder, with a timeout; it is a folder, not a
security boundary.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import sdk

TASK = "Read the file greet.py and explain the bug."
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

    def list_files(self, folder: str = ".") -> list[str]:
        """List the files under a folder of the workspace.

        Args:
            folder: A folder relative to the workspace root.
        """
        base = self._path(folder)
        if not base.is_dir():
            raise FileNotFoundError(f"no folder {folder!r} in the workspace")
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file())

    def read_file(self, path: str) -> str:
        """Read a text file of the workspace.

        Args:
            path: The file's path relative to the workspace root.
        """
        return self._path(path).read_text()[:4000]

    def write_file(self, path: str, content: str) -> str:
        """Write a text file in the workspace, replacing it if it exists.

        Args:
            path: The file's path relative to the workspace root.
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
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)}
        done = subprocess.run(command, shell=True, cwd=self.root, env=env, text=True,
                              capture_output=True, timeout=self.timeout_s)
        return f"exit code {done.returncode}\n{done.stdout}{done.stderr}"[:4000]


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
                system="You are a coding agent. Use the tools to inspect the workspace.",
                max_turns=3, generate={"max_tokens": 48})
            # The first turn must call read_file (a 135M model picks tools poorly); later turns
            # choose for themselves ("auto"). tool_choice="required" would allow any tool.
            result = loop.run(TASK, tool_choice={"name": "read_file"})
        for record in result.turns:
            for ran in record.tool_results:
                first_line = (ran.content.splitlines() or [""])[0][:60]
                print(f"tool {ran.call.name}({ran.call.arguments}) -> {first_line}")
        print(f"\nanswer ({result.stop_reason}): {result.text.strip()}\n")
        print(sdk.turn_table(result.turns))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
