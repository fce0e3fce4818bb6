"""Client defaults (after the anthropic SDK's `_constants.py`)."""

from __future__ import annotations

import httpx

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
DEFAULT_MAX_RETRIES = 2
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
MAX_RETRY_AFTER = 60.0  # longer server-requested waits fall back to our own backoff
IDEMPOTENCY_HEADER = "Idempotency-Key"
LAST_EVENT_ID_HEADER = "Last-Event-ID"
MAX_STREAM_CONTINUATIONS = 3  # continuations of one interrupted stream
