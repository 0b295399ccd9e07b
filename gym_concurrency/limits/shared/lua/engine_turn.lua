-- ENGINE_TURN: a process's turn at following the engine for every process on the limit
-- (scripts.py). KEYS: the engine lease, the engine reading. ARGV[1] this
-- process's id, ARGV[2] the lease in ms. It takes (or renews) the lease if free (or its own).
local lease, reading = KEYS[1], KEYS[2]
local proc, lease_ms = ARGV[1], tonumber(ARGV[2])
local holder = redis.call('GET', lease)
local mine = 0
if holder == proc then
  redis.call('PEXPIRE', lease, lease_ms)
  mine = 1
elseif not holder then
  redis.call('SET', lease, proc, 'PX', lease_ms)
  mine = 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('HMGET', reading, 'waiting', 'cache', 'running', 'at')
return {mine, now, r[1] or '', r[2] or '', r[3] or '', r[4] or ''}
