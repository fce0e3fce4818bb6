"""`GET /v1/models` and `GET /v1/models/{model_id}` in the shape the caller expects.

A request with an `anthropic-version` header gets Anthropic's list
(`{"data": [{"type": "model", "id", "display_name", "created_at"}], "has_more", "first_id",
"last_id"}`), any other the OpenAI list (`{"object": "list", "data": [{"id", "object": "model",
"created", "owned_by"}]}`) together with the catalogue Codex CLI decodes (`"models": [{slug,
context_window, base_instructions, ...}]`, every field its decoder requires), so Codex learns the
served context window instead of warning about missing metadata. `base_instructions` replaces
Codex's own long default prompt (about 4k tokens): a short one leaves a small model its context.
Listed: the served model and every exact (non-wildcard) alias of
`settings.model_aliases`; a wildcard alias resolves on retrieve and in requests but is not listed.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request

from gateway.compat.runner import CompatDep
from gateway.deps import TenantDep

router = APIRouter(prefix="/v1/models", tags=["models"])
_EPOCH_ISO = "1970-01-01T00:00:00Z"  # no meaningful release date for a local model
AnthropicVersionDep = Annotated[str | None, Header(alias="anthropic-version")]
CODEX_INSTRUCTIONS = (
    "You are a coding agent running in the Codex CLI on the user's machine. Use the tools to "
    "read files and run commands when the task needs it, then answer briefly and exactly.")
# Codex keeps 95% of the window for the prompt; its truncation policy counts tokens.
_CODEX_TRUNCATION_LIMIT = 10_000


def codex_model(model_id: str, context_len: int) -> dict[str, Any]:
    """One entry of Codex CLI's model catalogue (codex-rs models-manager `ModelInfo`)."""
    entry: dict[str, Any] = {
        "slug": model_id, "display_name": model_id, "supported_reasoning_levels": [],
        "shell_type": "shell_command", "visibility": "list", "supported_in_api": True,
        "priority": 0, "support_verbosity": False,
        "truncation_policy": {"mode": "tokens", "limit": _CODEX_TRUNCATION_LIMIT},
        "experimental_supported_tools": [], "base_instructions": CODEX_INSTRUCTIONS}
    if context_len > 0:
        entry["context_window"] = context_len
    return entry


def _model(model_id: str, anthropic: bool) -> dict[str, Any]:
    if anthropic:
        return {"type": "model", "id": model_id, "display_name": model_id,
                "created_at": _EPOCH_ISO}
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "radixgate"}


@router.get("")
async def list_models(request: Request, tenant: TenantDep, compat: CompatDep,
                      anthropic_version: AnthropicVersionDep = None) -> dict[str, Any]:
    names = [compat.model, *(k for k, v in compat.settings.model_aliases.items()
                             if not k.endswith("*") and k != compat.model
                             and (v or compat.model) == compat.model)]
    data = [_model(name, anthropic_version is not None) for name in names]
    if anthropic_version is None:
        context_len: int = request.state.context_len
        return {"object": "list", "data": data,
                "models": [codex_model(name, context_len) for name in names]}
    return {"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}


@router.get("/{model_id}")
async def get_model(model_id: str, tenant: TenantDep, compat: CompatDep,
                    anthropic_version: AnthropicVersionDep = None) -> dict[str, Any]:
    compat.check_model(model_id)
    return _model(model_id, anthropic_version is not None)
