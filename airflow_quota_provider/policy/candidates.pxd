# For setup.py's Cython build only: these classes of candidates.py become extension types, with exactly
# the attributes their __init__ sets (an attribute added there must be declared here).
cdef class Candidates:
    cdef public object _first, _host_gpus, _more, _on_host, _own, _quotas, _running, _sorted, by_work, now, taken
