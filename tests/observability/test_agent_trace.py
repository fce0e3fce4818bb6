"""A 3-turn `AgentLoop` with tool calls is one trace: invoke_workflow → invoke_agent (one per
iteration) → HTTP server span → `chat {model}` → queue / prefill / decode, with `execute_tool`
spans under their iteration's invoke_agent and cache-read tokens on turns 2 and 3."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan

from sdk import AgentLoop, Client
from tests.observability.conftest import MODEL, StartGateway

TURNS_ROUTE = "POST /v1/sessions/{session_id}/turns"


def pick(color: str) -> str:
    """Pick a colour.

    Args:
        color: The colour to pick.
    """
    return f"picked {color}"


def children(span: ReadableSpan, spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.parent and s.parent.span_id == span.context.span_id),
                  key=lambda s: s.start_time or 0)


def test_agent_loop_is_one_trace(traced_gateway: StartGateway) -> None:
    with traced_gateway() as gw, Client(gw.base_url, max_retries=0) as client:
        # Every turn is forced to call `pick`, so the loop runs tools on all three turns.
        loop = AgentLoop.create(client, [pick], system="Pick colours.", max_turns=3,
                                tool_choice={"name": "pick"}, generate={"max_tokens": 48},
                                tracer_provider=gw.provider, name="coder")
        result = loop.run("Pick three colours, one per turn.")
        spans = gw.wait_for_spans(lambda ss: sum(s.name == TURNS_ROUTE for s in ss) == 3)

    assert len(result.turns) == 3 and result.stop_reason == "max_turns"
    (root,) = [s for s in spans if s.name == "invoke_workflow coder"]
    # Creating the session happens before the run, in its own trace.
    outside = {s.name for s in spans if s.context.trace_id != root.context.trace_id}
    assert outside == {"POST /v1/sessions"}
    agents = children(root, spans)
    assert [a.name for a in agents] == ["invoke_agent coder"] * 3
    for i, (agent, record) in enumerate(zip(agents, result.turns, strict=True)):
        kids = children(agent, spans)
        (http,) = [k for k in kids if k.name == TURNS_ROUTE]
        tools = [k for k in kids if k.name == "execute_tool pick"]
        assert len(tools) == len(record.tool_results)
        assert record.turn.tool_calls  # forced on every turn
        assert tools or i == 2  # the loop stops at max_turns without running the last calls
        (chat,) = children(http, spans)
        assert chat.name == f"chat {MODEL}"
        assert [c.name for c in children(chat, spans)] == ["queue", "prefill", "decode"]
        attrs = chat.attributes or {}
        assert attrs["radixgate.turn.id"] == record.turn.id
        cached = attrs["gen_ai.usage.cache_read.input_tokens"]
        assert cached == record.cached_tokens
        if i:
            assert isinstance(cached, int) and cached > 0
