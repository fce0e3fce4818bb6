"""`gateway/schemas.py` and `sdk/types.py` agree (in the spirit of anthropic's
`assert_signatures_in_sync`): every field of each response model exists in its SDK twin with a
type that accepts every value the gateway may send, the SDK's request types send only what the
gateway accepts, and real responses of a live gateway validate into the SDK types with no field
left unknown."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

import httpx
import pytest
from pydantic import BaseModel

import sdk.types as st
from gateway import schemas as gs
from gateway import toolcall_parser as gp
from sdk._sse import iter_sse

# (gateway model, its SDK twin): responses, plus Message, which travels both ways
PAIRS: list[tuple[type[BaseModel], type[BaseModel]]] = [
    (gs.SessionCreated, st.SessionCreated),
    (gs.SessionView, st.SessionState),
    (gs.TurnSummaryView, st.TurnSummary),
    (gs.TurnView, st.Turn),
    (gs.Usage, st.Usage),
    (gs.BranchView, st.BranchState),
    (gs.Message, st.Message),
]
TWIN = dict(PAIRS)
# (gateway SSE event dataclass, SDK event model, event type)
EVENTS = [(gp.ToolCallStart, st.ToolCallStart, "tool_call_start"),
          (gp.ToolCallDelta, st.ToolCallDelta, "tool_call_delta"),
          (gp.ToolCallEnd, st.ToolCallEnd, "tool_call_end")]
_UNIONS = (typing.Union, types.UnionType)


def accepts(sender: Any, receiver: Any) -> bool:
    """True if every value of type `sender` validates as type `receiver`. A gateway model is
    accepted by its SDK twin, or by a plain JSON object type (`dict[str, ...]`)."""
    if sender == receiver or receiver is Any:
        return True
    s_origin, r_origin = typing.get_origin(sender), typing.get_origin(receiver)
    if s_origin in _UNIONS or r_origin in _UNIONS:
        senders = typing.get_args(sender) if s_origin in _UNIONS else (sender,)
        receivers = typing.get_args(receiver) if r_origin in _UNIONS else (receiver,)
        return all(any(accepts(s, r) for r in receivers) for s in senders)
    models = [t for t in (sender, receiver) if isinstance(t, type) and issubclass(t, BaseModel)]
    if models:
        if TWIN.get(sender) is receiver or TWIN.get(receiver) is sender:
            return True
        other = receiver if sender in models else sender
        return other is dict or typing.get_origin(other) is dict
    if s_origin is Literal:
        if r_origin is Literal:
            return set(typing.get_args(sender)) <= set(typing.get_args(receiver))
        return isinstance(receiver, type) and all(isinstance(v, receiver)
                                                  for v in typing.get_args(sender))
    if s_origin is not None and s_origin == r_origin:
        s_args, r_args = typing.get_args(sender), typing.get_args(receiver)
        return len(s_args) == len(r_args) and all(accepts(s, r) for s, r in zip(s_args, r_args,
                                                                                strict=True))
    return False


def model_types(model: type[BaseModel]) -> dict[str, Any]:
    return {name: f.annotation for name, f in model.model_fields.items()}


@pytest.mark.parametrize(("gateway", "sdk_twin"), PAIRS, ids=[g.__name__ for g, _ in PAIRS])
def test_response_models_agree(gateway: type[BaseModel], sdk_twin: type[BaseModel]) -> None:
    g_types, s_types = model_types(gateway), model_types(sdk_twin)
    assert set(g_types) == set(s_types), f"{gateway.__name__} vs {sdk_twin.__name__}"
    for name, g_type in g_types.items():
        assert accepts(g_type, s_types[name]), f"{gateway.__name__}.{name}: {g_type} vs " \
                                               f"{s_types[name]}"
    assert sdk_twin.model_config.get("extra") == "allow"  # a newer server never breaks the SDK


def test_message_param_sends_what_the_gateway_accepts() -> None:
    hints = typing.get_type_hints(st.MessageParam)
    g_types = model_types(gs.Message)
    assert set(hints) == set(g_types)
    for name, s_type in hints.items():
        assert accepts(s_type, g_types[name]), name
    assert accepts(model_types(st.Message)["role"], g_types["role"])


def test_generate_params_send_what_the_gateway_accepts() -> None:
    hints = typing.get_type_hints(st.GenerateParams)
    g_types = model_types(gs.GenerateOptions)
    assert set(hints) == set(g_types) - {"stream"}  # `stream` is chosen by the method
    for name, s_type in hints.items():
        assert accepts(s_type, g_types[name]), f"{name}: {s_type} vs {g_types[name]}"


@pytest.mark.parametrize(("gateway", "sdk_twin", "name"), EVENTS, ids=[e[2] for e in EVENTS])
def test_tool_call_events_agree(gateway: type, sdk_twin: type[BaseModel], name: str) -> None:
    g_types = {f.name: f.type for f in dataclasses.fields(gateway)}
    g_types = typing.get_type_hints(gateway) if any(isinstance(t, str)
                                                    for t in g_types.values()) else g_types
    s_types = model_types(sdk_twin)
    assert s_types.pop("type") == Literal[name]
    assert name in st.KNOWN_EVENTS
    assert set(g_types) == set(s_types)
    for field, g_type in g_types.items():
        assert accepts(g_type, s_types[field]), field


def test_accepts_is_not_vacuous() -> None:
    assert not accepts(str | None, str)
    assert not accepts(Literal["a", "b"], Literal["a"])
    assert not accepts(list[int], list[str])
    assert not accepts(gs.Usage, st.Turn)
    assert accepts(Literal["a"], str) and accepts(gs.Usage | None, st.Usage | None)


# ---- real responses ----------------------------------------------------------------------------


def no_unknown_fields(value: Any, path: str = "") -> list[str]:
    """Paths of fields an SDK model kept as extras (the gateway sent something it lacks)."""
    found: list[str] = []
    if isinstance(value, BaseModel):
        found += [f"{path}.{k}" for k in value.model_extra or {}]
        for name in type(value).model_fields:
            found += no_unknown_fields(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list):
        for k, item in enumerate(value):
            found += no_unknown_fields(item, f"{path}[{k}]")
    return found


def validate(response: httpx.Response, model: type[BaseModel]) -> Any:
    assert response.is_success or model is st.ErrorEvent, response.text
    parsed = model.model_validate_json(response.content)
    assert no_unknown_fields(parsed) == [], model.__name__
    return parsed


PICK = {"type": "function", "function": {
    "name": "pick", "description": "Pick a colour.",
    "parameters": {"type": "object", "properties": {
        "color": {"type": "string", "enum": ["red", "blue"]}, "flag": {"type": "boolean"}},
        "required": ["color", "flag"], "additionalProperties": False}}}


def stream_events(http: httpx.Client, sid: str, body: dict[str, Any]) -> list[Any]:
    events = []
    with http.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as response:
        assert response.status_code == 200
        for sse in iter_sse(response.iter_text()):
            assert sse.event in st.KNOWN_EVENTS, sse.event
            event = st.STREAM_EVENT_ADAPTER.validate_json(sse.data)
            assert event.type == sse.event and no_unknown_fields(event) == [], sse.data
            events.append(event)
    return events


def test_real_responses_validate_into_sdk_types(live_server: str) -> None:
    with httpx.Client(base_url=live_server, timeout=60) as http:
        created = validate(http.post("/v1/sessions", json={
            "system": "Be brief.", "tools": [PICK], "metadata": {"k": 1}}), st.SessionCreated)
        sid = created.id
        say = {"messages": [{"role": "user", "content": "hi"}],
               "generate": {"max_tokens": 3, "tool_choice": "none"}}
        turn = validate(http.post(f"/v1/sessions/{sid}/turns", json=say), st.Turn)
        assert turn.usage is not None
        forced = {"messages": [{"role": "user", "content": "pick one"}],
                  "generate": {"max_tokens": 64, "stream": True, "tool_choice": {"name": "pick"}}}
        events = stream_events(http, sid, forced)
        kinds = {event.type for event in events}
        assert {"turn_start", "tool_call_start", "tool_call_end", "turn_end"} <= kinds, kinds
        end = events[-1]
        assert isinstance(end, st.TurnEnd) and end.turn.tool_calls
        tool_reply = {"messages": [{"role": "tool", "tool_call_id": end.turn.tool_calls[0]["id"],
                                    "content": "ok"}],
                      "generate": {"max_tokens": 3, "stream": True, "tool_choice": "none"}}
        assert {e.type for e in stream_events(http, sid, tool_reply)} >= {"turn_start",
                                                                         "turn_end"}
        state = validate(http.get(f"/v1/sessions/{sid}"), st.SessionState)
        assert state.tools == [PICK] and len(state.turns) == 7
        validate(http.get(f"/v1/sessions/{sid}/turns/{end.turn.id}"), st.Turn)
        validate(http.post(f"/v1/sessions/{sid}/fork",
                           json={"from_turn_id": turn.id, "branch": "b"}), st.BranchState)
        validate(http.post(f"/v1/sessions/{sid}/rewind",
                           json={"branch": "main", "to_turn_id": turn.id}), st.BranchState)
        missing = validate(http.get("/v1/sessions/nope"), st.ErrorEvent)
        assert missing.error.type == "session_not_found"
