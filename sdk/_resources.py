"""`client.sessions` and the `Session` handle, sync and async twins.

Request construction and handle bookkeeping live in `_SessionBase` / module functions; the
twins only send (`client.request*`) and differ in `async`/`await`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Unpack
from urllib.parse import quote

from sdk._base import (
    MessagesInput,
    RequestOptions,
    append_body,
    continue_options,
    make_options,
)
from sdk._streaming import AsyncTurnStream, TurnStream
from sdk.types import BranchState, GenerateParams, SessionCreated, SessionState, Turn

if TYPE_CHECKING:
    from sdk._client import AsyncClient, Client


def _path(session_id: str, *parts: str) -> str:
    return "/".join(["/v1/sessions", quote(session_id, safe=""),
                     *(quote(p, safe="") for p in parts)])


def _create_options(model: str | None, system: str | None, tools: list[dict[str, Any]] | None,
                    metadata: dict[str, Any] | None,
                    idempotency_key: str | None) -> RequestOptions:
    body: dict[str, Any] = {"tools": tools or [], "metadata": metadata or {}}
    if model is not None:
        body["model"] = model
    if system is not None:
        body["system"] = system
    return make_options("POST", "/v1/sessions", json=body, idempotency_key=idempotency_key)


class _SessionBase:
    """A handle on one session: its id, the branch appends go to, and the last known head and
    version (updated by this handle's own appends, forks and rewinds; `refresh()` re-reads)."""

    def __init__(self, session_id: str, branch: str, head_turn_id: str | None,
                 version: int | None, state: SessionState | None = None) -> None:
        self.id = session_id
        self.branch = branch
        self.head_turn_id = head_turn_id
        self.version = version
        self.state = state

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(id={self.id!r}, branch={self.branch!r}, "
                f"head_turn_id={self.head_turn_id!r}, version={self.version!r})")

    def _append_options(self, messages: MessagesInput, generate: GenerateParams, *,
                        stream: bool, branch: str | None, parent_turn_id: str | None,
                        if_match: int | str | None,
                        idempotency_key: str | None) -> RequestOptions:
        """Appends go to `branch`, else to `parent_turn_id` alone, else to this handle's branch."""
        if branch is None and parent_turn_id is None:
            branch = self.branch
        body = append_body(messages, generate, stream=stream, branch=branch,
                           parent_turn_id=parent_turn_id)
        return make_options("POST", _path(self.id, "turns"), json=body, if_match=if_match,
                            idempotency_key=idempotency_key, stream=stream)

    def _track_turn(self, turn: Turn) -> Turn:
        self.version = turn.version
        if turn.branch == self.branch:
            self.head_turn_id = turn.id
        return turn

    def _track_branches(self, state: BranchState) -> BranchState:
        self.version = state.version
        self.head_turn_id = state.branches.get(self.branch, self.head_turn_id)
        return state

    def _track_state(self, state: SessionState) -> SessionState:
        self.state, self.version = state, state.version
        self.head_turn_id = state.branches.get(self.branch, self.head_turn_id)
        return state


def _fork_options(session_id: str, turn_id: str, branch: str, if_match: int | str | None,
                  idempotency_key: str | None) -> RequestOptions:
    return make_options("POST", _path(session_id, "fork"),
                        json={"from_turn_id": turn_id, "branch": branch}, if_match=if_match,
                        idempotency_key=idempotency_key)


def _rewind_options(session_id: str, branch: str, turn_id: str, if_match: int | str | None,
                    idempotency_key: str | None) -> RequestOptions:
    return make_options("POST", _path(session_id, "rewind"),
                        json={"branch": branch, "to_turn_id": turn_id}, if_match=if_match,
                        idempotency_key=idempotency_key)


class Session(_SessionBase):
    def __init__(self, client: Client, session_id: str, branch: str = "main",
                 head_turn_id: str | None = None, version: int | None = None,
                 state: SessionState | None = None) -> None:
        super().__init__(session_id, branch, head_turn_id, version, state)
        self._client = client

    def append(self, messages: MessagesInput, *, branch: str | None = None,
               parent_turn_id: str | None = None, if_match: int | str | None = None,
               idempotency_key: str | None = None, **generate: Unpack[GenerateParams]) -> Turn:
        """Append `messages` and generate the assistant turn (a plain string is one user
        message). Returns the assistant turn, with `usage` and `finish_reason`."""
        options = self._append_options(messages, generate, stream=False, branch=branch,
                                       parent_turn_id=parent_turn_id, if_match=if_match,
                                       idempotency_key=idempotency_key)
        return self._track_turn(self._client.request_model(options, Turn))

    def stream(self, messages: MessagesInput, *, branch: str | None = None,
               parent_turn_id: str | None = None, if_match: int | str | None = None,
               idempotency_key: str | None = None,
               **generate: Unpack[GenerateParams]) -> TurnStream:
        """Like `append`, streamed: `with session.stream(...) as s: for text in s.text_stream`."""
        options = self._append_options(messages, generate, stream=True, branch=branch,
                                       parent_turn_id=parent_turn_id, if_match=if_match,
                                       idempotency_key=idempotency_key)
        return TurnStream(lambda: self._client.request(options), on_turn=self._track_turn,
                          reopen=lambda last: self._client.request(
                              continue_options(options, last)))

    def fork(self, turn_id: str, branch: str, *, if_match: int | str | None = None,
             idempotency_key: str | None = None) -> BranchState:
        """Create `branch` pointing at `turn_id` (409 ConflictError if it exists)."""
        options = _fork_options(self.id, turn_id, branch, if_match, idempotency_key)
        return self._track_branches(self._client.request_model(options, BranchState))

    def rewind(self, branch: str, turn_id: str, *, if_match: int | str | None = None,
               idempotency_key: str | None = None) -> BranchState:
        """Move `branch` back to `turn_id`, an ancestor of its head."""
        options = _rewind_options(self.id, branch, turn_id, if_match, idempotency_key)
        return self._track_branches(self._client.request_model(options, BranchState))

    def get_turn(self, turn_id: str) -> Turn:
        return self._client.request_model(make_options("GET", _path(self.id, "turns", turn_id)),
                                          Turn)

    def refresh(self) -> SessionState:
        state = self._client.request_model(make_options("GET", _path(self.id)), SessionState)
        return self._track_state(state)

    def delete(self, *, if_match: int | str | None = None) -> None:
        self._client.sessions.delete(self.id, if_match=if_match)


class AsyncSession(_SessionBase):
    def __init__(self, client: AsyncClient, session_id: str, branch: str = "main",
                 head_turn_id: str | None = None, version: int | None = None,
                 state: SessionState | None = None) -> None:
        super().__init__(session_id, branch, head_turn_id, version, state)
        self._client = client

    async def append(self, messages: MessagesInput, *, branch: str | None = None,
                     parent_turn_id: str | None = None, if_match: int | str | None = None,
                     idempotency_key: str | None = None,
                     **generate: Unpack[GenerateParams]) -> Turn:
        """See `Session.append`."""
        options = self._append_options(messages, generate, stream=False, branch=branch,
                                       parent_turn_id=parent_turn_id, if_match=if_match,
                                       idempotency_key=idempotency_key)
        return self._track_turn(await self._client.request_model(options, Turn))

    def stream(self, messages: MessagesInput, *, branch: str | None = None,
               parent_turn_id: str | None = None, if_match: int | str | None = None,
               idempotency_key: str | None = None,
               **generate: Unpack[GenerateParams]) -> AsyncTurnStream:
        """`async with session.stream(...) as s: async for text in s.text_stream`."""
        options = self._append_options(messages, generate, stream=True, branch=branch,
                                       parent_turn_id=parent_turn_id, if_match=if_match,
                                       idempotency_key=idempotency_key)
        return AsyncTurnStream(lambda: self._client.request(options), on_turn=self._track_turn,
                               reopen=lambda last: self._client.request(
                                   continue_options(options, last)))

    async def fork(self, turn_id: str, branch: str, *, if_match: int | str | None = None,
                   idempotency_key: str | None = None) -> BranchState:
        options = _fork_options(self.id, turn_id, branch, if_match, idempotency_key)
        return self._track_branches(await self._client.request_model(options, BranchState))

    async def rewind(self, branch: str, turn_id: str, *, if_match: int | str | None = None,
                     idempotency_key: str | None = None) -> BranchState:
        options = _rewind_options(self.id, branch, turn_id, if_match, idempotency_key)
        return self._track_branches(await self._client.request_model(options, BranchState))

    async def get_turn(self, turn_id: str) -> Turn:
        options = make_options("GET", _path(self.id, "turns", turn_id))
        return await self._client.request_model(options, Turn)

    async def refresh(self) -> SessionState:
        options = make_options("GET", _path(self.id))
        return self._track_state(await self._client.request_model(options, SessionState))

    async def delete(self, *, if_match: int | str | None = None) -> None:
        await self._client.sessions.delete(self.id, if_match=if_match)


class Sessions:
    """`client.sessions`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, *, model: str | None = None, system: str | None = None,
               tools: list[dict[str, Any]] | None = None,
               metadata: dict[str, Any] | None = None,
               idempotency_key: str | None = None) -> Session:
        options = _create_options(model, system, tools, metadata, idempotency_key)
        created = self._client.request_model(options, SessionCreated)
        return Session(self._client, created.id, created.branch, created.head_turn_id,
                       created.version)

    def get(self, session_id: str) -> Session:
        state = self._client.request_model(make_options("GET", _path(session_id)), SessionState)
        return Session(self._client, state.id, state.default_branch,
                       state.branches.get(state.default_branch), state.version, state)

    def delete(self, session_id: str, *, if_match: int | str | None = None) -> None:
        self._client.request(make_options("DELETE", _path(session_id), if_match=if_match))


class AsyncSessions:
    """`client.sessions` of an `AsyncClient`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, *, model: str | None = None, system: str | None = None,
                     tools: list[dict[str, Any]] | None = None,
                     metadata: dict[str, Any] | None = None,
                     idempotency_key: str | None = None) -> AsyncSession:
        options = _create_options(model, system, tools, metadata, idempotency_key)
        created = await self._client.request_model(options, SessionCreated)
        return AsyncSession(self._client, created.id, created.branch, created.head_turn_id,
                            created.version)

    async def get(self, session_id: str) -> AsyncSession:
        options = make_options("GET", _path(session_id))
        state = await self._client.request_model(options, SessionState)
        return AsyncSession(self._client, state.id, state.default_branch,
                            state.branches.get(state.default_branch), state.version, state)

    async def delete(self, session_id: str, *, if_match: int | str | None = None) -> None:
        await self._client.request(make_options("DELETE", _path(session_id), if_match=if_match))
