"""`Annotated` dependency aliases: handler signatures read like types.

Everything comes from the lifespan `State` (`request.state`); nothing is module-global.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from gateway.auth import KeyStore, parse_credentials
from gateway.engine_link import EngineLink
from gateway.errors import AuthenticationError, InvalidRequest
from gateway.idempotency import IdempotencyStore
from gateway.settings import GatewaySettings
from gateway.telemetry import Telemetry
from gateway.turns import TurnService
from sessions import SessionStore


def get_settings(request: Request) -> GatewaySettings:
    settings: GatewaySettings = request.state.settings
    return settings


def get_store(request: Request) -> SessionStore:
    store: SessionStore = request.state.store
    return store


def get_engine(request: Request) -> EngineLink:
    engine: EngineLink = request.state.engine
    return engine


def get_turns(request: Request) -> TurnService:
    service: TurnService = request.state.turns
    return service


def get_telemetry(request: Request) -> Telemetry:
    telemetry: Telemetry = request.state.telemetry
    return telemetry


def get_idempotency(request: Request) -> IdempotencyStore:
    idem: IdempotencyStore = request.state.idempotency
    return idem


async def get_tenant(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> str:
    """The caller's tenant (401 `authentication_error` without a valid key where one is needed)."""
    keys: KeyStore = request.state.keys
    policy = get_settings(request).access_policy
    try:
        key = parse_credentials(authorization, x_api_key)
    except AuthenticationError:
        if policy.api_key is not None or not policy.allow_open:
            raise
        key = None  # open access takes any credentials; a key store may still reject them
    return await keys.tenant_of(key, policy)


def get_expected_version(
    if_match: Annotated[str | None, Header(description='session version, e.g. "v3" or 3')] = None,
) -> int | None:
    """The version named by `If-Match` ('"v3"', 'v3', '3'); None when absent or '*'."""
    if if_match is None or if_match.strip() == "*":
        return None
    raw = if_match.strip().removeprefix("W/").strip('"').removeprefix("v")
    if not raw.isdigit():
        raise InvalidRequest("If-Match must name a session version, e.g. '\"v3\"'")
    return int(raw)


SettingsDep = Annotated[GatewaySettings, Depends(get_settings)]
SessionStoreDep = Annotated[SessionStore, Depends(get_store)]
EngineDep = Annotated[EngineLink, Depends(get_engine)]
TurnServiceDep = Annotated[TurnService, Depends(get_turns)]
IdempotencyDep = Annotated[IdempotencyStore, Depends(get_idempotency)]
TelemetryDep = Annotated[Telemetry, Depends(get_telemetry)]
TenantDep = Annotated[str, Depends(get_tenant)]
ExpectedVersionDep = Annotated[int | None, Depends(get_expected_version)]
IdempotencyKeyDep = Annotated[str | None, Header(alias="Idempotency-Key")]
