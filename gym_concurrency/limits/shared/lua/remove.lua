-- REMOVE: KEYS, ARGV and the answer are described in scripts.py.
current_limit()
for i = 6, #ARGV do remove(ARGV[i]) end
reap_leases()
grant()
return answer(0)
