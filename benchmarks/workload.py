"""Deterministic agent trajectories built from real text (Python standard-library sources).

A trajectory is what an agent loop sends turn after turn: a system prompt with tool schemas, a
task, then assistant tool calls (JSON) and tool results (file reads, shell output, edits that
re-emit a file with a small change). Every turn's prompt extends the previous one; the rendered
ChatML text is returned per turn so any engine can tokenise or be fed the same ids.
"""

from __future__ import annotations

import json
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

STDLIB_FILES = (
    "json/decoder.py", "json/encoder.py", "textwrap.py", "difflib.py", "shlex.py",
    "fnmatch.py", "glob.py", "bisect.py", "heapq.py", "string.py", "queue.py", "sched.py",
    "colorsys.py", "keyword.py", "struct.py", "netrc.py", "tabnanny.py", "graphlib.py",
)

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file of the repository.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "start_line": {"type": "integer"},
            "end_line": {"type": "integer"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command in the sandbox.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string"}, "timeout_s": {"type": "number"}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Replace a file's content.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the repository for a regular expression.",
        "parameters": {"type": "object", "properties": {
            "pattern": {"type": "string"}, "glob": {"type": "string"}},
            "required": ["pattern"]}}},
]

SYSTEM = (
    "You are a careful software engineering agent working in a Python repository. You can call "
    "tools. For each tool call, return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> tags. Read before you edit, run the tests after every change, and "
    "keep your answers short.\n\n# Tools\n<tools>\n{tools}\n</tools>"
)


@dataclass(frozen=True)
class TurnText:
    kind: str  # "task", "read_file", "run_shell", "write_file", "search"
    text: str  # ChatML text appended to the conversation at this turn, ending with the
    # assistant generation prompt


def stdlib_source(name: str) -> str:
    return (Path(sysconfig.get_paths()["stdlib"]) / name).read_text()


def _call(name: str, arguments: dict[str, object]) -> str:
    call = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{call}\n</tool_call><|im_end|>\n"


def _result(body: str) -> str:
    return (f"<|im_start|>user\n<tool_response>\n{body}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n")


def agent_trajectory(num_turns: int, seed: int = 0) -> list[TurnText]:
    """`num_turns` turns: the first holds system prompt and task; each later one holds the
    assistant's tool call for the previous turn plus the tool's result."""
    rng = random.Random(seed)
    files = list(STDLIB_FILES)
    rng.shuffle(files)
    system = SYSTEM.format(tools="\n".join(json.dumps(t) for t in TOOLS))
    task = ("The JSON decoder in this repository reports wrong line numbers for errors in long "
            "documents. Find the cause, fix it, and make sure the test suite passes.")
    turns = [TurnText("task", f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
                              f"{task}<|im_end|>\n<|im_start|>assistant\n")]
    last_read = ""
    for i in range(1, num_turns):
        kind = rng.choices(["read_file", "run_shell", "search", "write_file"],
                           weights=[5, 2, 2, 1 if last_read else 0])[0]
        if kind == "read_file":
            path = files[i % len(files)]
            lines = stdlib_source(path).splitlines()
            start = rng.randrange(0, max(1, len(lines) - 60))
            end = start + rng.randrange(10, 30)
            body = "\n".join(lines[start:end])
            last_read = body
            text = _call("read_file", {"path": f"Lib/{path}", "start_line": start + 1,
                                       "end_line": end}) + _result(body)
        elif kind == "run_shell":
            failed = rng.randrange(0, 4)
            body = (f"============ test session starts ============\ncollected "
                    f"{rng.randrange(40, 90)} items\n\n" + "".join(
                        f"tests/test_{rng.choice(['decoder', 'scanner', 'tool'])}.py "
                        f"{'.' * rng.randrange(5, 30)}\n" for _ in range(4)) +
                    f"\n===== {failed} failed, {rng.randrange(40, 90)} passed in "
                    f"{rng.random() * 3:.2f}s =====")
            text = _call("run_shell", {"command": "python -m pytest -q tests/"}) + _result(body)
        elif kind == "search":
            word = rng.choice(["lineno", "colno", "JSONDecodeError", "scanstring", "end"])
            hits = "\n".join(f"Lib/json/decoder.py:{rng.randrange(1, 350)}: ... {word} ..."
                             for _ in range(rng.randrange(3, 9)))
            text = _call("search", {"pattern": word, "glob": "*.py"}) + _result(hits)
        else:
            edited = last_read.replace("self", "this", 1).replace("  ", " ", 1)
            text = _call("write_file", {"path": "Lib/json/decoder.py", "content": edited}) + \
                _result("wrote 1 file")
        turns.append(TurnText(kind, text))
    return turns
