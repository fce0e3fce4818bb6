"""Gateway settings: read once from `RADIXGATE_*` environment variables, then frozen.

Build them at the edge (`create_app(settings)`, `radixgate serve`), never at import time.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, FilePath
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.auth import AccessPolicy


class GatewaySettings(BaseSettings):
    """Everything the gateway process needs. Immutable (`frozen=True`)."""

    model_config = SettingsConfigDict(
        env_prefix="RADIXGATE_", env_ignore_empty=True, extra="ignore", frozen=True
    )

    redis_url: str | None = None  # None: `serve` starts an embedded Valkey under state_dir
    # Replicas that must hold a session mutation before it is acknowledged (`WAIT`,
    # `sessions.durability`); None: 1 on a cluster (redis+cluster://...), 0 on one server.
    store_wait_replicas: int | None = Field(default=None, ge=0)
    store_wait_timeout_ms: int = Field(default=1000, gt=0)
    engine_url: str | None = None  # None: `serve` spawns one engine worker
    # A model name, .gguf file or HF folder; None: engine.models.locate.DEFAULT_MODEL.
    model: str | None = None
    state_dir: Path = Path.home() / ".radixgate"
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    pin_ttl_s: float = Field(default=300.0, gt=0)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    max_messages: int = Field(default=256, gt=0)
    max_tokens_limit: int = Field(default=4096, gt=0)  # cap on generate.max_tokens
    key_prefix: str = "rg:"
    insecure: bool = False  # allow a non-loopback host with no API key created
    # A key given at start (`serve --api-key`): keys are enforced even when none is stored, and
    # this one is the local tenant's.
    api_key: str | None = Field(default=None, min_length=1)
    # Load shedding: a turn the engine's queue would keep from its first token longer than
    # this gets 503 `overloaded` (Anthropic: 529) at once; None: turns queue without a bound.
    max_queue_wait_s: float | None = Field(default=None, gt=0)
    engine_timeout_s: float = Field(default=600.0, gt=0)  # longest wait for one engine message
    # How long a turn waits for a restarted engine worker before it fails with a 503.
    engine_restart_timeout_s: float = Field(default=300.0, gt=0)
    sse_keepalive_s: float = Field(default=10.0, gt=0)  # a ping after this long without a frame
    # How long a stored Responses API response (`store: true`) is kept; OpenAI keeps 30 days.
    responses_retention_s: int = Field(default=30 * 24 * 3600, gt=0)
    # Compatible routes (/v1/chat/completions, /v1/messages): requested model name -> served model
    # ("" = the one served). A key ending in "*" matches by prefix, the longest one winning; exact
    # keys are also listed by GET /v1/models. E.g. RADIXGATE_MODEL_ALIASES='{"claude-*": ""}'.
    # Cross-tenant prefix-cache sharing, opt-in (`gateway.cache_scope`): a system prompt whose
    # rendered whole pages every tenant may reuse; everything after it stays per tenant. The text
    # itself, or a file holding it (`serve --shared-prefix-file`).
    shared_prefix: str | None = Field(default=None, min_length=1)
    shared_prefix_file: FilePath | None = None  # must exist: checked at start
    model_aliases: dict[str, str] = Field(
        default_factory=lambda: {"claude-*": "", "gpt-*": "", "anthropic-*": ""})

    @property
    def is_loopback(self) -> bool:
        """True when `host` only accepts local connections."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def resolve_model(self, requested: str, served: str) -> str | None:
        """The model a compatible request naming `requested` runs on: `served` itself, an exact
        alias, else the longest matching prefix alias; None when nothing matches."""
        if requested == served:
            return served
        target = self.model_aliases.get(requested)
        if target is None:
            prefixes = [k for k in self.model_aliases
                        if k.endswith("*") and requested.startswith(k[:-1])]
            if not prefixes:
                return None
            target = self.model_aliases[max(prefixes, key=len)]
        return target or served

    def shared_prefix_text(self) -> str | None:
        """The declared public prefix (`shared_prefix`, else the file's text); None: none.
        Raises OSError when the file cannot be read."""
        if self.shared_prefix is not None:
            return self.shared_prefix
        if self.shared_prefix_file is None:
            return None
        return self.shared_prefix_file.read_text(encoding="utf-8") or None

    @property
    def access_policy(self) -> AccessPolicy:
        """Open access (any key is the local tenant while no key is stored) on a loopback host
        or with `insecure`, unless `api_key` is set."""
        return AccessPolicy(api_key=self.api_key, allow_open=self.is_loopback or self.insecure)

    @property
    def auth_key_prefix(self) -> str:
        """Redis key prefix of the API-key hashes."""
        return f"{self.key_prefix}auth:"
