"""The rate-limit headers of a 429, in the client family's own names.

    OpenAI     x-ratelimit-{limit,remaining,reset}-{requests,tokens}  (reset: "1m0s")
    Anthropic  anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-
               {limit,remaining,reset}  (reset: an RFC 3339 time)

Both get `retry-after` in whole seconds (the SDKs wait that long before their automatic
retry). OpenAI's single token budget is reported as the tighter of the input and output ones.
The native API uses OpenAI's names. A limit the subject does not have is not reported.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.errors import Dialect


@dataclass(frozen=True)
class Usage:
    """A subject's limits and counted values when it was checked (limit -1: none)."""

    limit: dict[str, int]  # rpm, input_tpm, output_tpm, concurrent
    used: dict[str, int]
    reset_s: float  # until the window's counters start over


def rate_limit_headers(dialect: Dialect, usage: Usage, retry_after_s: float) -> dict[str, str]:
    headers = {"retry-after": str(max(1, math.ceil(retry_after_s)))}
    groups = {"requests": "rpm", "input-tokens": "input_tpm", "output-tokens": "output_tpm"}
    present = {name: (usage.limit[key], max(0, usage.limit[key] - usage.used[key]))
               for name, key in groups.items() if usage.limit[key] > 0}
    tokens = [present[n] for n in ("input-tokens", "output-tokens") if n in present]
    tightest = min(tokens, key=lambda lr: lr[1]) if tokens else None
    if dialect == "anthropic":
        reset = datetime.fromtimestamp(time.time() + usage.reset_s, UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        if tightest is not None:
            present["tokens"] = tightest
        for name, (limit, remaining) in present.items():
            headers[f"anthropic-ratelimit-{name}-limit"] = str(limit)
            headers[f"anthropic-ratelimit-{name}-remaining"] = str(remaining)
            headers[f"anthropic-ratelimit-{name}-reset"] = reset
        return headers
    reset_text = _duration(usage.reset_s)
    if "requests" in present:
        limit, remaining = present["requests"]
        headers.update({"x-ratelimit-limit-requests": str(limit),
                        "x-ratelimit-remaining-requests": str(remaining),
                        "x-ratelimit-reset-requests": reset_text})
    if tightest is not None:
        headers.update({"x-ratelimit-limit-tokens": str(tightest[0]),
                        "x-ratelimit-remaining-tokens": str(tightest[1]),
                        "x-ratelimit-reset-tokens": reset_text})
    if usage.limit["concurrent"] > 0:
        headers["x-ratelimit-limit-concurrent"] = str(usage.limit["concurrent"])
        headers["x-ratelimit-remaining-concurrent"] = str(
            max(0, usage.limit["concurrent"] - usage.used["concurrent"]))
    return headers


def _duration(seconds: float) -> str:
    """OpenAI's reset format: "59s", "1m0s", "250ms"."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
