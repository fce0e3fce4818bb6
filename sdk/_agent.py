"""Sync-agnostic parts of the agent loop: its records and results, the step rule, generate
options, retry planning and timing. `AgentLoop` and `AsyncAgentLoop` (`sdk.agent`) only add I/O.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from sdk._base import MessagesInput
from sdk._output import OutputType
from sdk.tools import Tool, ToolCall, ToolResult, as_tool, parse_tool_call, tool_message
from sdk.types import StreamEvent, Turn, TurnEnd, TurnStart

StopReason = Literal["answered", "max_turns"]
ToolChoice = str | Mapping[str, Any]  # "auto" | "required" | "none" | {"name": ...}
# One tool choice for a run's first turn, or a sequence of them for its first turns in order
# (None in it: the loop's tool choice).
ToolChoicePlan = ToolChoice | Sequence[ToolChoice | None]
DEFAULT_AGENT_NAME = "radixgate-agent"


@dataclass(frozen=True)
class TurnRecord:
    """One assistant turn as the loop saw it. `ttft_s`: seconds from sending the append to the
    first output event (client side, so it includes HTTP and the gateway); `timings`: the
    engine's own phase timings (`queue_s`, `prefill_s`, `decode_s`, `ttft_s`) when sent;
    `tool_results`: the calls of this turn the loop ran, in order."""

    turn: Turn
    ttft_s: float | None = None
    timings: Mapping[str, Any] | None = None
    tool_results: tuple[ToolResult, ...] = ()

    @property
    def turn_id(self) -> str:
        return self.turn.id

    @property
    def branch(self) -> str | None:
        return self.turn.branch

    @property
    def input_tokens(self) -> int:
        return self.turn.usage.input_tokens if self.turn.usage else 0

    @property
    def cached_tokens(self) -> int:
        return self.turn.usage.cached_tokens if self.turn.usage else 0

    @property
    def computed_tokens(self) -> int:
        return self.turn.usage.computed_tokens if self.turn.usage else 0

    @property
    def output_tokens(self) -> int:
        return self.turn.usage.output_tokens if self.turn.usage else 0


@dataclass(frozen=True)
class AgentResult:
    """What one `run` did: every assistant turn in order and why it stopped ("answered": the
    last turn has no tool calls; "max_turns": it still asked for tools, which were not run).
    `output`: with the loop's `output_type`, the answer parsed (a model instance or a JSON
    value) when it "answered"; else None."""

    final_turn: Turn
    turns: tuple[TurnRecord, ...]
    stop_reason: StopReason
    output: Any = None

    @property
    def text(self) -> str:
        return self.final_turn.content or ""


@dataclass(frozen=True)
class Step:
    """What to do after a turn: run `calls`, or stop for `stop_reason`."""

    calls: tuple[ToolCall, ...] = ()
    stop_reason: StopReason | None = None


def next_step(turn: Turn, num_turns: int, max_turns: int) -> Step:
    """The loop rule. `num_turns` counts the assistant turns of this run, `turn` included."""
    calls = tuple(parse_tool_call(raw) for raw in turn.tool_calls)
    if not calls:
        return Step(stop_reason="answered")
    if num_turns >= max_turns:
        return Step(stop_reason="max_turns")
    return Step(calls=calls)


@dataclass(frozen=True)
class RunState:
    """Where one `run` stands: what the next append sends (`messages` with `options`), the
    turns so far, and, once it stopped, `result`. Advanced only by `advance`."""

    messages: MessagesInput
    options: Mapping[str, Any]
    later_options: Mapping[str, Any]  # options of the turns that answer tool results
    max_turns: int
    planned: tuple[Mapping[str, Any], ...] = ()  # options of the next turns, before later_options
    records: tuple[TurnRecord, ...] = ()
    result: AgentResult | None = None
    output_type: OutputType | None = None  # parses the answer into `AgentResult.output`

    def step(self, turn: Turn) -> Step:
        """What to do after `turn`, the next assistant turn of this run."""
        return next_step(turn, len(self.records) + 1, self.max_turns)


def start_run(messages: MessagesInput, base: Mapping[str, Any], overrides: Mapping[str, Any], *,
              first_tool_choice: ToolChoicePlan | None, tool_choice: ToolChoice | None,
              max_turns: int, output_type: OutputType | None = None) -> RunState:
    """The state before a run's first append: `overrides` apply to every turn of the run,
    `first_tool_choice` (else the loop's `tool_choice`) to the first turn only, or, a sequence,
    to the first turns in order (turns past its end use the loop's); with `output_type` every
    turn asks for its `response_format`."""
    if output_type is not None:
        base = {"response_format": output_type.response_format, **base}
    plan = tool_choice_plan(first_tool_choice) or (None,)
    options = [turn_options(base, overrides, choice or tool_choice) for choice in plan]
    return RunState(messages, options[0], turn_options(base, overrides, tool_choice), max_turns,
                    planned=tuple(options[1:]), output_type=output_type)


def tool_choice_plan(choice: ToolChoicePlan | None) -> tuple[ToolChoice | None, ...]:
    """`first_tool_choice` as one tool choice per turn (empty for None)."""
    if choice is None:
        return ()
    if isinstance(choice, (str, Mapping)):
        return (choice,)
    return tuple(choice)


def advance(state: RunState, turn: Turn, timing: StreamTiming, step: Step,
            results: Sequence[ToolResult]) -> RunState:
    """The state after `turn` and its tool `results` (one per `step.calls`). Pure. Raises
    OutputError when the answer does not parse as the run's `output_type`."""
    records = (*state.records, make_record(turn, timing, results))
    if step.stop_reason is not None:
        output = None
        if state.output_type is not None and step.stop_reason == "answered":
            output = state.output_type.parse(turn.content or "")
        return replace(state, records=records,
                       result=AgentResult(turn, records, step.stop_reason, output))
    options, planned = ((state.planned[0], state.planned[1:]) if state.planned
                        else (state.later_options, ()))
    return replace(state, messages=tool_messages(results), options=options, planned=planned,
                   records=records)


def tool_messages(results: Iterable[ToolResult]) -> list[dict[str, Any]]:
    return [tool_message(result) for result in results]


def tool_table(tools: Iterable[Tool | Callable[..., Any]], *, allow_async: bool) -> dict[str, Tool]:
    """Tools by name. Raises ValueError on a duplicate name, TypeError for a coroutine tool when
    `allow_async` is false (the sync loop cannot await it)."""
    table: dict[str, Tool] = {}
    for item in tools:
        built = as_tool(item)
        if built.name in table:
            raise ValueError(f"two tools are named {built.name!r}")
        if built.is_async and not allow_async:
            raise TypeError(f"tool {built.name!r} is async: use AsyncAgentLoop")
        table[built.name] = built
    return table


def turn_options(base: Mapping[str, Any], overrides: Mapping[str, Any],
                 tool_choice: ToolChoice | None) -> dict[str, Any]:
    """The `generate` options of one append: the loop's, then the call's, then `tool_choice`."""
    options = {**base, **overrides}
    if tool_choice is not None:
        options["tool_choice"] = tool_choice
    return options


def best_of_branches(branch: str, n: int, suffix: str | None = None) -> list[str]:
    """n fresh branch names beside `branch` (valid names: [A-Za-z0-9._-])."""
    suffix = suffix or secrets.token_hex(3)
    return [f"{branch}.best{k}-{suffix}" for k in range(n)]


def retry_plan(target: Turn, input_turn: Turn | None) -> tuple[str, list[dict[str, Any]]]:
    """(turn to rewind to, messages to send again) to redo `target` with no new message.

    `target` is an input turn (user/tool: redo it), or an assistant turn, whose `input_turn`
    (its parent) is sent again. Raises ValueError for a root or system turn."""
    redo = input_turn if target.role == "assistant" else target
    if redo is None or redo.role not in ("user", "tool") or redo.parent_id is None:
        raise ValueError(f"turn {target.id} ({target.role}) has no input turn to send again")
    return redo.parent_id, [dict(m) for m in redo.messages]


# ---- timing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamTiming:
    """Clock readings of one streamed turn (seconds, on the loop's clock)."""

    started: float
    first_output: float | None = None
    timings: Mapping[str, Any] | None = None


def observe(timing: StreamTiming, event: StreamEvent, now: float) -> StreamTiming:
    """The timing after `event`. Pure. The first event after `turn_start` (text, a tool call,
    or the turn's end when it produced nothing to stream) marks the first output."""
    if isinstance(event, TurnStart):
        return timing
    if timing.first_output is None:
        timing = replace(timing, first_output=now)
    if isinstance(event, TurnEnd):
        timing = replace(timing, timings=event.timings)
    return timing


def turn_attributes(turn: Turn) -> dict[str, str | int]:
    """Span attributes of one assistant turn, for the loop's `invoke_agent` span."""
    attributes: dict[str, str | int] = {"radixgate.turn.id": turn.id}
    if turn.finish_reason:
        attributes["radixgate.turn.finish_reason"] = turn.finish_reason
    if turn.usage is not None:
        attributes.update({"gen_ai.usage.input_tokens": turn.usage.input_tokens,
                           "gen_ai.usage.output_tokens": turn.usage.output_tokens,
                           "gen_ai.usage.cache_read.input_tokens": turn.usage.cached_tokens})
    return attributes


def make_record(turn: Turn, timing: StreamTiming,
                results: Sequence[ToolResult] = ()) -> TurnRecord:
    ttft = None if timing.first_output is None else timing.first_output - timing.started
    return TurnRecord(turn, ttft, timing.timings, tuple(results))


def turn_table(records: Iterable[TurnRecord]) -> str:
    """A small text table: one row per turn with its cached/computed/output tokens and TTFT."""
    rows = [("turn", "branch", "cached", "computed", "output", "ttft_ms", "tools")]
    for n, record in enumerate(records, 1):
        ttft = "-" if record.ttft_s is None else f"{record.ttft_s * 1000:.0f}"
        tools = ",".join(r.call.name + ("!" if r.is_error else "") for r in record.tool_results)
        rows.append((str(n), record.branch or "-", str(record.cached_tokens),
                     str(record.computed_tokens), str(record.output_tokens), ttft, tools or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) if i in (0, 2, 3, 4, 5) else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
                     .rstrip() for row in rows)
