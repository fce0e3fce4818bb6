"""The session-tree page: `/ui` and its files (plain HTML, CSS and ES modules from
`gateway/ui/static`, no build step), and `GET /v1/ui/overview`, the last hour of this
gateway's finished turns.

The files are public (they hold no data); every call the page makes goes through the API's
keys, so a page without a key sees nothing when keys are enforced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse, RedirectResponse

from gateway.deps import TelemetryDep, TenantDep
from gateway.errors import ApiError
from observability.turn_history import BUCKET_S, WINDOW_S

STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
          ".txt": "text/plain; charset=utf-8"}
# The page is a tool for people debugging agents: no caching while it changes under them.
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}

router = APIRouter(tags=["ui"])


@router.get("/ui", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type=_TYPES[".html"], headers=_HEADERS)


@router.get("/ui/", include_in_schema=False)
async def index_slash() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=308)


@router.get("/ui/{name}", include_in_schema=False)
async def static_file(name: str) -> FileResponse:
    """A file directly in the static folder (no sub-folders, no dot files)."""
    path = STATIC / name
    if name.startswith(".") or "/" in name or path.suffix not in _TYPES or not path.is_file():
        raise ApiError(f"no file {name!r} under /ui", error_type="not_found")
    return FileResponse(path, media_type=_TYPES[path.suffix], headers=_HEADERS)


@router.get("/v1/ui/overview")
async def overview(_tenant: TenantDep, telemetry: TelemetryDep,
                   window_s: Annotated[int, Query(ge=60, le=WINDOW_S)] = WINDOW_S,
                   bucket_s: Annotated[int, Query(ge=10, le=WINDOW_S)] = BUCKET_S
                   ) -> dict[str, Any]:
    """Per-minute prefix-cache hit rate, TTFT percentiles (ms) and output tokens/s per engine
    worker over the last `window_s` seconds, from the turns this gateway finished (all
    tenants' together: numbers, no sessions). Needs a key where keys are enforced."""
    return telemetry.history.overview(window_s=window_s, bucket_s=bucket_s)
