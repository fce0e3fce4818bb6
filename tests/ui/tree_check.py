"""What the session page draws, compared with what the API says (`GET /v1/sessions/{id}/tree`).

`page_mismatches` returns readable differences (empty: the page agrees), so a test can poll
until the page has caught up with the event stream and then show what still differs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.ui.browser import READ_TREE_JS, first_number, squash

TREE_PAGE_LIMIT = 2000  # the API's maximum
INT_FIELDS = ("cached_tokens", "computed_tokens", "output_tokens", "drafted_tokens",
              "accepted_tokens")
ONE_DECIMAL_FIELDS = ("ttft_ms", "decode_tokens_per_s")
# A one-decimal number shown for a value the API gives with more digits: at most half a unit
# of the last shown digit away (JS toFixed and Python round halves differently).
DECIMAL_SLACK = 0.05 + 1e-6


def api_tree(http: httpx.Client, session_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the first page's body, every turn of the tree in seq order), all pages read."""
    turns: list[dict[str, Any]] = []
    offset: int | None = 0
    first: dict[str, Any] | None = None
    while offset is not None:
        r = http.get(f"/v1/sessions/{session_id}/tree",
                     params={"offset": offset, "limit": TREE_PAGE_LIMIT})
        assert r.status_code == 200, f"GET tree: {r.status_code} {r.text[:300]}"
        body = r.json()
        first = first or body
        turns += body["turns"]
        offset = body["next_offset"]
    assert first is not None
    return first, turns


def read_page(page: Any) -> dict[str, Any]:
    """The drawn turns, edges and branch-head labels (`READ_TREE_JS`)."""
    drawn: dict[str, Any] = page.evaluate(READ_TREE_JS)
    return drawn


def page_mismatches(drawn: dict[str, Any], body: dict[str, Any],
                    turns: list[dict[str, Any]]) -> list[str]:
    """Every way the drawn tree differs from the API's (a tree small enough to be fully drawn)."""
    problems: list[str] = []
    by_id = {t["id"]: t for t in turns}
    shown = {t["id"]: t for t in drawn["turns"]}
    if len(shown) != len(drawn["turns"]):
        problems.append(f"{len(drawn['turns'])} turn elements for {len(shown)} turn ids")
    if missing := sorted(set(by_id) - set(shown)):
        problems.append(f"turns not drawn: {missing}")
    if extra := sorted(set(shown) - set(by_id)):
        problems.append(f"turns drawn that the API does not have: {extra}")
    want_edges = {(t["parent_id"], t["id"]) for t in turns if t["parent_id"] is not None}
    got_edges = {(a, b) for a, b, _ in drawn["edges"]}
    if missing_edges := sorted(want_edges - got_edges):
        problems.append(f"edges not drawn: {missing_edges}")
    if extra_edges := sorted(got_edges - want_edges):
        problems.append(f"edges drawn that the API does not have: {extra_edges}")
    if not_svg := [(a, b) for a, b, svg in drawn["edges"] if not svg]:
        problems.append(f"edge elements that are not SVG: {not_svg}")
    want_heads = set(body["session"]["branches"].items())
    got_heads = {(name, turn) for name, turn in drawn["heads"]}
    if want_heads != got_heads:
        problems.append(f"branch heads: drawn {sorted(got_heads)}, API {sorted(want_heads)}")
    for tid, turn in by_id.items():
        if tid in shown:
            problems += turn_mismatches(shown[tid], turn)
    return problems


def turn_mismatches(shown: dict[str, Any], turn: dict[str, Any]) -> list[str]:
    """How one drawn turn differs from its TreeTurn."""
    tid, fields = turn["id"], shown["fields"]
    problems = []
    if shown["parent"] != turn["parent_id"]:
        problems.append(f"{tid}: data-parent-id {shown['parent']!r}, API {turn['parent_id']!r}")
    if shown["role"] != turn["role"]:
        problems.append(f"{tid}: data-role {shown['role']!r}, API {turn['role']!r}")
    if shown["seq"] != str(turn["seq"]):
        problems.append(f"{tid}: data-seq {shown['seq']!r}, API {turn['seq']}")
    for name in ("role", "summary"):
        if name not in fields:
            problems.append(f"{tid}: no [data-field={name}]")
    summary = squash(turn.get("summary"))[:16]
    if summary and summary not in squash(fields.get("summary")):
        problems.append(f"{tid}: summary shows {fields.get('summary')!r}, API "
                        f"{turn.get('summary')!r}")
    usage = turn.get("usage")
    if turn["role"] != "assistant" or usage is None:
        return problems
    if not shown["cacheBar"]:
        problems.append(f"{tid}: no .cache-bar")
    for name in (*INT_FIELDS, *ONE_DECIMAL_FIELDS, "finish_reason", "tool_calls"):
        if name not in fields:
            problems.append(f"{tid}: no [data-field={name}]")
    for name in INT_FIELDS:
        value = usage.get(name)
        if value is not None and name in fields and first_number(fields[name]) != value:
            problems.append(f"{tid}: {name} shows {fields[name]!r}, API {value}")
    for name in ONE_DECIMAL_FIELDS:
        value = usage.get(name)
        if value is None or name not in fields:
            continue
        number = first_number(fields[name])
        if number is None or abs(number - value) > DECIMAL_SLACK:
            problems.append(f"{tid}: {name} shows {fields[name]!r}, API {value} (one decimal)")
    reason = turn.get("finish_reason")
    if reason and reason not in (fields.get("finish_reason") or ""):
        problems.append(f"{tid}: finish_reason shows {fields.get('finish_reason')!r}, "
                        f"API {reason!r}")
    for call in turn.get("tool_calls") or []:
        if call["name"] not in (fields.get("tool_calls") or ""):
            problems.append(f"{tid}: tool_calls shows {fields.get('tool_calls')!r}, "
                            f"API has a call of {call['name']!r}")
    return problems


def wait_until_agrees(page: Any, http: httpx.Client, session_id: str, *,
                      timeout_s: float = 15.0,
                      also: Callable[[dict[str, Any]], list[str]] | None = None,
                      ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Poll until the page draws exactly the API's tree (the API is read again each time);
    fails with the remaining differences. Returns the API's (body, turns)."""
    deadline = time.monotonic() + timeout_s
    while True:
        body, turns = api_tree(http, session_id)
        drawn = read_page(page)
        problems = page_mismatches(drawn, body, turns) + (also(drawn) if also else [])
        if not problems:
            return body, turns
        if time.monotonic() > deadline:
            raise AssertionError("the page does not draw the API's tree:\n  "
                                 + "\n  ".join(problems[:40]))
        page.wait_for_timeout(250)  # lets Playwright handle the page's events meanwhile
