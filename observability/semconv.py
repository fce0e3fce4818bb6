"""Attribute names, re-declared as string literals.

The GenAI conventions are `_incubating` in `opentelemetry-semantic-conventions`; re-declaring the
names here means an SDK bump cannot break an import. Names follow the GenAI spans spec as of
v1.56 (`gen_ai.provider.name`, `gen_ai.usage.input_tokens`, ...). Custom names live under
`radixgate.*`, never `gen_ai.*`.
"""

from __future__ import annotations

PROVIDER = "radixgate"  # gen_ai.provider.name: "a custom value MAY be used"

# ---- GenAI -------------------------------------------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"

OPERATION_CHAT = "chat"

# ---- general -----------------------------------------------------------------------------------
ERROR_TYPE = "error.type"
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
HTTP_ROUTE = "http.route"
URL_PATH = "url.path"
URL_SCHEME = "url.scheme"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
CLIENT_ADDRESS = "client.address"
USER_AGENT_ORIGINAL = "user_agent.original"

# ---- radixgate ---------------------------------------------------------------------------------
TURN_ID = "radixgate.turn.id"  # the assistant turn this request generated
TURN_PARENT_ID = "radixgate.turn.parent_id"  # the turn the new input was appended under
INPUT_TURN_ID = "radixgate.input_turn.id"  # the input turn holding the rendered delta
BRANCH = "radixgate.branch"
TOKENS_COMPUTED = "radixgate.tokens.computed"  # prompt tokens run through the model
SPEC_DRAFT_TOKENS = "radixgate.spec.draft_tokens"
SPEC_ACCEPTED_TOKENS = "radixgate.spec.accepted_tokens"
PHASE_SECONDS = "radixgate.phase.duration_s"  # on queue / prefill / decode spans
