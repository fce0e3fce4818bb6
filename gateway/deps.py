"""`Annotated` dependency aliases: handler signatures read like types.

Every dependency is `async def`: FastAPI runs a plain `def` dependency in a worker thread, a
thread hop per dependency per request for what is an attribute read.

Everything comes from the lifespan `State` (`request.state`); nothing is module-global.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from gateway.auth import KeyStore, Principal, parse_credentials
from gateway.engine_pool import EnginePool
from gateway.errors import AuthenticationError, InvalidRequest
from gateway.idempotency import IdempotencyStore
from gateway.rate_limits import RateLimiter
from gateway.settings import GatewaySettings
from gateway.telemetry import Telemetry
from gateway.turns import TurnService
from sessions import SessionStore


async def get_settings(request: Request) -> GatewaySettings:
    settings: GatewaySettings = request.state.settings
    return settings


async def get_store(request: Request) -> SessionStore:
    store: SessionStore = request.state.store
    return store


async def get_engine(request: Request) -> EnginePool:
    engine: EnginePool = request.state.engine
    return engine


async def get_turns(request: Request) -> TurnService:
    service: TurnService = request.state.turns
    return service


async def get_telemetry(request: Request) -> Telemetry:
    telemetry: Telemetry = request.state.telemetry
    return telemetry


async def get_idempotency(request: Request) -> IdempotencyStore:
    idem: IdempotencyStore = request.state.idempotency
    return idem


async def get_principal(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> Principal:
    """The caller's tenant and stored key (401 `authentication_error` without a valid key
    where one is needed)."""
    keys: KeyStore = request.state.keys
    settings: GatewaySettings = request.state.settings
    policy = settings.access_policy
    try:
        key = parse_credentials(authorization, x_api_key)
    except AuthenticationError:
        if policy.api_key is not None or not policy.allow_open:
            raise
        key = None  # open access takes any credentials; a key store may still reject them
    return await keys.principal_of(key, policy)


async def get_tenant(principal: Annotated[Principal, Depends(get_principal)]) -> str:
    """The caller's tenant (`get_principal`)."""
    return principal.tenant


@dataclass(frozen=True)
class Services:
    """The collaborators a turn route needs, built once by the lifespan: one dependency for
    what would be five (each dependency costs FastAPI work per request)."""

    settings: GatewaySettings
    turns: TurnService
    idempotency: IdempotencyStore
    telemetry: Telemetry
    model_name: str
    limiter: RateLimiter


async def get_services(request: Request) -> Services:
    services: Services = request.state.services
    return services


async def get_expected_version(
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
EngineDep = Annotated[EnginePool, Depends(get_engine)]
TurnServiceDep = Annotated[TurnService, Depends(get_turns)]
IdempotencyDep = Annotated[IdempotencyStore, Depends(get_idempotency)]
TelemetryDep = Annotated[Telemetry, Depends(get_telemetry)]
TenantDep = Annotated[str, Depends(get_tenant)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
ServicesDep = Annotated[Services, Depends(get_services)]
ExpectedVersionDep = Annotated[int | None, Depends(get_expected_version)]
IdempotencyKeyDep = Annotated[str | None, Header(alias="Idempotency-Key")]
