"""The `chat {model}` span of one turn and its engine-phase children.

    chat {model}          CLIENT   gateway → engine worker; from the handler to the stored reply
     ├─ queue             INTERNAL arrival at the engine → first scheduled step
     ├─ prefill           INTERNAL first scheduled step → first token
     └─ decode            INTERNAL first token → finish

The engine reports phase durations (monotonic clock, its own process). They are laid on the
gateway's wall clock backwards from `TurnOutcome.finished_ns`, the moment the engine's result
reached the gateway, so the phases need no clock agreement between hosts and always fall inside
the chat span (they are clamped to its start).
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from observability import semconv as sc

PHASES = ("queue", "prefill", "decode")


@dataclass(frozen=True)
class TurnOutcome:
    """One finished engine request of a turn, in plain values (no engine or gateway types)."""

    turn_id: str  # the stored assistant turn
    input_turn_id: str
    parent_turn_id: str  # the turn the input was appended under
    branch: str | None
    finish_reason: str  # "stop" | "length" | "abort"
    input_tokens: int  # full prompt length the output continued
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache
    computed_tokens: int  # prompt tokens run through the model
    output_tokens: int
    queue_s: float
    prefill_s: float
    decode_s: float
    ttft_s: float
    finished_ns: int  # time.time_ns() when the engine's result reached the gateway
    has_stop_token: bool = False  # a stop token was sampled (it is not in output_tokens)
    num_drafted: int = 0
    num_accepted: int = 0

    @property
    def has_ttft(self) -> bool:
        """Its TTFT says something about serving speed: a first token came (text or a stop
        token) and the request was not aborted."""
        return self.finish_reason != "abort" and (self.output_tokens > 0 or self.has_stop_token)

    @property
    def num_decode_intervals(self) -> int:
        """Token-to-token gaps after the first token (the sampled stop token included)."""
        return max(self.output_tokens + int(self.has_stop_token) - 1, 0)

    @property
    def inter_token_s(self) -> float | None:
        """Mean inter-token latency, or None with fewer than two sampled tokens."""
        n = self.num_decode_intervals
        return self.decode_s / n if n else None


class ChatSpan:
    """Starts `chat {model}` on construction under `context` (default: the current context).

    `turn_started` and `set_model` may be called while it runs; exactly one of `finish` / `fail`
    ends it (later calls are ignored). Not thread-safe; one per turn."""

    def __init__(self, tracer: trace.Tracer, model: str, session_id: str, *,
                 max_tokens: int | None = None, context: Context | None = None) -> None:
        attributes: dict[str, str | int] = {
            sc.GEN_AI_OPERATION_NAME: sc.OPERATION_CHAT, sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER,
            sc.GEN_AI_REQUEST_MODEL: model, sc.GEN_AI_CONVERSATION_ID: session_id}
        if max_tokens is not None:
            attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
        self.tracer = tracer
        self.model = model
        self.span = tracer.start_span(f"{sc.OPERATION_CHAT} {model}", context=context,
                                      kind=SpanKind.CLIENT, attributes=attributes)
        self.is_ended = False

    def set_model(self, model: str) -> None:
        """Rename to the session's model when it differs from the one assumed at start."""
        if model and model != self.model:
            self.model = model
            self.span.update_name(f"{sc.OPERATION_CHAT} {model}")
            self.span.set_attribute(sc.GEN_AI_REQUEST_MODEL, model)

    def turn_started(self, input_turn_id: str, parent_turn_id: str) -> None:
        self.span.set_attribute(sc.INPUT_TURN_ID, input_turn_id)
        self.span.set_attribute(sc.TURN_PARENT_ID, parent_turn_id)

    def finish(self, outcome: TurnOutcome) -> None:
        """Set the usage attributes, add the phase spans, end the span now."""
        if self.is_ended:
            return
        attributes: dict[str, str | int | float | list[str]] = {
            sc.GEN_AI_RESPONSE_FINISH_REASONS: [outcome.finish_reason],
            sc.GEN_AI_RESPONSE_ID: outcome.turn_id,
            sc.GEN_AI_USAGE_INPUT_TOKENS: outcome.input_tokens,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: outcome.output_tokens,
            sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: outcome.cached_tokens,
            sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: outcome.ttft_s,
            sc.TURN_ID: outcome.turn_id, sc.INPUT_TURN_ID: outcome.input_turn_id,
            sc.TURN_PARENT_ID: outcome.parent_turn_id,
            sc.TOKENS_COMPUTED: outcome.computed_tokens,
            sc.SPEC_DRAFT_TOKENS: outcome.num_drafted,
            sc.SPEC_ACCEPTED_TOKENS: outcome.num_accepted}
        if outcome.branch is not None:
            attributes[sc.BRANCH] = outcome.branch
        self.span.set_attributes(attributes)
        if outcome.finish_reason == "abort":
            self.span.set_attribute(sc.ERROR_TYPE, "aborted")
        self._add_phases(outcome)
        self.is_ended = True
        self.span.end()

    def fail(self, error_type: str, exc: BaseException | None = None) -> None:
        """End the span with status ERROR and `error.type` (e.g. "client_disconnected")."""
        if self.is_ended:
            return
        self.span.set_attribute(sc.ERROR_TYPE, error_type)
        if exc is not None:
            self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, error_type))
        self.is_ended = True
        self.span.end()

    def _add_phases(self, outcome: TurnOutcome) -> None:
        # Laid backwards from the moment the result arrived (see the module docstring):
        #   queue_start ... prefill_start ... decode_start ... finished_ns
        floor = getattr(self.span, "start_time", None) or 0
        end = outcome.finished_ns
        durations = (outcome.queue_s, outcome.prefill_s, outcome.decode_s)
        starts: list[int] = []
        for seconds in reversed(durations):
            end -= max(int(seconds * 1e9), 0)
            starts.append(end)
        starts.reverse()
        bounds = [max(start, floor) for start in starts] + [max(outcome.finished_ns, floor)]
        context = trace.set_span_in_context(self.span)
        for i, (name, seconds) in enumerate(zip(PHASES, durations, strict=True)):
            child = self.tracer.start_span(name, context=context, kind=SpanKind.INTERNAL,
                                           start_time=bounds[i],
                                           attributes={sc.PHASE_SECONDS: seconds})
            child.end(end_time=max(bounds[i + 1], bounds[i]))
