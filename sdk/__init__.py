"""radixgate Python SDK: `Client` / `AsyncClient` for the session API (`/v1/sessions`).

Imports only httpx and pydantic: no torch, and nothing from the server packages.
"""

from sdk._client import AsyncClient, Client
from sdk._constants import DEFAULT_BASE_URL, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from sdk._errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PreconditionFailedError,
    RadixgateError,
    RateLimitError,
    RequestTooLargeError,
    UnprocessableEntityError,
)
from sdk._resources import AsyncSession, AsyncSessions, Session, Sessions
from sdk._streaming import AsyncTurnStream, TurnStream
from sdk._toolcalls import ToolCallSnapshot
from sdk.agent import AgentLoop, AgentResult, AsyncAgentLoop, OutputError, TurnRecord, turn_table
from sdk.tools import Tool, ToolCall, ToolResult, tool
from sdk.types import (
    BranchState,
    ErrorEvent,
    GenerateParams,
    Message,
    MessageParam,
    SessionCreated,
    SessionState,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    Turn,
    TurnEnd,
    TurnStart,
    TurnSummary,
    Usage,
)

__all__ = [
    "DEFAULT_BASE_URL", "DEFAULT_MAX_RETRIES", "DEFAULT_TIMEOUT",
    "APIConnectionError", "APIError", "APIStatusError", "APITimeoutError", "AuthenticationError",
    "BadRequestError", "ConflictError", "InternalServerError", "NotFoundError",
    "PreconditionFailedError", "RadixgateError", "RateLimitError", "RequestTooLargeError",
    "UnprocessableEntityError",
    "AsyncClient", "Client", "AsyncSession", "AsyncSessions", "Session", "Sessions",
    "AsyncTurnStream", "TurnStream",
    "AgentLoop", "AgentResult", "AsyncAgentLoop", "OutputError", "Tool", "ToolCall", "ToolResult",
    "TurnRecord", "tool", "turn_table",
    "BranchState", "ErrorEvent", "GenerateParams", "Message", "MessageParam", "SessionCreated",
    "SessionState", "StreamEvent", "TextDelta", "Turn", "TurnEnd", "TurnStart", "TurnSummary",
    "Usage", "ToolCallDelta", "ToolCallEnd", "ToolCallStart", "ToolCallSnapshot",
]
