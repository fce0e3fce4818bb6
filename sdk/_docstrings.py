"""Google-style docstring parsing for tool schemas: the summary and the `Args:` entries."""

from __future__ import annotations

import re

_SECTION_RE = re.compile(r"^(Args|Arguments|Parameters|Params|Keyword Args|Returns|Return|"
                         r"Yields|Raises|Examples?|Notes?|Attributes|See Also|Warnings?):\s*$")
_ARGS_SECTIONS = frozenset({"Args", "Arguments", "Parameters", "Params", "Keyword Args"})
_PARAM_RE = re.compile(r"^\*{0,2}(?P<name>[A-Za-z_]\w*)\s*(\([^)]*\))?\s*:\s*(?P<text>.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) of a cleaned docstring (`inspect.getdoc`).

    The description is the first paragraph, its lines joined by spaces (empty when the
    docstring starts with a section). Entries of an `Args:` section are `name: text` or
    `name (type): text`; more-indented lines continue the entry. Pure."""
    lines = (doc or "").strip().splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION_RE.match(line.strip()):
            break
        summary.append(line.strip())
    return " ".join(summary), _args(lines)


def _args(lines: list[str]) -> dict[str, str]:
    params: dict[str, list[str]] = {}
    in_args, base_indent, current = False, 0, None
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        header = _SECTION_RE.match(stripped)
        if header and indent == 0:
            in_args, current = header.group(1) in _ARGS_SECTIONS, None
            base_indent = 0
            continue
        if not in_args:
            continue
        if stripped and indent == 0:  # unindented text ends the section
            in_args = False
            continue
        if not stripped:
            continue
        match = _PARAM_RE.match(stripped)
        if match and (current is None or indent <= base_indent):
            base_indent, current = indent, match.group("name")
            params[current] = [match.group("text").strip()]
        elif current is not None:
            params[current].append(stripped)
    return {name: " ".join(t for t in text if t) for name, text in params.items()}
