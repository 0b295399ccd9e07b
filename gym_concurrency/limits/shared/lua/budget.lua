-- Rate budgets of a shared limit (after state.lua and flows.lua, before queue.lua, whose
-- `grant` and the acquire script reserve a waiter's estimate with its slot, all or none).
-- Nothing here runs for a limit without budgets (ARGV[6] empty).
--
-- ARGV[6] is `<sizes>|<ops>`: sizes "T,R,I,O,P" (tokens, requests, input tokens, output
-- tokens a minute, 0: not configured; P: the calling process's backfill in ms, see
-- `budget_room`), and ops separated by ';', applied first, in batches:
--   `#<id>`                      starts batch `<id>` of this process: applied once, whichever
--                                call carries it (a call sent again after its reply was lost,
--                                redis-py's own retry, a batch a failed call gave back); the
--                                batches applied are kept in `bgrant` as `o<proc>:<id>` for
--                                61 to 62 s (a batch later than that: its refunds find their
--                                second out of the window; its overruns would charge twice)
--   `<ref>=<dt>,<dr>,<di>,<do>`  a settlement: per budget a refund (< 0) taken back from the
--                                second charged (while counted, at most what it holds) or an
--                                overrun (> 0) charged now; `<ref>` the second charged, or
--                                `g<proc>:<n>` for a waiter granted from the queue (`bgrant`)
--   `!<code>=<remaining>,<reset in ms>,<age in ms>`  a provider's reading of a budget
-- A waiter's estimate rides in its id (`<proc>:<n>.<tokens>`); it takes its tokens from the
-- tokens, input and output budgets and one request.
--
-- The window mirrors rate_window.py on Redis's clock: one-second slots, a charge counted
-- until its slot is 61 slots old (60 to 61 s). `budget` (HASH) holds `<code><second>` ->
-- charged, and `m`, the newest second, written as the window moves. The state's `b` (JSON,
-- read and written with the state at no extra command) holds what every decision reads:
-- `n` the newest second, `u` the charges counted, `c` the newest second's, `w` the provider's
-- readings ({remaining, reset, observed, spent since}, Redis ms). Lost keys:
-- - `budget` lost (no `m` as the window moves): what it held is counted as charged in the
--   newest second (`u` is kept in the state): it frees up to 61 s later than it would have,
--   never sooner.
-- - the state lost with it (a restart, a flush) while a grace period runs (see queue.lua):
--   nothing is known of the last minute, so the whole minute is counted as spent now (no
--   admission for 61 s: never over budget). The state lost alone: rebuilt from `budget`.
local BCODES = {'t', 'r', 'i', 'o'}
-- How many waiters behind the oldest one are looked at for one that may pass it (`pass_by`).
local PASS_SCAN = 32
local B_SPEC, B_OPS = string.match(ARGV[6], '^([^|]*)|?(.*)$')
local B = nil  -- loaded on first use (`budget()`); false: no budget configured
local B_SLOTS = nil  -- the counted slots' charges, read at most once a call (`slots()`)

local function bfield(code, slot) return code .. slot end

-- The counted slots' charges by code and second, read once (a fit's walk, a rebuild).
local function slots()
  if B_SLOTS then return B_SLOTS end
  local fields, where = {}, {}
  for _, code in ipairs(B.codes) do
    for k = B.n - 60, B.n do
      fields[#fields + 1] = bfield(code, k)
      where[#where + 1] = {code, k}
    end
  end
  local got = redis.call('HMGET', K_BUDGET, unpack(fields))
  B_SLOTS = {}
  for j, place in ipairs(where) do
    B_SLOTS[place[1] .. place[2]] = tonumber(got[j]) or 0
  end
  for _, code in ipairs(B.codes) do B_SLOTS[code .. B.n] = B.c[code] end
  return B_SLOTS
end

-- Move the window to second `s`: charges 61 seconds old leave it.
local function advance(s)
  if B.n >= s then return end
  if s - B.n > 60 then
    for _, code in ipairs(B.codes) do B.u[code], B.c[code] = 0, 0 end
    redis.call('DEL', K_BUDGET)
  else
    local fields = {'m'}
    for _, code in ipairs(B.codes) do
      for k = B.n - 60, s - 61 do fields[#fields + 1] = bfield(code, k) end
    end
    local got = redis.call('HMGET', K_BUDGET, unpack(fields))
    local kept = false
    for _, code in ipairs(B.codes) do kept = kept or B.u[code] > 0 end
    if got[1] == false and kept then
      -- (the key was lost: what it held stays counted, as charged in the newest second)
      redis.call('DEL', K_BUDGET)
      for _, code in ipairs(B.codes) do
        redis.call('HSET', K_BUDGET, bfield(code, B.n), B.u[code])
      end
    else
      local j = 2
      for _, code in ipairs(B.codes) do
        for _ = B.n - 60, s - 61 do
          B.u[code] = B.u[code] - (tonumber(got[j]) or 0)
          j = j + 1
        end
      end
      if #fields > 1 then redis.call('HDEL', K_BUDGET, unpack(fields, 2)) end
    end
    for _, code in ipairs(B.codes) do B.c[code] = 0 end
  end
  B.n = s
  B.moved = true
  redis.call('ZREMRANGEBYSCORE', K_BGRANT, '-inf', s - 61)
end

-- The state's budget missing: rebuilt from `budget`, or (lost with the state while a grace
-- period runs) the whole minute counted as spent now; else a first start.
local function rebuild(s)
  B.n = s
  local kept = redis.call('HGETALL', K_BUDGET)
  if #kept > 0 then
    for j = 1, #kept, 2 do
      local code, k = string.match(kept[j], '^(%a)(%d+)$')
      k = tonumber(k)
      if code and B.size[code] and k and k >= s - 60 then
        B.u[code] = B.u[code] + tonumber(kept[j + 1])
        if k >= s then B.c[code] = B.c[code] + tonumber(kept[j + 1]) end
      end
    end
  elseif S.grace > real then
    for _, code in ipairs(B.codes) do
      B.u[code], B.c[code] = B.size[code], B.size[code]
      redis.call('HSET', K_BUDGET, bfield(code, s), B.size[code])
    end
  end
  B.moved = true
end

-- The provider's reading of `code` in force (nil: none, or past its reset).
local function word(code)
  local w = B.w[code]
  if w and real >= w[2] then B.w[code], w = nil, nil end
  return w
end

-- The budgets (false: none configured), loaded once a call.
local function budget()
  if B ~= nil then return B end
  if B_SPEC == '' then B = false return B end
  local sizes, codes, j, pass = {}, {}, 0, 0
  for size in string.gmatch(B_SPEC, '(%d+)') do
    j = j + 1
    if j > #BCODES then
      pass = tonumber(size)
    elseif tonumber(size) > 0 then
      sizes[BCODES[j]] = tonumber(size)
      codes[#codes + 1] = BCODES[j]
    end
  end
  local kept = (S.budget and S.budget ~= '') and cjson.decode(S.budget) or {}
  B = {size = sizes, codes = codes, n = tonumber(kept.n), u = {}, c = {}, w = {},
    refunds = {}, h = kept.h, pass = pass}
  for _, code in ipairs(codes) do
    B.u[code] = kept.u and tonumber(kept.u[code]) or 0
    B.c[code] = kept.c and tonumber(kept.c[code]) or 0
    if kept.w and kept.w[code] then B.w[code] = kept.w[code] end
  end
  local s = math.floor(real / 1000)
  if B.n == nil then rebuild(s) else advance(s) end
  return B
end

-- What `id` takes from budget `code`: its tokens (in its id), or one request.
local function amount(id, code)
  if code == 'r' then return 1 end
  return math.min(tonumber(string.match(id, '^[^:]*:%d+%.(%d+)')) or 0, B.size[code])
end

-- Milliseconds until `id`'s estimate fits every budget (0: now), as RateWindow.fits_at:
-- the start of the second in which enough of the oldest charges have left the window. The
-- wait found for the waiter chosen next is kept (`h`), not walked again on every call, unless
-- refunds make it fit sooner (`head`: `id` is that waiter).
local function budget_wait(id, head)
  if not budget() then return 0 end
  local wait, walk = 0, false
  for _, code in ipairs(B.codes) do
    local want = amount(id, code)
    if want > 0 and B.u[code] + want > B.size[code] then walk = true end
    local w = word(code)
    if want > 0 and w and want > w[1] - w[4] then wait = math.max(wait, w[2] - real) end
  end
  if not walk then return math.max(wait, 0) end
  local hold = B.h
  if head and hold and hold[1] == id and real < hold[2] then
    return math.max(wait, hold[2] - real)
  end
  local counted = slots()
  for _, code in ipairs(B.codes) do
    local want = amount(id, code)
    local excess = B.u[code] + want - B.size[code]
    if want > 0 and excess > 0 then
      for k = B.n - 60, B.n do
        excess = excess - counted[code .. k]
        if excess <= 0 then
          wait = math.max(wait, (k + 61) * 1000 - real)
          break
        end
      end
    end
  end
  if head then  -- (its target, once set, stays while it is the one chosen next)
    local fit = real + wait
    local target = fit + B.pass
    if hold and hold[1] == id and hold[3] then target = math.max(hold[3], fit) end
    B.h = {id, fit, target}
  end
  return math.max(wait, 0)
end

-- Backfill: the waiter chosen next, which the budgets alone hold back, gets a target when it
-- is first held back: the moment its estimate would fit if nothing more were charged, plus
-- the backfill (`pass`, ms). Lighter waiters may be admitted past it meanwhile (`pass_by`)
-- while they leave it room at that target; so it is admitted no later (short of overruns
-- charged meanwhile, and a provider's reading): what it leaves idle while it waits is used.
-- What the waiters behind `head` (`budget_wait(head, true) > 0` in this call) may take in all
-- of each budget so: the size less its estimate less the charges still counted at its target,
-- and the same of a provider's reading in force then. nil: nothing (or no backfill).
local function budget_room(head)
  if not B or B.pass <= 0 then return nil end
  local hold = B.h
  if not hold or hold[1] ~= head or not hold[3] then return nil end
  local target, counted, room = hold[3], slots(), {}
  for _, code in ipairs(B.codes) do
    local want = amount(head, code)
    local left = B.size[code] - want
    for k = B.n - 60, B.n do
      if (k + 61) * 1000 > target then left = left - counted[code .. k] end
    end
    local w = word(code)
    if w and w[2] > target then left = math.min(left, w[1] - w[4] - want) end
    if left <= 0 then return nil end
    room[code] = left
  end
  return room
end

-- Whether `id` fits every budget now and what is left of `room` (`budget_room`): then its
-- estimate is taken from `room`.
local function budget_passes(id, room)
  for _, code in ipairs(B.codes) do
    local want = amount(id, code)
    if want > room[code] or B.u[code] + want > B.size[code] then return false end
    local w = word(code)
    if w and want > w[1] - w[4] then return false end
  end
  for _, code in ipairs(B.codes) do room[code] = room[code] - amount(id, code) end
  return true
end

-- Charge `id`'s estimate now (it fits: `budget_wait(id) == 0`); `grant` (its handle) keeps
-- the second charged for its settlement.
local function budget_charge(id, granted)
  if not budget() then return end
  for _, code in ipairs(B.codes) do
    local a = amount(id, code)
    B.u[code], B.c[code] = B.u[code] + a, B.c[code] + a
    local w = word(code)
    if w then w[4] = w[4] + a end
  end
  if B_SLOTS then
    for _, code in ipairs(B.codes) do B_SLOTS[code .. B.n] = B.c[code] end
  end
  if B.h and B.h[1] == id then B.h = nil end
  B.dirty = true
  if granted then
    redis.call('ZADD', K_BGRANT, B.n, string.match(id, '^[^:]+:%d+'))
  end
end

-- A settlement: `deltas` per budget, on a reservation charged in second `k`.
local function settle_one(k, deltas)
  for j, code in ipairs(BCODES) do
    local d = tonumber(deltas[j]) or 0
    if B.size[code] and d > 0 then
      B.u[code], B.c[code] = B.u[code] + d, B.c[code] + d
      local w = word(code)
      if w then w[4] = w[4] + d end
      B.dirty = true
    elseif B.size[code] and d < 0 and k and k >= B.n - 60 then
      local w = word(code)
      if w and k * 1000 >= w[3] then w[4] = w[4] + d end
      if k == B.n then
        local back = math.min(-d, B.c[code])
        B.u[code], B.c[code] = B.u[code] - back, B.c[code] - back
        B.dirty = true
      else
        local field = bfield(code, k)
        B.refunds[field] = (B.refunds[field] or 0) - d
      end
    end
  end
end

-- Apply one settlement or reading.
local function budget_op(op)
  local ref, rest = string.match(op, '^([^=]+)=(.*)$')
  local values = {}
  for v in string.gmatch(rest or '', '(-?%d+)') do values[#values + 1] = v end
  if string.sub(ref, 1, 1) == '!' then
    local code = string.sub(ref, 2)
    local observed, reset = real - tonumber(values[3]), real + tonumber(values[2])
    local w = word(code)
    if B.size[code] and reset > real and not (w and observed < w[3]) then
      B.w[code] = {tonumber(values[1]), reset, observed, 0}
    end
  elseif string.sub(ref, 1, 1) == 'g' then
    local handle = string.sub(ref, 2)
    local k = tonumber(redis.call('ZSCORE', K_BGRANT, handle))
    redis.call('ZREM', K_BGRANT, handle)
    settle_one(k, values)
  else
    settle_one(tonumber(ref), values)
  end
end

-- Apply the settlements and readings this call carries, each batch once.
local function budget_ops()
  if B_OPS == '' or not budget() then return end
  local new = true  -- (the batch of the ops read now was not applied before)
  for op in string.gmatch(B_OPS, '[^;]+') do
    if string.sub(op, 1, 1) == '#' then
      new = redis.call('ZADD', K_BGRANT, 'NX', B.n, 'o' .. PROC .. ':' .. string.sub(op, 2)) == 1
    elseif new then
      budget_op(op)
    end
  end
  B_SLOTS = nil
end

-- Write what changed (one HSET, refunds read first), and the state's copy (`answer` writes
-- it with the state); what the answer says of the budgets: JSON, "" without budgets.
local function budget_save()
  if not budget() then return nil, '' end
  local fields, refunded = {}, {}
  for field in pairs(B.refunds) do refunded[#refunded + 1] = field end
  if #refunded > 0 then
    local held = redis.call('HMGET', K_BUDGET, unpack(refunded))
    for j, field in ipairs(refunded) do
      local have = tonumber(held[j]) or 0
      local back = math.min(have, B.refunds[field])
      local code = string.sub(field, 1, 1)
      B.u[code] = B.u[code] - back
      fields[#fields + 1], fields[#fields + 2] = field, have - back
    end
  end
  if B.dirty or B.moved then
    for _, code in ipairs(B.codes) do
      fields[#fields + 1], fields[#fields + 2] = bfield(code, B.n), B.c[code]
    end
  end
  if B.moved then fields[#fields + 1], fields[#fields + 2] = 'm', B.n end
  if #fields > 0 then redis.call('HSET', K_BUDGET, unpack(fields)) end
  if B.moved then
    redis.call('PEXPIRE', K_BUDGET, 62000 + TTL)
    redis.call('PEXPIRE', K_BGRANT, 62000 + TTL)  -- (what it holds leaves within 62 s)
  end
  local remaining, reported = {}, {}
  for _, code in ipairs(B.codes) do
    local left = B.size[code] - B.u[code]
    local w = word(code)
    if w then
      left = math.min(left, w[1] - w[4])
      reported[code] = w[1]
    end
    remaining[code] = math.max(0, left)
  end
  local blocked = -1  -- (ms the waiter chosen next waits for the budgets)
  if S.queued == 0 then B.h = nil elseif B.h and B.h[2] > real then blocked = B.h[2] - real end
  local kept = cjson.encode({n = B.n, u = B.u, c = B.c, w = B.w, h = B.h})
  local said = cjson.encode({s = B.n, b = blocked, r = remaining, p = reported})
  return kept, said, blocked
end
