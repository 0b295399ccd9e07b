-- The start of every script of a shared limit (scripts.py puts state.lua, flows.lua and
-- queue.lua before each script's own part): its keys and arguments, the state read once,
-- the weight an id carries, and leases granted less than their waiter asked. The keys, the
-- state's fields and the ids are described in scripts.py.
local K_LIMIT, K_QUEUE, K_WEXP, K_LEASES, K_CONFIGURED, K_STATE, K_MEMBERS =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local K_FQ, K_READY, K_FHELD, K_DQ, K_CAPPED = KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local K_BUDGET, K_BGRANT = KEYS[13], KEYS[14]
local MBOX, TTL, PROC = ARGV[1], tonumber(ARGV[2]), ARGV[4]
-- ARGV[5]: "1" if this process saw the state before, else "0"; "c" after it: a Redis Cluster
local CONTACTED, CLUSTER = string.sub(ARGV[5], 1, 1) == '1', string.sub(ARGV[5], 2) == 'c'
local t = redis.call('TIME')
local real = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The state (see the module's docstring), read once.
local c = redis.call('HMGET', K_STATE, 'v', 't', 'l', 'n', 'q', 's', 'e', 'g', 'run', 'c', 'w',
  'fw', 'fh', 'f0', 'x', 'fn', 'b', 'id')
local S = {
  limit = tonumber(c[3]), held = tonumber(c[4]), queued = tonumber(c[5]) or 0,
  seq = tonumber(c[6]) or 0, earliest = tonumber(c[7]) or 0, grace = tonumber(c[8]) or 0,
  run = c[9], leases = tonumber(c[10]) or 0, queued_weight = tonumber(c[11]) or 0,
  fw = tonumber(c[12]) or 0, fh = tonumber(c[13]) or 0, t0 = tonumber(c[14]) or 0,
  chosen = c[15] or '', nf = tonumber(c[16]) or 0, budget = c[17], node = c[18] or '',
}

-- A lease's (or waiter's) weight rides in its id: `<proc>:<n>` weighs 1, `<proc>:<n>*<w>` w;
-- a lease granted below its waiter's ask (a limit shrunk under it) adds `/<c>` and weighs c
-- (a flow, `@<flow>`, comes after them).
local function weight(id)
  -- (one match, run for every lease and waiter a script touches; a capped id has `*<w>`)
  local asked, granted = string.match(id, '^[^@*]*%*(%d+)/?(%d*)')
  return tonumber(granted) or tonumber(asked) or 1
end
local function weight_of(key)
  local total, ids = 0, redis.call('ZRANGE', key, 0, -1)
  for _, id in ipairs(ids) do total = total + weight(id) end
  return total, #ids
end

-- The waiter chosen next, heavier than the limit (shrunk under it): it is granted the whole
-- limit (>= 1 wherever a slot is granted), else it could never fit nor be passed. Its lease
-- is `id` with `/<limit>`; `capped` maps the waiter's id to it (for a renewal that names the
-- waiter before its process heard of the grant) while the lease is held.
local function fitted(id)
  return math.min(weight(id), S.limit)
end
local function capped_lease(id)
  if weight(id) <= S.limit then return id end
  local head, flow = string.match(id, '^([^@]*)(.*)$')
  local lease = head .. '/' .. S.limit .. flow
  redis.call('HSET', K_CAPPED, id, lease)
  return lease
end
local function forget_cap(lease)
  local waiter, capped = string.gsub(lease, '^([^@/]*)/%d+', '%1', 1)
  if capped > 0 then redis.call('HDEL', K_CAPPED, waiter) end
end
