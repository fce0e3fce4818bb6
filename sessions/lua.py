"""Lua scripts of the session store. Each mutation is exactly one script, so it is atomic.

A Lua error after a write does not roll back earlier writes, so every script does all of its checks
before its first write. Scripts answer a table whose first element is a status word; the store
turns the non-OK words into typed errors (see `SessionStore._raise`).

Mutation scripts (append, fork, rewind) share `_MUTATION_PRELUDE`:

    KEYS[1] meta  KEYS[2] br  KEYS[3] turns  KEYS[4] ev  KEYS[5] idem index  KEYS[6] idem record
    ARGV[1] key base 'rg:{sid}:'   ARGV[2] tenant   ARGV[3] request hash ('' = no idempotency)
    ARGV[4] idempotency TTL (s)    ARGV[5] expected version ('' = any)   ARGV[6] stream MAXLEN ~

and its order of checks: tenant (NOT_FOUND) → idempotency record (DUP with the first result, or
IDEM_CONFLICT) → expected version (VERSION) → the operation's own checks → writes → `commit`
(version, idempotency record, event). Only successes are recorded for replay. Keys below a turn
(ancestors, children) are derived from ARGV[1] inside the script: they carry the same hash tag, so
they are in the script's slot.
"""

from __future__ import annotations

from typing import Final

_MUTATION_PRELUDE: Final = """
local base = ARGV[1]
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[2] then return {'NOT_FOUND'} end
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_str = string.format('%d', now_ms)
local function meta_reply()
  if WANT_META then return redis.call('HGETALL', KEYS[1]) end
  return {}
end
if ARGV[3] ~= '' then
  local prev = redis.call('GET', KEYS[6])
  if prev then
    local sep = string.find(prev, '\\n', 1, true)
    if string.sub(prev, 1, sep - 1) ~= ARGV[3] then return {'IDEM_CONFLICT'} end
    return {'DUP', string.sub(prev, sep + 1), meta_reply()}
  end
end
local version = tonumber(redis.call('HGET', KEYS[1], 'version'))
if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= version then
  return {'VERSION', tostring(version)}
end
local function ancestor_at(id, depth, target_depth)
  while depth > target_depth do
    id = redis.call('HGET', base .. 't:' .. id, 'parent')
    if not id then return false end
    depth = depth - 1
  end
  return id
end
local function depth_of(id)
  local d = redis.call('HGET', base .. 't:' .. id, 'depth')
  if d then return tonumber(d) end
  return nil
end
local function commit(result, event)
  redis.call('HSET', KEYS[1], 'version', tostring(version))
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now_str)
  if ARGV[3] ~= '' then
    local ttl = tonumber(ARGV[4])
    redis.call('SET', KEYS[6], ARGV[3] .. '\\n' .. result, 'EX', ttl)
    redis.call('ZADD', KEYS[5], string.format('%d', now_ms + ttl * 1000), KEYS[6])
  end
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*',
             'type', event[1], 'version', tostring(version), unpack(event, 2))
  return {'OK', result, meta_reply()}
end
"""

# ARGV[7] branch, ARGV[8] parent ('' = branch head), ARGV[9] expected head (''),
# ARGV[10] move branch ('1'/'0'), ARGV[11] n, ARGV[12] lease id to release ('' = none),
# ARGV[13] branch to fork at the parent when the head moved ('' = fail with HEAD_MOVED), then
# 8 values per turn: id, role, messages, tool_calls, packed token ids, usage, finish_reason,
# worker (the engine worker holding its KV, '' = none).
# KEYS[6+i]: turn i. The fork, when taken, is a mutation of its own (version and event).
APPEND: Final = (
    "local WANT_META = false\n"
    + _MUTATION_PRELUDE
    + """
local branch = ARGV[7]
local head = redis.call('HGET', KEYS[2], branch)
if not head then return {'NO_BRANCH'} end
local fork = ARGV[13]
local moved = nil
if ARGV[9] ~= '' and ARGV[9] ~= head then moved = 'expected head differs' end
local parent = ARGV[8]
if parent == '' then parent = head end
local pdepth = depth_of(parent)
if not pdepth then return {'NO_TURN', parent} end
local move = ARGV[10] == '1'
if move and not moved and parent ~= head then
  local hdepth = depth_of(head)
  if not hdepth or hdepth > pdepth or ancestor_at(parent, pdepth, hdepth) ~= head then
    moved = 'parent is not on the branch line (fork first)'
  end
end
if moved and fork == '' then return {'HEAD_MOVED', head, tostring(version), moved} end
if moved and redis.call('HEXISTS', KEYS[2], fork) == 1 then return {'BRANCH_EXISTS'} end
local n = tonumber(ARGV[11])
for i = 1, n do
  if redis.call('EXISTS', KEYS[6 + i]) == 1 then return {'ID_EXISTS', ARGV[14 + (i - 1) * 8]} end
end
if ARGV[12] ~= '' then
  local held = redis.call('HGET', base .. 'leases', branch)
  if held and string.sub(held, 1, #ARGV[12] + 1) == ARGV[12] .. '|' then
    redis.call('HDEL', base .. 'leases', branch)
  end
end
if moved then
  version = version + 1
  redis.call('HSET', KEYS[2], fork, parent)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'type', 'branch.created',
             'version', tostring(version), 'branch', fork, 'turn', parent)
  branch = fork
end
version = version + 1
local seq = tonumber(redis.call('HGET', KEYS[1], 'num_turns'))
local first_seq = seq
local prev = parent
local depth = pdepth
local ids = {}
for i = 1, n do
  local o = 13 + (i - 1) * 8
  local id = ARGV[o + 1]
  depth = depth + 1
  redis.call('HSET', KEYS[6 + i], 'parent', prev, 'depth', tostring(depth), 'seq', tostring(seq),
             'version', tostring(version), 'role', ARGV[o + 2], 'messages', ARGV[o + 3],
             'tool_calls', ARGV[o + 4], 'token_ids', ARGV[o + 5],
             'num_tokens', tostring(#ARGV[o + 5] / 4), 'usage', ARGV[o + 6],
             'finish_reason', ARGV[o + 7], 'worker', ARGV[o + 8], 'created_ms', now_str)
  redis.call('ZADD', base .. 'ch:' .. prev, seq, id)
  redis.call('ZADD', KEYS[3], seq, id)
  ids[i] = id
  prev = id
  seq = seq + 1
end
redis.call('HSET', KEYS[1], 'num_turns', tostring(seq))
local new_head = ''
if move then
  redis.call('HSET', KEYS[2], branch, prev)
  new_head = prev
end
local result = cjson.encode({v = tostring(version), ids = ids, p = parent,
  d = tostring(pdepth + 1), s = tostring(first_seq), ms = now_str, h = new_head, b = branch})
return commit(result, {'turns.appended', 'branch', branch, 'parent', parent,
                       'turn_ids', table.concat(ids, ' '), 'head', new_head})
"""
)

# ARGV[7] new branch, ARGV[8] turn to fork from.
FORK: Final = (
    "local WANT_META = true\n"
    + _MUTATION_PRELUDE
    + """
if redis.call('HEXISTS', KEYS[2], ARGV[7]) == 1 then return {'BRANCH_EXISTS'} end
if not depth_of(ARGV[8]) then return {'NO_TURN', ARGV[8]} end
version = version + 1
redis.call('HSET', KEYS[2], ARGV[7], ARGV[8])
local result = cjson.encode({v = tostring(version), br = redis.call('HGETALL', KEYS[2])})
return commit(result, {'branch.created', 'branch', ARGV[7], 'turn', ARGV[8]})
"""
)

# ARGV[7] branch, ARGV[8] turn to rewind to, ARGV[9] expected head ('').
REWIND: Final = (
    "local WANT_META = true\n"
    + _MUTATION_PRELUDE
    + """
local head = redis.call('HGET', KEYS[2], ARGV[7])
if not head then return {'NO_BRANCH'} end
if ARGV[9] ~= '' and ARGV[9] ~= head then
  return {'HEAD_MOVED', head, tostring(version), 'expected head differs'}
end
local tdepth = depth_of(ARGV[8])
if not tdepth then return {'NO_TURN', ARGV[8]} end
local hdepth = depth_of(head)
if not hdepth or tdepth > hdepth or ancestor_at(head, hdepth, tdepth) ~= ARGV[8] then
  return {'NOT_ANCESTOR'}
end
version = version + 1
redis.call('HSET', KEYS[2], ARGV[7], ARGV[8])
local result = cjson.encode({v = tostring(version), br = redis.call('HGETALL', KEYS[2])})
return commit(result, {'branch.moved', 'branch', ARGV[7], 'from', head, 'to', ARGV[8]})
"""
)

# KEYS: meta, br, turns, ev, root turn, paths. ARGV[1] tenant, ARGV[2] create hash ('' = none),
# ARGV[3] model, ARGV[4] metadata, ARGV[5] system, ARGV[6] tools (JSON), ARGV[7] root id,
# ARGV[8] packed system token ids, ARGV[9] default branch, ARGV[10] stream MAXLEN ~,
# ARGV[11] the root's path hash to index ('' = none; `sessions.path_index`).
# The create's idempotency record is `create_hash` in meta: it never expires, and a replay
# reports the first result (version 1, only the default branch) rebuilt from meta.
CREATE: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  local f = redis.call('HMGET', KEYS[1], 'tenant', 'create_hash')
  if ARGV[2] ~= '' and f[1] == ARGV[1] and f[2] == ARGV[2] then
    return {'DUP', redis.call('HGETALL', KEYS[1])}
  end
  if ARGV[2] ~= '' then return {'IDEM_CONFLICT'} end
  return {'ID_EXISTS'}
end
local clock = redis.call('TIME')
local now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local now_str = string.format('%d', now_ms)
redis.call('HSET', KEYS[1], 'tenant', ARGV[1], 'model', ARGV[3], 'created_ms', now_str,
           'version', '1', 'root', ARGV[7], 'default_branch', ARGV[9], 'num_turns', '1',
           'metadata', ARGV[4], 'system', ARGV[5], 'tools', ARGV[6], 'create_hash', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[9], ARGV[7])
redis.call('HSET', KEYS[5], 'parent', '', 'depth', '0', 'seq', '0', 'version', '1',
           'role', 'root', 'messages', '[]', 'tool_calls', '[]', 'token_ids', ARGV[8],
           'num_tokens', tostring(#ARGV[8] / 4), 'usage', 'null', 'finish_reason', '',
           'created_ms', now_str)
redis.call('ZADD', KEYS[3], 0, ARGV[7])
if ARGV[11] ~= '' then redis.call('HSET', KEYS[6], ARGV[11], ARGV[7]) end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[10], '*', 'type', 'session.created',
           'version', '1', 'root', ARGV[7], 'branch', ARGV[9])
return {'OK', redis.call('HGETALL', KEYS[1])}
"""

# KEYS: meta, br, turns, ev, idem index. ARGV[1] key base, ARGV[2] tenant.
# UNLINK frees memory off the main thread; batches keep unpack() within Lua's stack limit.
DELETE: Final = """
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[2] then return {'NOT_FOUND'} end
local keys = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  keys[#keys + 1] = ARGV[1] .. 't:' .. id
  keys[#keys + 1] = ARGV[1] .. 'ch:' .. id
end
for _, k in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do keys[#keys + 1] = k end
keys[#keys + 1] = ARGV[1] .. 'paths'
keys[#keys + 1] = ARGV[1] .. 'leases'
for i = 1, 5 do keys[#keys + 1] = KEYS[i] end
for i = 1, #keys, 500 do
  redis.call('UNLINK', unpack(keys, i, math.min(i + 499, #keys)))
end
return {'OK'}
"""

# KEYS: meta. ARGV[1] key base, ARGV[2] tenant, ARGV[3] turn id, ARGV[4] '1' = collect tokens.
# Answers {'OK', concatenated packed token ids (root first), id_root, ..., id_turn}.
# The walk is bounded by num_turns, so a corrupt (cyclic) tree answers CORRUPT, never hangs.
PATH: Final = """
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[2] then return {'NOT_FOUND'} end
local base = ARGV[1]
if redis.call('EXISTS', base .. 't:' .. ARGV[3]) == 0 then return {'NO_TURN', ARGV[3]} end
local limit = tonumber(redis.call('HGET', KEYS[1], 'num_turns'))
local want_tokens = ARGV[4] == '1'
local ids, blobs = {}, {}
local cur = ARGV[3]
while cur ~= '' do
  if #ids >= limit then return {'CORRUPT', 'cycle at ' .. cur} end
  local f
  if want_tokens then
    f = redis.call('HMGET', base .. 't:' .. cur, 'parent', 'token_ids')
  else
    f = redis.call('HMGET', base .. 't:' .. cur, 'parent')
  end
  if not f[1] then return {'CORRUPT', 'missing turn ' .. cur} end
  ids[#ids + 1] = cur
  if want_tokens then blobs[#blobs + 1] = f[2] or '' end
  cur = f[1]
end
local out = {'OK', ''}
local ordered = {}
for i = #ids, 1, -1 do
  out[#out + 1] = ids[i]
  if want_tokens then ordered[#ordered + 1] = blobs[i] end
end
if want_tokens then out[2] = table.concat(ordered) end
return out
"""

# KEYS: meta, turns. ARGV[1] key base, ARGV[2] tenant.
# Answers {'OK', id, seq, parent, role, depth, num_tokens, id, ...} in creation order.
TREE: Final = """
if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[2] then return {'NOT_FOUND'} end
local out = {'OK'}
local rows = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #rows, 2 do
  local f = redis.call('HMGET', ARGV[1] .. 't:' .. rows[i], 'parent', 'role', 'depth', 'num_tokens')
  out[#out + 1] = rows[i]
  out[#out + 1] = rows[i + 1]
  for j = 1, 4 do out[#out + 1] = f[j] end
end
return out
"""
