-- ACQUIRE: KEYS, ARGV and the answer are described in scripts.py.
current_limit()
local removals = tonumber(ARGV[7])
for i = 8, 7 + removals do remove(ARGV[i]) end
reap_leases()
grant()
local max_queue = tonumber(ARGV[6])
local statuses = {}
local over = false
for i = 8 + removals, #ARGV do
  local id = ARGV[i]
  local status = 0
  if S.queued == 0 and not in_grace() and S.held + weight(id) <= S.limit then
    add_lease(id, now + TTL)
    status = 1
  elseif max_queue >= 0 and S.queued >= max_queue then
    status = 2
  else
    enqueue(id)
    over = over or weight(id) > S.limit
  end
  statuses[#statuses + 1] = status
end
-- With flows, one queued behind others may be the fair next (its flow holds the least): it
-- is granted now, not at the next call; so is one over the limit, on a limit that is idle.
if S.fw > 0 or over then grant() end
return answer(0, statuses)
