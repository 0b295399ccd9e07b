"""Fault injection for the shared limit over real OS processes and real redis-servers: a
witness Redis that every holder reports to, agent processes holding a SharedLimit, a TCP
proxy that cuts one process off, and the runs that measure what each fault does."""
