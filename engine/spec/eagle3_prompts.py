"""Training prompts for `radixgate train-draft`, built here from templates (no dataset download).

A draft head learns what its target tends to say next, so the prompts only need to steer the
target into the kinds of text it will serve: tool calls against a tool schema, code edits,
summaries of shell output, short questions and prose. The responses are the target's own
(eagle3_data regenerates them), as EAGLE and SpecForge do.

Each prompt is a list of chat messages ({"role", "content"}); the sequence is deterministic in
its seed, so a resumed run rebuilds the same prompts.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

Message = dict[str, str]

_TOOLS = [
    {"name": "read_file", "description": "Read a file of the repository.",
     "parameters": {"type": "object", "properties": {
         "path": {"type": "string"}, "start_line": {"type": "integer"},
         "end_line": {"type": "integer"}}, "required": ["path"]}},
    {"name": "write_file", "description": "Replace a file's content.",
     "parameters": {"type": "object", "properties": {
         "path": {"type": "string"}, "content": {"type": "string"}},
         "required": ["path", "content"]}},
    {"name": "run_shell", "description": "Run a shell command and return its output.",
     "parameters": {"type": "object", "properties": {
         "command": {"type": "string"}, "timeout_s": {"type": "integer"}},
         "required": ["command"]}},
    {"name": "search", "description": "Search the repository for a pattern.",
     "parameters": {"type": "object", "properties": {
         "pattern": {"type": "string"}, "glob": {"type": "string"}}, "required": ["pattern"]}},
    {"name": "get_weather", "description": "Current weather for a city.",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
         "required": ["city"]}},
    {"name": "send_email", "description": "Send an email.",
     "parameters": {"type": "object", "properties": {
         "to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
         "required": ["to", "subject", "body"]}},
]

_TOOL_SYSTEM = (
    "You are a helpful assistant that can call tools. For each tool call, return a JSON object "
    "with the function name and arguments within <tool_call></tool_call> tags.\n\n# Tools\n"
    "<tools>\n{tools}\n</tools>")

_FILES = ["src/app.py", "src/utils/strings.py", "tests/test_api.py", "lib/parser.py",
          "server/routes.py", "cli/main.py", "models/user.py", "scripts/build.sh",
          "config/settings.toml", "docs/README.md"]
_CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Austin", "Seoul", "Perth"]
_PEOPLE = ["alice@example.com", "bob@example.org", "team@example.net", "carol@example.com"]
_TOPICS = ["photosynthesis", "the French Revolution", "black holes", "compound interest",
           "the water cycle", "TCP handshakes", "vaccines", "plate tectonics", "inflation",
           "neural networks", "the Roman Empire", "climate change", "recursion",
           "the immune system", "supply and demand", "binary search", "volcanoes", "jazz",
           "the printing press", "electric cars", "sleep", "honeybees", "the Moon landing"]
_FUNCS = [
    ("add", "def add(a, b):\n    return a + b\n"),
    ("is_even", "def is_even(n):\n    if n % 2 == 0:\n        return True\n    return False\n"),
    ("mean", "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
             "    return total / len(xs)\n"),
    ("greet", "def greet(name):\n    print('Hello, ' + name + '!')\n"),
    ("read_lines", "def read_lines(path):\n    f = open(path)\n    lines = f.readlines()\n"
                   "    f.close()\n    return lines\n"),
    ("fib", "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
    ("count_words", "def count_words(text):\n    counts = {}\n    for w in text.split():\n"
                    "        counts[w] = counts.get(w, 0) + 1\n    return counts\n"),
    ("clamp", "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n"),
]
_EDITS = ["add type hints to", "add a docstring to", "rename the parameters of",
          "handle the empty-input case in", "rewrite with a list comprehension",
          "add error handling to", "write a unit test for", "explain line by line"]
_SHELL = [
    ("pytest -q", "....F..\n=== FAILURES ===\n___ test_parse_date ___\nAssertionError: "
                  "assert '2024-01-02' == '2024-02-01'\n1 failed, 6 passed in 0.41s"),
    ("git status", "On branch main\nChanges not staged for commit:\n  modified:   src/app.py\n"
                   "  modified:   tests/test_api.py\nUntracked files:\n  notes.txt"),
    ("df -h", "Filesystem  Size  Used Avail Use% Mounted on\n/dev/sda1   50G   47G  3.0G  94% /\n"
              "tmpfs       7.8G     0  7.8G   0% /dev/shm"),
    ("npm install", "npm WARN deprecated request@2.88.2\nadded 312 packages in 14s\n"
                    "3 high severity vulnerabilities"),
    ("ls -la", "total 24\ndrwxr-xr-x 4 dev dev 4096 .\n-rw-r--r-- 1 dev dev  220 README.md\n"
               "-rwxr-xr-x 1 dev dev 1024 build.sh\ndrwxr-xr-x 2 dev dev 4096 src"),
    ("python app.py", "Traceback (most recent call last):\n  File \"app.py\", line 12, in "
                      "<module>\n    main()\n  File \"app.py\", line 8, in main\n    "
                      "return data['user']['id']\nKeyError: 'user'"),
    ("make", "gcc -O2 -c main.c\nmain.c:14:5: warning: unused variable 'n'\n"
             "gcc -o app main.o util.o\nmake: done"),
]
_PROSE = ["Write a short story about {x}.", "Write a poem about {x}.",
          "Describe {x} to a ten-year-old.", "Write a product description for {x}.",
          "Write a friendly email inviting a colleague to talk about {x}.",
          "Give three tips about {x}.", "Summarize the history of {x} in a paragraph."]
_SUBJECTS = ["a lighthouse keeper", "a lost robot", "autumn in the city", "a small bakery",
             "a mountain hike", "a reusable water bottle", "learning to cook", "the ocean",
             "a rainy Sunday", "an old library", "a space station", "a garden in spring"]
_QUESTIONS = ["What is {x}?", "How does {x} work?", "Why is {x} important?",
              "Explain {x} in simple terms.", "What are the main ideas behind {x}?",
              "Give me a short summary of {x}.", "What are common misconceptions about {x}?"]


def _tool_call(rng: random.Random) -> list[Message]:
    tools = rng.sample(_TOOLS, rng.randint(2, len(_TOOLS)))
    system = _TOOL_SYSTEM.format(tools="\n".join(json.dumps(t) for t in tools))
    names = {t["name"] for t in tools}
    asks = []
    if "get_weather" in names:
        asks.append(f"What's the weather in {rng.choice(_CITIES)} right now?")
    if "send_email" in names:
        asks.append(f"Email {rng.choice(_PEOPLE)} that the meeting moves to "
                    f"{rng.randint(1, 11)} pm.")
    if "read_file" in names:
        asks.append(f"Show me the first {rng.randint(10, 80)} lines of {rng.choice(_FILES)}.")
    if "run_shell" in names:
        asks.append(f"Run the tests in {rng.choice(_FILES).split('/')[0]} and tell me if "
                    "they pass.")
    if "search" in names:
        asks.append(f"Find where `{rng.choice(_FUNCS)[0]}` is defined.")
    if not asks:
        asks.append("Which tools can you use? List them.")
    return [{"role": "system", "content": system}, {"role": "user", "content": rng.choice(asks)}]


def _code_edit(rng: random.Random) -> list[Message]:
    name, source = rng.choice(_FUNCS)
    return [{"role": "user", "content": f"Please {rng.choice(_EDITS)} this function "
                                        f"`{name}`:\n\n```python\n{source}```"}]


def _shell_summary(rng: random.Random) -> list[Message]:
    command, output = rng.choice(_SHELL)
    ask = rng.choice(["Summarize this output.", "What went wrong here?",
                      "What should I do next?", "Explain this output briefly."])
    return [{"role": "user", "content": f"I ran `{command}`:\n\n```\n{output}\n```\n\n{ask}"}]


def _question(rng: random.Random) -> list[Message]:
    return [{"role": "user", "content": rng.choice(_QUESTIONS).format(x=rng.choice(_TOPICS))}]


def _prose(rng: random.Random) -> list[Message]:
    subject = rng.choice(_SUBJECTS + _TOPICS)
    return [{"role": "user", "content": rng.choice(_PROSE).format(x=subject)}]


_KINDS: tuple[Callable[[random.Random], list[Message]], ...] = (
    _tool_call, _code_edit, _shell_summary, _question, _prose)


def training_prompts(num: int, seed: int = 0) -> list[list[Message]]:
    """Up to `num` distinct chat prompts cycling through the kinds above (tool calls, code
    edits, shell summaries, questions, prose), varied by a `random.Random(seed)`; fewer when
    the templates run out of distinct prompts (greedy responses to a repeated prompt would
    only repeat). Pure and deterministic."""
    rng = random.Random(seed)
    prompts: list[list[Message]] = []
    seen: set[str] = set()
    for i in range(num * 20):
        if len(prompts) == num:
            break
        prompt = _KINDS[i % len(_KINDS)](rng)
        key = json.dumps(prompt)
        if key not in seen:
            seen.add(key)
            prompts.append(prompt)
    return prompts
