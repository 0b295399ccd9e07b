-- ENGINE_READING: the holder of the engine lease writes the reading of a scrape (scripts.py).
-- KEYS: the engine lease, the engine reading, the limit's state. ARGV[1] this process's id, ARGV[2..4] waiting,
-- cache usage, running ("" for a gauge not read), ARGV[5] ms the reading is kept, ARGV[6] ms
-- since the scrape was sent. Answers {1, the weight held now (state's `n`, "" if none)} if
-- written, {0, ""} if the lease is another's (or gone).
local lease, reading, state = KEYS[1], KEYS[2], KEYS[3]
if redis.call('GET', lease) ~= ARGV[1] then
  return {0, ''}
end
local t = redis.call('TIME')
local sent = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[6])
redis.call('HSET', reading, 'waiting', ARGV[2], 'cache', ARGV[3], 'running', ARGV[4], 'at', sent)
redis.call('PEXPIRE', reading, ARGV[5])
return {1, redis.call('HGET', state, 'n') or ''}
