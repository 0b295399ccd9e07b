-- Fair queuing by flow in a shared limit (after state.lua, which defines `S`, the keys and
-- `weight`): the same rules as a process limit, with the held weight and the order global.
--
-- A waiter of a named flow has an id ending `@<flow>`; one without is in the default flow.
-- While only the default flow waits, the queue is the `queue` ZSET in ticket order and none
-- of this runs (the default path costs nothing more). Once a named flow waits ("flow mode",
-- `S.fw` named waiters queued), the next waiter is the head of the flow holding the least
-- weight now (ties: the oldest head), FIFO within a flow:
--
-- `fq`     ZSET (all scores 0, ordered by member): `<flow>\0<ticket, 15 digits><id>` for
--          every waiter of a named flow, so that a flow's head is one ZRANGEBYLEX.
-- `dq`     ZSET id -> ticket: the default flow's waiters that arrived in flow mode. Those
--          that arrived before it (tickets below `S.t0`) are the head of `queue`, since
--          nothing else queued then.
-- `ready`  ZSET `<ticket, 15 digits><id>` -> the weight its flow holds: the head of each
--          waiting flow, so that the next waiter is its first member.
-- `fheld`  HASH flow -> weight its leases hold (named flows holding any); `S.fh` is their
--          sum, so the default flow holds `S.held - S.fh`.
--
-- In `state`: `fw` (`S.fw`), `fh` (`S.fh`), `f0` (`S.t0`), `x` (`S.chosen`), `fn` (`S.nf`,
-- the flows in `ready`). `S.chosen` is the waiter chosen next that did not fit: it is never
-- passed, and capacity that frees is kept for it (as in a process limit). Losing any of
-- these keys admits nothing more (every decision reads the counts in `state`): `reflow()`
-- rebuilds them from `queue` and `leases`, run when the state is rebuilt and whenever a
-- renewal finds them disagree.
local function flow_of(id)  -- nil: the default flow
  return string.match(id, '^[^@]*@(.*)$')
end
local function pad(ticket)
  return string.format('%015d', tonumber(ticket))
end
local function fq_first(flow)
  local m = redis.call('ZRANGEBYLEX', K_FQ, '[' .. flow .. '\0', '(' .. flow .. '\1',
    'LIMIT', 0, 1)
  return m[1]
end

-- The `ready` member of a waiting flow's head, or nil if the flow has no waiter.
local function head_of(flow)
  if flow then
    local m = fq_first(flow)
    return m and string.sub(m, #flow + 2)
  end
  if S.queued <= S.fw then return nil end
  local first = redis.call('ZRANGE', K_QUEUE, 0, 0, 'WITHSCORES')
  if #first == 2 and tonumber(first[2]) < S.t0 then return pad(first[2]) .. first[1] end
  first = redis.call('ZRANGE', K_DQ, 0, 0, 'WITHSCORES')
  return #first == 2 and pad(first[2]) .. first[1] or nil
end

local function held_by(flow)
  if flow then return tonumber(redis.call('HGET', K_FHELD, flow)) or 0 end
  return S.held - S.fh
end

-- A waiting flow's head goes into `ready` (or is scored anew): `S.nf` counts the flows there.
local function ready(held, head)
  S.nf = S.nf + redis.call('ZADD', K_READY, held, head)
end

-- The weight held by `id`'s flow changes by `delta`; its head (if it waits) is scored anew.
local function held_change(id, delta)
  S.held = S.held + delta
  local flow, held = flow_of(id), nil
  if flow then
    S.fh = S.fh + delta
    held = redis.call('HINCRBY', K_FHELD, flow, delta)
    if held <= 0 then redis.call('HDEL', K_FHELD, flow) end
  else
    held = S.held - S.fh
  end
  if S.fw == 0 then return end
  local head = head_of(flow)
  if head then ready(held, head) end
end

local function end_flow_mode()
  redis.call('DEL', K_READY, K_DQ, K_FQ)
  S.fw, S.t0, S.chosen, S.nf = 0, 0, '', 0
end

-- `id` joins the flows' order with `ticket` (it is in `queue` already).
local function flow_enqueue(id, ticket)
  local flow = flow_of(id)
  if flow == nil then
    if S.fw == 0 then return end
    redis.call('ZADD', K_DQ, ticket, id)
    if S.queued - S.fw == 1 then ready(held_by(nil), pad(ticket) .. id) end
    return
  end
  if S.fw == 0 then
    S.t0 = ticket
    if S.queued > 1 then ready(held_by(nil), head_of(nil)) end
  end
  S.fw = S.fw + 1
  local member = pad(ticket) .. id
  redis.call('ZADD', K_FQ, 0, flow .. '\0' .. member)
  if fq_first(flow) == flow .. '\0' .. member then ready(held_by(flow), member) end
end

-- Waiter `id` with `ticket` left the queue (admitted, or gone): the flows' order forgets it.
-- Its flow's next head takes its place in `ready`, unless `later` (the caller's lease for it
-- rescores the flow at once).
local function flow_unqueue(id, ticket, later)
  if S.fw == 0 then return end
  if S.chosen == id then S.chosen = '' end
  local flow, member = flow_of(id), pad(ticket) .. id
  local was_head = redis.call('ZREM', K_READY, member) == 1
  if was_head then S.nf = S.nf - 1 end
  if flow then
    S.fw = S.fw - redis.call('ZREM', K_FQ, flow .. '\0' .. member)
  else
    redis.call('ZREM', K_DQ, id)
  end
  if S.fw == 0 then end_flow_mode() return end
  if was_head and not later then
    local head = head_of(flow)
    if head then ready(held_by(flow), head) end
  end
end

-- The waiter to serve next in flow mode: the chosen one while it waits, else the first of
-- `ready` (nil if `ready` is empty: lost, to be rebuilt).
local function flow_next()
  if S.chosen ~= '' then
    local ticket = redis.call('ZSCORE', K_QUEUE, S.chosen)
    if ticket then return S.chosen, ticket end
    S.chosen = ''
  end
  local top = redis.call('ZRANGE', K_READY, 0, 0)
  if #top == 0 then return nil end
  return string.sub(top[1], 16), string.sub(top[1], 1, 15)
end

-- Rebuild the flows' order and held weights from `queue` and `leases` (O(waiters + leases)):
-- after the state or one of these keys was lost.
local function reflow()
  local chosen = S.chosen  -- (the waiter chosen next stays chosen: never passed)
  end_flow_mode()
  redis.call('DEL', K_FHELD)
  S.fh = 0
  for _, id in ipairs(redis.call('ZRANGE', K_LEASES, 0, -1)) do
    local flow = flow_of(id)
    if flow then
      redis.call('HINCRBY', K_FHELD, flow, weight(id))
      S.fh = S.fh + weight(id)
    end
  end
  local queue = redis.call('ZRANGE', K_QUEUE, 0, -1, 'WITHSCORES')
  local heads = {}
  for i = 1, #queue, 2 do
    local id, ticket = queue[i], queue[i + 1]
    local flow = flow_of(id)
    local member = pad(ticket) .. id
    if flow then
      redis.call('ZADD', K_FQ, 0, flow .. '\0' .. member)
      S.fw = S.fw + 1
    else
      redis.call('ZADD', K_DQ, ticket, id)
    end
    local name = flow or '\0'  -- (no named flow is '\0': its waiters could not be found)
    if heads[name] == nil then heads[name] = {member, flow} end
  end
  if S.fw > 0 then
    for _, head in pairs(heads) do ready(held_by(head[2]), head[1]) end
  else
    end_flow_mode()
  end
  S.chosen = chosen
end

-- True if the flows' keys disagree with the counts (one of them lost): a renewal reflows.
local function flows_broken()
  if S.fh > 0 and redis.call('EXISTS', K_FHELD) == 0 then return true end
  if S.fw == 0 then return false end
  local defaults = redis.call('ZCARD', K_DQ) + redis.call('ZCOUNT', K_QUEUE, '-inf', '(' .. S.t0)
  return redis.call('ZCARD', K_FQ) ~= S.fw or defaults ~= S.queued - S.fw
    or redis.call('ZCARD', K_READY) ~= S.nf
end
