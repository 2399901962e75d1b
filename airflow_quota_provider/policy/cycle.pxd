# For setup.py's Cython build only: these classes of cycle.py become extension types, with exactly
# the attributes their __init__ sets (an attribute added there must be declared here).
cdef class _Cycle:
    cdef public object state, now, backlog, running, usage, quotas, placement, candidates, decision
    cdef public object waiting_for, awaiting, reserving, epoch, _fit_failed, _search_failed, handled, of_type, drained_for
    cdef public object longest_waiting_gang
