"""`AgentLoop` / `AsyncAgentLoop`: run Python tools for the model until it answers.

    loop = AgentLoop.create(client, tools=[read_file], system="You are a coding agent.")
    result = loop.run("What does main.py do?", max_tokens=128)
    print(result.text); print(turn_table(result.turns))

With `output_type` (a pydantic model class or a JSON-schema dict) every turn is either tool calls
or a JSON answer matching its schema (the gateway's grammar guarantees it), and `result.output`
is that answer parsed (`sdk._output`).

Each iteration appends one turn (streamed, for TTFT), runs the tool calls the assistant turn
asks for, and appends their results as `tool` messages, until a turn has no tool calls or
`max_turns` is reached. `best_of` forks n branches from one turn; `retry_from` rewinds the loop's
branch and runs again. Every iteration is an `invoke_agent` span and every tool call an
`execute_tool` span (no-ops without opentelemetry); run the loop inside a span of your own to
make a whole run one trace. The twins differ only in `async`/`await`; the rules live in
`sdk._agent` and `sdk.tools`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sdk._agent import (
    DEFAULT_AGENT_NAME,
    AgentResult,
    RunState,
    StreamTiming,
    ToolChoice,
    ToolChoicePlan,
    TurnRecord,
    advance,
    best_of_branches,
    make_record,
    observe,
    retry_plan,
    start_run,
    tool_table,
    turn_attributes,
    turn_options,
    turn_table,
)
from sdk._base import MessagesInput
from sdk._output import OutputError, OutputType, OutputTypeLike
from sdk._resources import AsyncSession, Session
from sdk._tracing import agent_span, tool_span, workflow_span
from sdk.tools import Tool, ToolCall, ToolResult, arun_tool, run_tool
from sdk.types import BranchState, Turn

if TYPE_CHECKING:
    from sdk._client import AsyncClient, Client

__all__ = ["AgentLoop", "AgentResult", "AsyncAgentLoop", "OutputError", "TurnRecord",
           "turn_table"]

ToolLike = Tool | Callable[..., Any]


class _LoopBase:
    """Configuration and branch-head bookkeeping shared by the twins.

    `session` must have been created with these tools declared (`create` does that).
    `branch`: where the loop appends (default: the session handle's). `generate`: options of
    every append (`max_tokens`, `temperature`, ...); `tool_choice`: sent with every append when
    set (the server's default is "auto"). `output_type`: the answer's type (module docstring).
    `clock`: seconds, for TTFT (injectable for tests). `tracer_provider`: an OpenTelemetry
    provider for the loop's spans (default: the global one)."""

    def __init__(self, tools: dict[str, Tool], branch: str, head_turn_id: str | None, *,
                 max_turns: int, name: str, tool_choice: ToolChoice | None,
                 generate: Mapping[str, Any] | None, clock: Callable[[], float],
                 tracer_provider: Any | None, output_type: OutputTypeLike | None) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        self.tools = tools
        self.branch = branch
        self.head_turn_id = head_turn_id
        self.max_turns = max_turns
        self.name = name
        self.tool_choice = tool_choice
        self.generate = dict(generate or {})
        self._clock = clock
        self.tracer_provider = tracer_provider
        self.output_type = None if output_type is None else OutputType.of(output_type)

    def _options(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        return turn_options(self.generate, overrides, self.tool_choice)

    def _start(self, message: MessagesInput, overrides: Mapping[str, Any],
               tool_choice: ToolChoicePlan | None) -> RunState:
        return start_run(message, self.generate, overrides, first_tool_choice=tool_choice,
                         tool_choice=self.tool_choice, max_turns=self.max_turns,
                         output_type=self.output_type)

    def _track_turn(self, turn: Turn) -> None:
        if turn.branch == self.branch:
            self.head_turn_id = turn.id

    def _track_branches(self, state: BranchState) -> None:
        self.head_turn_id = state.branches.get(self.branch, self.head_turn_id)


class AgentLoop(_LoopBase):
    """Synchronous agent loop over a `Session`. Tools must be plain (not async) callables."""

    def __init__(self, session: Session, tools: Iterable[ToolLike] = (), *,
                 branch: str | None = None, max_turns: int = 8, name: str = DEFAULT_AGENT_NAME,
                 tool_choice: ToolChoice | None = None,
                 generate: Mapping[str, Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 tracer_provider: Any | None = None,
                 output_type: OutputTypeLike | None = None) -> None:
        branch = branch or session.branch
        head = session.head_turn_id if branch == session.branch else None
        super().__init__(tool_table(tools, allow_async=False), branch, head,
                         max_turns=max_turns, name=name, tool_choice=tool_choice,
                         generate=generate, clock=clock, tracer_provider=tracer_provider,
                         output_type=output_type)
        self.session = session

    @classmethod
    def create(cls, client: Client, tools: Iterable[ToolLike] = (), *, system: str | None = None,
               model: str | None = None, metadata: dict[str, Any] | None = None,
               **loop_options: Any) -> AgentLoop:
        """A new session on `client` (a `Client`) declaring `tools`, and a loop over it."""
        table = tool_table(tools, allow_async=False)
        session = client.sessions.create(model=model, system=system, metadata=metadata,
                                         tools=[t.to_openai() for t in table.values()])
        return cls(session, table.values(), **loop_options)

    def run(self, message: MessagesInput, *, tool_choice: ToolChoicePlan | None = None,
            **generate: Any) -> AgentResult:
        """Append `message` to the loop's branch and loop until the model answers without tool
        calls or `max_turns` turns were generated. `generate` overrides the loop's options for
        every turn of this run; `tool_choice` applies to the first turn only, or, a list (e.g.
        `[{"name": "read_file"}, "required", "none"]`), to the first turns in order; later turns
        use the loop's. Raises the SDK's API errors; never raises for a tool (its error text goes
        back to the model)."""
        state = self._start(message, generate, tool_choice)
        with workflow_span(self.name, self.session.id, tracer_provider=self.tracer_provider):
            while state.result is None:
                with agent_span(self.name, self.session.id,
                                tracer_provider=self.tracer_provider) as span:
                    turn, timing = self._turn(state.messages, state.options, branch=self.branch)
                    span.set_attributes(turn_attributes(turn))
                    step = state.step(turn)
                    results = [self._run_tool(call) for call in step.calls]
                state = advance(state, turn, timing, step, results)
        return state.result

    def best_of(self, n: int, message: MessagesInput, *, from_turn_id: str | None = None,
                temperature: float = 0.8, seed: int = 0, **generate: Any) -> list[TurnRecord]:
        """Fork n branches at `from_turn_id` (default: the loop's head) and append `message` to
        each with `temperature` and seeds `seed`, `seed + 1`, ... One turn per branch, no tool
        runs; the loop's branch does not move. Branches are `<branch>.best<k>-<random>`."""
        parent = from_turn_id or self.head_turn_id or self._refresh_head()
        options = self._options({**generate, "temperature": temperature})
        records = []
        for k, branch in enumerate(best_of_branches(self.branch, n)):
            self.session.fork(parent, branch)
            with agent_span(self.name, self.session.id,
                            tracer_provider=self.tracer_provider) as span:
                turn, timing = self._turn(message, {**options, "seed": seed + k}, branch=branch)
                span.set_attributes(turn_attributes(turn))
            records.append(make_record(turn, timing))
        return records

    def retry_from(self, turn_id: str, message: MessagesInput | None = None,
                   **generate: Any) -> AgentResult:
        """Rewind the loop's branch and run again. With `message`: rewind to `turn_id` (an
        ancestor of the head, usually an assistant turn) and `run(message)`. Without: redo
        `turn_id` (an assistant turn, or the user/tool turn before one) by rewinding to just
        before its input and sending that input again; pass e.g. `temperature=0.7, seed=1` to
        get a different answer. Raises ValueError for a root turn, ConflictError/
        BadRequestError if the target is not on the loop's branch."""
        if message is None:
            target = self.session.get_turn(turn_id)
            parent = (self.session.get_turn(target.parent_id)
                      if target.role == "assistant" and target.parent_id else None)
            turn_id, message = retry_plan(target, parent)
        self._track_branches(self.session.rewind(self.branch, turn_id))
        return self.run(message, **generate)

    def _turn(self, message: MessagesInput, options: Mapping[str, Any], *,
              branch: str) -> tuple[Turn, StreamTiming]:
        timing = StreamTiming(started=self._clock())
        with self.session.stream(message, branch=branch, **options) as stream:
            for event in stream:
                timing = observe(timing, event, self._clock())
            turn = stream.get_final_turn()
        self._track_turn(turn)
        return turn, timing

    def _run_tool(self, call: ToolCall) -> ToolResult:
        with tool_span(call.name, call.id, session_id=self.session.id,
                       tracer_provider=self.tracer_provider) as span:
            result = run_tool(self.tools, call, self._clock)
            if result.is_error:
                span.set_attribute("error.type", "tool_error")
            return result

    def _refresh_head(self) -> str:
        return self.session.refresh().branches[self.branch]


class AsyncAgentLoop(_LoopBase):
    """Async twin of `AgentLoop`; tools may be coroutine functions (plain ones run in a thread)."""

    def __init__(self, session: AsyncSession, tools: Iterable[ToolLike] = (), *,
                 branch: str | None = None, max_turns: int = 8, name: str = DEFAULT_AGENT_NAME,
                 tool_choice: ToolChoice | None = None,
                 generate: Mapping[str, Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 tracer_provider: Any | None = None,
                 output_type: OutputTypeLike | None = None) -> None:
        branch = branch or session.branch
        head = session.head_turn_id if branch == session.branch else None
        super().__init__(tool_table(tools, allow_async=True), branch, head,
                         max_turns=max_turns, name=name, tool_choice=tool_choice,
                         generate=generate, clock=clock, tracer_provider=tracer_provider,
                         output_type=output_type)
        self.session = session

    @classmethod
    async def create(cls, client: AsyncClient, tools: Iterable[ToolLike] = (), *,
                     system: str | None = None, model: str | None = None,
                     metadata: dict[str, Any] | None = None,
                     **loop_options: Any) -> AsyncAgentLoop:
        """See `AgentLoop.create` (`client` is an `AsyncClient`)."""
        table = tool_table(tools, allow_async=True)
        session = await client.sessions.create(model=model, system=system, metadata=metadata,
                                               tools=[t.to_openai() for t in table.values()])
        return cls(session, table.values(), **loop_options)

    async def run(self, message: MessagesInput, *, tool_choice: ToolChoicePlan | None = None,
                  **generate: Any) -> AgentResult:
        """See `AgentLoop.run`."""
        state = self._start(message, generate, tool_choice)
        with workflow_span(self.name, self.session.id, tracer_provider=self.tracer_provider):
            while state.result is None:
                with agent_span(self.name, self.session.id,
                                tracer_provider=self.tracer_provider) as span:
                    turn, timing = await self._turn(state.messages, state.options,
                                                    branch=self.branch)
                    span.set_attributes(turn_attributes(turn))
                    step = state.step(turn)
                    results = [await self._run_tool(call) for call in step.calls]
                state = advance(state, turn, timing, step, results)
        return state.result

    async def best_of(self, n: int, message: MessagesInput, *, from_turn_id: str | None = None,
                      temperature: float = 0.8, seed: int = 0,
                      **generate: Any) -> list[TurnRecord]:
        """See `AgentLoop.best_of` (branches run one after another, as in the sync twin)."""
        parent = from_turn_id or self.head_turn_id or await self._refresh_head()
        options = self._options({**generate, "temperature": temperature})
        records = []
        for k, branch in enumerate(best_of_branches(self.branch, n)):
            await self.session.fork(parent, branch)
            with agent_span(self.name, self.session.id,
                            tracer_provider=self.tracer_provider) as span:
                turn, timing = await self._turn(message, {**options, "seed": seed + k},
                                                branch=branch)
                span.set_attributes(turn_attributes(turn))
            records.append(make_record(turn, timing))
        return records

    async def retry_from(self, turn_id: str, message: MessagesInput | None = None,
                         **generate: Any) -> AgentResult:
        """See `AgentLoop.retry_from`."""
        if message is None:
            target = await self.session.get_turn(turn_id)
            parent = (await self.session.get_turn(target.parent_id)
                      if target.role == "assistant" and target.parent_id else None)
            turn_id, message = retry_plan(target, parent)
        self._track_branches(await self.session.rewind(self.branch, turn_id))
        return await self.run(message, **generate)

    async def _turn(self, message: MessagesInput, options: Mapping[str, Any], *,
                    branch: str) -> tuple[Turn, StreamTiming]:
        timing = StreamTiming(started=self._clock())
        async with self.session.stream(message, branch=branch, **options) as stream:
            async for event in stream:
                timing = observe(timing, event, self._clock())
            turn = await stream.get_final_turn()
        self._track_turn(turn)
        return turn, timing

    async def _run_tool(self, call: ToolCall) -> ToolResult:
        with tool_span(call.name, call.id, session_id=self.session.id,
                       tracer_provider=self.tracer_provider) as span:
            result = await arun_tool(self.tools, call, self._clock)
            if result.is_error:
                span.set_attribute("error.type", "tool_error")
            return result

    async def _refresh_head(self) -> str:
        return (await self.session.refresh()).branches[self.branch]
