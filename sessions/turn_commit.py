"""One turn's protocol with the store: reserve the branch, generate, then commit input and reply.

    begin_turn   one script: tenant, If-Match version, the parent (default: the branch head),
                 the head check and the branch lease; answers the session, its branches and the
                 parent turn, so nothing else is read before the engine runs
    renew_lease  while the turn generates (a lease lapses after its TTL, so a crashed gateway
                 holds a branch for at most that long)
    commit_turn  one script: the input and the reply (ids chosen before generation) appended as a
                 chain under the parent, the head moved, the lease released, the idempotency
                 record written; nothing is stored before it, so a failed turn leaves nothing
    release_lease  a turn that failed or was aborted gives its branch back

A lease is `rg:{sid}:leases` field `<branch>` = "<lease id>|<expiry ms>". While another turn's
lease on the branch is live, `begin_turn` raises BranchBusy; with `fork_branch` it forks that
branch at the parent instead (the compatible routes: a stateless client never sees the tree). The
same `fork_branch` is the way out when the head moved anyway (a lease that lapsed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from redis.commands.core import AsyncScript

from sessions.codec import decode_branches, decode_session, decode_turn, pairs, raise_for_reply
from sessions.keys import check_tenant, is_valid_branch, is_valid_id
from sessions.models import NewTurn, Session, Turn

if TYPE_CHECKING:
    from sessions.store import SessionStore

# KEYS: meta, br, ev. ARGV[1] key base, [2] tenant, [3] branch ('' = the parent's, else the
# default), [4] parent ('' = branch head), [5] expected version (''), [6] lease id, [7] lease TTL
# ms, [8] branch to fork on a conflict ('' = fail), [9] stream MAXLEN ~. A parent that heads no
# branch is a conflict only when a fork branch is given (else the reply moves no branch).
BEGIN: Final = """
local base = ARGV[1]
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[2] then return {'NOT_FOUND'} end
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local version = tonumber(redis.call('HGET', KEYS[1], 'version'))
if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= version then return {'VERSION', tostring(version)} end
local leases = base .. 'leases'
local branch, parent, conflict = ARGV[3], ARGV[4], nil
local default = redis.call('HGET', KEYS[1], 'default_branch')
if parent == '' then
  if branch == '' then branch = default end
  parent = redis.call('HGET', KEYS[2], branch)
  if not parent then return {'NO_BRANCH'} end
elseif redis.call('EXISTS', base .. 't:' .. parent) == 0 then
  return {'NO_TURN', parent}
elseif branch == '' then
  if redis.call('HGET', KEYS[2], default) == parent then branch = default else
    local flat, names = redis.call('HGETALL', KEYS[2]), {}
    for i = 1, #flat, 2 do if flat[i + 1] == parent then names[#names + 1] = flat[i] end end
    table.sort(names)
    branch = names[1] or ''
  end
  if branch == '' and ARGV[8] ~= '' then conflict = {'NO_HEAD'} end
else
  local head = redis.call('HGET', KEYS[2], branch)
  if not head then return {'NO_BRANCH'} end
  if head ~= parent then
    conflict = {'HEAD_MOVED', head, tostring(version),
                'parent_turn_id is not the branch head; fork a branch there'}
  end
end
if branch ~= '' and not conflict then
  local held = redis.call('HGET', leases, branch)
  if held then
    local sep = string.find(held, '|', 1, true)
    if string.sub(held, 1, sep - 1) ~= ARGV[6] and tonumber(string.sub(held, sep + 1)) > now_ms
    then conflict = {'BUSY', branch} end
  end
end
local forked = '0'
if conflict then
  if ARGV[8] == '' then return conflict end
  if redis.call('HEXISTS', KEYS[2], ARGV[8]) == 1 then return {'BRANCH_EXISTS'} end
  version = version + 1
  redis.call('HSET', KEYS[1], 'version', tostring(version))
  redis.call('HSET', KEYS[2], ARGV[8], parent)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[9], '*', 'type', 'branch.created',
             'version', tostring(version), 'branch', ARGV[8], 'turn', parent)
  branch, forked = ARGV[8], '1'
end
if branch ~= '' then
  redis.call('HSET', leases, branch,
             ARGV[6] .. '|' .. string.format('%d', now_ms + tonumber(ARGV[7])))
end
return {'OK', branch, forked, parent, redis.call('HGETALL', KEYS[1]),
        redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', base .. 't:' .. parent)}
"""

# KEYS: leases. ARGV[1] branch ('' = whichever it holds: release only), [2] lease id,
# [3] TTL ms ('' = release). Only the owner's.
LEASE: Final = """
if ARGV[1] == '' then
  local fields = redis.call('HGETALL', KEYS[1])
  local released = 0
  for i = 1, #fields, 2 do
    if string.sub(fields[i + 1], 1, #ARGV[2] + 1) == ARGV[2] .. '|' then
      redis.call('HDEL', KEYS[1], fields[i])
      released = released + 1
    end
  end
  return released
end
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held or string.sub(held, 1, #ARGV[2] + 1) ~= ARGV[2] .. '|' then return 0 end
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) return 1 end
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = string.format('%d', now_ms + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. expiry)
return 1
"""


@dataclass(frozen=True)
class TurnStart:
    """What `begin_turn` found and reserved. `branch` is None when the parent heads no branch
    (the reply then moves none); `forked` when `branch` was created for this turn."""

    session: Session
    parent: Turn
    branch: str | None
    lease_id: str
    forked: bool


class TurnCommits:
    """The turn protocol of one `SessionStore` (`store.turns`)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._begin: AsyncScript = store.redis.register_script(BEGIN)
        self._lease: AsyncScript = store.redis.register_script(LEASE)

    async def begin_turn(self, session_id: str, *, tenant: str, lease_id: str, lease_ttl_s: float,
                         branch: str | None = None, parent_turn_id: str | None = None,
                         expected_version: int | None = None,
                         fork_branch: str | None = None) -> TurnStart:
        """Reserve the branch the turn's reply will move. Raises SessionNotFound,
        BranchNotFound, TurnNotFound, VersionConflict, HeadMoved, BranchBusy, BranchExists
        (`fork_branch` taken)."""
        check_tenant(tenant)
        keys = self.store.keys(session_id)
        for name in (branch, fork_branch):
            if name is not None and not is_valid_branch(name):
                raise_for_reply([b"NO_BRANCH"], session_id, name)
        if parent_turn_id is not None and not is_valid_id(parent_turn_id):
            raise_for_reply([b"NO_TURN", parent_turn_id.encode()], session_id)
        reply = await self._begin(keys=[keys.meta, keys.branches, keys.events], args=[
            keys.base, tenant, branch or "", parent_turn_id or "",
            "" if expected_version is None else str(expected_version), lease_id,
            str(int(lease_ttl_s * 1000)), fork_branch or "", str(self.store.stream_maxlen)])
        if reply[0] != b"OK":
            raise_for_reply(reply, session_id, branch, expected_version)
        name, forked, parent_id = reply[1].decode(), reply[2] == b"1", reply[3].decode()
        meta = pairs(reply[4])
        session = decode_session(session_id, meta, int(meta[b"version"]),
                                 decode_branches(pairs(reply[5])))
        parent = decode_turn(session_id, parent_id, pairs(reply[6]))
        return TurnStart(session, parent, name or None, lease_id, forked)

    async def renew_lease(self, start: TurnStart, ttl_s: float) -> bool:
        """Push the lease's expiry out; False when it is no longer this turn's."""
        if start.branch is None:
            return True
        keys = self.store.keys(start.session.id)
        renewed = await self._lease(keys=[keys.base + "leases"], args=[
            start.branch, start.lease_id, str(int(ttl_s * 1000))])
        return bool(renewed)

    async def release_lease(self, start: TurnStart) -> None:
        """Give the branch back (the turn failed or was aborted); a lease it lost is left."""
        if start.branch is not None:
            await self.release_lease_id(start.session.id, start.lease_id, start.branch)

    async def release_lease_id(self, session_id: str, lease_id: str,
                               branch: str | None = None) -> int:
        """Release `lease_id` on `branch`, or on whichever branch it holds when None (a
        `begin_turn` whose answer was lost may have taken it). Safe to repeat; returns the
        number of leases released."""
        keys = self.store.keys(session_id)
        released = await self._lease(keys=[keys.base + "leases"], args=[branch or "", lease_id,
                                                                         ""])
        return int(released)

    async def commit_turn(self, start: TurnStart, *, tenant: str,
                          turns: Sequence[tuple[str, NewTurn]], fork_branch: str | None = None,
                          idempotency_key: str | None = None,
                          request_fields: Mapping[str, Any] | None = None
                          ) -> tuple[list[Turn], str | None]:
        """Append `turns` ((id, turn) pairs: the input, then the reply) under the parent, move
        the branch and release the lease, in one script. If the head moved after all (the lease
        lapsed), `fork_branch` is forked at the parent and moved instead (else HeadMoved).
        With `idempotency_key` a retry returns the first commit (`request_fields`, the request
        that made the turn, is what must match); without one the reply's id is the key, so a
        commit repeated after its answer was lost (a store failover) is answered as the first
        rather than refused for the ids it wrote. Returns the turns and the branch moved."""
        session_id = start.session.id
        idempotency_key = idempotency_key or f"commit:{turns[-1][0]}"
        if start.branch is None:
            appended, _ = await self.store._append(
                session_id, tenant, turns, start.session.default_branch, start.parent.id,
                expected_version=None, expected_head=None, idempotency_key=idempotency_key,
                move_branch=False, idempotency_fields=request_fields)
            return appended, None
        appended, branch = await self.store._append(
            session_id, tenant, turns, start.branch, start.parent.id, expected_version=None,
            expected_head=start.parent.id, idempotency_key=idempotency_key, move_branch=True,
            lease_id=start.lease_id, fork_branch=fork_branch, idempotency_fields=request_fields)
        return appended, branch
