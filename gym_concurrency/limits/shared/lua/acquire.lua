-- ACQUIRE: KEYS, ARGV and the answer are described in scripts.py.
current_limit()
budget_ops()
local removals = tonumber(ARGV[8])
for i = 9, 8 + removals do remove(ARGV[i]) end
reap_leases()
grant()
local max_queue = tonumber(ARGV[7])
local statuses, waits = {}, {}
local over = false
for i = 9 + removals, #ARGV do
  local id = ARGV[i]
  local status = 0
  local free = S.queued == 0 and not in_grace() and S.held + weight(id) <= S.limit
  if free and budget_wait(id, true) == 0 then
    add_lease(id, now + TTL)
    budget_charge(id, false)
    status = 1
  elseif max_queue >= 0 and S.queued >= max_queue then
    status = 2
  else
    enqueue(id)
    over = over or weight(id) > S.limit
  end
  statuses[#statuses + 1] = status
  if budget() then waits[#waits + 1] = status == 0 and budget_wait(id, free) or 0 end
end
-- With flows, one queued behind others may be the fair next (its flow holds the least): it
-- is granted now, not at the next call; so is one over the limit, on a limit that is idle,
-- and one that may pass the oldest waiter, which only the budgets hold back.
if S.fw > 0 or over or PASSING then grant() end
return answer(0, statuses, waits)
