-- REMOVE: KEYS, ARGV and the answer are described in scripts.py.
current_limit()
budget_ops()
for i = 7, #ARGV do remove(ARGV[i]) end
reap_leases()
grant()
return answer(0)
