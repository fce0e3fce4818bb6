"""Browse reads (`sessions.browse`) → the JSON the session-tree page draws.

Contract (docs/ui.md): a tree row carries its role, a one-line summary, tool call
names, the finish reason and, for a generated turn, its usage with the engine's timings and the
decode rate derived from them.
"""

from __future__ import annotations

from typing import Any

from sessions import Session, Turn
from sessions.browse import SessionRow, TreePage, TreeRow

SUMMARY_LEN = 160
CACHED_TAIL_CHARS = 200


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: their text parts
        return " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def summary_of(turn: Turn) -> str:
    """One line: the turn's text (a tool result's too), else the tools it called."""
    text = " ".join(_text_of(m.get("content")) for m in turn.messages).strip()
    if not text and turn.tool_calls:
        text = ", ".join(f"{c.get('name', '?')}(…)" for c in turn.tool_calls)
    text = " ".join(text.split())
    return text if len(text) <= SUMMARY_LEN else text[: SUMMARY_LEN - 1] + "…"


def usage_view(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Stored usage plus `decode_tokens_per_s`: tokens after the first over the decode time
    (None where timings were not kept or there is no interval)."""
    if usage is None:
        return None
    view = {k: usage.get(k) for k in ("input_tokens", "cached_tokens", "computed_tokens",
                                      "output_tokens", "ttft_ms", "queue_ms", "decode_ms",
                                      "drafted_tokens", "accepted_tokens")}
    decode_ms, output = usage.get("decode_ms"), int(usage.get("output_tokens") or 0)
    rate = (output - 1) / (decode_ms / 1000) if decode_ms and output > 1 else None
    view["decode_tokens_per_s"] = None if rate is None else round(rate, 1)
    return view


def session_meta(session: Session) -> dict[str, Any]:
    return {"id": session.id, "model": session.model, "version": session.version,
            "created_ms": session.created_ms, "root_turn_id": session.root_turn_id,
            "default_branch": session.default_branch, "branches": dict(session.branches),
            "metadata": session.metadata}


def session_row_view(row: SessionRow) -> dict[str, Any]:
    meta = session_meta(row.session)
    del meta["root_turn_id"]
    return {**meta, "num_turns": row.num_turns}


def tree_row_view(row: TreeRow) -> dict[str, Any]:
    turn = row.turn
    return {"id": turn.id, "parent_id": turn.parent_id, "role": turn.role, "depth": turn.depth,
            "seq": turn.seq, "num_tokens": row.num_tokens, "created_ms": turn.created_ms,
            "summary": summary_of(turn), "finish_reason": turn.finish_reason,
            "tool_calls": [{"id": c.get("id"), "name": c.get("name")} for c in turn.tool_calls],
            "worker": turn.worker, "usage": usage_view(turn.usage)}


def tree_page_view(page: TreePage) -> dict[str, Any]:
    return {"session": session_meta(page.session), "num_turns": page.num_turns,
            "offset": page.offset, "next_offset": page.next_offset,
            "turns": [tree_row_view(r) for r in page.rows]}
