"""Token deltas of new messages, rendered with the model's chat template.

The ledger in Redis is canonical: history is never re-rendered. A delta is what appending the new
messages (plus the generation prompt) adds after the ledger's tokens. The template is asked only
about short synthetic conversations to learn where each piece starts and ends.

Ledger layout per turn:
  root       the rendered system prompt (the template's default one when the session has none),
             with the session's tools written into it (`gateway.tool_prompt`)
  input      [closer of the previous assistant message] + rendered new messages + generation prompt
  assistant  the generated ids (+ the stop token when generation stopped on one)

"closer": the template writes e.g. "<|im_end|>\\n" after an assistant message, but the model stops
at "<|im_end|>", so the next input delta starts with what the ledger lacks ("\\n").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.chat_template import ChatTemplate
from engine.errors import InvalidRequest, UnsupportedModel
from engine.tokenizer import Tokenizer
from gateway.tool_prompt import ToolDef, template_messages, tools_system_content

_PROBE_USER = {"role": "user", "content": "\x00probe\x00"}


class TurnRenderer:
    """Pure functions of one tokenizer; holds no per-request state.

    Raises `UnsupportedModel` at construction if the model has no (prefix-stable) chat template.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        template = tokenizer.chat_template
        if template is None:
            raise UnsupportedModel("the model has no chat template; the session API needs one")
        self.tokenizer = tokenizer
        self.template: ChatTemplate = template
        self._generation_prompt = template.generation_prompt()
        self._default_system = self._default_system_text()
        self.tool_role = self._tool_role()

    def system_token_ids(self, system: str | None, tools: Sequence[ToolDef] = ()) -> list[int]:
        """Token ids of the root turn: the rendered system prompt (with `tools`, if any)."""
        return self.tokenizer.encode(self.system_text(system, tools))

    def system_text(self, system: str | None, tools: Sequence[ToolDef] = ()) -> str:
        if system is None and not tools:
            return self._default_system
        return self.template.render(self._system_messages(system, tools))

    def input_token_ids(self, messages: Sequence[Mapping[str, Any]], *, system: str | None,
                        after_root: bool, closer: str = "",
                        tools: Sequence[ToolDef] = (), note: str | None = None) -> list[int]:
        """Delta of an input turn: `closer` + the new messages + the generation prompt.

        `after_root`: the parent is the root (only the system prompt precedes). Tool calls of
        assistant messages and tool results are written as `gateway.tool_prompt` says. `note`
        (the structured-output instruction, `gateway.response_format.format_note`) ends the last
        message's text, after a blank line: every template renders that, where a system message
        after a user one is refused by some (Gemma's). Raises `InvalidRequest` (engine) if the
        template rejects the conversation.
        """
        msgs = template_messages(messages, tool_role=self.tool_role)
        if note and msgs:
            msgs[-1] = _with_note(msgs[-1], note)
        if after_root:
            full = self.template.render(
                self._system_messages(system, tools) + msgs, add_generation_prompt=True)
            head = self.system_text(system, tools)
            if not full.startswith(head):
                raise UnsupportedModel("the chat template does not start with the system prompt")
            text = full[len(head):]
        else:
            history = [*self._system_messages(system, tools), _PROBE_USER,
                       {"role": "assistant", "content": "."}]
            text = self.template.render_delta(history, msgs, add_generation_prompt=True)
        return self.tokenizer.encode(closer + text)

    def closer(self, content: str, assistant_token_ids: Sequence[int]) -> str:
        """What the template writes after an assistant message that the ledger does not hold."""
        rendered = self.template.render_delta(
            [_PROBE_USER], [{"role": "assistant", "content": content}])
        if rendered.startswith(self._generation_prompt):
            rendered = rendered[len(self._generation_prompt):]
        if not rendered.startswith(content):
            return ""
        tail = rendered[len(content):]
        held = self.tokenizer.decode(assistant_token_ids)
        for k in range(len(tail), 0, -1):
            if held.endswith(tail[:k]):
                return tail[k:]
        return tail

    def _system_messages(self, system: str | None,
                         tools: Sequence[ToolDef] = ()) -> list[dict[str, Any]]:
        if tools:
            return [{"role": "system", "content": tools_system_content(system, tools)}]
        return [] if system is None else [{"role": "system", "content": system}]

    def _tool_role(self) -> str:
        # Hermes writes tool results as role "tool"; a template that rejects or drops that
        # role gets them as "user" (Qwen2.5 does the same).
        probe = "\x00tool\x00"
        try:
            rendered = self.template.render([_PROBE_USER, {"role": "tool", "content": probe}])
        except InvalidRequest:
            return "user"
        return "tool" if probe in rendered else "user"

    def _default_system_text(self) -> str:
        # Text the template puts before the first user message when no system message is given.
        alone = self.template.render([_PROBE_USER])
        user_part = self.template.render_delta([_PROBE_USER], [_PROBE_USER])
        return alone[: len(alone) - len(user_part)] if alone.endswith(user_part) else ""


def _with_note(message: dict[str, Any], note: str) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": f"\n\n{note}"}]}
    return {**message, "content": f"{content or ''}\n\n{note}"}
