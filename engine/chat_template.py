"""A model's jinja chat template, rendered as HF transformers renders it, plus per-turn deltas.

Sessions append turns to a conversation whose earlier turns are already tokenized and cached, so
they need the text a new turn adds, not the whole conversation again. `render_delta` gives it, and
refuses templates whose rendering of a conversation is not a prefix of the rendering of any
extension of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import InvalidRequest, UnsupportedModel

Message = Mapping[str, Any]

# A one-turn conversation used to derive the generation prompt.
_PROBE: tuple[Message, ...] = ({"role": "user", "content": "Hello"},)


def _raise_exception(message: str) -> None:
    """Templates call `raise_exception(...)` to reject a conversation (HF convention)."""
    raise InvalidRequest(f"chat template rejected the conversation: {message}")


def _tojson(value: Any, indent: int | None = None) -> str:
    # HF's override: keep non-ASCII text readable instead of \\u-escaping it.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def normalize_message(message: Message) -> dict[str, Any]:
    """A copy of `message` with `content` as a str: a list of text blocks (`{"type": "text",
    "text": ...}` or plain strings) is joined, None becomes "". Other keys pass through unchanged.
    Raises `InvalidRequest` for a missing role or a non-text block."""
    role = message.get("role")
    if not isinstance(role, str):
        raise InvalidRequest(f"message role must be a string, got {role!r}")
    content = message.get("content")
    if content is None:
        content = ""
    elif not isinstance(content, str):
        parts: list[str] = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                raise InvalidRequest(f"only text content blocks can be rendered, got {block!r:.80}")
        content = "".join(parts)
    return {**message, "role": role, "content": content}


class ChatTemplate:
    """A compiled chat template. Immutable; `render*` do not mutate their arguments.

    `render(history) + render_delta(history, new) == render(history + new)` and
    `render(m, add_generation_prompt=True) == render(m) + generation_prompt()` for prefix-stable
    templates (ChatML, Llama-3 and most others); methods raise `UnsupportedModel` when a template
    breaks that on the conversation at hand, and `InvalidRequest` when it rejects a conversation.
    """

    __slots__ = ("_source", "_template", "_bos_token", "_eos_token", "_generation_prompt")

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        """Compile `source`. Raises `UnsupportedModel` if it does not compile, cannot render a
        one-user-message conversation, or its generation prompt is not a plain suffix."""
        # The same environment HF transformers uses (minus its assistant-mask tracking).
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise UnsupportedModel(f"chat template does not compile: {exc}") from exc
        self._source = source
        self._bos_token = bos_token
        self._eos_token = eos_token
        try:
            without = self.render(_PROBE)
            with_prompt = self.render(_PROBE, add_generation_prompt=True)
        except InvalidRequest as exc:
            raise UnsupportedModel(f"chat template cannot render one user message: {exc}") from exc
        self._generation_prompt = _suffix_after(without, with_prompt, "the generation prompt")

    @property
    def source(self) -> str:
        return self._source

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = False) -> str:
        """The whole conversation as the model sees it (no tokenization, no BOS beyond what the
        template itself writes)."""
        normalized = [normalize_message(m) for m in messages]
        try:
            return self._template.render(
                messages=normalized,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_token,
                eos_token=self._eos_token,
            )
        except (TemplateError, TypeError, ValueError) as exc:
            # TypeError/ValueError: the template's own logic failing on this conversation's shape.
            raise InvalidRequest(f"chat template failed to render: {exc}") from exc

    def render_delta(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """Text that appending `new_messages` (and the generation prompt, if asked) adds after
        `render(history)`. Raises `UnsupportedModel` if the template rewrites earlier text."""
        head = self.render(history)
        full = self.render([*history, *new_messages], add_generation_prompt=add_generation_prompt)
        return _suffix_after(head, full, f"message #{len(history)}")

    def generation_prompt(self) -> str:
        """What `add_generation_prompt=True` appends, e.g. "<|im_start|>assistant\\n" for ChatML
        (derived from a one-user-turn conversation)."""
        return self._generation_prompt


def _suffix_after(prefix: str, full: str, what: str) -> str:
    if not full.startswith(prefix):
        at = next(
            (i for i, (a, b) in enumerate(zip(prefix, full, strict=False)) if a != b),
            min(len(prefix), len(full)),
        )
        raise UnsupportedModel(
            f"chat template is not prefix-stable: adding {what} changes earlier text at char {at} "
            f"({prefix[at : at + 40]!r} -> {full[at : at + 40]!r}); per-turn rendering needs a "
            "template that only appends"
        )
    return full[len(prefix) :]
