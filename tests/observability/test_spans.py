"""One trace for a 3-turn session driven through the SDK under a parent span:
root → invoke_agent (SDK) → HTTP server span → `chat {model}` → queue / prefill / decode, with
`execute_tool` under invoke_agent, over real HTTP to a live gateway."""

from __future__ import annotations

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from sdk import Client, Turn
from sdk._tracing import agent_span, tool_span
from tests.observability.conftest import MODEL, StartGateway

TURNS_ROUTE = "POST /v1/sessions/{session_id}/turns"


def _parent_of(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> ReadableSpan:
    assert span.parent is not None, f"{span.name} has no parent"
    return by_id[span.parent.span_id]


def _children(span: ReadableSpan, spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.parent and s.parent.span_id == span.context.span_id),
                  key=lambda s: s.start_time or 0)


def _ask(client: Client, turn_index: int, session_id: str, *, stream: bool) -> Turn:
    session = client.sessions.get(session_id)
    message = f"question number {turn_index}: " + "tell me more " * 6
    if not stream:
        return session.append(message, max_tokens=6)
    with session.stream(message, max_tokens=6) as turn_stream:
        turn_stream.until_done()
        return turn_stream.get_final_turn()


def test_three_turns_are_one_trace(traced_gateway: StartGateway) -> None:
    with traced_gateway() as gw, Client(gw.base_url, max_retries=0) as client:
        tracer = gw.provider.get_tracer("test")
        turns: list[Turn] = []
        with tracer.start_as_current_span("agent run") as root:
            session = client.sessions.create(system="Be brief.")
            first_parent = session.head_turn_id
            for i in range(3):
                with agent_span("tester", session.id, tracer_provider=gw.provider):
                    turns.append(_ask(client, i, session.id, stream=i == 1))
                    with tool_span("echo", f"call_{i}", tracer_provider=gw.provider):
                        pass
        spans = gw.wait_for_spans(lambda ss: sum(s.name == TURNS_ROUTE for s in ss) == 3)

    by_id = {s.context.span_id: s for s in spans}
    assert {s.context.trace_id for s in spans} == {root.get_span_context().trace_id}
    http_spans = sorted((s for s in spans if s.name == TURNS_ROUTE),
                        key=lambda s: s.start_time or 0)
    assert len(http_spans) == 3
    parent_ids = [first_parent, turns[0].id, turns[1].id]
    for i, (http, turn) in enumerate(zip(http_spans, turns, strict=True)):
        assert http.kind is SpanKind.SERVER
        assert http.attributes is not None
        assert http.attributes["http.response.status_code"] == 200
        assert http.attributes["http.route"] == "/v1/sessions/{session_id}/turns"
        agent = _parent_of(http, by_id)
        assert agent.name == "invoke_agent tester"
        assert agent.attributes is not None
        assert agent.attributes["gen_ai.conversation.id"] == session.id
        assert _parent_of(agent, by_id).name == "agent run"
        tools = [s for s in _children(agent, spans) if s.name == "execute_tool echo"]
        assert len(tools) == 1 and tools[0].attributes is not None
        assert tools[0].attributes["gen_ai.tool.call.id"] == f"call_{i}"

        (chat,) = _children(http, spans)
        assert chat.name == f"chat {MODEL}"
        a = chat.attributes
        assert a is not None and turn.usage is not None
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == "radixgate"
        assert a["gen_ai.request.model"] == MODEL
        assert a["gen_ai.conversation.id"] == session.id
        assert a["gen_ai.usage.input_tokens"] == turn.usage.input_tokens
        assert a["gen_ai.usage.output_tokens"] == turn.usage.output_tokens == 6
        assert a["gen_ai.usage.cache_read.input_tokens"] == turn.usage.cached_tokens
        assert a["radixgate.tokens.computed"] == turn.usage.computed_tokens
        assert tuple(a["gen_ai.response.finish_reasons"]) == (turn.finish_reason,)  # type: ignore[arg-type]
        assert a["radixgate.turn.id"] == turn.id
        assert a["radixgate.input_turn.id"] == turn.parent_id
        assert a["radixgate.turn.parent_id"] == parent_ids[i]
        assert a["radixgate.branch"] == "main"
        assert chat.status.status_code is not StatusCode.ERROR
        if i > 0:
            assert a["gen_ai.usage.cache_read.input_tokens"] > 0
        # The chat span ends with the turn, before the HTTP span (for the stream too).
        assert http.start_time and http.end_time and chat.start_time and chat.end_time
        assert http.start_time <= chat.start_time <= chat.end_time <= http.end_time

        phases = _children(chat, spans)
        assert [p.name for p in phases] == ["queue", "prefill", "decode"]
        assert all(p.start_time is not None and p.end_time is not None for p in phases)
        assert chat.start_time <= phases[0].start_time  # type: ignore[operator]
        assert phases[-1].end_time <= chat.end_time  # type: ignore[operator]
        for earlier, later in zip(phases, phases[1:], strict=False):
            assert earlier.end_time == later.start_time
        decode = phases[2]
        assert decode.end_time - decode.start_time > 0  # type: ignore[operator]


def test_a_stream_closed_early_ends_the_chat_span_as_disconnected(
        traced_gateway: StartGateway) -> None:
    with traced_gateway() as gw, Client(gw.base_url, max_retries=0) as client:
        session = client.sessions.create()
        with session.stream("write a long story", max_tokens=3000) as turn_stream:
            first = next(iter(turn_stream))
            assert first.type == "turn_start"
        spans = gw.wait_for_spans(lambda ss: any(s.name == f"chat {MODEL}" for s in ss))
        metrics = httpx.get(f"{gw.base_url}/metrics").text

    (chat,) = [s for s in spans if s.name == f"chat {MODEL}"]
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.attributes is not None
    assert chat.attributes["error.type"] == "client_disconnected"
    assert "gen_ai.usage.output_tokens" not in chat.attributes
    assert 'radixgate_requests_finished_total{finish_reason="abort"} 1.0' in metrics
