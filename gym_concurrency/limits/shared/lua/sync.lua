-- SYNC: KEYS, ARGV and the answer are described in scripts.py.
current_limit()
if redis.call('EXISTS', K_LIMIT) == 0 then redis.call('SET', K_LIMIT, S.limit) end
local leases, queued = redis.call('ZCARD', K_LEASES), redis.call('ZCARD', K_QUEUE)
local recount = leases ~= S.leases or queued ~= S.queued
if leases ~= S.leases then  -- (fewer: the leases key was lost)
  if leases < S.leases then start_grace(TTL) end
  S.held, S.leases = weight_of(K_LEASES)
end
if queued ~= S.queued then S.queued_weight, S.queued = weight_of(K_QUEUE) end
if recount or flows_broken() then reflow() end
if leases == 0 then S.earliest = 0 end
reap_waiters()
member()
reap_leases()
budget_ops()
local n = tonumber(ARGV[7])
local held_from, queued_from = 8, 9 + n
local drops_from = queued_from + tonumber(ARGV[8 + n])
-- Drops first: a slot they free is one a lost lease may take back.
for j = drops_from, #ARGV do remove(ARGV[j]) end
local reclaimed, granted, requeued = {}, {}, {}
for j = held_from, queued_from - 2 do
  local id = ARGV[j]
  if redis.call('ZADD', K_LEASES, 'XX', 'CH', now + TTL, id) == 0
      and not redis.call('ZSCORE', K_LEASES, id) then
    add_lease(id, now + TTL)
    reclaimed[#reclaimed + 1] = id
  end
end
local queue_lost = S.queued < redis.call('ZCARD', K_WEXP)
for j = queued_from, drops_from - 1 do
  local id = ARGV[j]
  local waiting = redis.call('ZSCORE', K_WEXP, id)
  if waiting and not (queue_lost and not redis.call('ZSCORE', K_QUEUE, id)) then
    redis.call('ZADD', K_WEXP, now + TTL, id)
  elseif redis.call('ZSCORE', K_LEASES, id) then
    redis.call('ZADD', K_LEASES, now + TTL, id)
    granted[#granted + 1] = id
  else
    local lease = redis.call('HGET', K_CAPPED, id)  -- (granted less than it asked?)
    if lease and redis.call('ZSCORE', K_LEASES, lease) then
      redis.call('ZADD', K_LEASES, now + TTL, lease)
      granted[#granted + 1] = lease
    else
      enqueue(id)
      requeued[#requeued + 1] = id
    end
  end
end
grant()
return answer(0, granted, reclaimed, requeued)
