# For setup.py's Cython build only: these classes of running.py become extension types, with exactly
# the attributes their __init__ sets (an attribute added there must be declared here).
cdef class Running:
    cdef public object _jobs, _by_quota, physical, in_use, _stopping, _stoppable, _own_min_runtime
    cdef public object with_runtime, _totals, _started, _unstarted, _saved, _ends, _own_grace, _types
