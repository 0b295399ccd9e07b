-- ENGINE_SIZE: KEYS, ARGV and the answer are described in scripts.py.
local K_ELEASE, K_ENGINE = KEYS[15], KEYS[16]
current_limit()
budget_ops()
reap_leases()
local status = 0
if redis.call('GET', K_ELEASE) == PROC then
  status = 1
  local cap, size = tonumber(ARGV[8]), tonumber(ARGV[9])
  if ARGV[7] == 'held' then size = S.held + size end  -- the room beyond what is held now
  if ARGV[10] ~= '' then
    redis.call('HSET', K_ENGINE, 'waiting', ARGV[10], 'cache', ARGV[11], 'running', ARGV[12],
      'at', real - tonumber(ARGV[14]))
    redis.call('PEXPIRE', K_ENGINE, ARGV[13])
  end
  set_limit(math.max(0, math.min(size, cap)))
end
grant()
return answer(status)
