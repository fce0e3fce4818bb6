"""Browsing routes for people (the `/ui` page, or curl): list and search a tenant's sessions,
read a tree in pages, see the prompt text a turn actually computed.

Same keys and tenancy as the rest of the API: another tenant's session is 404."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from gateway.deps import SessionStoreDep, TenantDep, TurnServiceDep
from gateway.errors import InvalidRequest, error_responses
from gateway.tree_views import (
    CACHED_TAIL_CHARS,
    session_row_view,
    tree_page_view,
)
from sessions.browse import list_session_rows, tree_page

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
_ERRORS = error_responses(400, 401, 404, 422, 503)
MAX_TREE_PAGE = 2000


def _cursor(cursor: str | None) -> int:
    if cursor is None:
        return 0
    if not cursor.isdigit():
        raise InvalidRequest(f"cursor must be a value from next_cursor, not {cursor!r}")
    return int(cursor)


@router.get("", responses=_ERRORS)
async def list_sessions(tenant: TenantDep, store: SessionStoreDep,
                        q: Annotated[str, Query(max_length=200)] = "",
                        limit: Annotated[int, Query(ge=1, le=200)] = 50,
                        cursor: str | None = None) -> dict[str, Any]:
    """The tenant's sessions, newest first; `q` keeps those whose id or metadata contains it
    (case-insensitive). `next_cursor` continues the listing (null at its end)."""
    page = await list_session_rows(store, tenant, query=q.strip(), limit=limit,
                                   cursor=_cursor(cursor))
    next_cursor = None if page.next_cursor is None else str(page.next_cursor)
    return {"object": "list", "data": [session_row_view(r) for r in page.rows],
            "next_cursor": next_cursor}


@router.get("/{session_id}/tree", responses=_ERRORS)
async def get_tree_page(session_id: str, tenant: TenantDep, store: SessionStoreDep,
                        offset: Annotated[int, Query(ge=0)] = 0,
                        limit: Annotated[int, Query(ge=1, le=MAX_TREE_PAGE)] = 1000
                        ) -> dict[str, Any]:
    """Turns `offset`.. of the tree in creation order (the root first), each with its summary,
    tool call names, finish reason and usage with timings; `next_offset` pages on."""
    page = await tree_page(store, session_id, tenant=tenant, offset=offset, limit=limit)
    return tree_page_view(page)


@router.get("/{session_id}/turns/{turn_id}/computed", responses=_ERRORS)
async def get_computed(session_id: str, turn_id: str, tenant: TenantDep,
                       store: SessionStoreDep, turns: TurnServiceDep) -> dict[str, Any]:
    """For a generated turn: the part of its prompt the engine ran (`computed_text`, the
    prompt after the cached prefix) and the end of the cached part before it. Other turns
    carry no usage: nulls."""
    turn = await store.get_turn(session_id, turn_id, tenant=tenant)
    usage = turn.usage or {}
    view: dict[str, Any] = {"turn_id": turn.id, "input_tokens": usage.get("input_tokens"),
                            "cached_tokens": usage.get("cached_tokens"),
                            "computed_tokens": usage.get("computed_tokens"),
                            "computed_text": None, "cached_tail": None}
    if not usage or turn.parent_id is None:
        return view
    prompt = await store.token_path(session_id, turn.parent_id, tenant=tenant)
    prompt_len = min(int(usage.get("input_tokens", len(prompt))), len(prompt))
    cached = min(int(usage.get("cached_tokens", 0)), prompt_len)
    decode = turns.renderer.tokenizer.decode
    view["computed_text"] = decode(prompt[cached:prompt_len])
    # Decode a window before the boundary, not the whole prefix (it may be 100k tokens).
    view["cached_tail"] = decode(prompt[max(cached - 96, 0):cached])[-CACHED_TAIL_CHARS:]
    return view
