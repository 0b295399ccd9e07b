-- CONFIGURE: KEYS, ARGV and the answer are described in scripts.py.
reap_waiters()
local CONFLICT = 3
local size, kind = tonumber(ARGV[7]), ARGV[8]
local configured = tonumber(redis.call('GET', K_CONFIGURED))
local status = 0
if S.limit == nil then
  restore(size)
  if kind == 'configure' then redis.call('SET', K_CONFIGURED, size) end
elseif kind == 'resize' then
  set_limit(size)
elseif configured == nil then  -- (restored by a resize): the size in force stays
  redis.call('SET', K_CONFIGURED, size)
elseif size ~= configured and size ~= S.limit then
  local others = redis.call('ZCARD', K_MEMBERS)
  if redis.call('ZSCORE', K_MEMBERS, PROC) then others = others - 1 end
  if others > 0 then
    status = CONFLICT
  else
    set_limit(size)
    redis.call('SET', K_CONFIGURED, size)
  end
end
if status == 0 then member() end
reap_leases()
grant()
local memory = redis.call('INFO', 'memory')
local policy = ''
if (tonumber(string.match(memory, 'maxmemory:(%d+)')) or 0) > 0 then
  policy = string.match(memory, 'maxmemory_policy:([%w-]+)') or ''
end
return answer(status, tostring(configured or ''), policy)
