-- LEAVE: KEYS, ARGV and the answer are described in scripts.py.
current_limit()
budget_ops()
for i = 7, #ARGV do remove(ARGV[i]) end
redis.call('ZREM', K_MEMBERS, PROC)
redis.call('DEL', MBOX .. PROC)
reap_leases()
grant()
return answer(0)
