-- CHECK_SERVER: KEYS, ARGV and the answer are described in scripts.py.
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
if redis.call('EXISTS', KEYS[1]) == 0 then return 2 end
local kept = redis.call('HGET', KEYS[2], 'run')
redis.call('HSET', KEYS[2], 'run', run)
if ARGV[2] == 'c' then redis.call('HSET', KEYS[2], 'id', redis.call('CLUSTER', 'MYID')) end
if kept and kept ~= run then
  local t = redis.call('TIME')
  local real = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local until_ms = real + tonumber(ARGV[1])
  local grace = tonumber(redis.call('HGET', KEYS[2], 'g')) or 0
  redis.call('HSET', KEYS[2], 'g', math.max(grace, until_ms))
  return 1
end
return 0
